"""OpenTelemetry around the core: spans and metrics, configured only by ``OTEL_*`` variables.

Nothing here decides an outcome; it wraps what does. ``configure(role)`` runs once at start-up
of each process. With no exporter configured it installs nothing and returns False, and
HookBus adds no wrapper at all — tracing off costs nothing on the hot path.

Configuration (standard variables): ``OTEL_TRACES_EXPORTER`` / ``OTEL_METRICS_EXPORTER``
(``otlp``, ``console`` or ``none``; ``otlp`` is implied when ``OTEL_EXPORTER_OTLP_ENDPOINT``
is set), ``OTEL_EXPORTER_OTLP_ENDPOINT`` (OTLP over HTTP, e.g. ``http://jaeger:4318``),
``OTEL_SERVICE_NAME`` (default ``hookbus-<role>``), ``OTEL_BSP_*`` and
``OTEL_METRIC_EXPORT_INTERVAL``.

Spans: the agent's turn → step → tool call → ``dispatch <Event>`` (in the coordinator or
registry) → ``hook <name>`` (in the worker process that ran it, its parent carried in the
request's ``traceparent``). Async hook spans link to the span that published the event.
"""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from opentelemetry import metrics, propagate, trace
from opentelemetry.context import Context
from opentelemetry.trace import Link, Span, SpanKind, Status, StatusCode

from bus.aggregation import Outcome, would_do
from bus.events import HookContext, HookEvent, session_of, tool_of
from bus.runner import EventRunner

tracer = trace.get_tracer("hookbus")
meter = metrics.get_meter("hookbus")

_state = {"enabled": False}
_ACTION_EVENTS = frozenset({"Block", "MutateInput", "MutateOutput", "Override"})


def enabled() -> bool:
    return _state["enabled"]


def _exporter(kind: str, env: Mapping[str, str]) -> str:
    chosen = env.get(f"OTEL_{kind}_EXPORTER", "").strip().lower()
    if chosen:
        return chosen.split(",")[0]
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
    resource = Resource.create({"service.name": env.get("OTEL_SERVICE_NAME", f"hookbus-{role}")})
    if traces != "none":
        provider = TracerProvider(resource=resource)
        if traces == "console":
            provider.add_span_processor(BatchSpanProcessor(ConsoleSpanExporter()))
        else:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
        trace.set_tracer_provider(provider)
    if metric_kind != "none":
        if metric_kind == "console":
            exporter: Any = ConsoleMetricExporter()
        else:
            from opentelemetry.exporter.otlp.proto.http.metric_exporter import (
                OTLPMetricExporter,
            )

            exporter = OTLPMetricExporter()
        reader = PeriodicExportingMetricReader(exporter)
        metrics.set_meter_provider(MeterProvider(resource=resource, metric_readers=[reader]))
    _state["enabled"] = True
    _instruments.cache_clear()
    return True


def shutdown() -> None:
    """Flush and stop the exporters (call before the process exits)."""
    for provider in (trace.get_tracer_provider(), metrics.get_meter_provider()):
        stop = getattr(provider, "shutdown", None)
        if callable(stop):
            stop()


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


def count_dead_letters(source: str, n: int = 1) -> None:
    if enabled():
        _instruments()["dead_letters"].add(n, {"source": source})


def count_lost(group: str, stream: str, n: int) -> None:
    if enabled():
        _instruments()["lost"].add(n, {"hook.name": group, "stream": stream})
