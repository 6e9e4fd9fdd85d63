"""Spans made in a process of their own (OpenTelemetry's providers are process-wide), for
tests/test_span_export.py: ``python -m tests.span_scenario NAME``; exporting as ``OTEL_*``
says. Prints one JSON line: what the process made and ``telemetry.span_stats()``."""

from __future__ import annotations

import asyncio
import json
import sys
import threading
import time
from typing import Any

from bus.telemetry import tracing as telemetry


def traces(n: int) -> dict[str, Any]:
    """``n`` traces of a root span with one child; a third span in a "worker" continues each
    trace from the W3C fields ``headers()`` wrote, as a hook worker does."""
    made: list[dict[str, Any]] = []
    for i in range(n):
        with telemetry.span("root", {"i": i}) as root:
            with telemetry.span("child", {"i": i}):
                traceparent, tracestate = telemetry.headers()
            with telemetry.hook_span("hook remote", {"i": i}, traceparent, tracestate):
                pass
        made.append({"trace_id": f"{root.get_span_context().trace_id:032x}",
                     "traceparent": traceparent})  # fmt: skip
    return {"traces": made}


async def loop_while_export_is_stuck(n: int) -> dict[str, Any]:
    """``n`` spans made on an event loop, one per turn of the loop, while the receiver does not
    answer: the loop finishes them all (the export does not run on it)."""
    for i in range(n):
        with telemetry.span("on the loop", {"i": i}):
            await asyncio.sleep(0)
    return {"made": n}


def in_flight(n: int) -> dict[str, Any]:
    """``n`` spans, then a wait (deadline 30 s) until the export thread has a request out to
    the receiver: shutdown then finds it waiting on one."""
    for i in range(n):
        with telemetry.span("waiting", {"i": i}):
            pass
    export = telemetry._export
    assert export is not None
    deadline = time.monotonic() + 30
    while not export._in_flight:
        assert time.monotonic() < deadline, "no request went out"
        time.sleep(0.01)
    return {"made": n}


def main() -> int:
    name, n = sys.argv[1], int(sys.argv[2])
    assert telemetry.configure("scenario"), "no exporter configured"
    if name == "traces":
        out = traces(n)
    elif name == "in_flight":
        out = in_flight(n)
    elif name == "stuck":
        out = asyncio.run(loop_while_export_is_stuck(n))
    else:
        raise SystemExit(f"unknown scenario {name}")
    print(json.dumps({**out, "before_shutdown": telemetry.span_stats()}), flush=True)
    telemetry.shutdown()
    alive = any(t.name == "hookbus-span-export" for t in threading.enumerate())
    print(json.dumps({"stats": telemetry.span_stats(), "export_alive": alive}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
