"""The cost of tracing on the synchronous path: one PreToolUse dispatch, tracing off vs on.

Both sides run in their own child process (OpenTelemetry providers are process-wide): an
agent with HookClient and one hook worker, against a private redis-server. "On" exports every
span over OTLP/HTTP to a local receiver that discards them, as a collector would receive them.
Prints p50/p99 and the ratio on/off; writes bench/results/tracing_cost.json.
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from bench.common import ROOT, write_results

RESULTS = ROOT / "bench" / "results" / "tracing_cost.json"


class _Discard(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


async def _measure(samples: int) -> dict[str, float]:
    from opentelemetry import trace

    from agent_adapter.client import HookClient
    from bus import HookSettings, PreToolUseContext, telemetry
    from bus.settings import BusSettings

    telemetry.configure("bench-agent")
    client = await HookClient(BusSettings.from_env(), HookSettings(hook_timeout_secs=5)).start()
    tracer = trace.get_tracer("bench")
    try:
        while not client.directory.live("bench-noop-1"):
            await asyncio.sleep(0.02)
        ctx = PreToolUseContext(session_id="s", tool_name="file_read", tool_args={"path": "a"})
        times = []
        for i in range(samples + 200):
            t0 = time.perf_counter()
            with tracer.start_as_current_span("tool file_read"):  # as the executor does
                await client.run_pre_tool_use(ctx)
            if i >= 200:
                times.append((time.perf_counter() - t0) * 1e6)
    finally:
        await client.close()
        telemetry.shutdown()
    times.sort()
    return {"p50_us": statistics.median(times), "p99_us": times[int(len(times) * 0.99) - 1]}


def _child(samples: int) -> None:
    print(json.dumps(asyncio.run(_measure(samples))))


def _run_side(on: bool, redis_url: str, endpoint: str, samples: int) -> dict[str, float]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env.update(HOOKBUS_REDIS_URL=redis_url, HOOKBUS_PREFIX=f"trace-{'on' if on else 'off'}")
    if on:
        env.update(OTEL_EXPORTER_OTLP_ENDPOINT=endpoint, OTEL_BSP_SCHEDULE_DELAY="200")
    worker = subprocess.Popen(
        [sys.executable, "-m", "workers.cli", "worker", "bench.sync_dispatch:Noop1"],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        out = subprocess.run(
            [sys.executable, "-m", "bench.tracing_cost", "--child", str(samples)],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        if out.returncode:
            raise RuntimeError(out.stderr[-2000:])
        return dict(json.loads(out.stdout.strip().splitlines()[-1]))
    finally:
        worker.kill()
        worker.wait()


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--child"]:
        _child(int(argv[1]))
        return 0
    from workers.redis_server import RedisServer

    samples = 300 if "--quick" in argv else 3000
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Discard)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    endpoint = f"http://127.0.0.1:{server.server_address[1]}"
    print(f"tracing cost: {samples} PreToolUse dispatches to one hook worker, off then on ...")
    try:
        with RedisServer() as redis:
            off = _run_side(False, redis.url, endpoint, samples)
            on = _run_side(True, redis.url, endpoint, samples)
    finally:
        server.shutdown()
    ratio = on["p50_us"] / off["p50_us"]
    print(f"{'tracing':<8} {'p50 µs':>10} {'p99 µs':>10}")
    print(f"{'off':<8} {off['p50_us']:>10.0f} {off['p99_us']:>10.0f}")
    print(f"{'on':<8} {on['p50_us']:>10.0f} {on['p99_us']:>10.0f}")
    print(f"tracing on costs {ratio:.2f}x at p50 (+{on['p50_us'] - off['p50_us']:.0f} µs)")
    write_results(RESULTS, {"samples": samples, "off": off, "on": on, "ratio_p50": ratio})
    return 0


if __name__ == "__main__":
    sys.exit(main())
