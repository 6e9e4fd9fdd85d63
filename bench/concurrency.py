"""Synchronous dispatch latency with 1 to 32 concurrent agents, over Redis.

C agent tasks in this process's asyncio loop (C = 1, 2, 4, 8, 16, 32), each with its own session,
each making sequential PreToolUse calls to one no-op hook served by one ``hookbus worker``
process, on a private ``redis-server``. Each figure is the latency of one call, timed with
``time.perf_counter_ns``. Three series per level:

shared
    one ``HookClient`` for all C agents (a runtime that hosts many agents in one process).
each
    one ``HookClient`` per agent (C coordinators, each with its own inbox and reader).
floor
    the raw redis-py floor of ``bench.sync_dispatch``: C floor agents (one connection pool, an
    inbox each) doing ``XADD`` then ``BLMPOP`` against one ``bench.floor_worker`` hook process.

Two loops, each over every level:

closed
    each agent calls again as soon as it has its answer: the most load C agents can make. In
    a closed loop, throughput is C / mean latency (Little's law); it is reported per level.
paced
    each agent pauses between two calls (uniform over 10-30 ms: under 50 calls/s per agent,
    ~1,500/s for 32; a real agent thinks for seconds between tool calls), so that 32 agents
    load the machine without saturating it.

After the warm-up the process freezes its heap (``gc.freeze()``, as HookBus's services do at
start-up and as a long-running agent host should): a full collection then walks only what came
after, instead of stalling every agent for tens of milliseconds (docs/performance.md, "Garbage
collection"). Every agent warms up, is timed for its share of the samples, then keeps calling
(untimed) until every agent of the level has its samples, so that each timed call runs with
exactly C agents calling. The series take turns in rounds, so that a noisy moment spreads over
all of them.

The targets, in the closed loop with 32 agents, for both HookBus series (shared and each): p99
at most 1.2x the floor's p99, and throughput (dispatches/s) at least 0.95x the floor's. On a
machine with few cores a closed loop saturates it: once the agent process, the hook process and
redis-server use every core, latency grows with C whatever the protocol does, for the floor as
for HookBus; measured against the floor at the same C, the figures say what HookBus's protocol
costs under that load. The growth from 1 to 32 agents (``growth``) is reported beside them, and
the paced loop (no target) says how the latency holds when the machine keeps up.

Usage: ``python -m bench.concurrency [--quick]``; results go to
``bench/results/concurrency.json``. It starts worker processes and kills them all on exit.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import random
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import redis as redis_py
from redis.asyncio import Redis

from agent_adapter.client import HookClient
from bench.common import Children, header, hookbus_env
from bench.floor_worker import fan_out, hook_request, requests_key
from bench.sync_dispatch import (
    CALL_TIMEOUT,
    MODULE,
    NOOPS,
    _check,
    _hiredis,
    _ratio,
    percentiles,
    progress,
    quantiles,
    run_benchmark,
    time_calls,
    wait_ready,
    wait_until,
)
from bus.actions import Continue
from bus.events import PreToolUseContext
from bus.protocol import raw
from bus.settings import BusSettings, HookSettings
from workers.cli.common import freeze_start_up_heap

LEVELS = (1, 2, 4, 8, 16, 32)
SERIES = ("shared", "each", "floor")
TARGET_SERIES = ("shared", "each")
TARGET_LOOP = "closed"
TARGET_MAX_P99 = 1.2  # p99 at 32 agents at most this times the floor's p99 at 32
TARGET_MIN_PER_SEC = 0.95  # dispatches/s at 32 agents at least this times the floor's at 32
HB_PREFIX = "cbench-hb"
FLOOR_PREFIX = "cbench-floor"
THINK_MS = 20.0  # mean pause of a paced agent between two calls
RESULTS = Path(__file__).resolve().parent / "results" / "concurrency.json"

DESCRIPTIONS = {
    "shared": "one HookClient shared by all C agent tasks",
    "each": "one HookClient per agent task",
    "floor": "raw redis-py floor agents (XADD, BLMPOP on an inbox each) to a floor hook process",
}

Call = Callable[[], Awaitable[Any]]


@dataclass(frozen=True)
class Plan:
    """One loop, per level and series: ``rounds`` turns of ``per_round`` timed calls in all
    (split over the agents, at least ``min_per_agent`` each), after ``warmup`` calls per agent;
    ``think_ms`` between calls (0: a closed loop)."""

    think_ms: float
    rounds: int
    per_round: int
    min_per_agent: int
    warmup: int

    def per_agent(self, agents: int) -> int:
        return max(self.min_per_agent, math.ceil(self.per_round / agents))


FULL = {
    "closed": Plan(think_ms=0, rounds=8, per_round=500, min_per_agent=10, warmup=20),
    "paced": Plan(think_ms=THINK_MS, rounds=2, per_round=300, min_per_agent=10, warmup=5),
}
QUICK = {
    "closed": Plan(think_ms=0, rounds=1, per_round=40, min_per_agent=3, warmup=3),
    "paced": Plan(think_ms=2, rounds=1, per_round=20, min_per_agent=2, warmup=1),
}


def agent_context(i: int) -> PreToolUseContext:
    return PreToolUseContext(
        session_id=f"bench-agent-{i:02d}",
        tool_name="file_read",
        tool_args={"path": "src/app/main.py", "limit": 200},
        step=3,
    )


# -- the agents ----------------------------------------------------------------------------


def hookbus_call(client: HookClient, i: int) -> Call:
    ctx = agent_context(i)

    async def call() -> Any:
        return await client.run_pre_tool_use(ctx)

    return call


class FloorAgent:
    """``bench.sync_dispatch``'s floor agent, with an inbox of its own."""

    def __init__(self, redis: Redis, i: int, name: str) -> None:
        self.redis = redis
        self.name = name
        self.streams = [requests_key(FLOOR_PREFIX, name)]
        self.inbox = f"{FLOOR_PREFIX}:inbox:floor-agent-{os.getpid()}-{i}"
        ctx = agent_context(i)
        self.session = ctx.session_id
        self.context = raw(ctx)

    async def __call__(self) -> int:
        request_id, payload = hook_request(self.name, self.session, self.context, self.inbox)
        return await fan_out(self.redis, self.inbox, self.streams, [payload], [request_id])


async def agents_calling(
    calls: list[Call], warmup: int, timed: int, think_ms: float, seed: int
) -> list[int]:
    """Every agent calls ``warmup`` times, then ``timed`` times timed, then on until all are
    done: every timed call has ``len(calls)`` agents calling. Without ``think_ms`` the next call
    starts at once (a closed loop); with it, each agent first waits a random time, uniform over
    0.5-1.5x ``think_ms``. The samples of all agents, in ns."""
    done = 0
    clock = time.perf_counter_ns

    async def closed(i: int, call: Call) -> list[int]:
        nonlocal done
        await time_calls(call, warmup)
        samples = await time_calls(call, timed)
        done += 1
        while done < len(calls):
            await call()
        return samples

    async def paced(i: int, call: Call) -> list[int]:
        nonlocal done
        pause = random.Random(seed * 1000 + i).uniform
        low, high = think_ms / 2000, think_ms * 1.5 / 1000
        samples: list[int] = []
        for n in range(warmup + timed):
            await asyncio.sleep(pause(low, high))
            t0 = clock()
            await call()
            if n >= warmup:
                samples.append(clock() - t0)
        done += 1
        while done < len(calls):
            await asyncio.sleep(pause(low, high))
            await call()
        return samples

    agent = paced if think_ms else closed
    budget = (CALL_TIMEOUT + 3 * think_ms / 1000) * (warmup + timed + 10)
    per_agent = await asyncio.wait_for(
        asyncio.gather(*(agent(i, call) for i, call in enumerate(calls))), budget
    )
    return [s for samples in per_agent for s in samples]


# -- the run -------------------------------------------------------------------------------


class Agents:
    """The clients of each series, grown as the levels rise; closed at the end."""

    def __init__(self, url: str, redis: Redis, children: Children) -> None:
        self.url = url
        self.redis = redis
        self.children = children
        self.name = NOOPS[0].name
        self.shared: HookClient | None = None
        self.clients: list[HookClient] = []

    async def client(self) -> HookClient:
        settings = BusSettings(redis_url=self.url, prefix=HB_PREFIX)
        client = await HookClient(settings, HookSettings(hook_timeout_secs=10)).start()

        async def live() -> bool:
            return client.directory.live(self.name)

        await wait_until(live, self.children, "the hookbus worker to be live")
        return client

    async def calls(self, agents: int) -> dict[str, list[Call]]:
        if self.shared is None:
            self.shared = await self.client()
        while len(self.clients) < agents:
            self.clients.append(await self.client())
        shared = self.shared
        return {
            "shared": [hookbus_call(shared, i) for i in range(agents)],
            "each": [hookbus_call(self.clients[i], i) for i in range(agents)],
            "floor": [FloorAgent(self.redis, i, self.name) for i in range(agents)],
        }

    async def close(self) -> None:
        clients = [c for c in [self.shared, *self.clients] if c is not None]
        await asyncio.gather(*(c.close() for c in clients), return_exceptions=True)


def level_row(loop: str, agents: int, series: str, rounds: list[list[int]]) -> dict[str, Any]:
    """Percentiles over every round's samples, and each round's p99 (how noisy the tail is)."""
    samples = [s for batch in rounds for s in batch]
    p50, p99 = percentiles(samples)
    mean = statistics.fmean(samples) / 1000
    return {
        "loop": loop,
        "agents": agents,
        "series": series,
        "samples": len(samples),
        "p50_us": round(p50, 1),
        "p99_us": round(p99, 1),
        "p99_us_per_round": [round(percentiles(batch)[1], 1) for batch in rounds],
        "mean_us": round(mean, 1),
        # closed loop: Little's law; paced: what the agents asked for, at most that
        "dispatches_per_sec": round(agents / mean * 1e6, 1) if loop == "closed" else None,
        "quantiles_us": quantiles(samples),
    }


def growth(rows: list[dict[str, Any]], loop: str) -> dict[str, dict[str, float]]:
    """Per series: p50 and p99 at the highest level over those at one agent."""
    out: dict[str, dict[str, float]] = {}
    top = max(LEVELS)
    for series in SERIES:
        by_level = {r["agents"]: r for r in rows if r["series"] == series and r["loop"] == loop}
        one, most = by_level[1], by_level[top]
        out[series] = {
            "p50": _ratio(most["p50_us"], one["p50_us"]),
            "p99": _ratio(most["p99_us"], one["p99_us"]),
        }
    return out


def versus_floor(rows: list[dict[str, Any]], loop: str) -> dict[str, dict[str, float]]:
    """Per HookBus series, at the highest level: p99 over the floor's p99, and (closed loop)
    dispatches/s over the floor's dispatches/s."""
    top = max(LEVELS)
    by = {r["series"]: r for r in rows if r["agents"] == top and r["loop"] == loop}
    floor = by["floor"]
    out: dict[str, dict[str, float]] = {}
    for series in TARGET_SERIES:
        mine = by[series]
        out[series] = {"p99": _ratio(mine["p99_us"], floor["p99_us"])}
        if mine["dispatches_per_sec"] is not None:
            out[series]["per_sec"] = _ratio(mine["dispatches_per_sec"], floor["dispatches_per_sec"])
    return out


def target(vs_floor: dict[str, dict[str, dict[str, float]]]) -> dict[str, Any]:
    """The closed loop's targets at the highest level, against the floor."""
    ratios = vs_floor[TARGET_LOOP]
    met = {
        series: {
            "p99": ratios[series]["p99"] <= TARGET_MAX_P99,
            "per_sec": ratios[series]["per_sec"] >= TARGET_MIN_PER_SEC,
        }
        for series in TARGET_SERIES
    }
    return {
        "loop": TARGET_LOOP,
        "agents": max(LEVELS),
        "series": list(TARGET_SERIES),
        "baseline": "floor",
        "max_ratio_p99_to_floor": TARGET_MAX_P99,
        "min_ratio_per_sec_to_floor": TARGET_MIN_PER_SEC,
        "ratios": {series: ratios[series] for series in TARGET_SERIES},
        "met_by": met,
        "met": all(all(m.values()) for m in met.values()),
    }


async def measure(loop: str, plan: Plan, agents: Agents, level: int) -> list[dict[str, Any]]:
    """One level of one loop: the series in turns, ``plan.rounds`` times."""
    calls = await agents.calls(level)
    timed = plan.per_agent(level)
    for series in SERIES:  # warm up: connections in the pools, sessions cached
        await agents_calling(calls[series], plan.warmup, 0, plan.think_ms, seed=0)
    freeze_start_up_heap()  # as a long-running agent host should (docs/performance.md)
    rounds: dict[str, list[list[int]]] = {series: [] for series in SERIES}
    for rnd in range(plan.rounds):
        order = SERIES[rnd % len(SERIES) :] + SERIES[: rnd % len(SERIES)]
        for series in order:
            rounds[series].append(
                await agents_calling(calls[series], 2, timed, plan.think_ms, seed=rnd + 1)
            )
    rows = [level_row(loop, level, series, rounds[series]) for series in SERIES]
    progress(
        f"{loop} loop, {level:>2} agent(s) x {timed} calls x {plan.rounds}: "
        + "; ".join(f"{r['series']} p50 {r['p50_us']:,.0f} p99 {r['p99_us']:,.0f}" for r in rows)
    )
    return rows


async def run(plans: dict[str, Plan], url: str, children: Children) -> dict[str, Any]:
    redis = Redis.from_url(url, socket_connect_timeout=2, socket_timeout=CALL_TIMEOUT * 2)
    hook = NOOPS[0]
    children.start(
        f"hb-{hook.name}", "workers.cli", ["worker", f"{MODULE}:{hook.__name__}"],
        hookbus_env(url, HB_PREFIX),
    )  # fmt: skip
    children.start(
        f"floor-{hook.name}", "bench.floor_worker", ["worker", url, FLOOR_PREFIX, hook.name]
    )
    agents = Agents(url, redis, children)
    rows: list[dict[str, Any]] = []
    try:
        info = await redis.info("server")
        await wait_ready(redis, FLOOR_PREFIX, 1, children)
        calls = await agents.calls(1)
        result = await calls["shared"][0]()
        _check(isinstance(result.action, Continue) and not result.skipped, f"HookBus: {result}")
        _check(await calls["floor"][0]() == 1, "the floor agent did not get its reply")
        progress("1 hookbus worker and 1 floor worker up")
        for loop, plan in plans.items():
            for level in LEVELS:
                rows += await measure(loop, plan, agents, level)
    finally:
        await agents.close()
        await redis.aclose()
    ratios = {loop: growth(rows, loop) for loop in plans}
    vs_floor = {loop: versus_floor(rows, loop) for loop in plans}
    return {
        **header("concurrency", plans is QUICK),
        "redis_server": str(info.get("redis_version", "?")),
        "redis_py": redis_py.__version__,
        "hiredis": _hiredis(),
        "msgspec": msgspec.__version__,
        "hooks": 1,
        "levels": list(LEVELS),
        "loops": {
            loop: {
                "think_ms": plan.think_ms,
                "think": "none: the next call starts at once"
                if not plan.think_ms
                else f"uniform over {plan.think_ms / 2:g}-{plan.think_ms * 1.5:g} ms",
                "rounds": plan.rounds,
                "per_round": plan.per_round,
            }
            for loop, plan in plans.items()
        },
        "series": DESCRIPTIONS,
        "results": rows,
        "growth": ratios,
        "vs_floor": vs_floor,
        "target": target(vs_floor),
    }


def _verdict(met: bool) -> str:
    return "HOLDS" if met else "DOES NOT HOLD"


def render(report: dict[str, Any]) -> str:
    lines = [
        f"sync dispatch with concurrent agents, 1 no-op hook (Python {report['python']}, "
        f"redis-server {report['redis_server']}, {report['cpus']} CPUs"
        f"{', QUICK' if report['quick'] else ''}); latencies in µs",
    ]
    by = {(r["loop"], r["agents"], r["series"]): r for r in report["results"]}
    top = max(report["levels"])
    t = report["target"]
    for loop, about in report["loops"].items():
        closed = not about["think_ms"]
        lines += [
            "",
            f"{loop} loop (pause between calls: {about['think']})",
            f"{'agents':>6}  "
            + "  ".join(f"{s + ' p50':>11} {'p99':>7}" for s in SERIES)
            + ("  " + "  ".join(f"{s + ' /s':>9}" for s in SERIES) if closed else ""),
        ]
        for level in report["levels"]:
            rows = [by[loop, level, s] for s in SERIES]
            lines.append(
                f"{level:>6}  "
                + "  ".join(f"{r['p50_us']:>11,.0f} {r['p99_us']:>7,.0f}" for r in rows)
                + (
                    "  " + "  ".join(f"{r['dispatches_per_sec']:>9,.0f}" for r in rows)
                    if closed
                    else ""
                )
            )
        for series, g in report["growth"][loop].items():
            lines.append(
                f"  {series:<6} p50({top})/p50(1) {g['p50']:.2f}x, "
                f"p99({top})/p99(1) {g['p99']:.2f}x"
            )
        vs = report["vs_floor"][loop]
        lines.append(
            f"  at {top} agents over the floor: "
            + "; ".join(
                f"{series} p99 {v['p99']:.2f}x"
                + (f", dispatches/s {v['per_sec']:.2f}x" if "per_sec" in v else "")
                for series, v in vs.items()
            )
        )
        if loop != t["loop"]:
            continue
        lines.append(
            f"  target: at {t['agents']} agents, p99 at most {t['max_ratio_p99_to_floor']:g}x "
            f"the floor's and dispatches/s at least {t['min_ratio_per_sec_to_floor']:g}x the "
            "floor's, for " + " and ".join(t["series"])
        )
        for series in t["series"]:
            r, met = t["ratios"][series], t["met_by"][series]
            lines.append(
                f"    {series:<6} p99 {r['p99']:.2f}x {_verdict(met['p99'])}, "
                f"dispatches/s {r['per_sec']:.2f}x {_verdict(met['per_sec'])}"
            )
    lines.append(f"targets ({t['loop']} loop, {t['agents']} agents): {_verdict(t['met'])}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.concurrency", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="few iterations (smoke test)")
    args = parser.parse_args(argv)
    plans = QUICK if args.quick else FULL
    return run_benchmark(RESULTS, render, lambda url, children: run(plans, url, children))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
