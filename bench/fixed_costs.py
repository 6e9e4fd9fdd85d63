"""Fixed costs: CPU time per operation of each process, HookBus beside its floor, in one run.

Latency on a loaded machine says as much about the other processes as about HookBus; the CPU
time a process spends per operation does not depend on who else runs. So each row here counts,
per process, the CPU time (user + system, every thread: ``/proc/PID/task/*/schedstat``, in
nanoseconds; ``time.process_time_ns()`` for this process) spent over batches of operations,
divided by the operations. HookBus and its floor run in alternating batches of the same run, so
that a slower moment of the machine (caches shared with a busy neighbour) spreads over both.

Rows:

in-process
    ``HookRegistry.run_pre_tool_use`` with 1 / 3 / 16 no-op hooks against pluggy calling as
    many no-op plugins (``bench.inprocess``'s floor). Target: ≤ 1.5× pluggy's CPU per call.
sync agent, 1 hook
    ``HookClient.run_pre_tool_use`` in this process against ``hookbus worker`` (a no-op hook),
    beside the floor agent and floor hook of ``bench.sync_dispatch`` / ``bench/floor_worker.py``.
    Target: the agent (this process) and the hook process each ≤ 1.2× the floor's.
coordinator service, 1 hook
    a foreign agent (this process: XADD a decision, BLPOP the reply) to the ``hookbus
    coordinator`` service against the floor service. Target: the service ≤ 1.1× the floor's.
cluster (skipped with ``--no-cluster``)
    HookBus on a 3-master ``LocalCluster`` (no replicas: the masters' own work only) against
    HookBus on one node (AOF on, as the cluster's nodes), the agent and service topologies
    above. Target: the agent's HookClient, the hook worker and the coordinator service each
    ≤ 1.3× one node's CPU per decision, and the masters' CPU per decision summed ≤ 1.3× the
    node's.

The Redis servers' CPU per operation is shown beside each row (it is no target but for the
cluster). Before the rounds, each process's idle CPU per second is measured (heartbeats,
blocking reads that time out, Redis's own cron; ``idle_ms_per_s``) and taken off each batch
for the time it lasted: a figure is what the operations cost, not what the process costs
while it waits (which a busy process spreads over many more operations). Each figure is the
median over the rounds, the ratio the median of the rounds' ratios (their range beside it).
This process is both HookBus's agent and the floor's.

Usage: ``python -m bench.fixed_costs [--quick] [--no-cluster] [--only PART]``; results go to
``bench/results/fixed_costs.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import os
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis as redis_py
from redis.asyncio import Redis, RedisCluster

from agent_adapter.client import HookClient
from bench import inprocess, sync_dispatch
from bench.common import Children, header, hookbus_env, progress, terminated, write_results
from bench.floor_worker import connect
from bus.actions import Continue
from bus.protocol import raw
from bus.settings import BusSettings, HookSettings
from bus.transport.keys import Keys
from workers.local.redis_cluster import LocalCluster
from workers.local.redis_server import RedisServer

RESULTS = Path(__file__).resolve().parent / "results" / "fixed_costs.json"
INPROCESS_HOOKS = (1, 3, 16)
TARGETS = {
    "inprocess": {"process": 1.5},
    "agent": {"agent": 1.2, "hook": 1.2},
    "service": {"service": 1.1},
    "cluster agent": {"agent": 1.3, "hook": 1.3, "redis": 1.3},
    "cluster service": {"service": 1.3, "hook": 1.3, "redis": 1.3},
}
CLUSTER_PARTITIONS = 6  # as bench.cluster's cluster target
#: The hook's request shards on the cluster, as bench.cluster's (and docs/scaling.md's advice
#: for a hot hook): a session's requests then go to the master of its events partition.
CLUSTER_SHARDS = 3
SELF = 0  # the pid that stands for this process


@dataclass(frozen=True)
class CpuPlan:
    """``rounds`` alternating batches of ``batch`` operations per side, after ``warmup``."""

    warmup: int
    rounds: int
    batch: int
    inprocess_batch: int
    idle_secs: float  # how long each process's idle CPU is measured, before the rounds


FULL = CpuPlan(warmup=300, rounds=15, batch=200, inprocess_batch=10_000, idle_secs=2.0)
QUICK = CpuPlan(warmup=20, rounds=2, batch=30, inprocess_batch=500, idle_secs=0.2)


def cpu_ns(pid: int) -> int:
    """CPU time of a process so far, in ns: every thread's (``schedstat``), or this process's."""
    if pid == SELF:
        return time.process_time_ns()
    total = 0
    for task in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(OSError), open(f"/proc/{pid}/task/{task}/schedstat") as f:
            total += int(f.read().split()[0])  # OSError: a thread that just ended
    return total


@dataclass
class Side:
    """One implementation of a row: its call and the processes to count (role → pids)."""

    call: Callable[[], Awaitable[Any]]
    roles: dict[str, list[int]]
    plain: bool = False  # a plain function, called without awaiting (pluggy)
    ns: dict[str, list[int]] = field(default_factory=dict)  # role → CPU ns of each batch
    wall: list[int] = field(default_factory=list)  # ns each batch took
    idle: dict[str, float] = field(default_factory=dict)  # role → CPU ns per s, no calls

    def cpu(self) -> dict[str, int]:
        return {role: sum(cpu_ns(p) for p in pids) for role, pids in self.roles.items()}

    async def batch(self, n: int) -> None:
        before, t0 = self.cpu(), time.monotonic_ns()
        call = self.call
        if self.plain:
            for _ in range(n):
                call()
        else:
            for _ in range(n):
                await call()
        self.wall.append(time.monotonic_ns() - t0)
        for role, spent in self.cpu().items():
            self.ns.setdefault(role, []).append(spent - before[role])

    def per_op(self, role: str, batch: int) -> list[float]:
        """µs of CPU per operation in each batch, less what the process spends idle."""
        rate = self.idle.get(role, 0.0)
        return [(ns - rate * wall / 1e9) / batch / 1000 for ns, wall in zip(self.ns[role],
                self.wall, strict=True)]  # fmt: skip


async def measure_idle(sides: dict[str, Side], seconds: float) -> None:
    """Each process's CPU per second with no calls (heartbeats, blocked reads timing out,
    Redis's own cron): subtracted from the batches, so that a figure is the operation's."""
    before = {label: side.cpu() for label, side in sides.items()}
    t0 = time.monotonic()
    await asyncio.sleep(seconds)  # a measuring period, not a wait for anything
    elapsed = time.monotonic() - t0
    for label, side in sides.items():
        side.idle = {r: (ns - before[label][r]) / elapsed for r, ns in side.cpu().items()}


async def alternate(
    sides: dict[str, Side], warmup: int, rounds: int, batch: int, idle_secs: float = 0.0
) -> None:
    """Warm each side up, measure the idle, then run the sides in alternating batches (the
    order rotating)."""
    for side in sides.values():
        await side.batch(warmup)
        side.ns.clear()
        side.wall.clear()
    gc.collect()
    gc.freeze()  # as a long-running agent host should (docs/performance.md)
    if idle_secs:
        await measure_idle(sides, idle_secs)
    order = list(sides.values())
    for r in range(rounds):
        for side in order[r % len(order) :] + order[: r % len(order)]:
            await side.batch(batch)


def row(
    what: str, ours: Side, floor: Side, batch: int, targets: dict[str, float]
) -> dict[str, Any]:
    """µs of CPU per operation of each role, both sides (medians over the rounds), the median
    of the rounds' ratios and their range, and each side's idle CPU."""
    roles: dict[str, Any] = {}
    for role in ours.roles:
        a, b = ours.per_op(role, batch), floor.per_op(role, batch)
        per_round = sorted(x / y for x, y in zip(a, b, strict=True) if y > 0)
        ratio = round(statistics.median(per_round), 2) if per_round else None
        roles[role] = {
            "hookbus_us": round(statistics.median(a), 2),
            "floor_us": round(statistics.median(b), 2),
            "ratio": ratio,
            "ratio_per_round": [round(per_round[0], 2), round(per_round[-1], 2)]
            if per_round
            else [],
            "idle_ms_per_s": [round(s.idle.get(role, 0.0) / 1e6, 2) for s in (ours, floor)],
        }
        if role in targets:
            roles[role]["target"] = targets[role]
            roles[role]["met"] = ratio is not None and ratio <= targets[role]
    return {"what": what, "roles": roles}


# -- in-process ------------------------------------------------------------------------------


async def inprocess_rows(plan: CpuPlan) -> list[dict[str, Any]]:
    rows = []
    ctx = inprocess._ctx()
    for n in INPROCESS_HOOKS:
        reg = inprocess.make_registry(inprocess.NoopHook, n)
        hook = inprocess.make_plugin_manager(n).hook.pre_tool_use
        result = await reg.run_pre_tool_use(ctx)
        _check(isinstance(result.action, Continue), f"dispatch answered {result}")
        _check(len(hook(ctx=ctx)) == n, f"pluggy did not call {n} plugins")

        ours = Side(lambda reg=reg: reg.run_pre_tool_use(ctx), {"process": [SELF]})
        floor = Side(lambda hook=hook: hook(ctx=ctx), {"process": [SELF]}, plain=True)
        await alternate({"hookbus": ours, "floor": floor}, plan.warmup * 10, plan.rounds,
                        plan.inprocess_batch)  # fmt: skip
        r = row(f"in-process, {n} no-op hook(s)", ours, floor, plan.inprocess_batch,
                TARGETS["inprocess"])  # fmt: skip
        r["hooks"] = n
        rows.append(r)
        progress(line(r))
    return rows


# -- over Redis ------------------------------------------------------------------------------


def _check(condition: bool, what: str) -> None:
    if not condition:
        raise RuntimeError(f"benchmark set-up is wrong: {what}")


async def wait_for(condition: Callable[[], Awaitable[bool]], children: Children, what: str) -> None:
    deadline = time.monotonic() + sync_dispatch.START_TIMEOUT
    while time.monotonic() < deadline:
        children.check()
        with contextlib.suppress(redis_py.RedisError):
            if await condition():
                return
        await asyncio.sleep(0.05)
    raise RuntimeError(f"timed out waiting for {what}")


@dataclass
class Deployment:
    """HookBus on one Redis target: a hook worker, a coordinator service, an agent client."""

    label: str
    url: str
    prefix: str
    partitions: int
    servers: list[int]  # pids of the Redis masters
    children: Children
    shards: int = 1  # the hook's request streams (``hookbus worker --shards``)
    worker: int = 0
    coordinator: int = 0
    client: HookClient | None = None

    def env(self) -> dict[str, str]:
        return {**hookbus_env(self.url, self.prefix), "HOOKBUS_PARTITIONS": str(self.partitions)}

    async def start(self) -> None:
        hook = sync_dispatch.NOOPS[0]
        target = f"{sync_dispatch.MODULE}:{hook.__name__}"
        self.worker = self.children.start(
            f"{self.label}-worker",
            "workers.cli",
            ["worker", target, "--shards", str(self.shards)],
            self.env(),
        ).pid
        self.coordinator = self.children.start(
            f"{self.label}-coordinator", "workers.cli", ["coordinator"], self.env()
        ).pid
        settings = BusSettings(redis_url=self.url, prefix=self.prefix, partitions=self.partitions)
        self.client = await HookClient(settings, HookSettings(hook_timeout_secs=10)).start()
        client = self.client

        async def live() -> bool:
            found = client.directory.by_name.get(hook.name)
            return found is not None and found.replicas >= 1

        await wait_for(live, self.children, f"the hook worker on {self.label}")

    async def agent_call(self) -> Any:
        assert self.client is not None
        return await self.client.run_pre_tool_use(CTX)

    def foreign_agent(self, redis: Redis) -> sync_dispatch.ForeignAgent:
        keys = Keys(self.prefix, self.partitions)
        return sync_dispatch.ForeignAgent(
            redis,
            self.prefix,
            sync_dispatch.hookbus_decision(raw(CTX)),
            keys.decision_partitions[0],
            keys.inbox(f"agent-{os.getpid()}"),
        )

    async def close(self) -> None:
        if self.client is not None:
            await self.client.close()


CTX = sync_dispatch.context()


async def service_ready(agent: sync_dispatch.ForeignAgent, children: Children) -> None:
    async def answered() -> bool:
        try:
            answer = await asyncio.wait_for(agent(), 3)
        except TimeoutError:
            return False
        return bool((answer.result or {}).get("action", {}).get("type") == "Continue")

    await wait_for(answered, children, f"the coordinator service on {agent.decisions}")


async def node_rows(plan: CpuPlan, url: str, server: int, children: Children) -> list[Any]:
    """Sync agent and coordinator service, 1 hook, HookBus against the floor on one node."""
    name = sync_dispatch.NOOPS[0].name
    floor_prefix = "fixed-floor"
    redis = connect(url)
    hookbus = Deployment("hb", url, "fixed-hb", 1, [server], children)
    try:
        await hookbus.start()
        floor_hook = children.start(
            "floor-worker", "bench.floor_worker", ["worker", url, floor_prefix, name]
        ).pid
        floor_service = children.start(
            "floor-service", "bench.floor_worker", ["service", url, floor_prefix, name]
        ).pid
        await sync_dispatch.wait_ready(redis, floor_prefix, 2, children)
        floor_agent = sync_dispatch.FloorAgent(redis, floor_prefix, [name])
        _check(await floor_agent() == 1, "the floor agent did not collect its reply")
        result = await hookbus.agent_call()
        _check(isinstance(result.action, Continue), f"HookClient answered {result}")

        progress("sync agent, 1 hook: HookClient + hookbus worker vs floor agent + floor hook")
        ours = Side(hookbus.agent_call, {"agent": [SELF], "hook": [hookbus.worker],
                                         "redis": [server]})  # fmt: skip
        floor = Side(floor_agent, {"agent": [SELF], "hook": [floor_hook], "redis": [server]})
        await alternate({"hookbus": ours, "floor": floor}, plan.warmup, plan.rounds, plan.batch,
                        plan.idle_secs)  # fmt: skip
        agent = row("sync agent, 1 hook", ours, floor, plan.batch, TARGETS["agent"])
        progress(line(agent))

        progress("coordinator service, 1 hook: hookbus coordinator vs the floor service")
        hb_agent = hookbus.foreign_agent(redis)
        floor_agent2 = sync_dispatch.ForeignAgent(
            redis, floor_prefix, sync_dispatch.floor_decision(raw(CTX))
        )
        await service_ready(hb_agent, children)
        ours = Side(hb_agent, {"service": [hookbus.coordinator], "hook": [hookbus.worker],
                               "agent": [SELF], "redis": [server]})  # fmt: skip
        floor = Side(floor_agent2, {"service": [floor_service], "hook": [floor_hook],
                                    "agent": [SELF], "redis": [server]})  # fmt: skip
        await alternate({"hookbus": ours, "floor": floor}, plan.warmup, plan.rounds, plan.batch,
                        plan.idle_secs)  # fmt: skip
        service = row("coordinator service, 1 hook", ours, floor, plan.batch, TARGETS["service"])
        progress(line(service))
        return [agent, service]
    finally:
        await hookbus.close()
        await redis.aclose()


async def cluster_rows(
    plan: CpuPlan, node: tuple[str, int], cluster: LocalCluster, children: Children
) -> list[Any]:
    """HookBus on a 3-master cluster (the 'hookbus' side) against HookBus on one node (the
    'floor' side of these rows), agent and service topologies, 1 hook."""
    masters = [cluster.node(p).proc.pid for p in cluster.master_ports()]  # type: ignore[union-attr]
    url = cluster.url.replace("redis://", "redis+cluster://", 1)
    one = Deployment("node", node[0], "fixed-node", 1, [node[1]], children)
    many = Deployment("cluster", url, "fixed-cluster", CLUSTER_PARTITIONS, masters, children,
                      shards=CLUSTER_SHARDS)  # fmt: skip
    plain = connect(node[0])
    spread = RedisCluster.from_url(cluster.url)
    try:
        for d in (one, many):
            await d.start()
        progress("cluster, agent topology: HookClient + hookbus worker, 3 masters vs one node")
        sides = {
            d.label: Side(d.agent_call, {"agent": [SELF], "hook": [d.worker], "redis": d.servers})
            for d in (many, one)
        }
        await alternate(sides, plan.warmup, plan.rounds, plan.batch, plan.idle_secs)
        agent = row("cluster vs one node, sync agent, 1 hook", sides["cluster"], sides["node"],
                    plan.batch, TARGETS["cluster agent"])  # fmt: skip
        progress(line(agent))

        progress("cluster, service topology: hookbus coordinator, 3 masters vs one node")
        agents = {"cluster": many.foreign_agent(spread), "node": one.foreign_agent(plain)}  # type: ignore[arg-type]
        for a in agents.values():
            await service_ready(a, children)
        sides = {
            d.label: Side(
                agents[d.label],
                {"service": [d.coordinator], "hook": [d.worker], "redis": d.servers},
            )
            for d in (many, one)
        }
        await alternate(sides, plan.warmup, plan.rounds, plan.batch, plan.idle_secs)
        service = row("cluster vs one node, coordinator service, 1 hook", sides["cluster"],
                      sides["node"], plan.batch, TARGETS["cluster service"])  # fmt: skip
        progress(line(service))
        return [agent, service]
    finally:
        for d in (one, many):
            await d.close()
        await plain.aclose()
        await spread.aclose()


# -- the run ---------------------------------------------------------------------------------


def line(r: dict[str, Any]) -> str:
    parts = []
    for role, v in r["roles"].items():
        mark = "" if "met" not in v else (" ok" if v["met"] else f" MISSES ≤{v['target']}x")
        parts.append(
            f"{role} {v['hookbus_us']:.1f} vs {v['floor_us']:.1f} µs = {v['ratio']}x"
            f" [{'-'.join(map(str, v['ratio_per_round']))}]{mark}"
        )
    return f"{r['what']}: " + "; ".join(parts)


def render(report: dict[str, Any]) -> str:
    lines = [
        f"fixed costs: CPU µs per operation of each process, HookBus vs its floor in one run "
        f"({report['cpus']} CPUs, load {report['load_average']}"
        f"{', QUICK' if report['quick'] else ''}); [min-max ratio over the rounds]"
    ]
    lines += [line(r) for r in report["rows"]]
    lines.append("(cluster rows: 'floor' = HookBus on one node)" if report["cluster"] else "")
    return "\n".join(lines)


async def run(
    plan: CpuPlan, with_cluster: bool, logdir: Path, only: str | None = None
) -> dict[str, Any]:
    children = Children(logdir)
    server = RedisServer(extra=["--appendonly", "yes"])  # as the cluster's nodes
    server.binary = sync_dispatch._dying_with_us(server.binary, logdir)
    cluster = LocalCluster(masters=3, replicas=0) if with_cluster else None
    try:
        rows = await inprocess_rows(plan) if only in (None, "inprocess") else []
        server.start()
        assert server.proc is not None
        if only in (None, "node"):
            rows += await node_rows(plan, server.url, server.proc.pid, children)
        if cluster is not None and only in (None, "cluster"):
            progress("starting a 3-master cluster")
            cluster.start()
            rows += await cluster_rows(plan, (server.url, server.proc.pid), cluster, children)
    finally:
        children.stop()
        server.close()
        if cluster is not None:
            cluster.close()
    return {
        **header("fixed_costs", plan is QUICK),
        "cluster": with_cluster,
        "batch": plan.batch,
        "rounds": plan.rounds,
        "rows": rows,
        "met": all(v.get("met", True) for r in rows for v in r["roles"].values()),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.fixed_costs", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="few iterations (smoke test)")
    parser.add_argument("--no-cluster", action="store_true", help="skip the cluster rows")
    parser.add_argument("--only", choices=("inprocess", "node", "cluster"), help="one part")
    args, _ = parser.parse_known_args(argv)
    previous = signal.signal(signal.SIGTERM, terminated)
    try:
        with tempfile.TemporaryDirectory(prefix="hookbus-fixed-") as logdir:
            report = asyncio.run(
                run(QUICK if args.quick else FULL, not args.no_cluster, Path(logdir), args.only)
            )
    finally:
        signal.signal(signal.SIGTERM, previous)
    print(render(report), flush=True)
    write_results(RESULTS, report)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
