"""The cost of tracing on the synchronous path: one PreToolUse dispatch, tracing off vs on.

Each side is an agent process (``HookClient``, as in production) and a hook worker process
(``hookbus worker``) on one private redis-server: OpenTelemetry's providers are process-wide,
so "off" and "on" cannot share a process. "On" is tracing as a fleet would run it: every
process exports its spans over OTLP/HTTP to a real receiver (``tests/otlp_receiver.py``, which
decodes every request, as a collector would, and counts the spans), every trace sampled (the
SDK's default, ``parentbased_always_on``), metrics on too. The agent wraps each dispatch in an
``execute_tool`` span as ``agent_adapter/executor.py`` does (``telemetry.span``), so a dispatch
makes three spans: ``execute_tool file_read`` and ``dispatch PreToolUse`` in the agent, ``hook
bench-noop-1`` in the worker. A third HookBus side, ``on-sdk``, sends the same spans through the
SDK's spans, ``BatchSpanProcessor`` and OTLP/HTTP exporter instead of HookBus's own
(``tracing.private_export``): what bus/telemetry/export.py saves, measured in the same run.

Beside them, the floor with tracing off and on: the hand-written redis-py agent and hook of
``bench.sync_dispatch`` (``bench/floor_worker.py``), instrumented as the OpenTelemetry
documentation shows (``floor_worker.stock_telemetry``: the SDK's ``BatchSpanProcessor`` and
OTLP/HTTP exporters, SDK defaults) with the same three spans, the ``traceparent`` carried in
the request, and a histogram record per dispatch and per answer; "off" runs the same code with
no SDK installed (the API's no-op), as an instrumented application with tracing off does. It
tells what tracing costs anything built on the OpenTelemetry SDK, against what it costs HookBus.

Each group (HookBus off, on and on-sdk, then the floor off and on) is timed in alternating
batches (the order flips every round); a group is closed, its spans flushed, before the next one
runs, so that one group's exports never fall in the other's batches. CPU time per dispatch of
each process (every thread, from /proc) over the timed batches is reported beside the
latencies: on a loaded machine it moves less than they do. The result says how many spans the
receiver got against how many the processes made.
Prints p50/p99 of each side and the ratios; writes ``bench/results/tracing_cost.json``.

``--profile DIR``: py-spy samples both agents and the tracing worker during the timed batches
(see ``bench/profile.py``; the figures of a profiled run are not the benchmark's).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TextIO

from bench.common import (
    BOOT,
    ROOT,
    Children,
    Plan,
    header,
    hookbus_env,
    percentiles,
    progress,
    write_results,
)

RESULTS = ROOT / "bench" / "results" / "tracing_cost.json"
FULL = Plan(warmup=500, rounds=10, batch=1000)
QUICK = Plan(warmup=50, rounds=2, batch=100)
#: Tracing on against off, and below the floor's own ratios (the stock SDK) in the same run.
TARGET = {"max_ratio_p50": 1.3, "max_ratio_p99": 1.5}
SPANS_PER_DISPATCH = 3  # execute_tool + dispatch in the agent; hook in the hook's process
START_TIMEOUT = 30.0
HOOK = "bench-noop-1"
#: HookBus with its spans sent through the SDK's span machinery, batch processor and OTLP/HTTP
#: exporter instead of its own (``tracing.private_export``): what export.py saves, or not.
SDK = "on-sdk"
# (name, tracing on, the floor): each side is an agent process and its hook's process.
SIDES = (("off", False, False), ("on", True, False), (SDK, True, False),
         ("floor-off", False, True), ("floor-on", True, True))  # fmt: skip
GROUPS = tuple(tuple(name for name, _, f in SIDES if f is floor) for floor in (False, True))
TRACED = tuple(name for name, on, _ in SIDES if on)


# -- the agent process ---------------------------------------------------------------------


async def _answer(out: TextIO, traced: bool, dispatch: Callable[[], Awaitable[Any]]) -> int:
    """An agent's side of its pipe: say it is ready, then for each line ``N`` on stdin time
    ``N`` dispatches and write their latencies (ns) as one JSON line. Returns how many it made,
    at the end of stdin."""
    from workers.cli.common import freeze_start_up_heap

    freeze_start_up_heap()  # as a long-running agent host should (docs/performance.md)
    print(json.dumps({"ready": True, "traced": traced}), file=out, flush=True)
    clock = time.perf_counter_ns
    loop = asyncio.get_running_loop()
    dispatched = 0
    while line := await loop.run_in_executor(None, sys.stdin.readline):
        samples = []
        for _ in range(int(line)):
            t0 = clock()
            await dispatch()
            samples.append(clock() - t0)
        dispatched += len(samples)
        print(json.dumps(samples), file=out, flush=True)
    return dispatched


async def _agent(out: TextIO, sdk: bool) -> None:
    """HookBus's agent: ``HookClient.run_pre_tool_use`` in an ``execute_tool`` span, as the
    executor. ``sdk``: its spans through the SDK's exporter."""
    from agent_adapter.client import HookClient
    from bench.sync_dispatch import context
    from bus import HookSettings
    from bus.settings import BusSettings
    from bus.telemetry import tracing as telemetry

    telemetry.private_export = not sdk
    traced = telemetry.configure("bench-agent")
    client = await HookClient(BusSettings.from_env(), HookSettings(hook_timeout_secs=5)).start()
    ctx = context()
    attrs = {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "file_read",
             "gen_ai.tool.call.id": "call-1", "session.id": ctx.session_id,
             "agent.name": "main"}  # fmt: skip

    async def dispatch() -> None:
        with telemetry.span("execute_tool file_read", dict(attrs)):  # as the executor
            await client.run_pre_tool_use(ctx)

    try:
        deadline = time.monotonic() + START_TIMEOUT
        while not client.directory.live(HOOK):
            if time.monotonic() > deadline:
                raise RuntimeError(f"hook {HOOK} never became live")
            await asyncio.sleep(0.02)
        dispatched = await _answer(out, traced, dispatch)
    finally:
        await client.close()
        telemetry.shutdown()  # flushes what is still queued
    print(json.dumps({"dispatched": dispatched}), file=out, flush=True)


async def _floor_agent(out: TextIO, url: str, prefix: str) -> None:
    """The floor's agent: ``floor_worker.fan_out`` in the same two spans, with the stock SDK
    when tracing is on."""
    from opentelemetry import metrics, propagate, trace
    from opentelemetry.trace import SpanKind

    from bench.floor_worker import connect, fan_out, hook_request, requests_key, stock_telemetry
    from bench.sync_dispatch import context
    from bus.protocol import raw

    traced = bool(os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"))
    if traced:
        tracer, histogram, shutdown = stock_telemetry("floor-agent")
    else:  # the API's no-op tracer and meter: instrumented code with no SDK installed
        tracer = trace.get_tracer("floor-agent")
        histogram = metrics.get_meter("floor-agent").create_histogram("floor.duration")
        shutdown = lambda: None  # noqa: E731
    redis = connect(url)
    stream, inbox = requests_key(prefix, HOOK), f"{prefix}:inbox:floor-agent-{os.getpid()}"
    ctx = context()
    session, body = ctx.session_id, raw(ctx)
    tool = {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "file_read",
            "gen_ai.tool.call.id": "call-1", "session.id": session,
            "agent.name": "main"}  # fmt: skip
    event = {"hook.event": "PreToolUse", "session.id": session, "gen_ai.tool.name": "file_read"}
    now = time.perf_counter

    async def dispatch() -> None:
        with (
            tracer.start_as_current_span("execute_tool file_read", attributes=tool),
            tracer.start_as_current_span(
                "dispatch PreToolUse", kind=SpanKind.CLIENT, attributes=event
            ),
        ):
            carrier: dict[str, str] = {}
            propagate.inject(carrier)
            request_id, payload = hook_request(
                HOOK, session, body, inbox, carrier.get("traceparent", "")
            )
            t1 = now()
            await fan_out(redis, inbox, [stream], [payload], [request_id])
            histogram.record((now() - t1) * 1000, event)

    try:
        if not await redis.blpop([f"{prefix}:ready"], timeout=START_TIMEOUT):
            raise RuntimeError(f"floor hook {HOOK} never became ready")
        dispatched = await _answer(out, traced, dispatch)
    finally:
        await redis.aclose()
        shutdown()  # flushes what is still queued
    print(json.dumps({"dispatched": dispatched}), file=out, flush=True)


# -- the benchmark -------------------------------------------------------------------------


class Side:
    """One agent process and its hook's process, HookBus's or the floor's, tracing on or off."""

    def __init__(
        self, name: str, env: dict[str, str], children: Children, floor: bool, url: str
    ) -> None:
        self.name = name
        self.floor = floor
        if floor:
            prefix = f"trace-{name}"
            kind = "traced-worker" if "OTEL_EXPORTER_OTLP_ENDPOINT" in env else "worker"
            worker = ("bench.floor_worker", [kind, url, prefix, HOOK])
            agent = ["--floor-agent", url, prefix]
        else:
            sdk = ["--sdk"] if name == SDK else []
            worker = ("bench.tracing_cost", [*sdk, "worker", "bench.sync_dispatch:Noop1"])
            agent = ["--agent", *sdk]
        self.worker = children.start(f"worker-{name}", *worker, env)
        with open(children.logdir / f"agent-{name}.log", "wb") as log:
            self.agent = subprocess.Popen(
                [sys.executable, "-c", BOOT, "bench.tracing_cost", *agent],
                cwd=ROOT, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log,
                text=True,
            )  # fmt: skip
        self.samples: list[int] = []
        self.dispatched = 0
        self.traced = json.loads(self._line())["traced"]

    def _line(self) -> str:
        assert self.agent.stdout is not None
        line = self.agent.stdout.readline()
        if not line:
            raise RuntimeError(f"the {self.name} agent exited with {self.agent.wait()}")
        return line

    def run(self, n: int, keep: bool = True) -> None:
        assert self.agent.stdin is not None
        self.agent.stdin.write(f"{n}\n")
        self.agent.stdin.flush()
        samples = json.loads(self._line())
        if keep:
            self.samples += samples

    def close(self) -> None:
        """End the agent (it flushes its spans) and stop the worker (it flushes its own)."""
        assert self.agent.stdin is not None
        self.agent.stdin.close()
        self.dispatched = json.loads(self._line())["dispatched"]
        self.agent.wait(30)


def _env(url: str, name: str, on: bool, endpoint: str) -> dict[str, str]:
    env = hookbus_env(url, f"trace-{name}")  # no OpenTelemetry settings of the caller's
    if on:
        env["OTEL_EXPORTER_OTLP_ENDPOINT"] = endpoint  # traces and metrics, SDK defaults
        env["OTEL_SERVICE_NAME"] = f"bench-{name}"  # the receiver counts each side's spans
    return env


def measure(plan: Plan, profile: Path | None) -> dict[str, Any]:
    from bench.profile import Recorder
    from tests.otlp_receiver import OTLPReceiver
    from workers.local.redis_server import RedisServer

    with (
        tempfile.TemporaryDirectory(prefix="bench-tracing-") as logdir,
        RedisServer() as redis,
        OTLPReceiver(keep=False) as receiver,
    ):
        children = Children(Path(logdir))
        sides: dict[str, Side] = {}
        recorder: Recorder | None = None
        cpu: dict[str, float] = {}
        try:
            for name, on, floor in SIDES:
                env = _env(redis.url, name, on, receiver.endpoint)
                sides[name] = Side(name, env, children, floor, redis.url)
                if sides[name].traced != on:
                    raise RuntimeError(f"tracing is not {'on' if on else 'off'} in {name}")
            # One pair at a time, closed (its spans flushed) before the next starts: a pair's
            # export never falls in the other's batches.
            for pair in GROUPS:
                group = {name: sides[name] for name in pair}
                for side in group.values():
                    side.run(plan.warmup, keep=False)
                if profile:
                    recorder = Recorder(profile)
                    for side in group.values():
                        recorder.start(f"tracing-agent-{side.name}", side.agent.pid)
                        recorder.start(f"tracing-worker-{side.name}", side.worker.pid)
                order = list(group.values())
                cpu0 = _cpu(group)
                for r in range(plan.rounds):
                    progress(f"{' and '.join(pair)}: round {r + 1}/{plan.rounds}")
                    for side in order if r % 2 == 0 else order[::-1]:
                        children.check()
                        side.run(plan.batch)
                cpu |= {k: v - cpu0[k] for k, v in _cpu(group).items()}
                if recorder:
                    for path in recorder.stop():
                        print(f"profile written to {path}")
                    recorder = None
                for side in group.values():
                    side.close()
                # SIGTERM: each worker flushes its spans on the way out
                children.stop([f"worker-{name}" for name in pair])
            # HookBus's sides by the service name each was given; the floor names its two
            # processes itself (floor_worker.stock_telemetry)
            expected = {f"bench-{name}": SPANS_PER_DISPATCH * sides[name].dispatched
                        for name in TRACED if not sides[name].floor}  # fmt: skip
            floor = sides["floor-on"].dispatched
            expected |= {"floor-agent": 2 * floor, "floor-worker": floor}
            received = _received(receiver, expected)
        finally:
            if recorder:
                recorder.stop()
            for side in sides.values():
                if side.agent.poll() is None:
                    side.agent.kill()
                    side.agent.wait()
                for pipe in (side.agent.stdin, side.agent.stdout):
                    if pipe is not None:
                        pipe.close()
            children.stop()
    timed = plan.samples
    report: dict[str, Any] = {
        "spans": {"expected": expected, "received": received},
        # CPU time of each process over the timed batches, per dispatch of its side; the
        # receiver (this process) decodes what both processes of the "on" side export.
        "cpu_us_per_dispatch": {k: round(v / timed * 1e6, 1) for k, v in cpu.items()},
    }
    # each side's agent and hook process together (every thread: the export's too)
    by_side: dict[str, float] = {}
    for key, seconds in cpu.items():
        process = key.partition(":")[0]  # "agent-on", "worker-floor-off"; "receiver"
        if "-" in process:
            side = process.partition("-")[2]
            by_side[side] = by_side.get(side, 0.0) + seconds
    report["cpu_us_per_dispatch_by_side"] = {
        side: round(seconds / timed * 1e6, 1) for side, seconds in by_side.items()
    }
    for name, side in sides.items():
        p50, p99 = percentiles(side.samples)
        report[name] = {"p50_us": round(p50, 1), "p99_us": round(p99, 1),
                        "samples": len(side.samples)}  # fmt: skip
    for prefix, on, off in (("", "on", "off"), ("sdk_", SDK, "off"),
                            ("floor_", "floor-on", "floor-off")):  # fmt: skip
        for pct in ("p50", "p99"):
            ratio = report[on][f"{pct}_us"] / report[off][f"{pct}_us"]
            report[f"{prefix}ratio_{pct}"] = round(ratio, 2)
        report[f"{prefix}ratio_p50_per_batch"] = _per_batch(
            sides[on].samples, sides[off].samples, plan
        )
    return report


def _cpu(sides: dict[str, Side]) -> dict[str, float]:
    """Seconds of CPU (user + system) each process has used so far."""
    tick = os.sysconf("SC_CLK_TCK")
    out = {}
    for name, side in sides.items():
        for role, pid in (("agent", side.agent.pid), ("worker", side.worker.pid)):
            for task in Path(f"/proc/{pid}/task").iterdir():
                comm, _, rest = (task / "stat").read_text().partition(" (")[2].rpartition(")")
                fields = rest.split()
                thread = "main" if task.name == str(pid) else comm.split("Record")[0]
                key = f"{role}-{name}:{thread}"
                out[key] = out.get(key, 0) + (int(fields[11]) + int(fields[12])) / tick
    usage = resource.getrusage(resource.RUSAGE_SELF)
    out["receiver"] = usage.ru_utime + usage.ru_stime
    return out


def _received(receiver: Any, expected: dict[str, int]) -> dict[str, int]:
    """Spans the receiver decoded, by service, once the count stops growing (at most 10 s)."""
    deadline = time.monotonic() + 10
    last: dict[str, int] = {}
    while True:
        counts = dict(receiver.counts)
        if counts == expected or (counts == last and time.monotonic() > deadline):
            return counts
        last = counts
        time.sleep(0.2)


def _per_batch(on: list[int], off: list[int], plan: Plan) -> dict[str, float]:
    ratios = []
    for start in range(0, min(len(on), len(off)), plan.batch):
        a, _ = percentiles(on[start : start + plan.batch])
        b, _ = percentiles(off[start : start + plan.batch])
        ratios.append(a / b)
    ratios.sort()
    return {"min": round(ratios[0], 2), "median": round(ratios[len(ratios) // 2], 2),
            "max": round(ratios[-1], 2)}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--agent"]:
        asyncio.run(_agent(sys.stdout, argv[1:2] == ["--sdk"]))
        return 0
    if argv[:1] == ["worker"] or argv[:2] == ["--sdk", "worker"]:  # a hook worker process
        from bus.telemetry import tracing
        from workers.cli import main as hookbus

        tracing.private_export = argv[0] != "--sdk"
        return hookbus(argv[argv.index("worker") :])
    if argv[:1] == ["--floor-agent"]:
        asyncio.run(_floor_agent(sys.stdout, *argv[1:3]))
        return 0
    parser = argparse.ArgumentParser(prog="python -m bench.tracing_cost", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="a few samples: checks it runs")
    parser.add_argument("--profile", type=Path, help="write py-spy profiles into this folder")
    args, _ = parser.parse_known_args(argv)
    plan = QUICK if args.quick else FULL
    print(
        f"tracing cost: 1-hook PreToolUse dispatches, tracing off and on (OTLP/HTTP), "
        f"{plan.rounds} alternating batches of {plan.batch} ...",
        flush=True,
    )
    report = {
        **header("tracing_cost", args.quick),
        "plan": plan.__dict__,
        **measure(plan, args.profile),
    }
    report["target"] = {
        **TARGET,
        "below_the_floor": True,
        "met": report["ratio_p50"] <= TARGET["max_ratio_p50"]
        and report["ratio_p99"] <= TARGET["max_ratio_p99"]
        and report["ratio_p50"] < report["floor_ratio_p50"]
        and report["ratio_p99"] < report["floor_ratio_p99"],
    }
    print(f"{'tracing':<10} {'p50 µs':>10} {'p99 µs':>10}")
    for name, _, _ in SIDES:
        print(f"{name:<10} {report[name]['p50_us']:>10.0f} {report[name]['p99_us']:>10.0f}")
    for who, prefix in (("HookBus", ""), ("HookBus, the SDK's exporter", "sdk_"),
                        ("the floor (stock OpenTelemetry SDK)", "floor_")):  # fmt: skip
        b = report[f"{prefix}ratio_p50_per_batch"]
        print(
            f"tracing on, {who}: {report[f'{prefix}ratio_p50']:.2f}x at p50 (batches "
            f"{b['min']:.2f}-{b['max']:.2f}x), {report[f'{prefix}ratio_p99']:.2f}x at p99"
        )
    print(f"spans received {report['spans']['received']} of {report['spans']['expected']}")
    print(f"CPU µs per dispatch: {report['cpu_us_per_dispatch']}")
    print(f"CPU µs per dispatch, agent + hook process: {report['cpu_us_per_dispatch_by_side']}")
    write_results(RESULTS, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
