"""Scale-out: decisions/s and events/s on one Redis node and on a 3-master Redis Cluster.

Two targets, each started by the benchmark on loopback and stopped at the end:

1 node
    one ``redis-server`` (AOF on, as the cluster's nodes), the one-node default layout:
    ``HOOKBUS_PARTITIONS=1``, one request stream per hook.
cluster
    a :class:`workers.local.redis_cluster.LocalCluster`: 3 masters + 3 replicas (asynchronous
    replication), ``redis+cluster://`` URLs, ``HOOKBUS_PARTITIONS=6`` and the hook's requests
    sharded 3 ways (``hookbus worker --shards 3``).

Two workloads on each, HookBus and a floor hand-written on the same library (redis-py asyncio,
``bench/cluster_load.py``) with the same key layout (bus/transport/keys.py), so the same slots:

decisions
    ``agents`` processes, each with ``sessions`` concurrent sessions making sequential
    PreToolUse calls to one no-op sync hook served by 2 replica processes. HookBus: a
    ``HookClient`` per process and ``hookbus worker bench.cluster:Noop [--shards 3]``. Floor: per
    call one pipelined XADD of the request (to the session's shard) + XADD of the event (to the
    session's partition), the reply BLMPOPed from one inbox per process; floor hooks XREADGROUP
    → pipelined RPUSH + XACK. Figure: decisions / (first agent's start → last agent's end).
events
    this process XADDs M events of 64 sessions (so every partition gets some) in batches of
    500, with ``bus.transport.redis_io.xadd_batch`` (what a coordinator publishes with) for HookBus
    and a raw pipeline for the floor, while the consumers are stopped (SIGSTOP); then the consumers
    go on (SIGCONT): 2 async hook groups of 2 replicas each, sharing the partitions. HookBus:
    ``hookbus worker bench.cluster:NoopA`` / ``NoopB``. Floor: one task per partition doing
    XREADGROUP BLOCK → decode → XACK. Figures: events/s = M / (consumers resumed → every group
    has delivered and acknowledged everything on every partition, read from XINFO GROUPS), and
    the publisher's M / publishing time, each measured alone.

And on the cluster, HookBus's durable mode (``HOOKBUS_DURABLE_REPLICAS=1``: ``WAIT 1`` after each
batch of XADDs, per master) for both workloads.

Per trial, besides the rate: the CPU time (``/proc``, user + system) of every process involved —
agents or publisher, hook processes, Redis masters, Redis replicas — divided by the decisions or
events; and each master's share of the load: its command calls (``INFO commandstats`` after a
``CONFIG RESETSTAT``), its CPU time, and the keys it holds. For the async hooks, the commands an
idle replica sends per second (the cost of waiting for events). Each (target, workload,
implementation) runs in turn with only its own processes up (started, warmed up, timed, stopped),
``rounds`` times in a rotating order; ratios are paired by round, then the median is reported.

On a machine whose cores are shared by every process here (clients, hooks and 6 redis-servers),
the cluster cannot show more throughput than one node: the CPU figures are what a capacity model
is built from (docs/scaling.md).

Usage: ``python -m bench.cluster [--quick]``; results go to ``bench/results/cluster.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import signal
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import redis as redis_py
from redis.asyncio import Redis

from bench.cluster_load import floor_connect
from bench.common import (
    Children,
    cpu_seconds,
    header,
    hookbus_env,
    progress,
    terminated,
    write_results,
)
from bench.sync_dispatch import _dying_with_us
from bus.actions import CONTINUE, PreToolUseAction
from bus.events import HookEvent, PostToolUseContext, PreToolUseContext, StepCompleteContext
from bus.hooks import AgentHook, AsyncAgentHook
from bus.protocol import EventMessage, encode, new_id, now_ms, raw
from bus.settings import BusSettings
from bus.transport.keys import Keys
from bus.transport.redis_io import close as close_client
from bus.transport.redis_io import connect, xadd_batch
from bus.transport.retention import hard_cap
from workers.local.redis_cluster import LocalCluster
from workers.local.redis_server import RedisServer

MODULE = "bench.cluster"
RESULTS = Path(__file__).resolve().parent / "results" / "cluster.json"
CLUSTER_PARTITIONS = 6
CLUSTER_SHARDS = 3
HOOK_REPLICAS = 2
GROUP_REPLICAS = 2
EVENT_SESSIONS = 64
CHUNK = 500  # events per publish batch
START_TIMEOUT = 60.0
RUN_TIMEOUT = 300.0
POLL_SECS = 0.005


@dataclass(frozen=True)
class Plan:
    agents: int  # agent processes
    sessions: int  # concurrent sessions per agent process
    calls: int  # sequential calls per session
    events: int  # events per timed trial
    warmup_events: int
    rounds: int
    idle_secs: float  # how long idle async replicas are watched
    quick: bool = False

    @property
    def decisions(self) -> int:
        return self.agents * self.sessions * self.calls


FULL = Plan(
    agents=2, sessions=16, calls=60, events=20_000, warmup_events=2_000, rounds=3, idle_secs=10.0
)
QUICK = Plan(
    agents=1,
    sessions=8,
    calls=20,
    events=2_000,
    warmup_events=200,
    rounds=1,
    idle_secs=2.0,  # at least one blocking wait (1 s) of every lane
    quick=True,
)


# -- the hooks --------------------------------------------------------------------------------


class Noop(AgentHook):
    """Answers Continue to PreToolUse without awaiting anything."""

    name = "bench-cluster-noop"
    subscribed_events = (HookEvent.PRE_TOOL_USE,)

    async def pre_tool_use(self, ctx: PreToolUseContext) -> PreToolUseAction:
        return CONTINUE


class NoopA(AsyncAgentHook):
    """An async hook subscribed to every event, whose methods do nothing."""

    name = "bench-cluster-async-a"


class NoopB(AsyncAgentHook):
    name = "bench-cluster-async-b"


ASYNC_HOOKS = (NoopA, NoopB)


# -- the targets ------------------------------------------------------------------------------


@dataclass
class Target:
    key: str  # "node" or "cluster"
    label: str
    url: str  # what HookBus and the floor are given
    partitions: int
    shards: int
    masters: list[tuple[int, int]]  # (port, pid) of each master
    replicas: list[int]  # pids

    def admin(self) -> list[tuple[int, redis_py.Redis]]:
        """A plain client of each master (INFO, CONFIG RESETSTAT, SCAN of that node only)."""
        return [(port, redis_py.Redis(port=port)) for port, _ in self.masters]

    def env(self, prefix: str, durable: bool = False) -> dict[str, str]:
        return {
            **hookbus_env(self.url, prefix),
            "HOOKBUS_PARTITIONS": str(self.partitions),
            "BENCH_SHARDS": str(self.shards),
            "HOOKBUS_DURABLE_REPLICAS": "1" if durable else "0",
        }

    def settings(self, prefix: str) -> BusSettings:
        return BusSettings(redis_url=self.url, prefix=prefix, partitions=self.partitions)


def node_target(server: RedisServer) -> Target:
    assert server.proc is not None
    return Target("node", "1 node", server.url, 1, 1, [(server.port, server.proc.pid)], [])


def cluster_target(cluster: LocalCluster) -> Target:
    ports = cluster.master_ports()
    masters = [(p, cluster.node(p).proc.pid) for p in ports]  # type: ignore[union-attr]
    replicas = [n.proc.pid for n in cluster.nodes if n.port not in ports and n.proc is not None]
    url = cluster.url.replace("redis://", "redis+cluster://", 1)
    return Target(
        "cluster", "3-master cluster", url, CLUSTER_PARTITIONS, CLUSTER_SHARDS, masters, replicas
    )


# -- measuring --------------------------------------------------------------------------------


class Meter:
    """CPU time per role and each master's commands, between ``start`` and ``stop``."""

    def __init__(self, target: Target, roles: dict[str, list[int]]) -> None:
        self.target = target
        self.roles = {
            **roles,
            "redis masters": [pid for _, pid in target.masters],
            "redis replicas": target.replicas,
        }
        self.admin = target.admin()
        self.cpu0: dict[str, float] = {}
        self.master_cpu0: list[float] = []

    def _cpu(self) -> dict[str, float]:
        return {role: cpu_seconds(pids) or 0.0 for role, pids in self.roles.items()}

    def start(self) -> None:
        for _, client in self.admin:
            client.config_resetstat()
        self.cpu0 = self._cpu()
        self.master_cpu0 = [cpu_seconds([pid]) or 0.0 for _, pid in self.target.masters]

    def stop(self, operations: int) -> dict[str, Any]:
        cpu1 = self._cpu()
        master_cpu = [
            (cpu_seconds([pid]) or 0.0) - before
            for (_, pid), before in zip(self.target.masters, self.master_cpu0, strict=True)
        ]
        by_command = [_by_command(client) for _, client in self.admin]
        calls = [sum(c.values()) for c in by_command]
        per_role = {
            role: round((cpu1[role] - self.cpu0[role]) / operations * 1e6, 1) for role in self.roles
        }
        return {
            "cpu_us": {"total": round(sum(per_role.values()), 1), **per_role},
            "masters": [
                {
                    "port": port,
                    "calls": c,
                    "cpu_s": round(cpu, 3),
                    "per_op": {k: round(v / operations, 3) for k, v in cmds.most_common(8)},
                }
                for (port, _), c, cpu, cmds in zip(
                    self.target.masters, calls, master_cpu, by_command, strict=True
                )
            ],
            "commands_per_op": round(sum(calls) / operations, 2),
        }

    def close(self) -> None:
        for _, client in self.admin:
            client.close()


def _by_command(client: redis_py.Redis) -> Counter[str]:
    """Calls of each command since the last CONFIG RESETSTAT (CONFIG itself left out)."""
    stats: Any = client.info("commandstats")
    return Counter(
        {
            k.removeprefix("cmdstat_"): int(v["calls"])
            for k, v in stats.items()
            if k != "cmdstat_config"
        }
    )


def _calls(client: redis_py.Redis) -> int:
    return sum(_by_command(client).values())


def shares(values: Sequence[float]) -> list[float]:
    total = sum(values)
    return [round(v / total, 3) if total else 0.0 for v in values]


def keys_per_master(target: Target, prefix: str, delete: bool = True) -> list[int]:
    """How many keys under ``prefix`` each master holds (SCAN of each node); then delete them."""
    counts = []
    for _, client in target.admin():
        found = list(client.scan_iter(match=f"{prefix}:*", count=1000))
        counts.append(len(found))
        if delete and found:
            with client.pipeline(transaction=False) as pipe:
                for key in found:  # one key per command: keys of one node, not of one slot
                    pipe.unlink(key)
                pipe.execute()
        client.close()
    return counts


async def collect(
    redis: Redis, key: str, count: int, children: Children, what: str, timeout: float
) -> list[bytes]:
    """Pop ``count`` items of list ``key`` (children push them), failing fast if one exits."""
    got: list[bytes] = []
    deadline = time.monotonic() + timeout
    while len(got) < count:
        children.check()
        popped: Any = await redis.blpop([key], timeout=1)
        if popped:
            got.append(popped[1])
        elif time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout:g}s waiting for {what}")
    return got


# -- one trial of decisions ---------------------------------------------------------------------


@dataclass
class Phase:
    """The processes of one trial: started together, stopped together."""

    children: Children
    name: str
    labels: list[str] = field(default_factory=list)
    pids: dict[str, list[int]] = field(default_factory=dict)

    def start(self, role: str, module: str, args: list[str], env: dict[str, str]) -> None:
        label = f"{self.name}-{role.replace(' ', '-')}-{len(self.labels)}"
        proc = self.children.start(label, module, args, env)
        self.labels.append(label)
        self.pids.setdefault(role, []).append(proc.pid)

    def stop(self) -> None:
        self.children.stop([label for label in self.labels if label in self.children.procs])


async def decisions_trial(
    target: Target, impl: str, plan: Plan, children: Children, tag: str
) -> dict[str, Any]:
    """One timed run of ``plan.decisions`` decisions; ``impl`` is hookbus, durable or floor."""
    prefix = f"cb{tag}-{target.key}-d-{impl}"
    env = target.env(prefix, durable=impl == "durable")
    hook = Noop.name
    phase = Phase(children, prefix)
    redis = floor_connect(target.url)
    clients0 = connected_clients(target)
    try:
        if impl == "floor":
            for _ in range(HOOK_REPLICAS):
                phase.start(
                    "hooks", "bench.cluster_load", ["floor-hook", target.url, prefix, hook], env
                )
            await collect(
                redis,
                f"{prefix}:bench:ready",
                HOOK_REPLICAS,
                children,
                "the floor hooks",
                START_TIMEOUT,
            )
        else:
            args = ["worker", f"{MODULE}:Noop", "--shards", str(target.shards)]
            for _ in range(HOOK_REPLICAS):
                phase.start("hooks", "workers.cli", args, env)
        kind = "floor-agent" if impl == "floor" else "agent"
        for n in range(plan.agents):
            phase.start(
                "agents",
                "bench.cluster_load",
                [kind, target.url, prefix, str(plan.sessions), str(plan.calls), hook],
                {**env, "BENCH_AGENT": str(n)},
            )
        await collect(
            redis,
            f"{prefix}:bench:ready",
            plan.agents,
            children,
            "the agents to warm up",
            START_TIMEOUT,
        )
        meter = Meter(target, phase.pids)
        meter.start()
        await redis.rpush(f"{prefix}:bench:go", *range(plan.agents))
        done = [
            json.loads(d)
            for d in await collect(
                redis, f"{prefix}:bench:done", plan.agents, children, "the agents", RUN_TIMEOUT
            )
        ]
        decisions = sum(d["calls"] for d in done)
        measured = meter.stop(decisions)
        clients = [b - a for a, b in zip(clients0, connected_clients(target), strict=True)]
        meter.close()
    finally:
        phase.stop()
        await redis.aclose()
    seconds = max(d["t1"] for d in done) - min(d["t0"] for d in done)
    return {
        "decisions": decisions,
        "seconds": round(seconds, 3),
        "per_sec": round(decisions / seconds, 1),
        **measured,
        "keys": keys_per_master(target, prefix),
        # connections the agent and hook processes hold on each master, per process
        "connections_per_process": [round(c / (plan.agents + HOOK_REPLICAS), 1) for c in clients],
    }


def connected_clients(target: Target) -> list[int]:
    counts = []
    for _, client in target.admin():
        counts.append(int(client.info("clients")["connected_clients"]))
        client.close()
    return counts


# -- one trial of events --------------------------------------------------------------------------


def payloads(n: int) -> list[tuple[str, bytes]]:
    """(session, encoded EventMessage) × n: PreToolUse, PostToolUse, StepComplete in turn, over
    ``EVENT_SESSIONS`` sessions."""
    out = []
    for i in range(n):
        session = f"bench-session-{i % EVENT_SESSIONS:03d}"
        args = {"path": f"src/app/module_{i % 50}.py", "limit": 200}
        ctx: Any
        if i % 3 == 0:
            event = HookEvent.PRE_TOOL_USE
            ctx = PreToolUseContext(
                session_id=session, tool_name="file_read", tool_args=args, step=i
            )
        elif i % 3 == 1:
            event = HookEvent.POST_TOOL_USE
            ctx = PostToolUseContext(
                session_id=session,
                tool_name="file_read",
                tool_args=args,
                step=i,
                output_content=f"def handler_{i}(request):\n    return respond(request)\n" * 2,
                elapsed_ms=3.5,
            )
        else:
            event = HookEvent.ON_STEP_COMPLETE
            ctx = StepCompleteContext(session_id=session, step=i, max_steps=10**6)
        message = EventMessage(
            id=new_id(), ts=now_ms(), event=event, session_id=session, context=raw(ctx)
        )
        out.append((session, encode(message)))
    return out


class Publisher:
    """XADDs events to their sessions' partitions: HookBus's way, or a raw pipeline."""

    def __init__(self, target: Target, prefix: str, impl: str) -> None:
        self.keys = Keys(prefix, target.partitions)
        self.impl = impl
        self.redis = (
            floor_connect(target.url) if impl == "floor" else connect(target.settings(prefix))
        )
        self.cap = hard_cap(BusSettings().events_maxlen)

    async def publish(self, events: list[tuple[str, bytes]]) -> dict[str, bytes]:
        """The last id XADDed to each partition."""
        last: dict[str, bytes] = {}
        for start in range(0, len(events), CHUNK):
            batch = [(self.keys.events(s), p, self.cap) for s, p in events[start : start + CHUNK]]
            if self.impl == "floor":
                async with self.redis.pipeline(transaction=False) as pipe:
                    for stream, payload, cap in batch:
                        pipe.xadd(stream, {"data": payload}, maxlen=cap, approximate=True)
                    results = await pipe.execute()
            else:
                results = await xadd_batch(
                    self.redis, batch, replicas=1 if self.impl == "durable" else 0
                )
            for (stream, _, _), result in zip(batch, results, strict=True):
                if isinstance(result, Exception):
                    raise RuntimeError(f"publishing to {stream} failed: {result}")
                last[stream] = result
        return last

    async def drained(self, groups: Sequence[str], last: dict[str, bytes]) -> None:
        """Until every group has delivered and acknowledged everything up to ``last``."""
        left = dict(last)
        deadline = time.monotonic() + RUN_TIMEOUT
        while left:
            for stream, last_id in list(left.items()):
                info: Any = await self.redis.xinfo_groups(stream)
                by_name = {_text(g["name"]): g for g in info}
                if all(
                    g in by_name
                    and _text(by_name[g]["last-delivered-id"]) == _text(last_id)
                    and by_name[g]["pending"] == 0
                    for g in groups
                ):
                    del left[stream]
            if left:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{len(left)} partitions not drained within {RUN_TIMEOUT}s")
                await asyncio.sleep(POLL_SECS)

    async def close(self) -> None:
        await close_client(self.redis)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


async def events_trial(
    target: Target,
    impl: str,
    plan: Plan,
    children: Children,
    tag: str,
    warm: list[tuple[str, bytes]],
    data: list[tuple[str, bytes]],
) -> dict[str, Any]:
    prefix = f"cb{tag}-{target.key}-e-{impl}"
    env = target.env(prefix)
    keys = Keys(prefix, target.partitions)
    groups = [h.name for h in ASYNC_HOOKS]
    phase = Phase(children, prefix)
    publisher = Publisher(target, prefix, impl)
    redis = publisher.redis
    try:
        for cls in ASYNC_HOOKS:
            for _ in range(GROUP_REPLICAS):
                if impl == "floor":
                    phase.start(
                        "consumers",
                        "bench.cluster_load",
                        ["floor-consumer", target.url, prefix, cls.name],
                        env,
                    )
                else:
                    phase.start(
                        "consumers", "workers.cli", ["worker", f"{MODULE}:{cls.__name__}"], env
                    )
        if impl == "floor":
            await collect(
                redis,
                f"{prefix}:bench:ready",
                len(groups) * GROUP_REPLICAS,
                children,
                "the floor consumers",
                START_TIMEOUT,
            )
        else:
            await until_registered(redis, keys, groups, children)
        idle = Meter(target, phase.pids)
        idle.start()
        await asyncio.sleep(plan.idle_secs)  # a window of measurement, not a synchronisation
        idle_calls = sum(_calls(c) for _, c in idle.admin)
        idle.close()
        await publisher.drained(groups, await publisher.publish(warm))
        # The consumers are stopped while the events go in, so that the publisher's rate and
        # the consumers' (a backlog of every partition, drained) are each measured alone.
        meter = Meter(target, phase.pids)
        meter.start()
        signal_all(phase.pids["consumers"], signal.SIGSTOP)
        cpu0 = time.process_time()
        t0 = time.monotonic()
        last = await publisher.publish(data)
        t_pub = time.monotonic()
        publish_cpu = time.process_time() - cpu0
        signal_all(phase.pids["consumers"], signal.SIGCONT)
        await publisher.drained(groups, last)
        t1 = time.monotonic()
        measured = meter.stop(len(data))
        meter.close()
        dead = sum(
            [await redis.xlen(keys.hook_dlq(g)) for g in groups] + [await redis.xlen(keys.dlq)]
        )
        if dead:
            raise RuntimeError(f"{impl} on {target.label}: {dead} dead letters: set-up is wrong")
    finally:
        signal_all(phase.pids.get("consumers", []), signal.SIGCONT)
        phase.stop()
        await publisher.close()
    measured["cpu_us"]["publisher"] = round(publish_cpu / len(data) * 1e6, 1)
    measured["cpu_us"]["total"] = round(
        measured["cpu_us"]["total"] + measured["cpu_us"]["publisher"], 1
    )
    return {
        "events": len(data),
        "seconds": round(t1 - t_pub, 3),
        "per_sec": round(len(data) / (t1 - t_pub), 1),
        "publish_seconds": round(t_pub - t0, 3),
        "publish_per_sec": round(len(data) / (t_pub - t0), 1),
        **measured,
        "idle_commands_per_sec_per_replica": round(
            idle_calls / plan.idle_secs / (len(groups) * GROUP_REPLICAS), 1
        ),
        "keys": keys_per_master(target, prefix),
    }


def signal_all(pids: Sequence[int], signum: int) -> None:
    for pid in pids:
        os.kill(pid, signum)


async def until_registered(
    redis: Redis, keys: Keys, groups: Sequence[str], children: Children
) -> None:
    """Every replica of every async hook has a heartbeat and its group on every partition."""
    deadline = time.monotonic() + START_TIMEOUT
    while True:
        children.check()
        beats = [await redis.zcount(keys.replicas(g), 0, "+inf") for g in groups]
        if all(b >= GROUP_REPLICAS for b in beats):
            named = [
                {_text(g["name"]) for g in await redis.xinfo_groups(p)}
                for p in keys.event_partitions
            ]
            if all(set(groups) <= n for n in named):
                return
        if time.monotonic() > deadline:
            raise RuntimeError(f"the async hooks did not register within {START_TIMEOUT:g}s")
        await asyncio.sleep(0.05)


# -- the run ----------------------------------------------------------------------------------

#: (target, workload, implementation) of every scenario, in the order of the first round.
SCENARIOS = [
    (t, w, i)
    for t in ("node", "cluster")
    for w in ("decisions", "events")
    for i in ("hookbus", "floor", "durable")
    if not (i == "durable" and t == "node")  # WAIT needs a replica: the cluster only
]


async def run(
    plan: Plan, targets: dict[str, Target], children: Children, workloads: Sequence[str]
) -> dict[str, Any]:
    warm, data = payloads(plan.warmup_events), payloads(plan.events)
    chosen = [s for s in SCENARIOS if s[0] in targets and s[1] in workloads]
    trials: dict[tuple[str, str, str], list[dict[str, Any]]] = {s: [] for s in chosen}
    for rnd in range(plan.rounds):
        order = chosen[rnd % len(chosen) :] + chosen[: rnd % len(chosen)]
        for scenario in order:
            t, w, i = scenario
            tag = f"{rnd}"
            if w == "decisions":
                trial = await decisions_trial(targets[t], i, plan, children, tag)
            else:
                trial = await events_trial(targets[t], i, plan, children, tag, warm, data)
            trials[scenario].append(trial)
            progress(
                f"round {rnd + 1}/{plan.rounds} {targets[t].label:<17} {w:<9} {i:<8} "
                f"{trial['per_sec']:>8,.0f}/s  CPU {trial['cpu_us']['total']:>6.0f} µs each"
                f"  masters' calls {shares([m['calls'] for m in trial['masters']])}"
            )
    return report(plan, targets, trials, sum(len(p) for _, p in data) / len(data))


def _median(values: Sequence[float]) -> float:
    return round(statistics.median(values), 3)


def _paired(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> float:
    """Median over rounds of a's rate over b's in the same round."""
    return _median([x["per_sec"] / y["per_sec"] for x, y in zip(a, b, strict=True)])


def median_shares(trials: list[dict[str, Any]], field: str) -> list[float]:
    """Each master's share of ``field`` (its value over the masters' sum), median over trials."""
    return [
        _median([shares([m[field] for m in t["masters"]])[k] for t in trials])
        for k in range(len(trials[0]["masters"]))
    ]


def summarise(trials: list[dict[str, Any]]) -> dict[str, Any]:
    roles = trials[0]["cpu_us"].keys()
    return {
        "per_sec": _median([t["per_sec"] for t in trials]),
        "best_per_sec": max(t["per_sec"] for t in trials),
        "cpu_us": {r: _median([t["cpu_us"][r] for t in trials]) for r in roles},
        "commands_per_op": _median([t["commands_per_op"] for t in trials]),
        "calls_share": median_shares(trials, "calls"),
        "cpu_share": median_shares(trials, "cpu_s"),
        "keys": trials[-1]["keys"],
        **(
            {"connections_per_process": trials[-1]["connections_per_process"]}
            if "connections_per_process" in trials[0]
            else {}
        ),
        **(
            {"publish_per_sec": _median([t["publish_per_sec"] for t in trials])}
            if "publish_per_sec" in trials[0]
            else {}
        ),
        **(
            {
                "idle_commands_per_sec_per_replica": _median(
                    [t["idle_commands_per_sec_per_replica"] for t in trials]
                )
            }
            if "idle_commands_per_sec_per_replica" in trials[0]
            else {}
        ),
        "trials": trials,
    }


def capacity(row: dict[str, Any], masters: int) -> dict[str, Any]:
    """What one master core and one client core carry, from CPU per operation (docs/scaling.md):
    a master is one thread, so one shard saturates near 1 s of its CPU per second."""
    cpu = row["cpu_us"]
    per_master = cpu["redis masters"] / masters  # per operation, on each master, if even
    clients = cpu["total"] - cpu["redis masters"] - cpu["redis replicas"]
    busiest = max(row["calls_share"]) if row["calls_share"] else 1.0
    return {
        "master_cpu_us_per_op": round(cpu["redis masters"], 1),
        "ops_per_sec_per_master_core": round(1e6 / cpu["redis masters"])
        if cpu["redis masters"]
        else None,
        "ops_per_sec_cluster_ceiling": (
            round(1e6 / (per_master * masters * busiest)) if per_master else None
        ),
        "client_cpu_us_per_op": round(clients, 1),
        "ops_per_sec_per_client_core": round(1e6 / clients) if clients else None,
    }


def report(
    plan: Plan,
    targets: dict[str, Target],
    trials: dict[tuple[str, str, str], list[dict[str, Any]]],
    event_bytes: float,
) -> dict[str, Any]:
    rows = []
    for (t, w, i), ts in trials.items():
        row = {"target": t, "workload": w, "impl": i, **summarise(ts)}
        if i != "floor":
            row["ratio_to_floor"] = _paired(ts, trials[(t, w, "floor")])
        if i == "durable":
            row["ratio_to_async"] = _paired(ts, trials[(t, w, "hookbus")])
        if t == "cluster" and i != "durable" and ("node", w, i) in trials:
            row["ratio_to_node"] = _paired(ts, trials[("node", w, i)])
        row["capacity"] = capacity(row, len(targets[t].masters))
        rows.append(row)
    return {
        **header("cluster", plan.quick),
        "redis_server": server_version(next(iter(targets.values()))),
        "redis_py": redis_py.__version__,
        "targets": {
            k: {
                "label": v.label,
                "masters": len(v.masters),
                "replicas": len(v.replicas),
                "partitions": v.partitions,
                "request_shards": v.shards,
            }
            for k, v in targets.items()
        },
        "plan": {
            "decisions_per_trial": plan.decisions,
            "agent_processes": plan.agents,
            "sessions_per_agent": plan.sessions,
            "hook_replicas": HOOK_REPLICAS,
            "events_per_trial": plan.events,
            "async_groups": len(ASYNC_HOOKS),
            "replicas_per_group": GROUP_REPLICAS,
            "event_sessions": EVENT_SESSIONS,
            "rounds": plan.rounds,
        },
        "event_bytes_mean": round(event_bytes, 1),
        "results": rows,
        **async_targets(rows),
    }


#: Issue 33's targets for async hooks on the cluster (same consumers: 2 groups x 2 replicas).
ASYNC_VS_FLOOR, ASYNC_VS_NODE, IDLE_COMMANDS = 0.9, 1.5, 40.0


def _drain_cpu(trial: dict[str, Any]) -> float:
    """CPU µs per event of the consumers and the masters: what draining the events cost."""
    return float(trial["cpu_us"]["consumers"] + trial["cpu_us"]["redis masters"])


def async_targets(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """HookBus's async hooks on the cluster against their targets, where the run has them.
    ``cpu_vs_floor``: the floor's CPU per event (consumers and masters) over HookBus's, paired by
    round, held to the rate's target: on shared cores a rate moves with the other processes,
    the CPU a drain costs much less."""
    by = {(r["target"], r["workload"], r["impl"]): r for r in rows}
    row = by.get(("cluster", "events", "hookbus"))
    if row is None:
        return {}
    floor = by.get(("cluster", "events", "floor"))
    cpu = None
    if floor is not None:  # the same work's CPU: steadier than a rate on shared cores
        pairs = zip(row["trials"], floor["trials"], strict=True)
        cpu = round(_median([_drain_cpu(f) / _drain_cpu(h) for h, f in pairs]), 2)
    figures = {
        "vs_floor": (row["ratio_to_floor"], ASYNC_VS_FLOOR),
        "cpu_vs_floor": (cpu, ASYNC_VS_FLOOR),
        "vs_node": (row.get("ratio_to_node"), ASYNC_VS_NODE),
        "idle_commands_per_sec": (row["idle_commands_per_sec_per_replica"], IDLE_COMMANDS),
    }
    return {
        "async_cluster_targets": {
            name: {
                "value": value,
                "target": target,
                "holds": None
                if value is None
                else (value <= target if name == "idle_commands_per_sec" else value >= target),
            }
            for name, (value, target) in figures.items()
        }
    }


def server_version(target: Target) -> str:
    (_, client), *_ = target.admin()
    try:
        return str(client.info("server").get("redis_version", "?"))
    finally:
        client.close()


def render(report: dict[str, Any]) -> str:
    p = report["plan"]
    lines = [
        f"scale-out: 1 node vs a 3-master cluster (3 replicas), median of {p['rounds']} round(s) "
        f"(Python {report['python']}, Redis {report['redis_server']}, redis-py "
        f"{report['redis_py']}, {report['cpus']} CPUs{', QUICK' if report['quick'] else ''})",
        f"decisions: {p['agent_processes']} agent process(es) x {p['sessions_per_agent']} "
        f"sessions, {p['decisions_per_trial']:,} per trial, 1 no-op sync hook x "
        f"{p['hook_replicas']} replicas; events: {p['events_per_trial']:,} per trial, "
        f"{p['async_groups']} async groups x {p['replicas_per_group']} replicas",
        "cluster: 6 partitions, requests in 3 shards; durable = HOOKBUS_DURABLE_REPLICAS=1 (WAIT)",
        "",
        f"{'target':<8} {'workload':<9} {'impl':<8} {'per s':>8} {'vs floor':>8} {'vs node':>8} "
        f"{'CPU µs/op':>9} {'masters µs':>10} {'clients µs':>10}  masters' share of calls",
    ]
    for r in report["results"]:
        cap = r["capacity"]
        vs_floor = f"{r['ratio_to_floor']:.2f}x" if "ratio_to_floor" in r else "-"
        vs_node = f"{r['ratio_to_node']:.2f}x" if "ratio_to_node" in r else "-"
        lines.append(
            f"{r['target']:<8} {r['workload']:<9} {r['impl']:<8} {r['per_sec']:>8,.0f} "
            f"{vs_floor:>8} {vs_node:>8} {r['cpu_us']['total']:>9.0f} "
            f"{cap['master_cpu_us_per_op']:>10.1f} {cap['client_cpu_us_per_op']:>10.1f}  "
            f"{'/'.join(f'{s:.2f}' for s in r['calls_share'])}"
        )
    lines.append("")
    for name, t in report.get("async_cluster_targets", {}).items():
        if t["value"] is not None:
            bound = "<=" if name == "idle_commands_per_sec" else ">="
            verdict = "HOLDS" if t["holds"] else "misses"
            lines.append(
                f"async hooks on the cluster, {name}: {t['value']:g} (target {bound} "
                f"{t['target']:g}) -> {verdict}"
            )
    for r in report["results"]:
        if r["impl"] == "durable":
            lines.append(
                f"durable mode ({r['workload']}): {r['ratio_to_async']:.2f}x the rate of "
                f"asynchronous replication"
            )
        if "publish_per_sec" in r:
            lines.append(
                f"publisher alone ({r['target']}, {r['impl']}): {r['publish_per_sec']:,.0f} "
                "events/s"
            )
        if "idle_commands_per_sec_per_replica" in r and r["impl"] != "durable":
            lines.append(
                f"idle async replica ({r['target']}, {r['impl']}): "
                f"{r['idle_commands_per_sec_per_replica']:,.0f} commands/s"
            )
    return "\n".join(lines)


P = TypeVar("P")


def chosen_plan(parser: argparse.ArgumentParser, args: argparse.Namespace, quick: P, full: P) -> P:
    """The plan ``--quick`` and ``--rounds`` ask for."""
    plan = quick if args.quick else full
    if args.rounds is not None:
        if args.rounds < 1:
            parser.error("--rounds must be at least 1")
        plan = dataclasses.replace(plan, rounds=args.rounds)  # type: ignore[type-var]
    return plan


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=f"python -m {MODULE}", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="few calls, one round (smoke test)")
    parser.add_argument("--rounds", type=int, help=f"rounds (default {FULL.rounds}; quick: 1)")
    parser.add_argument(
        "--only",
        metavar="TARGET",
        choices=["node", "cluster"],
        help="one target (its ratios to the other are left out)",
    )
    parser.add_argument(
        "--workload", choices=["decisions", "events"], help="one workload (default: both)"
    )
    args = parser.parse_args(argv)
    plan = chosen_plan(parser, args, QUICK, FULL)
    previous = signal.signal(signal.SIGTERM, terminated)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="hookbus-bench-") as logdir:
        children = Children(Path(logdir))
        server = RedisServer(extra=["--appendonly", "yes"])
        # A long node timeout: a loaded machine must not make a busy master look failed.
        cluster = LocalCluster(node_timeout_ms=5000)
        for node in [server, *cluster.nodes]:
            node.binary = _dying_with_us(node.binary, Path(logdir))
        try:
            server.start()
            cluster.start()
            progress(
                f"redis-server on port {server.port}, cluster from port {cluster.nodes[0].port}"
                f"; logs of the processes in {logdir}"
            )
            targets = {"node": node_target(server), "cluster": cluster_target(cluster)}
            if args.only:
                targets = {args.only: targets[args.only]}
            workloads = [args.workload] if args.workload else ["decisions", "events"]
            result = asyncio.run(run(plan, targets, children, workloads))
        finally:
            children.stop()
            cluster.close()
            server.close()
            signal.signal(signal.SIGTERM, previous)
    progress(f"done in {time.monotonic() - started:.0f} s")
    print(render(result), flush=True)
    write_results(RESULTS, result)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
