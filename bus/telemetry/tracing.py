"""OpenTelemetry around the core: spans and metrics, configured only by ``OTEL_*`` variables.

Nothing here decides an outcome; it wraps what does. ``configure(role)`` runs once at start-up
of each process. With no exporter configured it installs nothing and returns False, and
HookBus adds no wrapper at all — tracing off costs nothing on the hot path.

Configuration (standard variables): ``OTEL_TRACES_EXPORTER`` / ``OTEL_METRICS_EXPORTER``
(``otlp``, ``console`` or ``none``; ``otlp`` is implied when ``OTEL_EXPORTER_OTLP_ENDPOINT``
is set), ``OTEL_EXPORTER_OTLP_ENDPOINT`` (e.g. ``http://jaeger:4318``),
``OTEL_EXPORTER_OTLP_PROTOCOL`` (and its ``_TRACES_`` / ``_METRICS_`` forms: ``http/protobuf``,
the default, or ``grpc`` when opentelemetry-exporter-otlp-proto-grpc is installed),
``OTEL_SERVICE_NAME`` (default ``hookbus-<role>``), ``OTEL_BSP_*`` and
``OTEL_METRIC_EXPORT_INTERVAL``. Any other exporter or protocol (``jaeger``, ``zipkin``,
``http/json``) is refused with a ConfigError rather than quietly sent as OTLP/HTTP.

Traces over OTLP/HTTP are HookBus's ``LightSpan``s (and the application's SDK spans), sent by
the thread of ``bus.telemetry.export.SpanExport``; over gRPC or to the console, SDK spans sent by
the SDK's ``BatchSpanProcessor``.

``shutdown`` flushes what is left within ``FLUSH_SECS``; with the collector down it gives up
then instead of retrying for the exporters' full timeout.

Spans: the agent's turn → step → ``execute_tool <tool>`` → ``dispatch <Event>`` (CLIENT, in
the coordinator or registry) → ``hook <name>`` (SERVER, in the worker process that ran it, its
parent carried in the request's ``traceparent``; INTERNAL for a hook run in the coordinator's
process). Async hook spans link to the span that published the event. Every span, its kind and
attributes: docs/protocol.md 6.9, checked by tests/test_tracing.py.

No tool input or output leaves through telemetry by default: span attributes name the event,
session, tool and hooks; a hook's action is a span event with what the agent sees of it (a
reason, a decision, context for the model), never the arguments or output a hook rewrote.
``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true`` (the OpenTelemetry GenAI opt-in)
adds to a tool call's dispatch span the final input (``gen_ai.tool.call.arguments``, JSON) and
output (``gen_ai.tool.call.result``) as the hooks left them — after every rewrite, as the
agent gets them; no input for a blocked call — up to ``CONTENT_CHARS`` characters each.

Why one module: configuration, HookBus's own spans and the instruments that wrap a runner share
the process-wide tracing state (the provider, the export thread, the deferred records). The
export thread itself is export.py.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import os
import re
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from types import TracebackType
from typing import Any

from opentelemetry import metrics, trace
from opentelemetry.context import Context, attach, detach, get_current
from opentelemetry.trace import (
    INVALID_SPAN,
    INVALID_SPAN_CONTEXT,
    Link,
    NonRecordingSpan,
    Span,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
    TraceState,
)

from bus.aggregation import Outcome, _all_continue, would_do
from bus.errors import ConfigError
from bus.events import HookContext, HookEvent, session_of, tool_of
from bus.runner import EventRunner
from bus.telemetry.export import SpanExport

tracer = trace.get_tracer("hookbus")
meter = metrics.get_meter("hookbus")

_state = {"enabled": False, "content": False}
#: The last span export (its counts stay readable after ``shutdown()``); whether HookBus's
#: spans are the SDK's (console exporter, OTLP over gRPC).
_last_export: SpanExport | None = None
_sdk_spans = False
#: Whether traces over OTLP/HTTP are HookBus's ``LightSpan``s sent by export.py's thread (True)
#: or the SDK's spans, batch span processor and OTLP/HTTP exporter, as over gRPC (False): what
#: ``bench/tracing_cost.py`` compares, in the same run.
private_export = True
#: What the exporters may still take at shutdown to send what is left (seconds).
FLUSH_SECS = 2.0
#: The SDK's exporters (metrics; spans to the console or over gRPC), shut down past FLUSH_SECS.
_exporters: list[Any] = []
EXPORTERS = ("otlp", "console", "none")
PROTOCOLS = ("http/protobuf", "grpc")
_ACTION_EVENTS = frozenset({"Block", "MutateInput", "MutateOutput", "Override"})
#: Fields of an action that carry a tool's input or output: never exported (see above).
_CONTENT_FIELDS = frozenset({"updated_args", "updated_content"})
#: The opt-in to export a tool call's final input and output (its values: true, 1, yes, on).
CAPTURE_CONTENT = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"
#: The most characters of a final input or output exported with the opt-in.
CONTENT_CHARS = 4096


def enabled() -> bool:
    return _state["enabled"]


def _exporter(kind: str, env: Mapping[str, str]) -> str:
    chosen = env.get(f"OTEL_{kind}_EXPORTER", "").strip().lower()
    if chosen:
        first = chosen.split(",")[0].strip()
        if first not in EXPORTERS:
            hint = " (Jaeger takes OTLP: otlp, with its port 4318)" if first == "jaeger" else ""
            raise ConfigError(
                f"OTEL_{kind}_EXPORTER={chosen}: HookBus exports {', '.join(EXPORTERS)}{hint}"
            )
        return first
    endpoint = env.get("OTEL_EXPORTER_OTLP_ENDPOINT") or env.get(
        f"OTEL_EXPORTER_OTLP_{kind}_ENDPOINT"
    )
    return "otlp" if endpoint else "none"


def console(env: Mapping[str, str] | None = None) -> bool:
    """Whether the environment sends traces to the console (``OTEL_TRACES_EXPORTER=console``)."""
    return _exporter("TRACES", os.environ if env is None else env) == "console"


def configure(role: str, env: Mapping[str, str] | None = None) -> bool:
    """Install the providers the environment asks for; True if anything is exported."""
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import (
        ConsoleMetricExporter,
        PeriodicExportingMetricReader,
    )
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter
    from opentelemetry.sdk.trace.sampling import DEFAULT_ON

    global _export, _sampler, _ids, _default_sampler, _sdk_spans, _last_export
    env = os.environ if env is None else env
    capture = env.get(CAPTURE_CONTENT, "").strip().lower() in ("true", "1", "yes", "on")
    _state["content"] = capture
    traces, metric_kind = _exporter("TRACES", env), _exporter("METRICS", env)
    if traces == "none" and metric_kind == "none":
        return False
    trace_protocol, metric_protocol = _protocol("TRACES", env), _protocol("METRICS", env)
    resource = Resource.create({"service.name": env.get("OTEL_SERVICE_NAME", f"hookbus-{role}")})
    if traces != "none":
        provider = TracerProvider(resource=resource, shutdown_on_exit=False)
        if traces == "console":
            span_exporter: Any = ConsoleSpanExporter()
        elif trace_protocol == "grpc":
            # gRPC goes through the SDK's exporter and batch processor: HookBus's own export
            # thread (bus/telemetry/export.py) speaks OTLP/HTTP only.
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (  # type: ignore[import-not-found]
                OTLPSpanExporter as GrpcSpanExporter,
            )

            span_exporter = GrpcSpanExporter()
        elif not private_export:  # the SDK's OTLP/HTTP exporter (bench/tracing_cost.py)
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            span_exporter = OTLPSpanExporter()
        else:  # OTLP/HTTP: HookBus's spans and the application's through one export thread
            from bus.telemetry.export import Forward

            span_exporter = None
            export = SpanExport(resource, env)
            provider.add_span_processor(Forward(export))
            describe: Any = provider.sampler.get_description  # untyped in the SDK
            default = describe() == DEFAULT_ON.get_description()  # type: ignore[no-untyped-call]
            _export = _last_export = export
            _sampler, _ids, _default_sampler = provider.sampler, provider.id_generator, default
            export.chores.append(_deferred.drain)
        if span_exporter is not None:
            _exporters.append(span_exporter)
            provider.add_span_processor(BatchSpanProcessor(span_exporter))
            _sdk_spans = True
        trace.set_tracer_provider(provider)
    if metric_kind != "none":
        if metric_kind == "console":
            exporter: Any = ConsoleMetricExporter()
        elif metric_protocol == "grpc":
            from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import (  # type: ignore[import-not-found]
                OTLPMetricExporter as GrpcMetricExporter,
            )

            exporter = GrpcMetricExporter()
        else:
            from opentelemetry.exporter.otlp.proto.http.metric_exporter import (
                OTLPMetricExporter,
            )

            exporter = OTLPMetricExporter()
        _exporters.append(exporter)
        reader = PeriodicExportingMetricReader(exporter)
        metrics.set_meter_provider(
            MeterProvider(resource=resource, metric_readers=[reader], shutdown_on_exit=False)
        )
        # Its callback runs on the reader's thread before each collection: the histogram
        # records deferred since the last one go in first.
        metrics.get_meter("hookbus").create_observable_counter(
            "hookbus.spans.lost",
            callbacks=[_spans_lost],
            description="spans not exported: the export queue was full (dropped) or the "
            "receiver refused or did not answer (failed)",
        )
    _state["enabled"] = True
    _instruments.cache_clear()
    return True


def _protocol(kind: str, env: Mapping[str, str]) -> str:
    """The OTLP protocol for ``kind``; a ConfigError for one HookBus cannot send."""
    chosen = (
        (
            env.get(f"OTEL_EXPORTER_OTLP_{kind}_PROTOCOL")
            or env.get("OTEL_EXPORTER_OTLP_PROTOCOL")
            or "http/protobuf"
        )
        .strip()
        .lower()
    )
    if chosen not in PROTOCOLS:
        raise ConfigError(
            f"OTLP protocol {chosen!r} (OTEL_EXPORTER_OTLP_PROTOCOL): HookBus sends "
            f"{' or '.join(PROTOCOLS)}"
        )
    if (
        chosen == "grpc"
        and importlib.util.find_spec("opentelemetry.exporter.otlp.proto.grpc") is None
    ):
        raise ConfigError(
            "OTEL_EXPORTER_OTLP_PROTOCOL=grpc needs the package "
            "opentelemetry-exporter-otlp-proto-grpc (pip install it), or use http/protobuf (the "
            "collector's port 4318)"
        )
    return chosen


def shutdown() -> None:
    """Flush what is left and stop the exporters (every process that calls ``configure``
    calls this before it exits: the providers do not shut down at exit by themselves): within
    about twice ``FLUSH_SECS``, whether the collector answers or not.

    The SDK's own timeouts do not bound this: an exporter retries against a collector that is
    down for up to ``OTEL_EXPORTER_OTLP_TIMEOUT`` (10 s) per signal, and a span processor's
    shutdown waits 30 s for its export thread. So flush and shutdown run on a daemon thread;
    past ``FLUSH_SECS`` the SDK's exporters are shut down, which ends their retries, and past
    as much again the process goes on without them: what was not sent is dropped (the
    exporters log it). HookBus's own span export (OTLP/HTTP) sends nothing past about twice
    ``FLUSH_SECS`` either: its requests' timeout is cut to that deadline, and the spans it
    has not sent by then are counted failed (``span_stats()``, ``hookbus.spans.lost``)."""
    global _export, _sdk_spans
    providers = [trace.get_tracer_provider(), metrics.get_meter_provider()]
    export = _export
    flush_ms = int(FLUSH_SECS * 1000)
    flushed, stopped = threading.Event(), threading.Event()

    def run() -> None:
        for provider in providers:
            with contextlib.suppress(Exception):  # the metrics SDK raises on a timeout
                getattr(provider, "force_flush", lambda timeout_millis=0: None)(flush_ms)
        flushed.set()
        if export is not None:  # before the tracer provider's (its Forward would wait 30 s)
            export.shutdown(FLUSH_SECS)
        for provider in providers:
            with contextlib.suppress(Exception):
                getattr(provider, "shutdown", lambda: None)()
        stopped.set()

    threading.Thread(target=run, name="hookbus-telemetry-shutdown", daemon=True).start()
    if not flushed.wait(FLUSH_SECS):
        for exporter in _exporters:
            with contextlib.suppress(Exception):
                exporter.shutdown()
    stopped.wait(FLUSH_SECS)
    if export is not None:
        export.shutdown(0)  # whatever it has not sent by now is counted lost, and it stops
    _exporters.clear()
    _export, _sdk_spans = None, False


#: Metric attributes as (key, value) pairs: hashable, so records of the same series share a list.
Attrs = tuple[tuple[str, Any], ...]


class _Deferred:
    """Histogram records taken on the event loop and recorded into the SDK off it.

    Profiled, one ``Histogram.record`` of the SDK costs ~6-12 µs (attribute hashing, views,
    aggregation, exemplars) and a dispatch makes two. Here a record appends a float to the
    list of its (histogram, attributes) under a lock: no SDK call on the loop, and nothing the
    garbage collector tracks (a record kept as a tuple and a dict until the next drain made the
    collector run every few dozen dispatches: docs/performance.md, "Tracing"). The span
    export thread and the metric reader's thread (before each collection) record them into
    the SDK, a few at a time between releases of the GIL. Past ``LIMIT`` waiting values, a
    record is made at once instead: none is lost.
    """

    LIMIT = 65_536

    def __init__(self) -> None:
        self.pending: dict[tuple[Any, Attrs], list[float]] = {}
        self.count = 0
        self.lock = threading.Lock()  # held only to add a value or take the whole table

    def record(self, histogram: Any, value: float, attrs: Attrs) -> None:
        """``attrs``: the attributes as (key, value) pairs."""
        with self.lock:
            if self.count < self.LIMIT:
                self.count += 1
                values = self.pending.get((histogram, attrs))
                if values is None:
                    self.pending[(histogram, attrs)] = [value]
                else:
                    values.append(value)
                return
        histogram.record(value, dict(attrs))

    def drain(self) -> None:
        with self.lock:  # two threads may drain; each takes the values the other has not
            pending, self.pending, self.count = self.pending, {}, 0
        n = 0
        for (histogram, attrs), values in pending.items():
            attributes = dict(attrs)
            for value in values:
                histogram.record(value, attributes)
                n += 1
                if n % 8 == 0:
                    time.sleep(0)  # gives the GIL back to the event loop's thread


_deferred = _Deferred()


def _spans_lost(options: Any) -> Iterator[Any]:
    from opentelemetry.metrics import Observation

    _deferred.drain()
    stats = span_stats()
    for reason in ("dropped", "failed"):
        if reason in stats:
            yield Observation(stats[reason], {"reason": reason})


def span_stats() -> dict[str, int]:
    """Spans exported, dropped (the queue was full) and failed (the receiver refused them or
    did not answer) so far; after ``shutdown()``, the final counts."""
    return dict(_last_export.stats) if _last_export is not None else {}


# -- HookBus's own spans -----------------------------------------------------------------------
#
# Why not the SDK's spans on the hot path: profiled (docs/performance.md, "Tracing"), an SDK
# span costs ~20-30 µs on the event loop here (sampler, id generation, attribute bounds, span
# processors, context manager layers) and each dispatch makes two or three. ``LightSpan`` keeps
# what OTLP needs in slots and hands itself to the export thread when it ends; the sampler of
# the SDK's provider (``OTEL_TRACES_SAMPLER``) still decides, and inside the span the current
# OpenTelemetry context carries its span context, so that ``headers()``, any propagator and any
# SDK span the application starts there see it as their parent.


class LightSpan(Span):
    """One span HookBus records itself. It is an API ``Span``: while it is current, the
    application's code that asks for the current span gets it, and may add to it.

    Its ids and flags are plain fields; the API's ``SpanContext`` is built only when someone
    asks for it (``get_span_context``): HookBus's own path reads the fields (profiled, the
    property calls of a ``SpanContext`` were a sixth of the calls tracing adds to a dispatch)."""

    __slots__ = ("_base", "_context", "_token", "attributes", "end_ns", "events", "flags",
                 "kind", "links", "name", "parent_id", "parent_remote", "recording", "span_id",
                 "start_ns", "state", "status_code", "status_message", "trace_id",
                 "w3c")  # fmt: skip

    def __init__(
        self,
        name: str,
        trace_id: int,
        span_id: int,
        flags: int,
        state: TraceState | None,
        parent_id: int,
        parent_remote: bool,
        kind: SpanKind,
        attributes: dict[str, Any],
        links: Sequence[SpanContext],
        start_ns: int,
        recording: bool,
        base: Context | None,
    ) -> None:
        self.name = name
        self.trace_id = trace_id
        self.span_id = span_id
        self.flags = flags  # the W3C trace flags: 1 = sampled
        self.state = state
        self.parent_id = parent_id  # 0: a root span
        self.parent_remote = parent_remote
        self.kind = kind
        self.attributes = attributes
        self.links = links
        self.start_ns = start_ns
        self.end_ns = 0
        self.events: list[tuple[str, int, Mapping[str, Any]]] | None = None
        self.status_code = 0
        self.status_message = ""
        self.recording = recording
        self._base = base
        self._token: object = None
        self._context: SpanContext | None = None
        self.w3c: tuple[str, str] | None = None  # its traceparent and tracestate, once asked

    def is_recording(self) -> bool:
        return self.recording

    def get_span_context(self) -> SpanContext:
        if self._context is None:
            self._context = SpanContext(
                self.trace_id, self.span_id, False, TraceFlags(self.flags), self.state
            )
        return self._context

    def set_attribute(self, key: str, value: Any) -> None:
        if self.recording and not self.end_ns:
            self.attributes[key] = value

    def set_attributes(self, attributes: Mapping[str, Any]) -> None:
        if self.recording and not self.end_ns:
            self.attributes.update(attributes)

    def add_event(
        self, name: str, attributes: Mapping[str, Any] | None = None, timestamp: int | None = None
    ) -> None:
        if self.recording and not self.end_ns:
            if self.events is None:
                self.events = []
            self.events.append((name, timestamp or time.time_ns(), attributes or {}))

    def update_name(self, name: str) -> None:
        if not self.end_ns:
            self.name = name

    def record_exception(
        self,
        exception: BaseException,
        attributes: Mapping[str, Any] | None = None,
        timestamp: int | None = None,
        escaped: bool = False,
    ) -> None:
        self.add_event("exception", {"exception.type": type(exception).__name__,
                                     "exception.message": str(exception)[:1000],
                                     **(attributes or {})}, timestamp)  # fmt: skip

    def set_status(self, status: Status | StatusCode, description: str | None = None) -> None:
        if isinstance(status, Status):
            self.status_code = status.status_code.value  # UNSET 0, OK 1, ERROR 2, as in OTLP
            self.status_message = status.description or ""
        else:
            self.status_code = status.value
            self.status_message = description or ""

    def end(self, end_time: int | None = None) -> None:
        if self.end_ns:
            return
        self.end_ns = time.time_ns() if end_time is None else end_time
        if self.recording and _export is not None and self.flags & 1:
            _export.add(self)
        self._base = None  # what it held only while it ran: an ended span keeps no context

    # as a context manager: the current span while it runs, ended on the way out
    def __enter__(self) -> LightSpan:
        self._token = attach(trace.set_span_in_context(self, self._base))
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        detach(self._token)  # type: ignore[arg-type]
        self._token = None
        if exc is not None and self.recording:
            if not self.status_code:
                self.set_status(StatusCode.ERROR, f"{kind.__name__ if kind else ''}: {exc}")
            self.record_exception(exc)
        self.end()


#: The export queue of HookBus's spans (None: not exporting over OTLP) and how spans are
#: sampled and numbered: module globals, read on every span.
_export: SpanExport | None = None
_default_sampler = False
_sampler: Any = None
_ids: Any = None


#: The key under which the API keeps the current span in a context: read off the API once
#: (``set_span_in_context``) rather than imported under its private name, so that
#: ``_current_span`` is one lookup instead of the API's three calls and an ABC check.
_SPAN_KEY = next(iter(trace.set_span_in_context(INVALID_SPAN, Context())))


def _current_span(context: Context | None = None) -> Span:
    """``trace.get_current_span(context)``, for the hot path."""
    span = (get_current() if context is None else context).get(_SPAN_KEY)
    if span is None or (type(span) is not LightSpan and not isinstance(span, Span)):
        return INVALID_SPAN
    return span


def start_span(
    name: str,
    attributes: dict[str, Any] | None = None,
    *,
    kind: SpanKind = SpanKind.INTERNAL,
    context: Context | None = None,
    links: Sequence[Link] = (),
    start_ns: int | None = None,
    parent: SpanContext | None = None,
) -> LightSpan:
    """A HookBus span, child of the span current in ``context`` (default: the current one), or
    of ``parent`` (a remote span context: then the span starts from an empty context); sampled
    as the provider's sampler decides. Only when ``light()`` is True."""
    remote = parent is not None
    if parent is None:
        current = _current_span(context)
        if type(current) is LightSpan:  # HookBus's own: its fields, no SpanContext
            valid, trace_id, parent_id = True, current.trace_id, current.span_id
            parent_flags, parent_state, parent_remote = current.flags, current.state, False
        else:
            parent = current.get_span_context()
    if parent is not None:
        valid = parent.is_valid
        trace_id, parent_id = parent.trace_id, parent.span_id
        parent_flags, parent_state = int(parent.trace_flags), parent.trace_state
        parent_remote = parent.is_remote
        if remote:
            context = _EMPTY
            if valid and not _default_sampler:  # a sampler reads the parent from the context
                context = trace.set_span_in_context(NonRecordingSpan(parent), Context())
    attrs = attributes if attributes is not None else {}
    if not valid:
        trace_id = _ids.generate_trace_id()
    if _default_sampler:
        # parentbased_always_on (the SDK's default): a child follows its parent, a root is
        # sampled. The same decision as the sampler's, without its objects.
        sampled = recording = bool(parent_flags & 1) if valid else True
        state = parent_state if valid else None
    else:
        decision = _sampler.should_sample(context, trace_id, name, kind, attrs, links)
        sampled, recording = decision.decision.is_sampled(), decision.decision.is_recording()
        state = decision.trace_state
        if decision.attributes:
            attrs.update(decision.attributes)
    return LightSpan(name, trace_id, _ids.generate_span_id(), 1 if sampled else 0, state,
                     parent_id if valid else 0, valid and parent_remote, kind, attrs,
                     tuple(lk.context for lk in links) if links else (),
                     time.time_ns() if start_ns is None else start_ns, recording,
                     context)  # fmt: skip


#: The base context of a span whose parent is remote (the span itself is put in on entry).
_EMPTY = Context()


def light() -> bool:
    """True when HookBus's spans are ``LightSpan``s (traces exported over OTLP)."""
    return _export is not None


def span(
    name: str,
    attributes: dict[str, Any] | None = None,
    *,
    kind: SpanKind = SpanKind.INTERNAL,
    context: Context | None = None,
    links: Sequence[Link] = (),
) -> AbstractContextManager[Any]:
    """``with span(name, attrs) as s:``: a span current while the block runs. A ``LightSpan``
    when traces go out over OTLP, else the SDK's (console exporter) or a no-op (tracing off)."""
    if _export is not None:
        return start_span(name, attributes, kind=kind, context=context, links=links)
    if _sdk_spans or not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
        return tracer.start_as_current_span(
            name, context=context, kind=kind, attributes=attributes, links=links
        )
    return _NO_SPAN  # nobody traces: the SDK's no-op span would still cost ~10 µs


class _NoSpan(AbstractContextManager[Any]):
    """What ``span()`` gives when no tracer provider is installed: does nothing, cheaply."""

    def __enter__(self) -> _NoSpan:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def is_recording(self) -> bool:
        return False

    def set_attribute(self, key: str, value: Any) -> None:
        pass

    def add_event(self, name: str, attributes: Mapping[str, Any] | None = None) -> None:
        pass

    def set_status(self, status: Status | StatusCode, description: str | None = None) -> None:
        pass

    def end(self, end_ns: int | None = None) -> None:
        pass


_NO_SPAN = _NoSpan()


@functools.cache
def _instruments() -> dict[str, Any]:
    m = metrics.get_meter("hookbus")
    return {
        "dispatch": m.create_histogram("hookbus.dispatch.duration", unit="s",
                                       description="time to decide one event"),
        "hook": m.create_histogram("hookbus.hook.duration", unit="s",
                                   description="time one hook took to answer"),
        "timeouts": m.create_counter("hookbus.hook.timeouts", description="hooks that timed out"),
        "skips": m.create_counter(
            "hookbus.hook.skips",
            description="hooks that did not answer, by what their failure policy made of it "
            "(fail_open: skipped; fail_closed: turned into Block/Deny)",
        ),
        "blocks": m.create_counter("hookbus.blocks", description="tool calls blocked, by hook"),
        "shadowed": m.create_counter(
            "hookbus.hook.shadowed",
            description="answers of warn/dryrun hooks that were not applied as given",
        ),
        "dead_letters": m.create_counter("hookbus.dead_letters",
                                         description="messages moved to the dead-letter stream"),
        "lost": m.create_counter("hookbus.entries.lost",
                                 description="stream entries a hard cap cut before a consumer "
                                 "group handled them, by group and stream"),
    }  # fmt: skip


def instrument(runner: EventRunner) -> EventRunner:
    """Wrap a runner's dispatch in spans and metrics (only when telemetry is enabled)."""
    if not enabled() or getattr(runner, "_hookbus_traced", False):
        return runner
    runner._hookbus_traced = True  # type: ignore[attr-defined]
    gather = runner.gather
    # A coordinator runs its remote hooks elsewhere (they record their own spans) and the
    # hooks given to its add() here; a registry runs every hook here.
    here: dict[HookEvent, list[Any]] | None = getattr(runner, "_local", None)
    asker = getattr(runner, "asker", None)  # who the dispatch is for (the gateway's tenant)
    default_timeout = runner.settings.hook_timeout_secs

    async def traced_gather(
        event: HookEvent, ctx: HookContext, *, sequential: bool = False
    ) -> list[Outcome]:
        tool, _ = tool_of(ctx)
        name = event._value_  # the member's value without the enum's property (a call)
        attrs = {"hook.event": name, "session.id": session_of(ctx)}
        if tool:
            attrs["gen_ai.tool.name"] = tool
        dispatch_attrs = dict(attrs)
        if asker is not None and (source := asker()).startswith(TENANT_SOURCE):
            dispatch_attrs["hookbus.tenant"] = source[len(TENANT_SOURCE) :]
        start = time.time_ns()
        with span(f"dispatch {name}", dispatch_attrs, kind=SpanKind.CLIENT) as dispatch:
            outcomes = await gather(event, ctx, sequential=sequential)
            if here is None:
                local: Any = True
            else:
                local = {id(t.spec) for t in here[event]} if here[event] else ()
            record_outcomes(dispatch, event, attrs, outcomes, start, local=local,
                            default_timeout=default_timeout)  # fmt: skip
            if dispatch.is_recording() and event in DECISION_EVENTS:
                record_result(dispatch, event, ctx, outcomes, runner.settings.truncate_chars)
        _deferred.record(
            _instruments()["dispatch"],
            (time.time_ns() - start) / 1e9,
            (("hook.event", name),),
        )
        return outcomes

    runner.gather = traced_gather  # type: ignore[method-assign]
    # the runner's own shortcut past gather() would go around the span
    runner.start_gather = (  # type: ignore[method-assign]
        lambda event, ctx, sequential=False: traced_gather(event, ctx, sequential=sequential)
    )
    return runner


#: How a dispatch's source names a tenant (the gateway's and the coordinator service's).
TENANT_SOURCE = "tenant:"
#: The events whose hooks' answers combine into one decision (``hookbus.decision``).
DECISION_EVENTS = frozenset({HookEvent.PRE_TOOL_USE, HookEvent.PERMISSION_REQUEST,
                             HookEvent.POST_TOOL_USE, HookEvent.POST_TOOL_USE_FAILURE})  # fmt: skip


def record_outcomes(
    parent: Span | LightSpan,
    event: HookEvent,
    attrs: dict[str, Any],
    outcomes: Sequence[Outcome],
    start_ns: int,
    *,
    local: Any,
    default_timeout: float,
) -> None:
    """Per-hook spans and metrics for one dispatch.

    A hook that ran in this process (``local``: True for every hook, else the ids of the specs
    of those that did) gets its span here; a remote hook that answered has its own span in its
    worker, so only its failures (timeout, unreachable) are recorded here.
    """
    inst = _instruments()
    for o in outcomes:
        if o.spec.mode != "enforce" and (would := would_do(event, o)) is not None:
            tag, detail = would
            parent.add_event(f"{o.spec.mode}: {o.spec.name} {detail}"[:200],
                             {"hook.name": o.spec.name, "hook.mode": o.spec.mode,
                              "hook.action": tag})  # fmt: skip
            inst["shadowed"].add(1, {"hook.name": o.spec.name, "hook.mode": o.spec.mode})
        _deferred.record(
            inst["hook"], o.elapsed, (("hook.name", o.spec.name), ("hook.event", event._value_))
        )
        action = action_tag(o.action)
        if o.failure is not None:
            enforced = o.spec.failure_policy == "fail" and event in (
                HookEvent.PRE_TOOL_USE,
                HookEvent.PERMISSION_REQUEST,
            )
            outcome = "fail_closed" if enforced else "fail_open"
            inst["skips"].add(1, {"hook.name": o.spec.name, "outcome": outcome})
            if o.failure == "timeout":
                inst["timeouts"].add(1, {"hook.name": o.spec.name})
        elif action == "Block":
            inst["blocks"].add(1, {"hook.name": o.spec.name})
        if o.failure is None and local is not True and id(o.spec) not in local:
            continue
        if not parent.is_recording():
            continue
        name = f"hook {o.spec.name}"
        # INTERNAL: in this process, or a remote hook's failure seen from here. The dispatch
        # span is the CLIENT a remote hook's SERVER span pairs with.
        attributes = {**attrs, "hook.mode": o.spec.mode, "hook.name": o.spec.name,
                      "hook.failure_policy": o.spec.failure_policy,
                      "hook.timeout_ms": int((o.spec.timeout or default_timeout) * 1000),
                      "hook.action": action if o.failure is None else o.failure,
                      "hook.timed_out": o.failure == "timeout"}  # fmt: skip
        child: Span | LightSpan
        if isinstance(parent, LightSpan):  # the dispatch span is current: the child's parent
            child = start_span(name, attributes, start_ns=start_ns)
        else:
            child = tracer.start_span(name, context=trace.set_span_in_context(parent),
                                      attributes=attributes, start_time=start_ns)  # fmt: skip
        annotate(child, o.action)
        if o.failure is not None:
            child.set_status(Status(StatusCode.ERROR, o.detail))
        child.end(start_ns + int(o.elapsed * 1e9))


def record_result(
    span: Span | LightSpan,
    event: HookEvent,
    ctx: HookContext,
    outcomes: Sequence[Outcome],
    truncate_chars: int,
) -> None:
    """The dispatch's combined decision (``hookbus.decision``: the aggregated action, as the
    runner aggregates ``outcomes``) and, with the opt-in (``CAPTURE_CONTENT``), the tool
    call's final input or output — every rewrite applied, as the agent gets it, never the
    input or output as it came. A blocked call's input is not recorded: the tool never ran
    with it."""
    if not _state["content"] and _all_continue(outcomes):  # the common case: nothing to combine
        span.set_attribute("hookbus.decision", "Continue")
        return
    import datetime as dt
    import json

    from bus.actions import Block
    from bus.aggregation import (
        aggregate_permission_request,
        aggregate_post_tool_use,
        aggregate_pre_tool_use,
    )

    now = dt.datetime.now(dt.UTC)
    if event is HookEvent.PRE_TOOL_USE:
        pre = aggregate_pre_tool_use(getattr(ctx, "tool_args", {}), outcomes, now)
        span.set_attribute("hookbus.decision", action_tag(pre.action))
        if _state["content"] and not isinstance(pre.action, Block):
            text = json.dumps(pre.final_args, ensure_ascii=False, default=str)
            span.set_attribute("gen_ai.tool.call.arguments", text[:CONTENT_CHARS])
    elif event is HookEvent.PERMISSION_REQUEST:
        decided = aggregate_permission_request(outcomes, now).action
        span.set_attribute("hookbus.decision", action_tag(decided))
    else:
        field = "output_content" if event is HookEvent.POST_TOOL_USE else "error_message"
        content = str(getattr(ctx, field, ""))
        post = aggregate_post_tool_use(event, content, outcomes, now, truncate_chars)
        rewritten = post.final_content != content
        span.set_attribute("hookbus.decision", "MutateOutput" if rewritten else "Continue")
        if _state["content"]:
            span.set_attribute("gen_ai.tool.call.result", post.final_content[:CONTENT_CHARS])


def action_tag(action: Any) -> str:
    """The wire name of an action (``"Block"``), or ``"none"``."""
    if action is None:
        return "none"
    return str(getattr(type(action), "__struct_config__").tag)  # noqa: B009


def annotate(span: Span | LightSpan, action: Any) -> None:
    """Span events for the actions that change what the agent does: what the agent is told (a
    reason, a decision, context), never the input or output a hook rewrote (one hook's rewrite
    is not what the agent gets: a later hook may have redacted it)."""
    if action is None:
        return
    tag = action_tag(action)
    if tag in _ACTION_EVENTS:
        fields = (f for f in action.__struct_fields__ if f not in _CONTENT_FIELDS)
        span.add_event(tag, {f: str(getattr(action, f))[:200] for f in fields})


def headers() -> tuple[str, str]:
    """The current span's W3C ``traceparent`` and ``tracestate`` ("" when not tracing).

    Written directly in the W3C format (``00-TRACE-SPAN-FLAGS``) rather than through
    ``propagate.inject``: the protocol's two fields are W3C trace context whatever
    ``OTEL_PROPAGATORS`` says, and the composite propagator costs ~4 µs a call on the loop.
    """
    if not enabled():
        return "", ""
    current = _current_span()
    if type(current) is LightSpan:  # written once per span, from its fields
        if current.w3c is None:
            current.w3c = _w3c(current.trace_id, current.span_id, current.flags, current.state)
        return current.w3c
    sc = current.get_span_context()
    if not sc.is_valid:
        return "", ""
    return _w3c(sc.trace_id, sc.span_id, int(sc.trace_flags), sc.trace_state)


def _w3c(trace_id: int, span_id: int, flags: int, state: TraceState | None) -> tuple[str, str]:
    return f"00-{trace_id:032x}-{span_id:016x}-{flags:02x}", state.to_header() if state else ""


#: The longest ``tracestate`` a remote parent's span context keeps (W3C Trace Context: a vendor
#: may drop one longer than 512 characters).
MAX_TRACESTATE = 512


#: A W3C ``traceparent``: version, trace id, span id, flags, lowercase hex (what a later version
#: adds after them kept apart: version 00 has none).
_TRACEPARENT = re.compile(r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?", re.S)


def _span_context(traceparent: str, tracestate: str) -> SpanContext | None:
    """The remote span context of a W3C ``traceparent`` (None if it is not a valid one)."""
    match = _TRACEPARENT.fullmatch(traceparent)
    if match is None:
        return None
    version, trace_hex, span_hex, flags, more = match.groups()
    if version == "ff" or (version == "00" and more is not None):
        return None
    trace_id, span_id = int(trace_hex, 16), int(span_hex, 16)
    if not trace_id or not span_id:
        return None
    # A longer tracestate is dropped, as W3C Trace Context lets a vendor do past 512 characters:
    # every message of the dispatch repeats it outside the context, escaped for JSON (up to
    # twice as long), and a sender's 16 kB one would push a hook's request over
    # MAX_MESSAGE_BYTES, failing every hook under its own policy.
    state = TraceState.from_header([tracestate]) if 0 < len(tracestate) <= MAX_TRACESTATE else None
    return SpanContext(trace_id, span_id, True, TraceFlags(int(flags, 16)), state)


def context_from(traceparent: str, tracestate: str = "") -> Context:
    """A context whose current span is the remote parent the two fields name (an empty one if
    they name none). Parsed directly, as ``headers()`` writes them (see there)."""
    sc = _span_context(traceparent, tracestate) if traceparent else None
    if sc is None:
        return Context()
    return trace.set_span_in_context(NonRecordingSpan(sc), Context())


def hook_span(
    name: str,
    attributes: dict[str, Any],
    traceparent: str = "",
    tracestate: str = "",
    *,
    link_only: bool = False,
) -> AbstractContextManager[Any]:
    """The span of one hook execution in a worker: child of the request's context, or (async
    hooks) a new trace linked to the span that published the event."""
    remote = _span_context(traceparent, tracestate) if traceparent else None
    if link_only:
        links = [Link(remote)] if remote is not None else []
        return span(name, attributes, kind=SpanKind.CONSUMER, context=Context(), links=links)
    if _export is not None:
        return start_span(
            name, attributes, kind=SpanKind.SERVER, parent=remote or INVALID_SPAN_CONTEXT
        )
    return span(
        name, attributes, kind=SpanKind.SERVER, context=context_from(traceparent, tracestate)
    )


#: Links a batch span keeps (OpenTelemetry's default span link limit).
MAX_LINKS = 128


def batch_span(
    name: str, attributes: dict[str, Any], parents: Sequence[tuple[str, str]]
) -> AbstractContextManager[Any]:
    """The span of one batch an async hook handles at once (``on_batch``, ``on_audit``): a new
    trace (kind CONSUMER) linked to the span that published each entry, up to ``MAX_LINKS``."""
    links: list[Link] = []
    seen: set[str] = set()
    for traceparent, tracestate in parents:
        if not traceparent or traceparent in seen or len(links) >= MAX_LINKS:
            continue
        seen.add(traceparent)
        linked = _span_context(traceparent, tracestate)
        if linked is not None:
            links.append(Link(linked))
    return span(name, attributes, kind=SpanKind.CONSUMER, context=Context(), links=links)


#: Also told of each count below, as (what, labels, n) (bus/telemetry/metrics.py, in the
#: processes that serve /metrics: an agent's process does not load prometheus-client).
listeners: list[Callable[[str, tuple[str, ...], int], None]] = []


def count_dead_letters(source: str, n: int = 1) -> None:
    for listener in listeners:
        listener("dead_letters", (source,), n)
    if enabled():
        _instruments()["dead_letters"].add(n, {"source": source})


def count_lost(group: str, stream: str, n: int) -> None:
    for listener in listeners:
        listener("lost", (group, stream), n)
    if enabled():
        _instruments()["lost"].add(n, {"hook.name": group, "stream": stream})


@functools.cache
def _replies_dropped() -> Any:
    return metrics.get_meter("hookbus").create_counter(
        "hookbus.replies.dropped",
        description="hook replies a coordinator dropped unread, by reason (oversized: over "
        "what their request allowed, HookRequest.reply_max)",
    )


def count_dropped_replies(reason: str, n: int = 1) -> None:
    if enabled():
        _replies_dropped().add(n, {"reason": reason})
