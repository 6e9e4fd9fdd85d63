"""What ``hookbus mcp`` adds to an MCP tool call: the same ``tools/call`` direct and proxied.

The official SDK's client calls the reference filesystem server's ``read_text_file`` on a small
file (tests/mcp_server, ``make node-deps``) over stdio, in three sessions open side by side:
**direct** (the client launches the server), **proxied, 0 hooks** (the client launches
``hookbus mcp -- server``, Redis up, no hook registered: the proxy's own cost), and **proxied,
Redactor worker** (the demo's Redactor as a worker process: one PostToolUse round trip through
Redis). Series alternate in ``rounds`` batches; the figure is each series' median and p99 and
its overhead over **direct** (the difference of the medians). Writes bench/results/mcp_proxy.json.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from bench.common import (
    ROOT,
    Children,
    Plan,
    header,
    hookbus_env,
    percentiles,
    progress,
    terminated,
    write_results,
)

RESULTS = ROOT / "bench" / "results" / "mcp_proxy.json"
FULL = Plan(warmup=50, rounds=10, batch=100)
QUICK = Plan(warmup=3, rounds=2, batch=5)
SERIES = ("direct", "proxied, 0 hooks", "proxied, Redactor worker")
SERVER = ROOT / "tests" / "mcp_server" / "node_modules" / ".bin" / "mcp-server-filesystem"


@contextlib.asynccontextmanager
async def _session(command: list[str], env: dict[str, str] | None) -> AsyncIterator[Any]:
    from mcp import ClientSession, StdioServerParameters, stdio_client

    params = StdioServerParameters(command=command[0], args=command[1:], env=env, cwd=str(ROOT))
    with open(Path(tempfile.gettempdir()) / "hookbus-bench-mcp.log", "a") as errlog:
        async with (
            stdio_client(params, errlog=errlog) as (read, write),
            ClientSession(read, write) as client,
        ):
            await client.initialize()
            await client.list_tools()
            yield client


async def _measure(plan: Plan, url: str, prefix: str, folder: Path, children: Children) -> Any:
    from agent_adapter.client import HookClient
    from bus.settings import BusSettings

    env = hookbus_env(url, prefix)
    server = [str(SERVER), str(folder)]
    proxy = [sys.executable, "-m", "workers.cli", "mcp", "--name", "filesystem", "--", *server]
    redactor_prefix = f"{prefix}r"
    children.start(
        "redactor",
        "workers.cli",
        ["worker", "workers.builtins.demo_hooks:Redactor"],
        hookbus_env(url, redactor_prefix),
    )
    async with HookClient(BusSettings(redis_url=url, prefix=redactor_prefix)) as watch:
        deadline = time.monotonic() + 60
        while "Redactor" not in watch.directory.by_name:
            children.check()
            if time.monotonic() > deadline:
                raise RuntimeError("the Redactor worker did not register within 60 s")
            await asyncio.sleep(0.05)
    args = {"path": str(folder / "small.txt")}
    samples: dict[str, list[int]] = {s: [] for s in SERIES}
    async with (
        _session(server, None) as direct,
        _session(proxy, env) as bare,
        _session(proxy, hookbus_env(url, redactor_prefix)) as hooked,
    ):
        sessions = dict(zip(SERIES, (direct, bare, hooked), strict=True))
        for name, client in sessions.items():
            for _ in range(plan.warmup):
                result = await client.call_tool("read_text_file", args)
                if result.is_error:
                    raise RuntimeError(f"{name}: {result.content}")
        for round_ in range(plan.rounds):
            progress(f"round {round_ + 1}/{plan.rounds}")
            for name, client in sessions.items():
                for _ in range(plan.batch):
                    t0 = time.perf_counter_ns()
                    await client.call_tool("read_text_file", args)
                    samples[name].append(time.perf_counter_ns() - t0)
    return samples


def main(argv: list[str]) -> int:
    quick = "--quick" in argv
    plan = QUICK if quick else FULL
    if not SERVER.exists():
        print(f"bench.mcp_proxy: {SERVER} is missing: run `make node-deps`", file=sys.stderr)
        return 1
    from workers.local.redis_server import RedisServer

    signal.signal(signal.SIGTERM, terminated)
    with tempfile.TemporaryDirectory() as tmp, RedisServer() as redis:
        folder = Path(tmp) / "files"
        folder.mkdir()
        (folder / "small.txt").write_text("hello\n" * 20)
        logs = Path(tmp) / "logs"
        logs.mkdir()
        children = Children(logs)
        try:
            samples = asyncio.run(
                _measure(plan, redis.url, f"bm{uuid.uuid4().hex[:8]}", folder, children)
            )
        finally:
            children.stop()
    rows = []
    base = percentiles(samples["direct"])[0]
    for series in SERIES:
        p50, p99 = percentiles(samples[series])
        rows.append(
            {
                "series": series,
                "samples": len(samples[series]),
                "p50_us": round(p50, 1),
                "p99_us": round(p99, 1),
                "overhead_p50_us": round(p50 - base, 1),
                "ratio_p50": round(p50 / base, 2),
            }
        )
        progress(f"{series}: p50 {p50:.0f} µs, p99 {p99:.0f} µs, +{p50 - base:.0f} µs")
    write_results(RESULTS, {**header("mcp_proxy", quick), "results": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
