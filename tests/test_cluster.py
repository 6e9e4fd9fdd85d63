"""The bus on a Redis Cluster with HOOKBUS_PARTITIONS > 1 (key layout 2, bus/transport/keys.py).

Against the session's private cluster (3 masters, 3 replicas; ``redis_cluster`` in conftest.py),
with 6 partitions:

* the events of one session land in one partition, in order, and the partitions and a hook's
  request shards are spread over every master;
* an async hook with 2 replicas consumes every partition: every event of every partition is
  handled exactly once, and nothing stays pending;
* a sync hook served with ``--shards 3`` answers sessions of every shard;
* the operator commands (``hookbus hooks list``, ``lag``, ``metrics``, ``events tail``) see the
  whole cluster: every partition and every shard, wherever its master is;
* the stream reads and blocking pops of every role go straight to the key's master, never
  through an extra ``COMMAND GETKEYS`` (bus/transport/redis_io.py ClusterClient).
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import zlib
from collections import Counter
from pathlib import Path
from typing import Any

import msgspec
import pytest
from redis.asyncio import Redis
from redis.crc import REDIS_CLUSTER_HASH_SLOTS, key_slot
from redis.exceptions import RedisError

from agent_adapter.client import HookClient
from bus import HookEvent, HookSettings, MutateInput
from bus.events import PostToolUseContext, PreToolUseContext, StepCompleteContext
from bus.protocol import DATA_FIELD, EventMessage, encode, new_id, now_ms
from bus.settings import BusSettings
from bus.transport.keys import Keys, partition_tag, shard_tag
from bus.transport.redis_io import close, connect
from bus.transport.retention import Retention
from tests.harness import ROOT, Processes, wait_for, wait_live, worker_env
from tests.remote_hooks import AsyncConfig, HookConfig
from tests.test_retention import group_of, loss_records, publish_capped
from workers.local.redis_cluster import LocalCluster
from workers.ops.lag import consumer_lag

pytestmark = [pytest.mark.redis, pytest.mark.timeout(300)]

PARTITIONS = 6
SHARDS = 3
PRE = HookEvent.PRE_TOOL_USE


def slot_range(slot: int, parts: int) -> int:
    """Which of ``parts`` equal slot ranges ``slot`` lies in."""
    return next(i for i in range(parts) if slot < (i + 1) * REDIS_CLUSTER_HASH_SLOTS // parts)


@pytest.mark.parametrize("parts", [1, 2, 3, 6, 16, 64])
def test_partition_and_shard_tags_fall_in_distinct_equal_slot_ranges(parts: int) -> None:
    tags = [partition_tag("e", i, parts) for i in range(parts)]
    assert [slot_range(key_slot(t.encode()), parts) for t in tags] == list(range(parts))
    for hook in ("Guard", "SecretGuard", "bench-cluster-noop", "a"):
        shards = [shard_tag(hook, k, parts) for k in range(parts)]
        assert shards[0] == hook  # shard 0 keeps the hook's own tag (its other keys' slot)
        assert sorted(slot_range(key_slot(t.encode()), parts) for t in shards) == list(
            range(parts)
        ), hook


@pytest.mark.parametrize(
    ("partitions", "shards"), [(3, 3), (6, 3), (16, 4), (64, 8), (2, 3), (4, 3), (1, 2)]
)
def test_a_sessions_requests_go_to_the_shard_beside_its_events_partition(
    partitions: int, shards: int
) -> None:
    keys = Keys("hookbus", partitions)
    for hook in ("Guard", "SecretGuard", "bench-cluster-noop", "a"):
        used = Counter()
        for n in range(400):
            sid = f"s-{n}"
            shard = keys.shard(hook, sid, shards)
            assert shard == keys.shard(hook, sid, shards)  # always the same: in order in one
            used[shard] += 1
            if partitions % shards:  # beside its partition, the shards' shares would differ
                assert shard == zlib.crc32(sid.encode()) % shards
                continue
            event_slot = key_slot(partition_tag("e", keys.partition(sid), partitions).encode())
            tag = shard_tag(hook, shard, shards)
            assert slot_range(key_slot(tag.encode()), shards) == slot_range(event_slot, shards)
        assert len(used) == shards, f"{hook}: sessions reach only shards {sorted(used)}"
        assert max(used.values()) < 2 * min(used.values()), f"{hook}: uneven shares {used}"


def redis_cli_ranges(masters: int) -> list[tuple[int, int]]:
    """The slots ``redis-cli --cluster create`` gives each of ``masters`` (first, last), as its
    clusterManagerCommandCreate splits them (``lround``: half away from zero)."""
    per, first, cursor, ranges = REDIS_CLUSTER_HASH_SLOTS / masters, 0, 0.0, []
    for i in range(masters):
        last = int(cursor + per - 1 + 0.5)
        if last >= REDIS_CLUSTER_HASH_SLOTS or i == masters - 1:
            last = REDIS_CLUSTER_HASH_SLOTS - 1
        ranges.append((first, last))
        first, cursor = last + 1, cursor + per
    return ranges


@pytest.mark.parametrize(("masters", "partitions", "shards"), [(3, 6, 3), (3, 6, 6), (6, 6, 3)])
def test_the_shard_beside_a_partition_shares_its_master_when_the_shards_fit_the_masters(
    masters: int, partitions: int, shards: int
) -> None:
    # docs/scaling.md: one write per dispatch on a redis-cli cluster when S is a multiple of the
    # masters' count (else about half the dispatches with 6 masters and S = 3 do not).
    ranges = redis_cli_ranges(masters)
    assert ranges[1] == ((5461, 10922) if masters == 3 else (2731, 5460))  # redis-cli's split

    def master(tag: str) -> int:
        slot = key_slot(tag.encode())
        return next(m for m, (low, high) in enumerate(ranges) if low <= slot <= high)

    keys = Keys("hookbus", partitions)
    split = total = 0
    for hook in ("Guard", "SecretGuard", "bench-cluster-noop", "a"):
        for n in range(300):
            sid = f"s-{n}"
            event_tag = partition_tag("e", keys.partition(sid), partitions)
            shard_master = master(shard_tag(hook, keys.shard(hook, sid, shards), shards))
            split += shard_master != master(event_tag)
            total += 1
    if shards % masters == 0:
        assert split == 0
    else:
        assert 0.3 < split / total < 0.7, split / total


@pytest.fixture
def settings(cluster_settings: BusSettings) -> BusSettings:
    return msgspec.structs.replace(cluster_settings, partitions=PARTITIONS)


def sessions_covering(keys: Keys, per_partition: int = 2) -> list[str]:
    """Session ids, ``per_partition`` in each partition (and so in each of 3 request shards)."""
    found: dict[int, list[str]] = {i: [] for i in range(keys.partitions)}
    n = 0
    while any(len(v) < per_partition for v in found.values()):
        sid = f"session-{n}"
        if len(found[keys.partition(sid)]) < per_partition:
            found[keys.partition(sid)].append(sid)
        n += 1
    return [sid for sids in found.values() for sid in sids]


def master_of(client: HookClient, key: str) -> int:
    node: Any = client.redis.get_node_from_key(key)  # type: ignore[attr-defined]
    return int(node.port)


def step(session: str, n: int) -> StepCompleteContext:
    return StepCompleteContext(session_id=session, step=n, max_steps=100)


async def test_one_sessions_events_stay_in_order_in_its_partition(settings: BusSettings) -> None:
    keys = Keys.of(settings)
    sessions = sessions_covering(keys)
    async with HookClient(settings) as client:
        masters = {master_of(client, p) for p in keys.event_partitions}
        assert len(masters) == 3, "the 6 partitions are not spread over the 3 masters"
        for n in range(10):  # the sessions' steps interleaved, as concurrent agents publish
            await asyncio.gather(*(client.run_on_step_complete(step(s, n)) for s in sessions))
    async with HookClient(settings) as reader:
        seen: dict[str, list[tuple[str, int]]] = {s: [] for s in sessions}
        for index, partition in enumerate(keys.event_partitions):
            entries: Any = await reader.redis.xrange(partition)
            assert entries, f"partition {index} got nothing"
            for _, fields in entries:
                event = msgspec.json.decode(fields[b"data"])
                seen[event["session_id"]].append((partition, event["context"]["step"]))
    for session, where in seen.items():
        assert {p for p, _ in where} == {keys.events(session)}, session
        assert [n for _, n in where] == list(range(10)), session


def ledger(procs: Processes, settings: BusSettings, record: Path) -> Any:
    config = AsyncConfig(name="Ledger", record=str(record))
    return procs.worker(
        settings, "tests.remote_hooks:ScriptedAsync", "ledger",
        HOOKBUS_TEST_ASYNC=msgspec.json.encode(config).decode(),
    )  # fmt: skip


async def test_an_async_hook_with_two_replicas_handles_every_partitions_events_once(
    settings: BusSettings, procs: Processes, tmp_path: Path
) -> None:
    keys = Keys.of(settings)
    records = [tmp_path / "ledger-1.txt", tmp_path / "ledger-2.txt"]
    for record in records:
        record.touch()
        ledger(procs, settings, record)
    sessions = sessions_covering(keys, per_partition=4)
    async with HookClient(settings) as client:
        await wait_for(lambda: "Ledger" in client.directory.async_hooks, 60, "Ledger")

        async def two_replicas() -> bool:
            return await client.redis.zcount(keys.replicas("Ledger"), 1, "+inf") == 2

        await wait_for(two_replicas, 60, "2 Ledger replicas")
        published: list[str] = []
        for n in range(5):
            for s in sessions:
                ctx = PostToolUseContext(
                    session_id=s, tool_name="read", tool_args={"n": n}, output_content="ok"
                )
                await client.run_post_tool_use(ctx)

        async def all_published() -> bool:
            published.clear()
            for partition in keys.event_partitions:
                entries: Any = await client.redis.xrange(partition)
                published.extend(msgspec.json.decode(f[b"data"])["id"] for _, f in entries)
            return len(published) == 5 * len(sessions)

        await wait_for(all_published, 30, "every event in its partition")

        def handled() -> Counter[str]:
            return Counter(i for r in records for i in r.read_text().split())

        await wait_for(lambda: set(handled()) >= set(published), 60, "every event handled")

        for partition in keys.event_partitions:
            groups: Any = await client.redis.xinfo_groups(partition)
            (group,) = [g for g in groups if g["name"] in (b"Ledger", "Ledger")]
            assert group["pending"] == 0, partition
    counts = handled()
    assert set(counts) == set(published)
    assert [i for i, n in counts.items() if n > 1] == [], "an event was handled twice"


async def test_a_hook_sharded_three_ways_answers_the_sessions_of_every_shard(
    settings: BusSettings, procs: Processes, tmp_path: Path
) -> None:
    keys = Keys.of(settings)
    record = tmp_path / "guard.txt"
    guard = HookConfig(
        name="Guard", events=[PRE], answers={PRE.value: MutateInput(updated_args={"x": -1})},
        record=str(record),
    )  # fmt: skip
    procs.scripted(settings, guard, "--shards", str(SHARDS))
    sessions = sessions_covering(keys)
    streams = [keys.requests("Guard", k, SHARDS) for k in range(SHARDS)]
    async with HookClient(settings, HookSettings(hook_timeout_secs=10)) as client:
        await wait_live(client, "Guard")
        assert client.directory.by_name["Guard"].manifest.shards == SHARDS
        assert len({master_of(client, s) for s in streams}) == 3, "shards share a master"
        used = {client.directory.requests("Guard", s) for s in sessions}
        assert used == set(streams), "the sessions do not cover every shard"
        for s in sessions:  # a dispatch's event, its requests and a foreign agent's decision
            beside = {keys.events(s), keys.decisions(s), client.directory.requests("Guard", s)}
            assert len({master_of(client, k) for k in beside}) == 1, s  # on one master
        results = await asyncio.gather(
            *(client.run_pre_tool_use(PreToolUseContext(session_id=s, tool_name="t",
                                                        tool_args={"x": 1}))
              for s in sessions)
        )  # fmt: skip

        async def every_shard_served() -> bool:
            groups = [(await client.redis.xinfo_groups(s))[0] for s in streams]
            return all(g["entries-read"] > 0 and g["pending"] == 0 for g in groups)

        await wait_for(every_shard_served, 30, "every shard's requests read and acknowledged")
    assert [r.final_args for r in results] == [{"x": -1}] * len(sessions)
    assert not any(r.skipped for r in results)
    assert len(record.read_text().splitlines()) == len(sessions)


# -- the operator's view ------------------------------------------------------------------------


def hookbus(settings: BusSettings, *args: str) -> str:
    env = worker_env(settings, COLUMNS="250", NO_COLOR="1", PYTHONIOENCODING="utf-8")
    env.pop("FORCE_COLOR", None)
    result = subprocess.run(
        [sys.executable, "-m", "workers.cli", *args], env=env, cwd=ROOT,
        stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
    return result.stdout


def rows(output: str) -> list[list[str]]:
    return [
        [c.strip() for c in line.strip().strip("│").split("│")]
        for line in output.splitlines()
        if "│" in line
    ]


async def test_operator_commands_see_every_partition_and_shard_of_the_cluster(
    settings: BusSettings, procs: Processes, tmp_path: Path
) -> None:
    keys = Keys.of(settings)
    guard = HookConfig(name="Guard", events=[PRE])
    for _ in range(2):  # two processes, SHARDS lanes each
        procs.scripted(settings, guard, "--shards", str(SHARDS))
    procs.worker(settings, "workers.builtins.metrics:AsyncMetricsHook", "metrics")
    sessions = sessions_covering(keys)
    out, err = tmp_path / "tail.out", tmp_path / "tail.err"
    env = worker_env(settings, NO_COLOR="1", COLUMNS="250", PYTHONIOENCODING="utf-8")
    with out.open("wb") as stdout, err.open("wb") as stderr:
        tail = subprocess.Popen(
            [sys.executable, "-m", "workers.cli", "events", "tail", "--event", "PreToolUse",
             "--count", str(len(sessions))],
            env=env, cwd=ROOT, stdin=subprocess.DEVNULL, stdout=stdout, stderr=stderr,
        )  # fmt: skip
    try:
        await wait_for(lambda: "following" in err.read_text(), 60, "events tail to start")
        async with HookClient(settings, HookSettings(hook_timeout_secs=10)) as client:
            await wait_live(client, "Guard")
            await wait_for(
                lambda: "AsyncMetricsHook" in client.directory.async_hooks, 60, "metrics"
            )
            for s in sessions:
                await client.run_pre_tool_use(PreToolUseContext(session_id=s, tool_name="t"))
        assert tail.wait(60) == 0, err.read_text()
    finally:
        if tail.poll() is None:
            tail.kill()
            tail.wait(10)
    tailed = [line.split() for line in out.read_text().splitlines()]
    assert sorted(line[2] for line in tailed) == sorted(sessions)  # from all 6 partitions

    async def both_listed() -> bool:
        listed = {r[0]: r for r in rows(hookbus(settings, "hooks", "list"))}
        return "AsyncMetricsHook" in listed and listed["Guard"][8] == f"2 ({2 * SHARDS} lanes)"

    # Processes and their shard lanes apart: 2 processes, not 6 replicas.
    await wait_for(both_listed, 60, "hooks list to show Guard's 2 processes and their lanes")

    lag = rows(hookbus(settings, "lag"))
    streams = {r[0] for r in lag}
    assert set(keys.event_partitions) <= streams  # the metrics group on every partition
    assert {keys.requests("Guard", k, SHARDS) for k in range(SHARDS)} <= streams

    async def counted() -> bool:
        figures = {r[1]: r[2] for r in rows(hookbus(settings, "metrics")) if len(r) == 3}
        return figures.get("events.PreToolUse") == str(len(sessions))

    await wait_for(counted, 60, "hookbus metrics to count every partition's events")


def getkeys_calls(cluster: Any) -> int:
    """``COMMAND GETKEYS`` calls on every node since the last ``CONFIG RESETSTAT``."""
    total = 0
    for node in cluster.nodes:
        for line in cluster.info(node, "info", "commandstats").splitlines():
            if line.startswith("cmdstat_command|getkeys:"):
                total += int(line.split("calls=")[1].split(",")[0])
    return total


async def test_stream_reads_and_blocking_pops_go_to_their_keys_master_without_a_lookup(
    settings: BusSettings, redis_cluster: Any
) -> None:
    keys = Keys.of(settings)
    redis = connect(settings)
    try:
        streams = keys.event_partitions  # on all three masters
        inboxes = [keys.inbox(f"i{n}") for n in range(6)]
        for stream in streams:
            await redis.xgroup_create(stream, "g", id="0", mkstream=True)
        for node in redis_cluster.nodes:
            redis_cluster.info(node, "config", "resetstat")
        for n, (stream, inbox) in enumerate(zip(streams, inboxes, strict=True)):
            entry = await redis.xadd(stream, {"data": str(n)})
            read: Any = await redis.xreadgroup("g", "c", {stream: ">"}, count=5, block=100)
            assert read == [[stream.encode(), [(entry, {b"data": str(n).encode()})]]]
            tailed: Any = await redis.xread({stream: "0-0"}, count=5, block=100)
            assert tailed == read
            await redis.rpush(inbox, f"reply-{n}")
            popped: Any = await redis.blmpop(1, 1, inbox, direction="LEFT", count=10)
            assert popped == [inbox.encode(), [f"reply-{n}".encode()]]
        assert getkeys_calls(redis_cluster) == 0
    finally:
        await redis.aclose()


# -- failover ------------------------------------------------------------------------------------


async def retried(step: Any) -> Any:
    """``step()`` once the cluster client reaches the new master (a failover's errors retried)."""
    deadline = asyncio.get_running_loop().time() + 30
    while True:
        try:
            return await step()
        except (RedisError, OSError):
            if asyncio.get_running_loop().time() > deadline:
                raise
            await asyncio.sleep(0.1)  # a retry's pace, not a synchronisation


async def test_a_failover_is_no_loss_and_a_cut_after_it_is_counted_exactly() -> None:
    """A promoted replica keeps a group's last-delivered-id but not its entries-read (Redis
    7.0): nothing is reported lost for it (no dead letter, no lost counter, no LOST in ``hookbus
    lag``), and a cut by the hard cap after the failover is counted exactly. On a cluster of its
    own: a master is killed."""
    with LocalCluster() as cluster:
        settings = BusSettings(
            redis_url=cluster.url.replace("redis://", "redis+cluster://", 1), prefix="failover"
        )
        keys = Keys.of(settings)
        stream = keys.event_partitions[0]
        redis = connect(settings)
        retention = Retention(redis, keys)
        try:
            await retention.create_group(stream, "Late", "$")
            await redis.hset(keys.lost("Late"), "seen", 0)  # as a hook service does
            await publish_capped(redis, stream, [b"x"] * 500, 2000)
            while (await retention.read(stream, "Late", "r1", 200))[0]:
                pass
            master: Any = redis.get_node_from_key(stream)  # type: ignore[attr-defined]
            node = Redis(host=master.host, port=master.port)
            assert await node.wait(1, 10_000) == 1  # the replica has every read
            await node.aclose()
            cluster.kill_master(master.port)
            await asyncio.to_thread(cluster.wait_promoted, master.port)
            promoted = await retried(lambda: group_of(redis, stream, "Late"))
            assert promoted["entries-read"] != 500  # the fact this test is about
            entries, gap, _ = await retried(lambda: retention.read(stream, "Late", "r1", 200))
            assert (entries, gap) == ([], None)
            assert (await group_of(redis, stream, "Late"))["entries-read"] == 500  # re-based
            assert await loss_records(redis, keys, "Late") == []
            [row] = [r for r in await consumer_lag(redis, keys, 200, 10) if r.stream == stream]
            assert (row.lag, row.lost) == (0, 0)
            # A real cut after the failover: counted exactly.
            await publish_capped(redis, stream, [b"y"] * 6000, 2000)
            length = await redis.xlen(stream)
            _, gap, _ = await retention.read(stream, "Late", "r1", 200)
            assert gap is not None and gap.count == 6000 - length
        finally:
            await close(redis)


async def master_of_key(cluster: LocalCluster, key: str) -> int:
    """The port of the master that serves ``key``."""
    redis = connect(BusSettings(redis_url=cluster.url.replace("redis://", "redis+cluster://")))
    try:
        await redis.ping()  # the client learns the slots
        node: Any = redis.get_node_from_key(key)  # type: ignore[attr-defined]
        return int(node.port)
    finally:
        await close(redis)


def guarded(settings: BusSettings) -> bool:
    """Guard listed with one live process by ``hookbus hooks list``."""
    listed = {r[0]: r for r in rows(hookbus(settings, "hooks", "list"))}
    return "Guard" in listed and listed["Guard"][8] == "1"


async def test_every_command_starts_from_any_live_seed_node(procs: Processes) -> None:
    """The URL names several seed nodes and the first is down (the cluster otherwise ok):
    ``hookbus worker``, ``check``, ``hooks list`` and ``lag`` start from the next."""
    with LocalCluster() as cluster:
        masters = cluster.master_ports()
        down = next(n.port for n in cluster.nodes if n.port not in masters)  # a replica
        cluster.node(down).kill()
        settings = BusSettings(
            redis_url=f"redis+cluster://127.0.0.1:{down},127.0.0.1:{masters[0]}/0",
            prefix="seeds",
            heartbeat_secs=0.2,
            liveness_secs=1.0,
            refresh_secs=0.2,
        )
        keys = Keys.of(settings)
        procs.scripted(settings, HookConfig(name="Guard", events=[PRE]))
        await wait_for(lambda: guarded(settings), 60, "the worker to start from the second seed")
        assert hookbus(settings, "check").startswith("ok: ")
        assert keys.requests("Guard") in {r[0] for r in rows(hookbus(settings, "lag"))}


async def test_operator_commands_survive_a_failover(procs: Processes, tmp_path: Path) -> None:
    """The master of the events stream is killed: ``lag`` and ``hooks list``, started inside
    the promotion window, retry until it is over; ``events tail`` keeps following and shows an
    event published after it; no traceback, every exit 0. On a cluster of its own, whose
    replicas take over after 3 s of silence (a window the commands start in)."""
    with LocalCluster(node_timeout_ms=3000) as cluster:
        settings = BusSettings(
            redis_url=cluster.url.replace("redis://", "redis+cluster://", 1),
            prefix="failover",
            heartbeat_secs=0.2,
            liveness_secs=1.0,
            refresh_secs=0.2,
        )
        keys = Keys.of(settings)
        stream = keys.event_partitions[0]
        victim = await master_of_key(cluster, stream)
        procs.scripted(settings, HookConfig(name="Guard", events=[PRE]))
        await wait_for(lambda: guarded(settings), 60, "the worker to start")
        out, err = tmp_path / "tail.out", tmp_path / "tail.err"
        env = worker_env(settings, NO_COLOR="1", COLUMNS="250", PYTHONIOENCODING="utf-8")
        with out.open("wb") as stdout, err.open("wb") as stderr:
            tail = subprocess.Popen(
                [sys.executable, "-m", "workers.cli", "events", "tail", "--count", "1"],
                env=env, cwd=ROOT, stdin=subprocess.DEVNULL, stdout=stdout, stderr=stderr,
            )  # fmt: skip
        redis = connect(settings)
        try:
            await wait_for(lambda: "following" in err.read_text(), 60, "events tail to start")
            cluster.kill_master(victim)
            # Started inside the promotion window: their first commands find no master.
            during = [
                await asyncio.to_thread(hookbus, settings, *command)
                for command in (["lag"], ["hooks", "list"])
            ]
            assert keys.requests("Guard") in {r[0] for r in rows(during[0])}
            assert "Guard" in {r[0] for r in rows(during[1])}
            await asyncio.to_thread(cluster.wait_promoted, victim)
            message = EventMessage(
                id=new_id(), ts=now_ms(), event=PRE, session_id="after-failover",
                context=msgspec.Raw(b"{}"),
            )  # fmt: skip
            await retried(lambda: redis.xadd(stream, {DATA_FIELD: encode(message)}))
            code = await asyncio.to_thread(tail.wait, 60)
            assert code == 0 and "Traceback" not in err.read_text(), err.read_text()
            assert "after-failover" in out.read_text()
        finally:
            if tail.poll() is None:
                tail.kill()
                tail.wait(10)
            await close(redis)
