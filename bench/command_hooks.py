"""Command hooks, as other agent CLIs run them, beside HookBus: one PreToolUse decision each.

Agent CLIs such as Claude Code run a hook as a command: one new process per hook per call, the
event as JSON on its stdin, the decision as JSON on its stdout. This benchmark times that model
on the same machine and in the same run as HookBus's synchronous dispatch, so that the two can be
read side by side. One agent (this process's asyncio loop) makes one PreToolUse call at a time;
each figure is the latency of one call, timed with ``time.perf_counter_ns`` after a warm-up.

hookbus
    ``await HookClient.run_pre_tool_use(ctx)`` with N ``hookbus worker`` processes (no-op hooks
    answering Continue), on a private ``redis-server``: ``bench.sync_dispatch``'s agent
    topology.
python
    ``python bench/command_hook.py`` started per hook per call with
    ``asyncio.create_subprocess_exec`` (no shell in between): it reads the event (Claude Code's
    PreToolUse fields) from stdin with ``json.load`` and writes an "allow" decision to stdout,
    which the agent parses and checks, as well as the exit status. The smallest Python hook.
shell
    ``/bin/sh -c 'cat >/dev/null; printf …'``: the same exchange with the cheapest process
    there is (no interpreter to start), the floor of the process-per-call model.

N = 1 and 3. With 3, the agent starts the 3 commands at once and waits for all of them (as
Claude Code runs the matching hooks of an event in parallel); HookBus asks its 3 hook services
at once too. Series are sampled in alternating batches in the same run, so that a noisy moment
of the machine spreads over all of them; command hooks are ~50x slower, so they get fewer
samples.

Usage: ``python -m bench.command_hooks [--quick]``; results go to
``bench/results/command_hooks.json``. It starts worker processes and kills them all on exit.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis as redis_py

from agent_adapter.client import HookClient
from bench.common import ROOT, Children, header, hookbus_env
from bench.sync_dispatch import (
    MODULE,
    NOOPS,
    _check,
    _hiredis,
    _ratio,
    context,
    percentiles,
    progress,
    quantiles,
    run_benchmark,
    time_calls,
    wait_until,
)
from bus.actions import Continue
from bus.settings import BusSettings, HookSettings

HOOK_COUNTS = (1, 3)
VARIANTS = ("hookbus", "python", "shell")
SCRIPT = Path(__file__).resolve().parent / "command_hook.py"
RESULTS = Path(__file__).resolve().parent / "results" / "command_hooks.json"
CALL_TIMEOUT = 10.0  # seconds one command may take before the run fails

DESCRIPTIONS = {
    "hookbus": "HookClient.run_pre_tool_use(ctx), N `hookbus worker` processes over Redis",
    "python": "one `python bench/command_hook.py` process per hook per call, JSON on stdin/stdout",
    "shell": "one `/bin/sh -c 'cat >/dev/null; printf …'` process per hook per call",
}

Call = Callable[[], Awaitable[Any]]


@dataclass(frozen=True)
class Plan:
    """``rounds`` alternating batches; each series has its own batch size and warm-up."""

    rounds: int
    batch: dict[str, int]
    warmup: dict[str, int]

    def samples(self, variant: str) -> int:
        return self.rounds * self.batch[variant]


FULL = Plan(
    rounds=5,
    batch={"hookbus": 200, "python": 40, "shell": 100},
    warmup={"hookbus": 200, "python": 5, "shell": 20},
)
QUICK = Plan(
    rounds=1,
    batch={"hookbus": 30, "python": 4, "shell": 10},
    warmup={"hookbus": 20, "python": 1, "shell": 2},
)


# -- the command hooks ---------------------------------------------------------------------


def event_json() -> bytes:
    """The PreToolUse event as a command hook receives it (Claude Code's field names)."""
    ctx = context()
    return json.dumps(
        {
            "session_id": ctx.session_id,
            "transcript_path": "/tmp/bench-session-0001.jsonl",
            "cwd": str(ROOT),
            "hook_event_name": "PreToolUse",
            "tool_name": ctx.tool_name,
            "tool_input": ctx.tool_args,
        }
    ).encode()


def shell_answer(name: str) -> str:
    answer = {
        "hookSpecificOutput": {
            "hookEventName": "PreToolUse",
            "permissionDecision": "allow",
            "permissionDecisionReason": f"{name}: file_read allowed",
        }
    }
    return f"cat >/dev/null; printf '%s' '{json.dumps(answer)}'"


def commands(variant: str, n: int) -> list[list[str]]:
    names = [f"command-hook-{i + 1}" for i in range(n)]
    if variant == "python":
        return [[sys.executable, str(SCRIPT), name] for name in names]
    return [["/bin/sh", "-c", shell_answer(name)] for name in names]


async def run_command(argv: list[str], payload: bytes) -> str:
    """Start one hook process, write the event, read and check its decision."""
    proc = await asyncio.create_subprocess_exec(
        *argv,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
        cwd=ROOT,
    )
    try:
        out, _ = await asyncio.wait_for(proc.communicate(payload), CALL_TIMEOUT)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise
    if proc.returncode != 0:
        raise RuntimeError(f"command hook {argv} exited with {proc.returncode}")
    decision = json.loads(out)["hookSpecificOutput"]["permissionDecision"]
    if decision != "allow":
        raise RuntimeError(f"command hook {argv} answered {out!r}")
    return str(decision)


def command_call(variant: str, n: int) -> Call:
    argvs = commands(variant, n)
    payload = event_json()

    async def call() -> list[str]:
        if n == 1:
            return [await run_command(argvs[0], payload)]
        return list(await asyncio.gather(*(run_command(a, payload) for a in argvs)))

    return call


# -- the run -------------------------------------------------------------------------------


async def alternate(plan: Plan, calls: dict[str, Call]) -> dict[str, list[int]]:
    """Warm every call up, then time them in alternating batches of their own sizes."""
    for label, call in calls.items():
        await time_calls(call, plan.warmup[label])
    gc.collect()
    samples: dict[str, list[int]] = {label: [] for label in calls}
    for _ in range(plan.rounds):
        for label, call in calls.items():
            samples[label] += await time_calls(call, plan.batch[label])
    return samples


async def hookbus_client(url: str, n: int, children: Children) -> tuple[HookClient, Call]:
    """A HookClient on prefix ``bench-cmd{n}``, once its n workers are live."""
    settings = BusSettings(redis_url=url, prefix=f"bench-cmd{n}")
    client = await HookClient(settings, HookSettings(hook_timeout_secs=10)).start()
    names = [hook.name for hook in NOOPS[:n]]

    async def live() -> bool:
        by_name = client.directory.by_name
        return all(name in by_name and by_name[name].replicas >= 1 for name in names)

    await wait_until(live, children, f"{n} hookbus worker(s) on bench-cmd{n}")
    ctx = context()

    async def call() -> Any:
        return await client.run_pre_tool_use(ctx)

    result = await call()
    _check(isinstance(result.action, Continue) and not result.skipped, f"HookBus: {result}")
    return client, call


def row(n: int, variant: str, samples: list[int], hookbus_p50: float) -> dict[str, Any]:
    p50, p99 = percentiles(samples)
    return {
        "hooks": n,
        "variant": variant,
        "samples": len(samples),
        "p50_us": round(p50, 1),
        "p99_us": round(p99, 1),
        "ratio_to_hookbus_p50": _ratio(p50, hookbus_p50),
        "quantiles_us": quantiles(samples),
    }


async def run(plan: Plan, url: str, children: Children) -> dict[str, Any]:
    for n in HOOK_COUNTS:
        env = hookbus_env(url, f"bench-cmd{n}")
        for hook in NOOPS[:n]:
            children.start(
                f"cmd{n}-{hook.name}", "workers.cli", ["worker", f"{MODULE}:{hook.__name__}"], env
            )
    progress(f"started {sum(HOOK_COUNTS)} hookbus worker(s); checking the command hooks")
    for variant in ("python", "shell"):
        _check(await command_call(variant, 1)() == ["allow"], f"the {variant} command hook")

    results: list[dict[str, Any]] = []
    for n in HOOK_COUNTS:
        client, hookbus = await hookbus_client(url, n, children)
        try:
            calls = {"hookbus": hookbus}
            calls.update({v: command_call(v, n) for v in VARIANTS if v != "hookbus"})
            progress(
                f"{n} hook(s): timing "
                + ", ".join(f"{plan.samples(v)} calls of {v}" for v in calls)
            )
            samples = await alternate(plan, calls)
        finally:
            await client.close()
        hb50, _ = percentiles(samples["hookbus"])
        for variant in VARIANTS:
            results.append(row(n, variant, samples[variant], hb50))
            r = results[-1]
            progress(
                f"  -> {variant:<8} p50 {r['p50_us']:>9,.0f} µs  p99 {r['p99_us']:>9,.0f} µs"
                f"  ({r['ratio_to_hookbus_p50']:.1f}x hookbus)"
            )
    return {
        **header("command_hooks", plan is QUICK),
        "redis_py": redis_py.__version__,
        "hiredis": _hiredis(),
        "rounds": plan.rounds,
        "batch": plan.batch,
        "variants": DESCRIPTIONS,
        "parallel": "with 3 hooks, the 3 processes (or hook services) are asked at once",
        "results": results,
    }


def render(report: dict[str, Any]) -> str:
    lines = [
        f"command hooks (one process per hook per call, JSON on stdin/stdout) vs HookBus "
        f"(Python {report['python']}, {report['cpus']} CPUs"
        f"{', QUICK' if report['quick'] else ''})",
        "",
        f"{'hooks':>5}  {'variant':<8}  {'samples':>7}  {'p50 µs':>9}  {'p99 µs':>9}  "
        f"{'p50 / hookbus':>13}",
    ]
    for r in report["results"]:
        lines.append(
            f"{r['hooks']:>5}  {r['variant']:<8}  {r['samples']:>7}  {r['p50_us']:>9,.0f}  "
            f"{r['p99_us']:>9,.0f}  {r['ratio_to_hookbus_p50']:>12.1f}x"
        )
    lines += ["", *(f"{k}: {v}" for k, v in report["variants"].items())]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.command_hooks", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="few iterations (smoke test)")
    args = parser.parse_args(argv)
    plan = QUICK if args.quick else FULL
    return run_benchmark(RESULTS, render, lambda url, children: run(plan, url, children))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
