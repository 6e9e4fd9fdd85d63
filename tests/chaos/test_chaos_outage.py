"""One master of a Redis Cluster fails under load: who pays for it.

A private cluster (3 masters, ``cluster-node-timeout`` 1 s, ``cluster-require-full-coverage no``
on every node but in the last case). 3 partitions, and the ``fail`` hook Guard served
with ``--shards 4`` by two processes, so that sessions' requests and events spread over every
master. One agent process (one HookClient) runs one closed loop of PreToolUse decisions per
session; the async hook Ledger (one replica) records every event it handles. The killed
master holds none of the bus-wide keys (the prefix is chosen so that they
share the master of Guard's own keys) and not the client's inbox: what cannot be spread (docs/
scaling.md, "What one master's outage costs") is left out, and the sessions whose keys are on
the healthy masters must not notice the outage.

* Durable mode, one replica per master: the master is SIGKILLed, its replica promoted, and that
  master has no replica left until the killed node comes back (as a replica): ``WAIT 1`` fails
  there, after its timeout. The sessions whose keys are elsewhere are never blocked; the
  victim's sessions fail closed until the replica is back, then are decided again. Ledger
  handles every event published on the healthy masters after the kill.
* No replica at all: the master is SIGKILLed and nothing replaces it. The sessions whose keys
  are elsewhere are never blocked; the victim's sessions fail closed, within their deadline.
  Ledger handles every event published on the healthy masters after the kill.
* Redis's default, ``cluster-require-full-coverage yes``: once a master is flagged as failed and
  while no replica serves its slots, a master that sees it so refuses every command
  (``CLUSTERDOWN``): with no replica, sessions whose keys are elsewhere are blocked too; with
  one, they may be until it is promoted (how many depends on when each master sees the flag:
  from 2 to 4,614 in the runs of docs/scaling.md), and are decided again after it.
"""

from __future__ import annotations

import asyncio
import gc
import itertools
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import msgspec
import pytest
from redis.crc import key_slot

from agent_adapter.client import HookClient
from bus import HookEvent, HookSettings
from bus.events import PreToolUseContext
from bus.settings import BusSettings
from bus.transport.clock import offset_from
from bus.transport.keys import Keys
from bus.transport.redis_io import close, connect
from tests.chaos.conftest import Ledger
from tests.chaos.load import CHAOS_EVENTS_MAXLEN, GUARD, GUARD_TIMEOUT, SLACK
from tests.harness import Processes, wait_for, wait_live
from tests.remote_hooks import AsyncConfig
from workers.local.redis_cluster import LocalCluster

pytestmark = pytest.mark.timeout(300)

PRE = HookEvent.PRE_TOOL_USE
PARTITIONS = 3
#: Not a multiple of the partitions' count: a session's requests then go to shard crc32 mod 4,
#: not beside its partition (Keys.shard), so that some sessions' events and requests are on
#: different masters, and a refused event is seen not to block a decision.
SHARDS = 4
BEFORE, DURING = 2.0, 3.0  # seconds of load before the kill, and with the master gone


@contextmanager
def cluster_of(replicas: int, full_coverage: bool) -> Iterator[LocalCluster]:
    """A private cluster; unless ``full_coverage`` (Redis's default), its masters keep serving
    their own slots while another's have no master."""
    with LocalCluster(replicas=replicas) as cluster:
        if not full_coverage:
            for node in cluster.nodes:
                cluster.info(node, "config", "set", "cluster-require-full-coverage", "no")
        yield cluster


def master_ports(cluster: LocalCluster) -> dict[int, int]:
    """Slot → port of its master, for every slot."""
    ports: dict[int, int] = {}
    for line in cluster.info(cluster.nodes[0], "cluster", "nodes").splitlines():
        fields = line.split()
        if len(fields) > 8 and "master" in fields[2]:
            port = int(fields[1].split("@")[0].rsplit(":", 1)[1])
            for part in fields[8:]:
                low, _, high = part.partition("-")
                for slot in range(int(low), int(high or low) + 1):
                    ports[slot] = port
    return ports


def bus_wide(prefix: str) -> list[str]:
    """The keys (and the control channel) every session's decisions need, wherever its own
    keys are: the hook directory's, the bus's configuration, Guard's manifest and replicas."""
    keys = Keys(prefix, PARTITIONS)
    return [keys.hooks, keys.modes, keys.breakglass, keys.config, keys.control,
            keys.manifest("Guard"), keys.replicas("Guard")]  # fmt: skip


def prefix_beside_guard(masters: dict[int, int]) -> str:
    """A key prefix whose bus-wide keys all live on the master of Guard's own keys."""
    home = masters[key_slot(b"Guard")]
    for n in itertools.count():
        prefix = f"outage{n}"
        if all(masters[key_slot(k.encode())] == home for k in bus_wide(prefix)):
            return prefix
    raise AssertionError("unreachable")


class Sessions:
    """One closed loop of PreToolUse decisions per session; per session, how many were
    checked by Guard, how many blocked (and when), and the slowest."""

    def __init__(self, client: HookClient, sessions: list[str]) -> None:
        self.client = client
        self.sessions = sessions
        self.checked = dict.fromkeys(sessions, 0)
        self.blocked: dict[str, list[float]] = {s: [] for s in sessions}
        self.slowest = dict.fromkeys(sessions, 0.0)
        self.done: list[tuple[str, float]] = []  # (session, when) of each checked decision

    async def run(self, stop: asyncio.Event) -> None:
        async def loop(session: str) -> None:
            for i in itertools.count(1):
                if stop.is_set():
                    return
                ctx = PreToolUseContext(session_id=session, tool_name="act", tool_args={"x": i})
                t0 = time.monotonic()
                result = await self.client.run_pre_tool_use(ctx)
                now = time.monotonic()
                self.slowest[session] = max(self.slowest[session], now - t0)
                if result.is_blocked:
                    self.blocked[session].append(now)
                else:
                    assert result.final_args == {"x": -1}, "a decision without Guard's answer"
                    self.checked[session] += 1
                    self.done.append((session, now))

        await asyncio.gather(*(loop(s) for s in self.sessions))

    def rate(self, sessions: list[str], start: float, end: float) -> float:
        """Decisions checked by Guard per second, of ``sessions``, between ``start`` and
        ``end``."""
        chosen = set(sessions)
        n = sum(start <= t < end and s in chosen for s, t in self.done)
        return n / max(end - start, 1e-9)


def spread_sessions(keys: Keys, per_partition: int = 2) -> list[str]:
    found: dict[int, list[str]] = {i: [] for i in range(keys.partitions)}
    for n in itertools.count():
        sid = f"session-{n}"
        if len(found[keys.partition(sid)]) < per_partition:
            found[keys.partition(sid)].append(sid)
        if all(len(v) == per_partition for v in found.values()):
            return [sid for sids in found.values() for sid in sids]
    raise AssertionError("unreachable")


@pytest.mark.filterwarnings("ignore:unclosed:ResourceWarning")
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
@pytest.mark.parametrize(
    ("replicas", "full_coverage"),
    [(1, False), (0, False), (1, True), (0, True)],
    ids=["durable-one-replica", "no-replica", "full-coverage-durable", "full-coverage-no-replica"],
)
async def test_one_masters_outage_costs_only_the_sessions_whose_keys_it_holds(
    replicas: int, full_coverage: bool, procs: Processes, ledger: Ledger, tmp_path: Path
) -> None:
    with cluster_of(replicas, full_coverage) as cluster:
        masters = master_ports(cluster)
        settings = BusSettings(
            redis_url=cluster.url.replace("redis://", "redis+cluster://", 1),
            prefix=prefix_beside_guard(masters),
            heartbeat_secs=0.2,
            liveness_secs=1.0,
            claim_idle_secs=0.5,
            refresh_secs=0.2,
            partitions=PARTITIONS,
            events_maxlen=CHAOS_EVENTS_MAXLEN,
            durable_replicas=replicas,
        )
        keys = Keys.of(settings)
        for _ in range(2):
            procs.scripted(settings, GUARD, "--shards", str(SHARDS))
        handled = tmp_path / "handled.txt"
        handled.touch()
        procs.worker(settings, "tests.remote_hooks:ScriptedAsync", "ledger",
                     HOOKBUS_TEST_ASYNC=msgspec.json.encode(
                         AsyncConfig(name="Ledger", record=str(handled))).decode())  # fmt: skip
        sessions = spread_sessions(keys)

        def master_of(key: str) -> int:
            return masters[key_slot(key.encode())]

        async with HookClient(settings, HookSettings(hook_timeout_secs=GUARD_TIMEOUT)) as client:
            await wait_live(client, "Guard", replicas=2)
            await wait_for(lambda: "Ledger" in client.directory.async_hooks, what="Ledger")
            spared = {master_of(k) for k in [*bus_wide(settings.prefix), client.inbox]}
            victim = next(p for p in sorted(set(masters.values())) if p not in spared)

            # A session's decisions need its requests' stream; its events' (the partition's)
            # are published beside them, and a refused event does not block the decision.
            hit = [
                s for s in sessions if master_of(client.directory.requests("Guard", s)) == victim
            ]
            healthy = [s for s in sessions if s not in hit]
            events_hit = [s for s in healthy if master_of(keys.events(s)) == victim]
            assert hit and events_hit and len(healthy) > len(events_hit), (hit, events_hit)
            load = Sessions(client, sessions)
            stop = asyncio.Event()
            running = asyncio.create_task(load.run(stop))
            started = time.monotonic()
            await asyncio.sleep(BEFORE)  # load before the kill (a duration, not a synchronisation)
            # The async hook Ledger keeps handling the partitions of the healthy masters.
            elsewhere = [p for p in keys.event_partitions if master_of(p) != victim]
            last = {p: (await client.redis.xrevrange(p, count=1))[0][0] for p in elsewhere}
            cluster.kill_master(victim)
            killed_at = time.monotonic()
            promoted_after: float | None = None
            if replicas:
                await asyncio.to_thread(cluster.wait_promoted, victim)
                promoted_after = time.monotonic() - killed_at
            await wait_for(lambda: all(load.blocked[s] for s in hit), 60,
                           "every session on the killed master to be blocked")  # fmt: skip
            if replicas:  # the sessions elsewhere are decided again (full coverage: again)
                checked = dict(load.checked)
                await wait_for(lambda: all(load.checked[s] > checked[s] for s in healthy), 60,
                               "the sessions elsewhere to be decided again")  # fmt: skip
            await asyncio.sleep(DURING)  # load with the master (or its replica) gone
            gone_until = time.monotonic()
            after: set[str] = set()
            if not full_coverage:
                for p in elsewhere:  # what was published there after the kill
                    entries = await client.redis.xrange(p, min=b"(" + last[p])
                    after |= {msgspec.json.decode(f[b"data"])["id"] for _, f in entries}
                await wait_for(lambda: not after - set(handled.read_text().split()), 60,
                               "Ledger to handle the healthy partitions' events")  # fmt: skip
            back_after: float | None = None
            if replicas:  # the killed node comes back, as the new master's replica
                cluster.node(victim).restart()
                checked = dict(load.checked)
                await wait_for(lambda: all(load.checked[s] > checked[s] for s in hit), 60,
                               "the sessions of the killed master to be decided again")  # fmt: skip
                back_after = time.monotonic() - gone_until
            stop.set()
            await running

    ledger.add(
        mode=(f"durable (WAIT 1), {replicas} replica per master" if replicas else "no replica")
        + (", cluster-require-full-coverage yes" if full_coverage else ""),
        **{"sessions: requests on the killed master": len(hit)},
        **{"sessions: events only on it / neither": (
            f"{len(events_hit)} / {len(healthy) - len(events_hit)}")},
        **{"promotion took (s)": f"{promoted_after:.1f}" if promoted_after else "none"},
        **{"checked/s elsewhere, before / after kill": (
            f"{load.rate(healthy, started, killed_at):.0f} / "
            f"{load.rate(healthy, killed_at, gone_until):.0f}")},
        **{"checked/s on it, before / after kill": (
            f"{load.rate(hit, started, killed_at):.0f} / "
            f"{load.rate(hit, killed_at, gone_until):.0f}")},
        **{"blocked elsewhere (events on it / neither)": (
            f"{sum(len(load.blocked[s]) for s in events_hit)} / "
            f"{sum(len(load.blocked[s]) for s in healthy if s not in events_hit)}")},
        **{"blocked on the killed master": sum(len(load.blocked[s]) for s in hit)},
        **{"slowest decision elsewhere (s)": f"{max(load.slowest[s] for s in healthy):.3f}"},
        **{"slowest decision on it (s)": f"{max(load.slowest[s] for s in hit):.3f}"},
        **{"events refused (their partition's master)": client.stats["publish_failures"]},
        **{"events handled elsewhere after the kill": len(after) if after else "-"},
        **{"decided again after the replica came back (s)": (
            f"{back_after:.1f}" if back_after is not None else "-")},
    )  # fmt: skip
    gc.collect()
    assert all(load.checked[s] > 0 for s in sessions)
    assert full_coverage or after, "no event published on the healthy masters after the kill"
    blocked_elsewhere = {s: len(load.blocked[s]) for s in healthy}
    if not full_coverage:
        assert not any(blocked_elsewhere.values()), blocked_elsewhere
    elif not replicas:  # a master that sees a slot without a master refuses every key
        assert any(blocked_elsewhere.values()), blocked_elsewhere
    assert max(load.slowest.values()) <= GUARD_TIMEOUT + SLACK


async def test_a_process_starts_while_a_master_is_down() -> None:
    """A new process (a restarted pod, a scale-out) connects while the master redis-py would
    ask first (slot 0's) is down for good: it learns the command table from another node and
    reaches the keys of the healthy masters (it could not before: bus/transport/redis_io.py,
    ``ClusterClient._refresh_topology``)."""
    with cluster_of(replicas=0, full_coverage=False) as cluster:
        masters = master_ports(cluster)
        victim = masters[0]
        seed = next(n for n in cluster.nodes if n.port != victim)
        cluster.kill_master(victim)
        healthy = next(k for k in (f"k{i}" for i in itertools.count())
                       if masters[key_slot(k.encode())] != victim)  # fmt: skip
        settings = BusSettings(redis_url=seed.url.replace("redis://", "redis+cluster://", 1))
        redis = connect(settings)
        try:
            assert await redis.set(healthy, "1")
            assert await offset_from(redis)  # TIME: a keyless command, to the default node
        finally:
            await close(redis)
