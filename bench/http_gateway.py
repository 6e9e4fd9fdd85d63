"""The HTTP entry point beside the Redis path: one PreToolUse decision, end to end.

One agent makes one call at a time; each figure is the latency of one call, timed with
``time.perf_counter_ns`` in the agent's asyncio loop after a warm-up. Every process runs on one
private ``redis-server`` that the benchmark starts and stops, with one ``hookbus worker`` (a
no-op hook answering Continue) behind both paths. Series:

http
    ``POST /v1/decisions`` to ``hookbus gateway`` on one kept-alive connection, with the
    protocol's ``DecisionRequest`` JSON and a bearer token; the gateway dispatches to the hook
    service over Redis.
claude-code
    ``POST /claude-code`` to the same gateway: Claude Code's PreToolUse input, mapped, dispatched
    and answered in Claude Code's output format.
redis
    the same request the Redis way (a foreign agent): raw redis-py ``XADD`` to
    ``{p}:decisions`` and ``BLPOP`` of the reply; the ``hookbus coordinator`` service dispatches.
floor
    a hand-written Starlette endpoint on uvicorn with the gateway's settings
    (``bench/http_floor.py``): the same request parsed, the token checked, a reply of the same
    size sent — HTTP and ASGI alone, no dispatch.
bridge
    ``hookbus-claude-code`` started once per call, as Claude Code starts a command hook, posting
    to the gateway's ``/claude-code``: process start-up included.

The agent's HTTP client is a few lines on asyncio streams (HTTP/1.1, keep-alive), so that the
figures are the server's and not a client library's. Series are sampled in alternating batches
in the same run, so that a noisy moment of the machine spreads over all of them; the bridge,
~100x slower, gets fewer samples.

Usage: ``python -m bench.http_gateway [--quick]``; results go to
``bench/results/http_gateway.json``. It starts its processes and stops them all on exit.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import msgspec
from redis.asyncio import Redis

from bench.command_hooks import CALL_TIMEOUT, Plan, alternate
from bench.common import ROOT, Children, header, hookbus_env, percentiles, progress
from bench.sync_dispatch import (
    MODULE,
    NOOPS,
    ForeignAgent,
    _check,
    _ratio,
    context,
    hookbus_decision,
    quantiles,
    run_benchmark,
    wait_until,
)
from bus.protocol import PROTOCOL_VERSION, new_id, now_ms, raw
from bus.transport.keys import Keys
from workers.local.redis_server import free_port
from workers.services.gateway import digest

RESULTS = Path(__file__).resolve().parent / "results" / "http_gateway.json"
SERIES = ("http", "claude-code", "redis", "floor", "bridge")
PREFIX = "bench-http"
TOKEN = "bench-gateway-token"
FLOOR_TOKEN = "bench-floor-token"
BRIDGE = Path(sys.executable).parent / "hookbus-claude-code"

DESCRIPTIONS = {
    "http": "POST /v1/decisions to `hookbus gateway` (kept-alive connection), 1 hook service",
    "claude-code": "POST /claude-code to the same gateway: Claude Code's PreToolUse input",
    "redis": "XADD {p}:decisions + BLPOP, `hookbus coordinator` service, the same hook service",
    "floor": "a hand-written Starlette endpoint on uvicorn, same request and reply, no dispatch",
    "bridge": "one `hookbus-claude-code` process per call, to the gateway's /claude-code",
}


FULL = Plan(
    rounds=10,
    batch={"http": 200, "claude-code": 200, "redis": 200, "floor": 200, "bridge": 10},
    warmup={"http": 300, "claude-code": 200, "redis": 300, "floor": 300, "bridge": 3},
)
QUICK = Plan(
    rounds=1,
    batch={"http": 20, "claude-code": 20, "redis": 20, "floor": 20, "bridge": 2},
    warmup={"http": 10, "claude-code": 10, "redis": 10, "floor": 10, "bridge": 1},
)

Call = Callable[[], Awaitable[Any]]


# -- the agent's HTTP client -------------------------------------------------------------------


class HttpAgent:
    """One kept-alive HTTP/1.1 connection; each call POSTs one body and reads one reply."""

    def __init__(self, port: int, path: str, token: str, make: Callable[[], tuple[str, bytes]]):
        self.port = port
        self.head = (
            f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAuthorization: Bearer {token}"
            "\r\nContent-Type: application/json\r\nContent-Length: "
        ).encode()
        self.make = make
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def __call__(self) -> bytes:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection("127.0.0.1", self.port)
        assert self.reader is not None
        expected, body = self.make()
        self.writer.write(b"%s%d\r\n\r\n%s" % (self.head, len(body), body))
        head = await asyncio.wait_for(self.reader.readuntil(b"\r\n\r\n"), CALL_TIMEOUT)
        length = 0
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        reply = await self.reader.readexactly(length)
        if head[9:12] != b"200" or expected.encode() not in reply:
            raise RuntimeError(f"unexpected reply: {head!r} {reply!r}")
        return reply

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            await self.writer.wait_closed()


def decision_body() -> tuple[str, bytes]:
    """The protocol's DecisionRequest (no reply_to: HTTP answers on the connection)."""
    request_id = new_id()
    body = {
        "v": PROTOCOL_VERSION, "id": request_id, "ts": now_ms(), "event": "PreToolUse",
        "context": raw(context()), "timeout_ms": int(CALL_TIMEOUT * 1000),
    }  # fmt: skip
    return f'"request_id":"{request_id}"', msgspec.json.encode(body)


def claude_code_input() -> bytes:
    ctx = context()
    return json.dumps(
        {
            "session_id": ctx.session_id,
            "transcript_path": "/tmp/bench.jsonl",
            "cwd": str(ROOT),
            "hook_event_name": "PreToolUse",
            "tool_name": "Read",
            "tool_input": {"file_path": "src/app/main.py"},
            "tool_use_id": "toolu_bench",
        }
    ).encode()


def bridge_call(port: int) -> Call:
    payload = claude_code_input()
    env = {k: v for k, v in os.environ.items() if not k.startswith("HOOKBUS_")}
    env.update(HOOKBUS_GATEWAY_URL=f"http://127.0.0.1:{port}", HOOKBUS_GATEWAY_TOKEN=TOKEN)

    async def call() -> bytes:
        proc = await asyncio.create_subprocess_exec(
            str(BRIDGE), stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE, env=env,
        )  # fmt: skip
        out, err = await asyncio.wait_for(proc.communicate(payload), CALL_TIMEOUT)
        if proc.returncode != 0 or out != b"{}":
            raise RuntimeError(f"the bridge exited {proc.returncode}: {out!r} {err!r}")
        return out

    return call


# -- the run -------------------------------------------------------------------------------


async def http_up(port: int, children: Children, what: str) -> None:
    async def answers() -> bool:
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            return False
        writer.close()
        await writer.wait_closed()
        return True

    await wait_until(answers, children, what)


async def run(plan: Plan, url: str, children: Children, logdir: Path) -> dict[str, Any]:
    _check(BRIDGE.is_file(), f"{BRIDGE} is installed (pip install -e .)")
    env = hookbus_env(url, PREFIX)
    hook = NOOPS[0]
    tokens = logdir / "tokens"
    tokens.write_text(f"bench:{digest(TOKEN)}\n")
    gateway_port, floor_port = free_port(), free_port()
    children.start("worker", "workers.cli", ["worker", f"{MODULE}:{hook.__name__}"], env)
    redis = Redis.from_url(url)
    try:
        await redis.sadd(Keys(PREFIX).tenants, "bench")  # a tenant the gateway serves

        async def hook_live() -> bool:
            return bool(await redis.zcard(Keys(PREFIX).replicas(hook.name)))

        await wait_until(hook_live, children, "the hook service")
        children.start("coordinator", "workers.cli", ["coordinator"], env)
        children.start(
            "gateway", "workers.cli",
            ["gateway", "--tokens", str(tokens), "--port", str(gateway_port)], env,
        )  # fmt: skip
        children.start("floor", "bench.http_floor", [str(floor_port)], env)
        await http_up(gateway_port, children, "the gateway")
        await http_up(floor_port, children, "the Starlette floor")

        async def coordinator_up() -> bool:
            try:
                groups = await redis.xinfo_groups(Keys(PREFIX).decision_partitions[0])
            except Exception:
                return False
            return bool(groups)

        await wait_until(coordinator_up, children, "the coordinator service")
        http = HttpAgent(gateway_port, "/v1/decisions", TOKEN, decision_body)
        cc_body = claude_code_input()
        claude = HttpAgent(gateway_port, "/claude-code", TOKEN, lambda: ("{}", cc_body))
        floor = HttpAgent(floor_port, "/v1/decisions", FLOOR_TOKEN, decision_body)
        foreign = ForeignAgent(
            redis, PREFIX, hookbus_decision(raw(context())), Keys(PREFIX).decision_partitions[0]
        )
        calls: dict[str, Call] = {
            "http": http, "claude-code": claude, "redis": foreign, "floor": floor,
            "bridge": bridge_call(gateway_port),
        }  # fmt: skip
        progress("checking each path answers")
        for call in calls.values():
            await call()
        answer = json.loads(await http())
        _check(answer["result"]["action"] == {"type": "Continue"}, f"http: {answer}")
        _check(not answer["result"]["skipped"], f"the hook answered over HTTP: {answer}")
        progress(
            "timing " + ", ".join(f"{plan.rounds * plan.batch[k]} calls of {k}" for k in calls)
        )
        samples = await alternate(plan, calls)
        for agent in (http, claude, floor):
            await agent.close()
    finally:
        await redis.aclose()

    floor_p50, _ = percentiles(samples["floor"])
    redis_p50, _ = percentiles(samples["redis"])
    results = []
    for label in SERIES:
        p50, p99 = percentiles(samples[label])
        results.append(
            {
                "series": label,
                "samples": len(samples[label]),
                "p50_us": round(p50, 1),
                "p99_us": round(p99, 1),
                "ratio_to_redis_p50": _ratio(p50, redis_p50),
                "ratio_to_floor_p50": _ratio(p50, floor_p50),
                "quantiles_us": quantiles(samples[label]),
            }
        )
        r = results[-1]
        progress(
            f"  -> {label:<11} p50 {r['p50_us']:>9,.0f} µs  p99 {r['p99_us']:>9,.0f} µs  "
            f"({r['ratio_to_redis_p50']:.2f}x redis, {r['ratio_to_floor_p50']:.2f}x floor)"
        )
    return {
        **header("http_gateway", plan is QUICK),
        "rounds": plan.rounds,
        "batch": plan.batch,
        "series": DESCRIPTIONS,
        "hooks": 1,
        "results": results,
    }


def render(report: dict[str, Any]) -> str:
    lines = [
        f"HTTP entry point vs the Redis path, one PreToolUse decision, 1 hook service "
        f"(Python {report['python']}, {report['cpus']} CPUs{', QUICK' if report['quick'] else ''})",
        "",
        f"{'series':<11}  {'samples':>7}  {'p50 µs':>9}  {'p99 µs':>9}  {'p50/redis':>9}  "
        f"{'p50/floor':>9}",
    ]
    for r in report["results"]:
        lines.append(
            f"{r['series']:<11}  {r['samples']:>7}  {r['p50_us']:>9,.0f}  {r['p99_us']:>9,.0f}  "
            f"{r['ratio_to_redis_p50']:>8.2f}x  {r['ratio_to_floor_p50']:>8.2f}x"
        )
    lines += ["", *(f"{k}: {v}" for k, v in report["series"].items())]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.http_gateway", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="few iterations (smoke test)")
    parser.add_argument(
        "--rounds", type=int, metavar="N", help=f"alternating rounds ({FULL.rounds}; quick: 1)"
    )
    args = parser.parse_args(argv)
    plan = QUICK if args.quick else FULL
    if args.rounds:
        plan = Plan(rounds=args.rounds, batch=plan.batch, warmup=plan.warmup)
    return run_benchmark(
        RESULTS, render, lambda url, children: run(plan, url, children, children.logdir)
    )


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
