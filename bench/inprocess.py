"""In-process dispatch latency: one ``run_pre_tool_use`` with N matching no-op hooks.

Every figure is the latency of one awaited call, timed with ``time.perf_counter_ns`` inside one
running asyncio loop, after a warm-up. Beside each HookBus figure, the same number of no-op
hooks called through pluggy (synchronous, no aggregation) gives the floor of "calling N Python
functions through a plugin manager"; the ratio says what HookBus's selection, timeouts,
answer checking and aggregation cost on top of it.

A secondary line times 3 hooks that really suspend (``await asyncio.sleep(0)``): HookBus then
wraps each in a task and waits for them; its floor is ``asyncio.gather`` of the same coroutines.

Samples of HookBus and of its floor are taken in alternating batches, so that a noisy moment of
the machine spreads over both. The garbage collector stays on: HookBus allocates per dispatch
and its collections are part of what an agent pays (they show up in p99).

Usage: ``python -m bench.inprocess [--quick]``; results go to ``bench/results/inprocess.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import math
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pluggy

from bench.common import Plan, header, percentiles, write_results
from bus.actions import CONTINUE, PreToolUseAction
from bus.events import HookEvent, PreToolUseContext
from bus.hooks import AgentHook
from bus.registry import HookRegistry
from bus.settings import HookSettings

HOOK_COUNTS = (0, 1, 3, 16)
SUSPENDING_HOOKS = 3
TARGET_HOOKS = (1, 3, 16)
TARGET_MAX_RATIO = 2.0  # p50 at most twice pluggy's, at each size
RESULTS = Path(__file__).resolve().parent / "results" / "inprocess.json"


FULL = Plan(warmup=2_000, rounds=20, batch=1_000)
QUICK = Plan(warmup=100, rounds=2, batch=100)


# -- the hooks -------------------------------------------------------------------------------


class NoopHook(AgentHook):
    """Answers Continue without awaiting anything (the dispatcher's fast path)."""

    name = "noop"
    subscribed_events = (HookEvent.PRE_TOOL_USE,)

    async def pre_tool_use(self, ctx: PreToolUseContext) -> PreToolUseAction:
        return CONTINUE


class SuspendingHook(AgentHook):
    """Yields to the event loop once, then answers Continue (the dispatcher's task path)."""

    name = "suspending"
    subscribed_events = (HookEvent.PRE_TOOL_USE,)

    async def pre_tool_use(self, ctx: PreToolUseContext) -> PreToolUseAction:
        await asyncio.sleep(0)
        return CONTINUE


def make_registry(base: type[AgentHook], n: int) -> HookRegistry:
    """A registry with ``n`` hooks of class ``base``, each a subclass with its own name."""
    reg = HookRegistry(HookSettings())
    for i in range(n):
        cls = type(f"{base.__name__}{i}", (base,), {"name": f"{base.name}-{i}"})
        reg.add(cls())
    return reg


# -- the pluggy floor --------------------------------------------------------------------------

_PROJECT = "hookbus_bench"
hookspec = pluggy.HookspecMarker(_PROJECT)
hookimpl = pluggy.HookimplMarker(_PROJECT)


class PluggySpec:
    @hookspec
    def pre_tool_use(self, ctx: PreToolUseContext) -> Any:
        """Called before a tool runs."""


class PluggyNoop:
    @hookimpl
    def pre_tool_use(self, ctx: PreToolUseContext) -> Any:
        return CONTINUE


def make_plugin_manager(n: int) -> pluggy.PluginManager:
    pm = pluggy.PluginManager(_PROJECT)
    pm.add_hookspecs(PluggySpec)
    for i in range(n):
        pm.register(PluggyNoop(), name=f"noop-{i}")
    return pm


async def _yield_once() -> Any:
    await asyncio.sleep(0)
    return CONTINUE


async def gather_floor(n: int) -> list[Any]:
    """What the suspending variant cannot avoid: n coroutines that yield once, as tasks."""
    return await asyncio.gather(*[_yield_once() for _ in range(n)])


# -- timing ----------------------------------------------------------------------------------


async def time_awaited(fn: Callable[[Any], Awaitable[Any]], arg: Any, n: int) -> list[int]:
    """Nanoseconds of each of ``n`` calls ``await fn(arg)``."""
    clock = time.perf_counter_ns
    samples: list[int] = []
    append = samples.append
    for _ in range(n):
        t0 = clock()
        await fn(arg)
        append(clock() - t0)
    return samples


def time_pluggy(call: Any, ctx: PreToolUseContext, n: int) -> list[int]:
    """Nanoseconds of each of ``n`` calls ``call(ctx=ctx)`` (pluggy takes keywords only)."""
    clock = time.perf_counter_ns
    samples: list[int] = []
    append = samples.append
    for _ in range(n):
        t0 = clock()
        call(ctx=ctx)
        append(clock() - t0)
    return samples


def time_nothing(n: int) -> list[int]:
    """The timer's own cost: two clock reads and an append."""
    clock = time.perf_counter_ns
    samples: list[int] = []
    append = samples.append
    for _ in range(n):
        t0 = clock()
        append(clock() - t0)
    return samples


def _ratio(a: float, b: float) -> float:
    return round(a / b, 2) if b > 0 else math.inf


def _check(condition: bool, what: str) -> None:
    if not condition:
        raise RuntimeError(f"benchmark set-up is wrong: {what}")


# -- the measurements ----------------------------------------------------------------------


def _ctx() -> PreToolUseContext:
    return PreToolUseContext(session_id="s", tool_name="file_read", tool_args={"path": "a"})


async def measure_noop(n: int, plan: Plan) -> dict[str, Any]:
    """HookBus and pluggy, ``n`` no-op hooks each."""
    ctx = _ctx()
    reg = make_registry(NoopHook, n)
    call = make_plugin_manager(n).hook.pre_tool_use

    result = await reg.run_pre_tool_use(ctx)
    _check(result.action is CONTINUE and not result.skipped, f"dispatch answered {result}")
    outcomes = await reg.gather(HookEvent.PRE_TOOL_USE, ctx)
    _check(len(outcomes) == n, f"{len(outcomes)} hooks called, expected {n}")
    _check(len(call(ctx=ctx)) == n, f"pluggy did not call {n} plugins")

    await time_awaited(reg.run_pre_tool_use, ctx, plan.warmup)
    time_pluggy(call, ctx, plan.warmup)
    gc.collect()
    ours: list[int] = []
    floor: list[int] = []
    for _ in range(plan.rounds):
        ours += await time_awaited(reg.run_pre_tool_use, ctx, plan.batch)
        floor += time_pluggy(call, ctx, plan.batch)
    p50, p99 = percentiles(ours)
    f50, f99 = percentiles(floor)
    return {
        "hooks": n,
        "variant": "noop",
        "hookbus_p50_us": round(p50, 3),
        "hookbus_p99_us": round(p99, 3),
        "pluggy_p50_us": round(f50, 3),
        "pluggy_p99_us": round(f99, 3),
        "ratio": _ratio(p50, f50),
    }


async def measure_suspending(n: int, plan: Plan) -> dict[str, Any]:
    """HookBus with ``n`` hooks that each await ``asyncio.sleep(0)``, beside asyncio.gather."""
    ctx = _ctx()
    reg = make_registry(SuspendingHook, n)

    result = await reg.run_pre_tool_use(ctx)
    _check(result.action is CONTINUE and not result.skipped, f"dispatch answered {result}")
    outcomes = await reg.gather(HookEvent.PRE_TOOL_USE, ctx)
    _check(len(outcomes) == n, f"{len(outcomes)} hooks called, expected {n}")

    await time_awaited(reg.run_pre_tool_use, ctx, plan.warmup)
    await time_awaited(gather_floor, n, plan.warmup)
    gc.collect()
    ours: list[int] = []
    floor: list[int] = []
    for _ in range(plan.rounds):
        ours += await time_awaited(reg.run_pre_tool_use, ctx, plan.batch)
        floor += await time_awaited(gather_floor, n, plan.batch)
    p50, p99 = percentiles(ours)
    f50, f99 = percentiles(floor)
    return {
        "hooks": n,
        "variant": "suspending (await asyncio.sleep(0))",
        "hookbus_p50_us": round(p50, 3),
        "hookbus_p99_us": round(p99, 3),
        "gather_p50_us": round(f50, 3),
        "gather_p99_us": round(f99, 3),
        "ratio": _ratio(p50, f50),
    }


async def run(plan: Plan) -> dict[str, Any]:
    loop = asyncio.get_running_loop()
    overhead, _ = percentiles(time_nothing(max(plan.samples, 10_000)))
    results = [await measure_noop(n, plan) for n in HOOK_COUNTS]
    secondary = await measure_suspending(SUSPENDING_HOOKS, plan)
    return {
        **header("inprocess", plan is QUICK),
        "event_loop": f"{type(loop).__module__}.{type(loop).__name__}",
        "pluggy": pluggy.__version__,
        "warmup_calls": plan.warmup,
        "samples_per_point": plan.samples,
        "timer_overhead_us": round(overhead, 3),
        "results": results,
        "secondary": secondary,
        "target": {
            "hooks": list(TARGET_HOOKS),
            "max_ratio": TARGET_MAX_RATIO,
            "met": all(
                r["ratio"] <= TARGET_MAX_RATIO for r in results if r["hooks"] in TARGET_HOOKS
            ),
        },
    }


def render(report: dict[str, Any]) -> str:
    lines = [
        f"in-process dispatch, one run_pre_tool_use "
        f"(Python {report['python']}, {report['event_loop']}, pluggy {report['pluggy']}, "
        f"{report['samples_per_point']} samples per point"
        f"{', QUICK' if report['quick'] else ''})",
        "",
        f"{'hooks':>5}  {'hookbus p50 µs':>14}  {'p99 µs':>8}  {'pluggy p50 µs':>13}  {'ratio':>7}",
    ]
    for r in report["results"]:
        lines.append(
            f"{r['hooks']:>5}  {r['hookbus_p50_us']:>14.2f}  {r['hookbus_p99_us']:>8.2f}  "
            f"{r['pluggy_p50_us']:>13.2f}  {r['ratio']:>6.1f}x"
        )
    s = report["secondary"]
    lines += [
        "",
        f"{s['hooks']} hooks that await asyncio.sleep(0): "
        f"hookbus p50 {s['hookbus_p50_us']:.2f} µs, p99 {s['hookbus_p99_us']:.2f} µs; "
        f"asyncio.gather of the same coroutines "
        f"p50 {s['gather_p50_us']:.2f} µs ({s['ratio']:.1f}x)",
        f"timer overhead (two perf_counter_ns reads), included above: "
        f"{report['timer_overhead_us']:.3f} µs",
    ]
    t = report["target"]
    verdict = "HOLDS" if t["met"] else "DOES NOT HOLD"
    sizes = "/".join(str(n) for n in t["hooks"])
    lines.append(
        f"target: p50 at most {t['max_ratio']:g}x pluggy's with {sizes} hooks -> {verdict}"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.inprocess", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="few iterations (smoke test)")
    args = parser.parse_args(argv)
    plan = QUICK if args.quick else FULL

    report = asyncio.run(run(plan))
    print(render(report), flush=True)
    write_results(RESULTS, report)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
