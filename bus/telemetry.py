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

``shutdown`` flushes what is left within ``FLUSH_SECS``; with the collector down it gives up
then instead of retrying for the exporters' full timeout.

Spans: the agent's turn → step → tool call → ``dispatch <Event>`` (in the coordinator or
registry) → ``hook <name>`` (in the worker process that ran it, its parent carried in the
request's ``traceparent``). Async hook spans link to the span that published the event.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import os
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from opentelemetry import metrics, propagate, trace
from opentelemetry.context import Context
from opentelemetry.trace import Link, Span, SpanKind, Status, StatusCode

from bus.aggregation import Outcome, would_do
from bus.errors import ConfigError
from bus.events import HookContext, HookEvent, session_of, tool_of
from bus.runner import EventRunner

tracer = trace.get_tracer("hookbus")
meter = metrics.get_meter("hookbus")

_state = {"enabled": False}
#: What the exporters may still take at shutdown to send what is left (seconds).
FLUSH_SECS = 2.0
_exporters: list[Any] = []
EXPORTERS = ("otlp", "console", "none")
PROTOCOLS = ("http/protobuf", "grpc")
_ACTION_EVENTS = frozenset({"Block", "MutateInput", "MutateOutput", "Override"})


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

    env = os.environ if env is None else env
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
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (  # type: ignore[import-not-found]
                OTLPSpanExporter as GrpcSpanExporter,
            )

            span_exporter = GrpcSpanExporter()
        else:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            span_exporter = OTLPSpanExporter()
        _exporters.append(span_exporter)
        provider.add_span_processor(BatchSpanProcessor(span_exporter))
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
    past ``FLUSH_SECS`` the exporters are shut down, which ends their retries, and past as much
    again the process goes on without them: what was not sent is dropped (the exporters log
    it)."""
    providers = [trace.get_tracer_provider(), metrics.get_meter_provider()]
    flushed, stopped = threading.Event(), threading.Event()

    def run() -> None:
        for provider in providers:
            with contextlib.suppress(Exception):  # the metrics SDK raises on a timeout
                getattr(provider, "force_flush", lambda: None)()
        flushed.set()
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
    _exporters.clear()


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
    is_local = not hasattr(runner, "directory")

    async def traced_gather(
        event: HookEvent, ctx: HookContext, *, sequential: bool = False
    ) -> list[Outcome]:
        tool, _ = tool_of(ctx)
        attrs = {"hook.event": event.value, "session.id": session_of(ctx)}
        if tool:
            attrs["tool.name"] = tool
        start = time.time_ns()
        with tracer.start_as_current_span(f"dispatch {event.value}", attributes=attrs) as span:
            outcomes = await gather(event, ctx, sequential=sequential)
            record_outcomes(span, event, attrs, outcomes, start, local=is_local)
        _instruments()["dispatch"].record(
            (time.time_ns() - start) / 1e9, {"hook.event": event.value}
        )
        return outcomes

    runner.gather = traced_gather  # type: ignore[method-assign]
    return runner


def record_outcomes(
    parent: Span,
    event: HookEvent,
    attrs: dict[str, Any],
    outcomes: Sequence[Outcome],
    start_ns: int,
    *,
    local: bool,
) -> None:
    """Per-hook spans and metrics for one dispatch.

    A hook that ran in this process gets its span here; a remote hook that answered has its
    own span in its worker, so only its failures (timeout, unreachable) are recorded here.
    """
    inst = _instruments()
    for o in outcomes:
        if o.spec.mode != "enforce" and (would := would_do(event, o)) is not None:
            tag, detail = would
            parent.add_event(f"{o.spec.mode}: {o.spec.name} {detail}"[:200],
                             {"hook.name": o.spec.name, "hook.mode": o.spec.mode,
                              "hook.action": tag})  # fmt: skip
            inst["shadowed"].add(1, {"hook.name": o.spec.name, "hook.mode": o.spec.mode})
        hook_attrs = {
            **attrs,
            "hook.mode": o.spec.mode,
            "hook.name": o.spec.name,
            "hook.failure_policy": o.spec.failure_policy,
        }
        inst["hook"].record(o.elapsed, {"hook.name": o.spec.name, "hook.event": event.value})
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
        if o.failure is None and not local:
            continue
        span = tracer.start_span(
            f"hook {o.spec.name}",
            context=trace.set_span_in_context(parent),
            kind=SpanKind.INTERNAL if local else SpanKind.CLIENT,
            attributes={**hook_attrs, "hook.action": action if o.failure is None else o.failure,
                        "hook.timed_out": o.failure == "timeout"},
            start_time=start_ns,
        )  # fmt: skip
        annotate(span, o.action)
        if o.failure is not None:
            span.set_status(Status(StatusCode.ERROR, o.detail))
        span.end(end_time=start_ns + int(o.elapsed * 1e9))


def action_tag(action: Any) -> str:
    """The wire name of an action (``"Block"``), or ``"none"``."""
    if action is None:
        return "none"
    return str(getattr(type(action), "__struct_config__").tag)  # noqa: B009


def annotate(span: Span, action: Any) -> None:
    """Span events for the actions that change what the agent does."""
    if action is None:
        return
    tag = action_tag(action)
    if tag in _ACTION_EVENTS:
        span.add_event(tag, {f: str(getattr(action, f))[:200] for f in action.__struct_fields__})


def headers() -> tuple[str, str]:
    """The current span's W3C ``traceparent`` and ``tracestate`` ("" when not tracing)."""
    if not enabled():
        return "", ""
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return carrier.get("traceparent", ""), carrier.get("tracestate", "")


def context_from(traceparent: str, tracestate: str = "") -> Context:
    carrier = {"traceparent": traceparent, "tracestate": tracestate} if traceparent else {}
    return propagate.extract(carrier)


@contextmanager
def hook_span(
    name: str,
    attributes: dict[str, Any],
    traceparent: str = "",
    tracestate: str = "",
    *,
    link_only: bool = False,
) -> Iterator[Span]:
    """The span of one hook execution in a worker: child of the request's context, or (async
    hooks) a new trace linked to the span that published the event."""
    parent = context_from(traceparent, tracestate)
    if link_only:
        linked = trace.get_current_span(parent).get_span_context()
        links = [Link(linked)] if linked.is_valid else []
        with tracer.start_as_current_span(
            name, context=Context(), kind=SpanKind.CONSUMER, attributes=attributes, links=links
        ) as span:
            yield span
        return
    with tracer.start_as_current_span(
        name, context=parent, kind=SpanKind.SERVER, attributes=attributes
    ) as span:
        yield span


#: Links a batch span keeps (OpenTelemetry's default span link limit).
MAX_LINKS = 128


@contextmanager
def batch_span(
    name: str, attributes: dict[str, Any], parents: Sequence[tuple[str, str]]
) -> Iterator[Span]:
    """The span of one batch an async hook handles at once (``on_batch``, ``on_audit``): a new
    trace (kind CONSUMER) linked to the span that published each entry, up to ``MAX_LINKS``."""
    links: list[Link] = []
    seen: set[str] = set()
    for traceparent, tracestate in parents:
        if not traceparent or traceparent in seen or len(links) >= MAX_LINKS:
            continue
        seen.add(traceparent)
        linked = trace.get_current_span(context_from(traceparent, tracestate)).get_span_context()
        if linked.is_valid:
            links.append(Link(linked))
    with tracer.start_as_current_span(
        name, context=Context(), kind=SpanKind.CONSUMER, attributes=attributes, links=links
    ) as span:
        yield span


def count_dead_letters(source: str, n: int = 1) -> None:
    if enabled():
        _instruments()["dead_letters"].add(n, {"source": source})


def count_lost(group: str, stream: str, n: int) -> None:
    if enabled():
        _instruments()["lost"].add(n, {"hook.name": group, "stream": stream})
