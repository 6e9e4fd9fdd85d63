"""Async hook throughput over Redis: events/second through two consumer groups, end to end.

Topology, on one private ``redis-server`` that the benchmark starts and stops: one publisher (this
process) and two async hook services, each one worker process reading its own consumer group on
``{p}:events``, so that every event is handled twice. The publisher XADDs M pre-encoded
``EventMessage`` payloads (PreToolUse, PostToolUse and StepComplete in turn, as an agent would
publish them) as fast as it can, in pipelines of 1000; the figure is

    M / (time from the first XADD until BOTH groups have delivered and acknowledged all M)

where "acknowledged" is read from ``XINFO GROUPS`` (``last-delivered-id`` is the last id
published and ``pending`` is 0), polled every 2 ms once the last pipeline is in.

Scenarios (each on its own key prefix; all processes stay up for the whole run):

hookbus
    2 × ``hookbus worker bench.async_throughput:NoopA`` / ``NoopB``: AsyncAgentHooks subscribed
    to every event whose methods do nothing (one call per event).
hookbus, handles_batches
    the same with ``handles_batches = True`` and an ``on_batch`` that does nothing.
floor
    2 × ``python -m bench.async_floor``: raw redis-py (``redis.asyncio``, like HookBus) doing
    ``XREADGROUP COUNT 100 BLOCK`` → ``msgspec.json.decode`` of each ``data`` → one pipelined
    ``XACK`` per batch. The same publisher, M and payloads.

Every scenario is warmed up first (untimed), then the scenarios take turns, ``rounds`` times, in a
rotating order, so that a noisy moment of the machine spreads over all of them; the stream is
trimmed to empty after each trial. Reported per scenario: the median events/s of the rounds; the
ratio to the floor, paired (each round's events/s over the floor's in the same round, then the
median); and the consumers' CPU time (user + system, from ``/proc``) per event handled, which a
busy machine disturbs much less than wall-clock throughput. The target: HookBus (one call per
event) delivers at least 0.9× the floor's events/second.

Usage: ``python -m bench.async_throughput [--quick]``; results go to
``bench/results/async_throughput.json``. It starts worker processes and kills them all on exit.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import msgspec
import redis as redis_py

from bench.common import (
    Children,
    cpu_seconds,
    header,
    hookbus_env,
    progress,
    terminated,
    write_results,
)
from bus.events import HookEvent, PostToolUseContext, PreToolUseContext, StepCompleteContext
from bus.hooks import AsyncAgentHook, DeliveredEvent
from bus.protocol import DATA_FIELD, EventMessage, encode, new_id, now_ms, raw
from bus.transport.keys import Keys

MODULE = "bench.async_throughput"
RESULTS = Path(__file__).resolve().parent / "results" / "async_throughput.json"
TARGET_RATIO = 0.9
CHUNK = 1000  # XADDs per pipeline
POLL_SECS = 0.002


@dataclass(frozen=True)
class Plan:
    """``events`` per timed trial, ``rounds`` trials per scenario, after ``warmup`` events."""

    events: int
    rounds: int
    warmup: int


FULL = Plan(events=50_000, rounds=5, warmup=2_000)
QUICK = Plan(events=5_000, rounds=1, warmup=500)


# -- the hooks: no-op async hooks, subscribed to every event (no subscribed_events) -----------


class NoopA(AsyncAgentHook):
    """Every ``on_<event>_async`` is AsyncAgentHook's, which does nothing."""

    name = "bench-async-noop-a"


class NoopB(AsyncAgentHook):
    name = "bench-async-noop-b"


class NoopBatchA(AsyncAgentHook):
    """Receives each read batch in one ``on_batch`` call, which does nothing."""

    name = "bench-async-batch-a"
    handles_batches = True

    async def on_batch(self, batch: Sequence[DeliveredEvent]) -> None:
        return None


class NoopBatchB(NoopBatchA):
    name = "bench-async-batch-b"


# -- the events --------------------------------------------------------------------------------


def payloads(n: int) -> list[bytes]:
    """``n`` encoded EventMessages: PreToolUse, PostToolUse, StepComplete in turn."""
    out = []
    session = "bench-session-0001"
    for i in range(n):
        kind = i % 3
        ctx: Any
        if kind == 0:
            event = HookEvent.PRE_TOOL_USE
            ctx = PreToolUseContext(
                session_id=session,
                tool_name="file_read",
                tool_args={"path": f"src/app/module_{i % 50}.py", "limit": 200},
                step=i,
            )
        elif kind == 1:
            event = HookEvent.POST_TOOL_USE
            ctx = PostToolUseContext(
                session_id=session,
                tool_name="file_read",
                tool_args={"path": f"src/app/module_{i % 50}.py", "limit": 200},
                output_content=f"def handler_{i}(request):\n    return respond(request)\n" * 2,
                step=i,
                elapsed_ms=3.5,
            )
        else:
            event = HookEvent.ON_STEP_COMPLETE
            ctx = StepCompleteContext(
                session_id=session, step=i, max_steps=10**6, messages_count=i, estimated_tokens=4096
            )
        message = EventMessage(
            id=new_id(), ts=now_ms(), event=event, session_id=session, context=raw(ctx)
        )
        out.append(encode(message))
    return out


# -- the scenarios -----------------------------------------------------------------------------


@dataclass
class Scenario:
    """Two consumers (one per group) of ``{prefix}:events``, and how to tell they are reading."""

    key: str
    label: str
    prefix: str
    groups: tuple[str, str]
    commands: list[tuple[str, str, list[str], dict[str, str]]]  # (label, module, args, env)
    ready: Callable[[redis_py.Redis], bool]
    stream: str  # the events stream its consumers read
    trials: list[dict[str, Any]] = field(default_factory=list)
    pids: list[int] = field(default_factory=list)

    def start(self, children: Children) -> None:
        for label, module, args, env in self.commands:
            self.pids.append(children.start(label, module, args, env).pid)


def hookbus_scenario(
    key: str,
    label: str,
    prefix: str,
    hooks: tuple[type[AsyncAgentHook], type[AsyncAgentHook]],
    url: str,
) -> Scenario:
    names = (hooks[0].name, hooks[1].name)
    commands = [
        (f"{key}-{cls.__name__}", "workers.cli", ["worker", f"{MODULE}:{cls.__name__}"],
         hookbus_env(url, prefix))
        for cls in hooks
    ]  # fmt: skip

    def ready(r: redis_py.Redis) -> bool:
        return all(int(r.zcard(Keys(prefix).replicas(n))) >= 1 for n in names)

    return Scenario(key, label, prefix, names, commands, ready, Keys(prefix).event_partitions[0])


def floor_scenario(prefix: str, url: str) -> Scenario:
    groups = ("floor-a", "floor-b")
    ready_key = f"{prefix}:ready"
    commands = [
        (f"floor-{g}", "bench.async_floor", [url, f"{prefix}:events", g, ready_key],
         dict(os.environ))
        for g in groups
    ]  # fmt: skip

    def ready(r: redis_py.Redis) -> bool:
        return int(r.llen(ready_key)) >= len(groups)

    stream = f"{prefix}:events"
    return Scenario("floor", "raw redis-py floor", prefix, groups, commands, ready, stream)


def scenarios(url: str) -> list[Scenario]:
    return [
        floor_scenario("abench-floor", url),
        hookbus_scenario("hookbus", "hookbus", "abench-hb", (NoopA, NoopB), url),
        hookbus_scenario(
            "hookbus_batches",
            "hookbus, handles_batches",
            "abench-hbb",
            (NoopBatchA, NoopBatchB),
            url,
        ),
    ]


# -- one trial ---------------------------------------------------------------------------------


def wait_until(
    condition: Callable[[], bool], timeout: float, what: str, children: Children
) -> None:
    deadline = time.monotonic() + timeout
    next_check = 0.0
    while not condition():
        now = time.monotonic()
        if now > deadline:
            raise RuntimeError(f"timed out after {timeout:g}s waiting for {what}")
        if now > next_check:
            children.check()
            next_check = now + 0.5
        time.sleep(POLL_SECS)


def publish(r: redis_py.Redis, stream: str, data: list[bytes]) -> bytes:
    """XADD every payload in pipelines of CHUNK; the id of the last entry."""
    last = b""
    for start in range(0, len(data), CHUNK):
        pipe = r.pipeline(transaction=False)
        for p in data[start : start + CHUNK]:
            pipe.xadd(stream, {DATA_FIELD: p})
        last = pipe.execute()[-1]
    return last


def drained(r: redis_py.Redis, s: Scenario, last: bytes) -> bool:
    """Both groups have read up to ``last`` and acknowledged everything."""
    by_name = {g["name"].decode(): g for g in r.xinfo_groups(s.stream)}
    return all(
        g in by_name and by_name[g]["last-delivered-id"] == last and by_name[g]["pending"] == 0
        for g in s.groups
    )


def _per_event_us(before: float | None, after: float | None, events: int) -> float | None:
    if before is None or after is None:
        return None
    return round((after - before) / events * 1e6, 2)


def trial(
    r: redis_py.Redis, s: Scenario, data: list[bytes], children: Children, server_pid: int
) -> dict[str, Any]:
    """Publish ``data`` and wait until both groups are done; the stream is emptied after."""
    consumers0, server0 = cpu_seconds(s.pids), cpu_seconds([server_pid])
    t0 = time.perf_counter()
    last = publish(r, s.stream, data)
    t_pub = time.perf_counter()
    wait_until(
        lambda: drained(r, s, last),
        timeout=max(60.0, len(data) / 500),
        what=f"{s.label} to acknowledge {len(data)} events",
        children=children,
    )
    t_end = time.perf_counter()
    consumers1, server1 = cpu_seconds(s.pids), cpu_seconds([server_pid])
    keys = Keys(s.prefix)  # key layout 3: each hook's dead letters in its own stream
    dead = sum(int(r.xlen(d)) for d in [keys.dlq, *(keys.hook_dlq(g) for g in s.groups)])
    if dead:
        raise RuntimeError(f"{s.label}: {dead} events dead-lettered: the benchmark set-up is wrong")
    r.xtrim(s.stream, maxlen=0, approximate=False)
    n = len(data)
    return {
        "events": n,
        "seconds": round(t_end - t0, 4),
        "publish_seconds": round(t_pub - t0, 4),
        "events_per_sec": round(n / (t_end - t0), 1),
        "publish_events_per_sec": round(n / (t_pub - t0), 1),
        # each consumer handles every event once: CPU of both / (2 n) is per event handled
        "consumer_cpu_us_per_event": _per_event_us(consumers0, consumers1, 2 * n),
        "redis_cpu_us_per_event": _per_event_us(server0, server1, n),
    }


# -- the run -----------------------------------------------------------------------------------


def run(plan: Plan, url: str, children: Children, server_pid: int) -> dict[str, Any]:
    r = redis_py.Redis.from_url(url)
    try:
        all_ = scenarios(url)
        progress("starting 2 floor consumers, 2 hookbus workers, 2 hookbus batch workers")
        for s in all_:
            s.start(children)
        for s in all_:
            wait_until(partial(s.ready, r), 30, f"{s.label} to register", children)
        progress("all consumers registered; encoding payloads")
        warm = payloads(plan.warmup)
        data = payloads(plan.events)
        size = sum(map(len, data)) / len(data)
        for s in all_:
            trial(r, s, warm, children, server_pid)
        progress(f"warmed up ({plan.warmup:,} events each); {plan.events:,} events per trial")
        for rnd in range(plan.rounds):
            order = all_[rnd % len(all_) :] + all_[: rnd % len(all_)]
            for s in order:
                t = trial(r, s, data, children, server_pid)
                s.trials.append(t)
                cpu = t["consumer_cpu_us_per_event"]
                progress(
                    f"round {rnd + 1}/{plan.rounds}  {s.label:<25} {t['events_per_sec']:>9,.0f} "
                    f"ev/s  ({t['seconds']:.2f} s, publish alone {t['publish_seconds']:.2f} s"
                    + (f"; consumer CPU {cpu:.1f} µs/event)" if cpu is not None else ")")
                )
        server_version = r.info("server").get("redis_version", "?")
    finally:
        r.close()
    return report(plan, all_, size, server_version)


def _median(values: Sequence[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return round(statistics.median(known), 2) if known else None


def report(plan: Plan, all_: list[Scenario], size: float, server: str) -> dict[str, Any]:
    floor = next(s for s in all_ if s.key == "floor")
    rows = []
    for s in all_:
        rates = [t["events_per_sec"] for t in s.trials]
        # Paired: each round's rate over the floor's in the same round, then the median.
        ratios = [
            t["events_per_sec"] / f["events_per_sec"]
            for t, f in zip(s.trials, floor.trials, strict=True)
        ]
        cpu = _median([t["consumer_cpu_us_per_event"] for t in s.trials])
        floor_cpu = _median([t["consumer_cpu_us_per_event"] for t in floor.trials])
        rows.append(
            {
                "scenario": s.key,
                "label": s.label,
                "events_per_sec": round(statistics.median(rates), 1),
                "best_events_per_sec": round(max(rates), 1),
                "ratio_to_floor": round(statistics.median(ratios), 3),
                "publish_events_per_sec": round(
                    statistics.median(t["publish_events_per_sec"] for t in s.trials), 1
                ),
                "consumer_cpu_us_per_event": cpu,
                "cpu_ratio_to_floor": round(floor_cpu / cpu, 3) if cpu and floor_cpu else None,
                "redis_cpu_us_per_event": _median([t["redis_cpu_us_per_event"] for t in s.trials]),
                "trials": s.trials,
            }
        )
    primary = next(row for row in rows if row["scenario"] == "hookbus")
    return {
        **header("async_throughput", plan is QUICK),
        "redis_server": server,
        "redis_py": redis_py.__version__,
        "hiredis": bool(redis_py.utils.HIREDIS_AVAILABLE),
        "msgspec": msgspec.__version__,
        "consumer_groups": 2,
        "events_per_trial": plan.events,
        "rounds": plan.rounds,
        "warmup_events": plan.warmup,
        "payload_bytes_mean": round(size, 1),
        "pipeline_chunk": CHUNK,
        "results": rows,
        "target": {
            "scenario": "hookbus",
            "min_ratio": TARGET_RATIO,
            "ratio": primary["ratio_to_floor"],
            "met": primary["ratio_to_floor"] >= TARGET_RATIO,
        },
    }


def render(report: dict[str, Any]) -> str:
    lines = [
        f"async hook throughput, 2 consumer groups, {report['events_per_trial']:,} events per "
        f"trial, median of {report['rounds']} round(s) (Python {report['python']}, Redis "
        f"{report['redis_server']}, redis-py {report['redis_py']}"
        f"{' + hiredis' if report['hiredis'] else ''}, {report['cpus']} CPUs, "
        f"{report['payload_bytes_mean']:.0f}-byte events{', QUICK' if report['quick'] else ''})",
        "",
        f"{'scenario':<25}  {'events/s':>9}  {'best':>9}  {'ratio to floor':>14}  "
        f"{'consumer CPU µs/event':>21}  {'CPU ratio':>9}",
    ]
    for row in report["results"]:
        cpu, cpu_ratio = row["consumer_cpu_us_per_event"], row["cpu_ratio_to_floor"]
        lines.append(
            f"{row['label']:<25}  {row['events_per_sec']:>9,.0f}  "
            f"{row['best_events_per_sec']:>9,.0f}  {row['ratio_to_floor']:>13.2f}x  "
            + (f"{cpu:>21.1f}" if cpu is not None else f"{'-':>21}")
            + "  "
            + (f"{cpu_ratio:>8.2f}x" if cpu_ratio is not None else f"{'-':>9}")
        )
    pub = max(row["publish_events_per_sec"] for row in report["results"])
    t = report["target"]
    verdict = "HOLDS" if t["met"] else "DOES NOT HOLD"
    lines += [
        "",
        "ratio to floor: median over rounds of events/s over the floor's in the same round;",
        "CPU ratio: the floor's consumer CPU per event over this row's (1.00x = as cheap).",
        f"the publisher alone XADDs up to {pub:,.0f} events/s (a ceiling for every row); "
        f"load average at the end {report['load_average']}",
        f"target: hookbus at least {t['min_ratio']:g}x the floor -> {verdict} ({t['ratio']:.2f}x)",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=f"python -m {MODULE}", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="few events, one round (smoke test)")
    args = parser.parse_args(argv)
    plan = QUICK if args.quick else FULL

    from workers.local.redis_server import RedisServer

    previous = signal.signal(signal.SIGTERM, terminated)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="hookbus-bench-") as logdir:
        children = Children(Path(logdir))
        server = RedisServer()
        try:
            server.start()
            progress(f"redis-server on port {server.port}; logs of the workers in {logdir}")
            server_pid = server.proc.pid if server.proc is not None else -1
            result = run(plan, server.url, children, server_pid)
        finally:
            children.stop()
            server.close()
            signal.signal(signal.SIGTERM, previous)
    progress(f"done in {time.monotonic() - started:.0f} s")
    print(render(result), flush=True)
    write_results(RESULTS, result)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
