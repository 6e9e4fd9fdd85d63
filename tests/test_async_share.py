"""Async hook replicas share the partitions (workers/services/async_worker.py ``share``).

* N live replicas and P partitions: each partition has exactly one reader when N <= P, and at
  least one when N > P; every replica computes the same from the same live set.
* On a real 3-master cluster (``redis_cluster`` in conftest.py, 6 partitions), 3 replica
  processes: every partition's events are handled by exactly one replica. One replica killed
  (SIGKILL) while it holds a batch: the 2 left take its partitions over (each then read by exactly
  one of them) and claim its pending entries: every event handled, nothing pending, and the
  claims counted in the survivors' stats.
* An idle replica sends few commands per wait: the commands of an idle replica of a hook on 6
  partitions, counted with ``INFO commandstats`` on a private redis-server, are at most
  ``IDLE_COMMANDS_PER_WAIT`` per blocking ``XREAD`` (a replica that polled every partition sent
  about 26 per ``XREAD``: the check script, the two ``XINFO`` it runs, and a read, for each
  partition, then the wait; commandstats counts a script's commands too).
"""

from __future__ import annotations

import ast
import asyncio
import re
import signal
from collections import Counter
from pathlib import Path
from typing import Any

import msgspec
import pytest
from redis.asyncio import Redis

from agent_adapter.client import HookClient
from bus.events import PostToolUseContext
from bus.settings import BusSettings
from bus.transport.keys import Keys
from tests.harness import Processes, wait_for
from tests.remote_hooks import AsyncConfig
from tests.test_cluster import sessions_covering
from workers.local.redis_server import RedisServer
from workers.services.async_worker import share

pytestmark = [pytest.mark.redis, pytest.mark.timeout(300)]

PARTITIONS = 6
IDLE_COMMANDS_PER_WAIT = 5
READING = re.compile(r"replica (\S+) \((\d+) live\) reading (.*)$", re.M)


@pytest.mark.parametrize("replicas", [1, 2, 3, 4, 6, 7, 13])
@pytest.mark.parametrize("partitions", [1, 3, 6])
def test_each_partition_has_one_reader_or_all_are_shared(replicas: int, partitions: int) -> None:
    parts = [f"p{i}" for i in range(partitions)]
    live = [f"r{i:02d}" for i in range(replicas)]
    readers = Counter(p for r in live for p in share(parts, live, r))
    assert set(readers) == set(parts)
    if replicas <= partitions:
        assert set(readers.values()) == {1}
    else:
        assert max(readers.values()) - min(readers.values()) <= 1


def test_a_replica_not_yet_in_the_live_set_counts_itself() -> None:
    assert share(["p0", "p1"], ["b"], "a") == ("p0",)
    assert share(["p0", "p1"], [], "a") == ("p0", "p1")


def ledger(procs: Processes, settings: BusSettings, record: Path, delay: float = 0) -> Any:
    config = AsyncConfig(name="Ledger", record=str(record), delay_secs=delay)
    return procs.worker(
        settings, "tests.remote_hooks:ScriptedAsync", "ledger",
        HOOKBUS_TEST_ASYNC=msgspec.json.encode(config).decode(),
    )  # fmt: skip


def shares(log: Path) -> tuple[int, set[str]] | None:
    """The last share a replica's log reports: (live replicas, partitions read)."""
    found = READING.findall(log.read_text(errors="replace"))
    if not found:
        return None
    _, live, streams = found[-1]
    return int(live), {s for s in streams.split(", ") if ":events" in s}


async def publish_round(client: HookClient, sessions: list[str], tag: str) -> None:
    for s in sessions:
        ctx = PostToolUseContext(session_id=s, tool_name="read", tool_args={"t": tag})
        await client.run_post_tool_use(ctx)


async def published(redis: Redis, keys: Keys, count: int) -> dict[str, str]:
    """Event id → its partition, for every event on the bus, once there are ``count`` (the
    client publishes them in the background)."""

    async def every_one() -> dict[str, str] | None:
        where = {}
        for partition in keys.event_partitions:
            entries: Any = await redis.xrange(partition)
            for _, fields in entries:
                where[msgspec.json.decode(fields[b"data"])["id"]] = partition
        return where if len(where) == count else None

    found: dict[str, str] = await wait_for(every_one, 30, f"{count} events published")
    return found


def handled_by(records: list[Path]) -> dict[str, list[int]]:
    """Event id → the replicas (indexes into ``records``) that handled it."""
    out: dict[str, list[int]] = {}
    for n, record in enumerate(records):
        for event_id in record.read_text().split():
            out.setdefault(event_id, []).append(n)
    return out


async def test_replicas_share_the_partitions_and_take_over_a_killed_ones(
    cluster_settings: BusSettings, procs: Processes, tmp_path: Path
) -> None:
    # Liveness of 3 s (the default): a heartbeat late on a loaded machine does not change shares.
    settings = msgspec.structs.replace(cluster_settings, partitions=PARTITIONS, liveness_secs=3.0)
    keys = Keys.of(settings)
    records = [tmp_path / f"ledger-{n}.txt" for n in range(3)]
    for record in records:
        record.touch()
    # slow enough that a batch is in hand when the replica is killed
    workers = [ledger(procs, settings, record, delay=2.0) for record in records]
    logs = [procs.logdir / f"ledger-{n}.log" for n in range(3)]

    def settled(alive: list[int]) -> bool:
        """Each live replica reports a share computed from exactly the live set, and together
        they read each partition once."""
        seen = [shares(logs[n]) for n in alive]
        if any(s is None or s[0] != len(alive) for s in seen):
            return False
        read = Counter(p for s in seen if s for p in s[1])
        return sorted(read) == sorted(keys.event_partitions) and set(read.values()) == {1}

    sessions = sessions_covering(keys, per_partition=2)
    async with HookClient(settings) as client:
        redis = client.redis
        await wait_for(lambda: settled([0, 1, 2]), 60, "3 replicas sharing 6 partitions")
        await publish_round(client, sessions, "one")
        where = await published(redis, keys, len(sessions))
        await wait_for(lambda: set(handled_by(records)) >= set(where), 60, "round one handled")
        readers: dict[str, set[int]] = {}
        for event_id, who in handled_by(records).items():
            readers.setdefault(where[event_id], set()).update(who)
        assert sorted(readers) == sorted(keys.event_partitions)
        assert all(len(r) == 1 for r in readers.values()), readers

        # Kill a replica holding a batch: the events of its partitions wait in its hands.
        victim = 0
        theirs = [p for p, r in readers.items() if r == {victim}]
        assert theirs
        await publish_round(client, sessions, "two")
        dead = f"-{workers[victim].pid}-"

        async def victim_holds_entries() -> int:
            held = 0
            for partition in theirs:
                rows: Any = await redis.xpending_range(partition, "Ledger", "-", "+", 1000)
                held += sum(dead in r["consumer"].decode() for r in rows)
            return held

        held = await wait_for(victim_holds_entries, 30, "the victim holding entries")
        workers[victim].send_signal(signal.SIGKILL)
        workers[victim].wait()

        await wait_for(lambda: settled([1, 2]), 60, "2 replicas sharing 6 partitions")
        where = await published(redis, keys, 2 * len(sessions))
        await wait_for(lambda: set(handled_by(records)) >= set(where), 60, "round two handled")

        async def nothing_pending() -> bool:
            for partition in keys.event_partitions:
                groups: Any = await redis.xinfo_groups(partition)
                if any(g["pending"] for g in groups):
                    return False
            return True

        await wait_for(nothing_pending, 60, "nothing pending")
        await publish_round(client, sessions, "three")
        where3 = await published(redis, keys, 3 * len(sessions))
        await wait_for(lambda: set(handled_by(records)) >= set(where3), 60, "round three")
        fresh = set(where3) - set(where)
        readers = {}
        for event_id, who in handled_by(records).items():
            if event_id in fresh:
                readers.setdefault(where3[event_id], set()).update(who)
        assert sorted(readers) == sorted(keys.event_partitions)
        assert all(len(r) == 1 and victim not in r for r in readers.values()), readers
    for n in (1, 2):
        workers[n].send_signal(signal.SIGTERM)
        workers[n].wait(timeout=30)
    stats = [ast.literal_eval(logs[n].read_text().rsplit("stopped: ", 1)[1]) for n in (1, 2)]
    assert sum(s["claimed"] for s in stats) >= held  # the victim's entries, taken over


async def test_an_idle_replica_sends_a_few_commands_per_blocking_wait(tmp_path: Path) -> None:
    from tests.remote_hooks import ScriptedAsync
    from workers.services.async_worker import AsyncHookWorker

    with RedisServer() as server:
        settings = BusSettings(redis_url=server.url, prefix="idle", partitions=PARTITIONS)
        worker = AsyncHookWorker(ScriptedAsync(AsyncConfig(name="Idle")), settings)
        admin = Redis.from_url(server.url)
        stop = asyncio.Event()
        task = asyncio.create_task(worker.run(stop))
        try:
            await wait_for(worker.registered.is_set, 30, "registration")

            async def calls() -> Counter[str]:
                stats: Any = await admin.info("commandstats")
                return Counter({k.removeprefix("cmdstat_"): v["calls"] for k, v in stats.items()})

            async def waits_since(before: Counter[str], n: int) -> Counter[str] | None:
                now = await calls()
                return now if now["xread"] - before["xread"] >= n else None

            # Past the start (every lane's first read): the steady idle state.
            start = await wait_for(lambda: waits_since(Counter(), 2 * PARTITIONS), 30, "waits")
            end = await wait_for(lambda: waits_since(start, 5 * PARTITIONS), 60, "30 waits")
            sent = end - start
            sent.pop("info", None)
            waits = sent["xread"]
            assert sum(sent.values()) <= IDLE_COMMANDS_PER_WAIT * waits, sent
        finally:
            stop.set()
            await task
            await admin.aclose()


async def test_a_heartbeat_dated_in_the_future_is_not_a_live_replica() -> None:
    """A replicas member an hour ahead (a skewed clock, or one written by hand with the hook's
    credential) is not live: the one real replica reads every partition, and `hooks list`
    counts one live replica (the ghost once kept its share of the partitions unread
    for as long as its score stayed ahead)."""
    from tests.remote_hooks import ScriptedAsync
    from workers.ops.hooks import replica_counts
    from workers.services.async_worker import AsyncHookWorker

    with RedisServer() as server:
        settings = BusSettings(redis_url=server.url, prefix="ghost", partitions=3)
        keys = Keys(settings.prefix, settings.partitions)
        admin = Redis.from_url(server.url)
        seconds, _ = await admin.time()
        await admin.zadd(keys.replicas("Ghosted"), {"ghost-1#0": (seconds + 3600) * 1000})
        worker = AsyncHookWorker(ScriptedAsync(AsyncConfig(name="Ghosted")), settings)
        stop = asyncio.Event()
        task = asyncio.create_task(worker.run(stop))
        try:
            await wait_for(worker.registered.is_set, 30, "registration")
            await wait_for(
                lambda: set(keys.event_partitions) <= set(worker._reading), 15,
                "the one live replica to read every partition",
            )  # fmt: skip
            now = (await admin.time())[0] * 1000
            counts = await replica_counts(admin, keys, "Ghosted", settings.liveness_secs, now)
            assert counts.live == 1 and counts.live_members == (worker.replica,)
        finally:
            stop.set()
            await task
            await admin.aclose()


async def test_a_replica_runs_partitions_side_by_side_and_each_session_in_order() -> None:
    """docs/writing-hooks.md: a replica reads each of its partitions in a lane of its own, so
    ``on_batch`` calls for different partitions run side by side in one process (a batch here
    waits for another to run beside it: with one batch at a time it never would); one session's
    events reach the hook in order."""
    from bus.events import HookEvent, StepCompleteContext
    from bus.hooks import AsyncAgentHook, DeliveredEvent
    from bus.protocol import DATA_FIELD, EventMessage, encode, new_id, now_ms, raw
    from workers.services.async_worker import AsyncHookWorker

    with RedisServer() as server:
        settings = BusSettings(redis_url=server.url, prefix="lanes", partitions=3)
        keys = Keys(settings.prefix, settings.partitions)
        sessions = sessions_covering(keys, per_partition=1)
        seen: dict[str, list[int]] = {s: [] for s in sessions}
        beside, running, peak = asyncio.Event(), 0, 0

        class Overlap(AsyncAgentHook):
            name = "Overlap"
            subscribed_events = (HookEvent.ON_STEP_COMPLETE,)
            handles_batches = True

            async def on_batch(self, batch: Any) -> None:
                nonlocal running, peak
                running += 1
                peak = max(peak, running)
                if running > 1:
                    beside.set()
                try:  # the hook's own work: wait (bounded) for a batch of another lane
                    await asyncio.wait_for(beside.wait(), 5)
                except TimeoutError:
                    pass
                finally:
                    running -= 1
                for delivered in batch:
                    assert isinstance(delivered, DeliveredEvent)
                    ctx = delivered.context
                    seen[ctx.session_id].append(ctx.step)

        worker = AsyncHookWorker(Overlap(), settings)
        admin = Redis.from_url(server.url)
        stop = asyncio.Event()
        task = asyncio.create_task(worker.run(stop))
        try:
            await wait_for(worker.registered.is_set, 30, "registration")
            for step in range(20):
                for sid in sessions:
                    ctx = StepCompleteContext(session_id=sid, step=step, max_steps=100)
                    message = EventMessage(
                        id=new_id(), ts=now_ms(), event=HookEvent.ON_STEP_COMPLETE,
                        session_id=sid, context=raw(ctx),
                    )  # fmt: skip
                    stream = keys.event_partitions[keys.partition(sid)]
                    await admin.xadd(stream, {DATA_FIELD: encode(message)})
            await wait_for(
                lambda: sum(map(len, seen.values())) == 20 * len(sessions), 60, "every event"
            )
            assert all(steps == list(range(20)) for steps in seen.values()), seen
            assert peak >= 2
        finally:
            stop.set()
            await task
            await admin.aclose()


async def test_the_directory_counts_no_replica_whose_heartbeat_is_dated_ahead(
    bus_settings: BusSettings,
) -> None:
    """A sync hook whose only heartbeat is an hour ahead has no live replica in a
    coordinator's directory (protocol.md's read of the directory), so its calls are skipped
    under its failure policy at once instead of waiting for a replica that does not exist;
    the same heartbeat dated now is live."""
    import redis as sync_redis

    from bus.protocol import HookManifest, encode, now_ms
    from tests.harness import put_manifest

    keys = Keys(bus_settings.prefix)
    manifest = HookManifest(name="Ahead", events=["PreToolUse"], registered_at=now_ms())
    with sync_redis.Redis.from_url(bus_settings.redis_url) as r:
        put_manifest(r, keys, "Ahead", encode(manifest))
        r.zadd(keys.replicas("Ahead"), {"ghost-1-ab": now_ms() + 3_600_000})
        async with HookClient(bus_settings) as client:
            await wait_for(lambda: "Ahead" in client.directory.by_name, 15, "the manifest")
            assert not client.directory.live("Ahead")
            r.zadd(keys.replicas("Ahead"), {"ghost-1-ab": now_ms()})
            await client.directory.refresh()
            assert client.directory.live("Ahead")
