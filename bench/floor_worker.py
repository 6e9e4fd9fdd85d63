"""The raw redis-py floor of ``bench.sync_dispatch``: the least a hook service can do.

Four kinds of process, all started by a benchmark (never by hand)::

    python -m bench.floor_worker worker URL PREFIX NAME         # one floor hook
    python -m bench.floor_worker traced-worker URL PREFIX NAME  # one floor hook, traced
    python -m bench.floor_worker service URL PREFIX NAME...     # a floor coordinator service
    python -m bench.floor_worker faststream URL PREFIX NAME     # FastStream subscriber (reference)

A traced floor hook is traced as the OpenTelemetry documentation shows (:func:`stock_telemetry`,
OTLP endpoint from ``OTEL_EXPORTER_OTLP_ENDPOINT``): a span per request, a child of the
``traceparent`` the request carries, and a histogram record; the floor of ``bench.tracing_cost``.
A plain ``worker`` is never traced, whatever its environment.

A floor hook reads its own stream with ``XREADGROUP … BLOCK`` and answers each request with one
pipelined ``RPUSH`` (to the inbox the request names) + ``XACK``: no validation, no deadline, no
heartbeat, no task per request. A floor service reads ``{p}:decisions`` the same way, fans each
decision out to its hooks exactly like the floor agent of the benchmark (one pipelined ``XADD``
per hook, then ``BLMPOP`` until every reply is in) and answers with one ``RPUSH`` + ``XACK``.
Messages are JSON of the same size as HookBus's, parsed with msgspec into the two or three
fields the floor needs.

Each process pushes its name to ``{p}:ready`` once it is reading, and exits when its parent
does (it is only ever a child of the benchmark).
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from collections.abc import Callable
from typing import Any

import msgspec
from redis.asyncio import Redis
from redis.exceptions import ResponseError

GROUP = "workers"
SERVICE_GROUP = "coordinators"
BLOCK_MS = 200  # what HookWorker uses; it only bounds how fast a stop is noticed


class FloorRequest(msgspec.Struct):
    """What a floor hook reads of a request (the rest of the JSON is skipped)."""

    id: str
    reply_to: str
    traceparent: str = ""


class FloorReply(msgspec.Struct):
    """What anyone reads of a reply."""

    request_id: str


CONTINUE = msgspec.Raw(b'{"type":"Continue"}')
_encode = msgspec.json.Encoder().encode
_request = msgspec.json.Decoder(FloorRequest).decode
_reply = msgspec.json.Decoder(FloorReply).decode


def requests_key(prefix: str, hook: str) -> str:
    return f"{prefix}:hook:{hook}:requests"


def connect(url: str) -> Redis:
    # No socket timeout: raw redis-py at its cheapest (with one, each send costs a wait_for task).
    return Redis.from_url(url, socket_connect_timeout=2)


async def ensure_group(redis: Redis, stream: str, group: str) -> None:
    try:
        await redis.xgroup_create(stream, group, id="0", mkstream=True)
    except ResponseError as exc:
        if "BUSYGROUP" not in str(exc):
            raise


def orphaned(parent: int) -> bool:
    return os.getppid() != parent


def stock_telemetry(service: str) -> tuple[Any, Any, Callable[[], None]]:
    """OpenTelemetry set up as its documentation shows, nothing of HookBus's: the SDK's tracer
    and meter providers, ``BatchSpanProcessor`` + ``OTLPSpanExporter`` and a periodic reader +
    ``OTLPMetricExporter`` (OTLP/HTTP, endpoint from ``OTEL_EXPORTER_OTLP_ENDPOINT``), SDK
    defaults throughout. Returns (tracer, a histogram in ms, shutdown: flushes both)."""
    from opentelemetry import metrics, trace
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    resource = Resource.create({"service.name": service})
    tracing = TracerProvider(resource=resource)
    tracing.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(tracing)
    reader = PeriodicExportingMetricReader(OTLPMetricExporter())
    metering = MeterProvider(resource=resource, metric_readers=[reader])
    metrics.set_meter_provider(metering)
    histogram = metrics.get_meter(service).create_histogram("floor.duration", unit="ms")

    def shutdown() -> None:
        tracing.shutdown()
        metering.shutdown()

    return trace.get_tracer(service), histogram, shutdown


async def hook(url: str, prefix: str, name: str, traced: bool = False) -> None:
    """One floor hook: answer Continue to every request, one pipelined round trip each.

    ``traced`` (the floor of ``bench.tracing_cost``): each answer in a span of the stock SDK
    (:func:`stock_telemetry`) whose parent is the request's ``traceparent``, its duration in a
    histogram; the spans are flushed on SIGTERM."""
    parent = os.getppid()
    redis = connect(url)
    stream = requests_key(prefix, name)
    replica = f"floor-{os.getpid()}"
    stop = asyncio.Event()
    around, shutdown = _stock_span(name) if traced else (None, None)
    if traced:
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)

    async def answer(entry_id: bytes, request: FloorRequest) -> None:
        reply = hook_reply(request.id, name, replica)
        async with redis.pipeline(transaction=False) as pipe:
            pipe.rpush(request.reply_to, reply)
            pipe.xack(stream, GROUP, entry_id)
            await pipe.execute()

    await ensure_group(redis, stream, GROUP)
    await redis.rpush(f"{prefix}:ready", name)
    try:
        while not (stop.is_set() or orphaned(parent)):
            response: Any = await redis.xreadgroup(
                GROUP, name, {stream: ">"}, count=32, block=BLOCK_MS
            )
            for _, entries in response or ():
                for entry_id, fields in entries:
                    request = _request(fields[b"data"])
                    if around is None:
                        await answer(entry_id, request)
                    else:
                        await around(answer(entry_id, request), request)
    finally:
        if shutdown is not None:
            shutdown()


def _stock_span(name: str) -> tuple[Any, Callable[[], None]]:
    """For a traced floor hook: (run an answer in its span and record its duration, shutdown)."""
    from opentelemetry import propagate
    from opentelemetry.trace import SpanKind

    tracer, histogram, shutdown = stock_telemetry("floor-worker")
    attributes = {"hook.name": name}

    async def around(step: Any, request: FloorRequest) -> None:
        t0 = time.perf_counter()
        context = propagate.extract({"traceparent": request.traceparent})
        with tracer.start_as_current_span(
            f"hook {name}", context=context, kind=SpanKind.CONSUMER, attributes=attributes
        ):
            await step
        histogram.record((time.perf_counter() - t0) * 1000, attributes)

    return around, shutdown


async def fan_out(
    redis: Redis, inbox: str, streams: list[str], payloads: list[bytes], ids: list[str]
) -> int:
    """One pipelined XADD per hook, then BLMPOP until each reply is in; the number of replies."""
    async with redis.pipeline(transaction=False) as pipe:
        for stream, payload in zip(streams, payloads, strict=True):
            pipe.xadd(stream, {"data": payload})
        await pipe.execute()
    waiting = set(ids)
    while waiting:
        popped: Any = await redis.blmpop(5, 1, inbox, direction="LEFT", count=len(ids))
        if popped is None:
            raise TimeoutError(f"{len(waiting)} of {len(ids)} floor replies missing after 5 s")
        for data in popped[1]:
            waiting.discard(_reply(data).request_id)
    return len(ids)


def hook_request(
    name: str, session_id: str, context: msgspec.Raw, inbox: str, traceparent: str = ""
) -> tuple[str, bytes]:
    """A request of HookBus's size: the same envelope fields, the same context."""
    request_id = os.urandom(16).hex()
    payload = _encode(
        {
            "v": 1,
            "id": request_id,
            "ts": 0,
            "traceparent": traceparent,
            "tracestate": "",
            "hook": name,
            "event": "PreToolUse",
            "session_id": session_id,
            "context": context,
            "deadline": 0,
            "reply_to": inbox,
        }
    )
    return request_id, payload


def hook_reply(request_id: str, name: str, replica: str) -> bytes:
    """A reply of HookBus's size (the fields of a HookReply, no checks behind them)."""
    return _encode(
        {
            "v": 1,
            "id": os.urandom(16).hex(),
            "ts": 0,
            "traceparent": "",
            "tracestate": "",
            "request_id": request_id,
            "hook": name,
            "replica": replica,
            "status": "ok",
            "action": CONTINUE,
            "error": "",
            "elapsed_ms": 0.0,
        }
    )


class FloorDecision(msgspec.Struct):
    """What the floor service reads of a decision request."""

    id: str
    reply_to: str
    context: msgspec.Raw
    session_id: str = ""


async def service(url: str, prefix: str, names: list[str]) -> None:
    """A floor coordinator service: read a decision, fan it out, answer; one at a time."""
    parent = os.getppid()
    redis = connect(url)
    decisions = f"{prefix}:decisions"
    inbox = f"{prefix}:inbox:floor-service-{os.getpid()}"
    streams = [requests_key(prefix, n) for n in names]
    decode = msgspec.json.Decoder(FloorDecision).decode
    await ensure_group(redis, decisions, SERVICE_GROUP)
    await redis.rpush(f"{prefix}:ready", "service")
    while not orphaned(parent):
        response: Any = await redis.xreadgroup(
            SERVICE_GROUP, "floor", {decisions: ">"}, count=64, block=BLOCK_MS
        )
        for _, entries in response or ():
            for entry_id, fields in entries:
                decision = decode(fields[b"data"])
                ids: list[str] = []
                payloads: list[bytes] = []
                for name in names:
                    request_id, payload = hook_request(
                        name, decision.session_id, decision.context, inbox
                    )
                    ids.append(request_id)
                    payloads.append(payload)
                answered = await fan_out(redis, inbox, streams, payloads, ids)
                reply = _encode(
                    {
                        "request_id": decision.id,
                        "status": "ok",
                        "result": {"action": CONTINUE, "hooks": answered},
                    }
                )
                async with redis.pipeline(transaction=False) as pipe:
                    pipe.rpush(decision.reply_to, reply)
                    pipe.xack(decisions, SERVICE_GROUP, entry_id)
                    await pipe.execute()


async def faststream_subscriber(url: str, prefix: str, name: str) -> None:
    """A FastStream 0.7 subscriber on a stream that answers every request (reference only)."""
    from faststream.redis import RedisBroker, StreamSub

    parent = os.getppid()
    broker = RedisBroker(url)

    @broker.subscriber(stream=StreamSub(requests_key(prefix, name), group=GROUP, consumer=name))
    async def handle(body: dict[str, Any]) -> dict[str, Any]:
        return {"request_id": body.get("id", ""), "hook": name, "action": {"type": "Continue"}}

    await broker.start()
    try:
        redis = connect(url)
        await redis.rpush(f"{prefix}:ready", name)
        while not orphaned(parent):
            await asyncio.sleep(0.2)
    finally:
        await broker.stop()


def main(argv: list[str]) -> int:
    if len(argv) < 4 or argv[0] not in ("worker", "traced-worker", "service", "faststream"):
        print(__doc__, file=sys.stderr)
        return 2
    kind, url, prefix, *names = argv
    if kind in ("worker", "traced-worker"):
        asyncio.run(hook(url, prefix, names[0], traced=kind == "traced-worker"))
    elif kind == "service":
        asyncio.run(service(url, prefix, names))
    else:
        asyncio.run(faststream_subscriber(url, prefix, names[0]))
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except KeyboardInterrupt:
        sys.exit(130)
