"""Retention never trims what a group still needs, and what a stream's hard cap cuts is counted
exactly and reported (dead letter, lost counter, metric, log line, ``hookbus lag``), never silent.
Async hooks slower than ``claim_idle_secs`` run each event once per group when nothing fails.

Caps are scaled down through the settings (events_maxlen 200: hard cap 2,000; audit_maxlen 50:
hard cap 500); the mechanism is the same at the defaults.
"""

from __future__ import annotations

import collections
import contextlib
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
from redis.asyncio import Redis
from redis.exceptions import ConnectionError

from bus.protocol import DATA_FIELD, AuditRecord, encode, new_id, now_ms
from bus.settings import BusSettings
from bus.transport.keys import WORKERS_GROUP, Keys
from bus.transport.redis_io import connect, keep_and_claim
from bus.transport.retention import TRIMMED, Retention, hard_cap
from tests.harness import Processes, audit_events, wait_for
from tests.otlp_receiver import OTLPReceiver
from tests.remote_hooks import AsyncConfig
from tests.test_async_workers import event, recorded, wait_group
from tests.test_operator_cli import hookbus, ok, table_rows
from workers.local.redis_server import RedisServer
from workers.ops.lag import consumer_lag


def ev(keys: Keys) -> str:
    """The events stream (one partition in these tests)."""
    return keys.event_partitions[0]


EVENTS_MAXLEN, AUDIT_MAXLEN = 200, 50


def scaled(settings: BusSettings) -> BusSettings:
    return msgspec.structs.replace(settings, events_maxlen=EVENTS_MAXLEN, audit_maxlen=AUDIT_MAXLEN)


def caps_env(settings: BusSettings) -> dict[str, str]:
    return {
        "HOOKBUS_EVENTS_MAXLEN": str(settings.events_maxlen),
        "HOOKBUS_AUDIT_MAXLEN": str(settings.audit_maxlen),
    }


def start_async(procs: Processes, settings: BusSettings, cfg: AsyncConfig, **env: str) -> Any:
    payload = msgspec.json.encode(cfg).decode()
    return procs.worker(
        settings, "tests.remote_hooks:ScriptedAsync", cfg.name,
        HOOKBUS_TEST_ASYNC=payload, **caps_env(settings), **env,
    )  # fmt: skip


def stop(proc: Any, sig: int = signal.SIGTERM) -> None:
    proc.send_signal(sig)
    proc.wait(30)


async def publish_capped(redis: Redis, stream: str, payloads: list[bytes], cap: int) -> None:
    """XADD as every publisher does (bus/transport/coordinator.py): ``MAXLEN ~ cap``, pipelined."""
    for start in range(0, len(payloads), 1000):
        async with redis.pipeline(transaction=False) as pipe:
            for p in payloads[start : start + 1000]:
                pipe.xadd(stream, {DATA_FIELD: p}, maxlen=cap, approximate=True)
            await pipe.execute()


async def group_of(redis: Redis, stream: str, group: str) -> dict[Any, Any]:
    groups: Any = await redis.xinfo_groups(stream)
    [mine] = [g for g in groups if g["name"] == group.encode()]
    return dict(mine)


async def caught_up(redis: Redis, stream: str, group: str) -> bool:
    g = await group_of(redis, stream, group)
    return bool(g["lag"] == 0 and g["pending"] == 0)


async def loss_records(redis: Redis, keys: Keys, group: str) -> list[dict[bytes, bytes]]:
    rows: Any = await redis.xrange(keys.hook_dlq(group))  # the group's unit
    return [f for _, f in rows if f.get(b"hook") == group.encode() and b"lost" in f]


async def counted(redis: Redis, keys: Keys, group: str, stream: str) -> int:
    return int(await redis.hget(keys.lost(group), stream) or 0)


@pytest.fixture
def receiver() -> Iterator[OTLPReceiver]:
    """A real OTLP/HTTP receiver the restarted hook services export their metrics to."""
    with OTLPReceiver() as running:
        yield running


def otel(receiver: OTLPReceiver) -> dict[str, str]:
    return {
        "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
        "OTEL_METRIC_EXPORT_INTERVAL": "300",
    }


def metric_total(receiver: OTLPReceiver, group: str) -> int:
    """The latest cumulative value of hookbus.entries.lost for ``group``."""
    points = [
        m["value"]
        for m in receiver.metrics
        if m["name"] == "hookbus.entries.lost" and m["attributes"].get("hook.name") == group
    ]
    return int(points[-1]) if points else 0


def lag_row(settings: BusSettings, stream: str) -> list[str]:
    """``hookbus lag``'s row for ``stream``: stream, group, lag, pending, lost, …"""
    return table_rows(ok(hookbus(settings, "lag", **caps_env(settings))))[stream]


# -- the scripts, on a real Redis, step by step --------------------------------------------------


async def test_a_gap_is_counted_exactly_settled_once_and_the_group_reads_on(
    bus_settings: BusSettings,
) -> None:
    keys = Keys(bus_settings.prefix)
    redis = connect(bus_settings)
    retention = Retention(redis, keys)
    try:
        await retention.create_group(ev(keys), "Late", "$")
        await retention.create_group(ev(keys), "Late", "$")  # exists: no error
        payloads = [f"e{i}".encode() for i in range(6000)]
        ids = []
        for p in payloads[:10]:
            ids.append(await redis.xadd(ev(keys), {DATA_FIELD: p}))
        entries, gap, _ = await retention.read(ev(keys), "Late", "r1", 4)
        assert gap is None and [i for i, _ in entries] == ids[:4]  # 4 pending on r1
        await publish_capped(redis, ev(keys), payloads[10:], 2000)
        length = await redis.xlen(ev(keys))
        assert length < 6000
        # Before anyone reads: hookbus lag shows the cut as lost, not as lag or pending.
        [row] = [r for r in await consumer_lag(redis, keys, 200, 10) if r.stream == ev(keys)]
        assert (row.lag, row.pending, row.lost) == (length, 0, 6000 - length)
        entries, gap, _ = await retention.read(ev(keys), "Late", "r2", 10)
        assert gap is not None and gap.count == 6000 - 4 - length
        assert gap.after == ids[3].decode()
        first: Any = await redis.xrange(ev(keys), count=1)
        assert gap.before == first[0][0].decode() == entries[0][0].decode()
        assert await retention.settle(ev(keys), "Late") is None  # settled once
        info = await group_of(redis, ev(keys), "Late")
        assert info["lag"] == length - 10  # exact again
        await retention.record(gap)
        # The 4 pending entries were cut too: XAUTOCLAIM drops them and names them.
        claim: Any = await redis.xautoclaim(ev(keys), "Late", "r2", 0, count=100)
        assert sorted(claim[2]) == sorted(ids[:4])
        await retention.record_trimmed(ev(keys), "Late", claim[2])
        letters = await loss_records(redis, keys, "Late")
        assert sum(int(f[b"lost"]) for f in letters) == 6000 - length
        assert [f[b"reason"].decode() for f in letters[1:]] == [
            f"{TRIMMED}: cut by the hard cap of {ev(keys)} while pending"
        ] * 4
        assert await counted(redis, keys, "Late", ev(keys)) == 6000 - length
        [row] = [r for r in await consumer_lag(redis, keys, 200, 10) if r.stream == ev(keys)]
        assert (row.lost, row.pending) == (6000 - length, 10)
    finally:
        await redis.aclose()


async def test_a_clients_first_read_of_a_stream_is_checked_before_it_reads(
    bus_settings: BusSettings,
) -> None:
    """The check runs pipelined before the read (EVALSHA): a Redis that lost its scripts (a
    restart, a new master) would answer NOSCRIPT and the read would run unchecked, crossing
    the gap. A client's first read of a stream (a restarted hook service's; or the first after
    a connection error) runs the check alone first: the gap is counted exactly, with its range,
    before the read goes on."""
    keys = Keys(bus_settings.prefix)
    redis = connect(bus_settings)
    try:
        before = Retention(redis, keys)
        await before.create_group(ev(keys), "Late", "$")
        ids = [await redis.xadd(ev(keys), {DATA_FIELD: b"x"}) for _ in range(4)]
        entries, gap, _ = await before.read(ev(keys), "Late", "r1", 10)
        assert gap is None and [i for i, _ in entries] == ids
        await publish_capped(redis, ev(keys), [f"e{i}".encode() for i in range(6000)], 2000)
        length = await redis.xlen(ev(keys))
        await redis.script_flush()  # as a restart or a failover leaves it
        retention = Retention(redis, keys)  # the hook service restarted
        entries, gap, _ = await retention.read(ev(keys), "Late", "r1", 10)
        first: Any = await redis.xrange(ev(keys), count=1)
        assert gap is not None and gap.count == 6000 - length  # exactly, with its range
        assert (gap.after, gap.before) == (ids[-1].decode(), first[0][0].decode())
        assert entries == []
        entries, gap, _ = await retention.read(ev(keys), "Late", "r1", 10)
        assert gap is None and entries[0][0] == first[0][0]
    finally:
        await redis.aclose()


async def test_a_restart_from_the_aof_is_no_loss_and_a_cut_after_it_is_counted_exactly(
    tmp_path: Path,
) -> None:
    """Redis restarted from its AOF replays XREADGROUP as XCLAIM, which does not carry the
    group's entries-read: the counter comes back short. Nothing is reported lost for it (no
    dead letter, no lost counter, no LOST in ``hookbus lag``); the counter is exact again, and a
    cut by the hard cap after the restart is counted exactly."""
    with RedisServer(extra=["--appendonly", "yes", "--appendfsync", "always"]) as server:
        settings = BusSettings(redis_url=server.url, prefix="aof")
        keys = Keys(settings.prefix)
        redis = connect(settings)
        retention = Retention(redis, keys)
        try:
            await retention.create_group(ev(keys), "Late", "$")
            await redis.hset(keys.lost("Late"), "seen", 0)  # as a hook service does
            await publish_capped(redis, ev(keys), [b"x"] * 500, 2000)
            while (await retention.read(ev(keys), "Late", "r1", 200))[0]:
                pass
            assert (await group_of(redis, ev(keys), "Late"))["entries-read"] == 500
            server.stop()
            server.start()
            with contextlib.suppress(ConnectionError):  # the old connection's end
                await redis.ping()
            restored = await group_of(redis, ev(keys), "Late")
            assert restored["entries-read"] != 500  # the fact this test is about
            entries, gap, _ = await retention.read(ev(keys), "Late", "r1", 200)
            assert (entries, gap) == ([], None)
            assert (await group_of(redis, ev(keys), "Late"))["entries-read"] == 500
            assert await loss_records(redis, keys, "Late") == []
            [row] = [r for r in await consumer_lag(redis, keys, 200, 10) if r.stream == ev(keys)]
            assert (row.lag, row.lost) == (0, 0)
            # A real cut after the restart: counted exactly.
            await publish_capped(redis, ev(keys), [b"y"] * 6000, 2000)
            length = await redis.xlen(ev(keys))
            _, gap, _ = await retention.read(ev(keys), "Late", "r1", 200)
            assert gap is not None and gap.count == 6000 - length
        finally:
            await redis.aclose()


async def test_a_cut_between_two_reads_of_a_backlog_is_counted_exactly_and_nothing_else_is(
    bus_settings: BusSettings,
) -> None:
    """While a group works through a backlog, its check is decided from its lag alone (the
    script's short way); a cut the cap makes between two such reads is still found, exactly,
    by the next read, and no read before or after it reports a loss."""
    keys = Keys(bus_settings.prefix)
    redis = connect(bus_settings)
    retention = Retention(redis, keys)
    try:
        await retention.create_group(ev(keys), "Busy", "$")
        await publish_capped(redis, ev(keys), [f"a{i}".encode() for i in range(1500)], 2000)
        got, gaps = 0, []
        for _ in range(5):  # a backlog: lag below the stream's length, the short way
            entries, gap, _ = await retention.read(ev(keys), "Busy", "r1", 100)
            got += len(entries)
            gaps.append(gap)
        assert got == 500 and gaps == [None] * 5
        g = await group_of(redis, ev(keys), "Busy")
        assert 0 < g["lag"] < await redis.xlen(ev(keys))
        before = g["last-delivered-id"]
        await publish_capped(redis, ev(keys), [f"b{i}".encode() for i in range(5000)], 2000)
        length = await redis.xlen(ev(keys))
        entries, gap, _ = await retention.read(ev(keys), "Busy", "r1", 100)
        assert gap is not None and gap.count == 6500 - 500 - length
        assert gap.after == before.decode() and gap.before == entries[0][0].decode()
        seen = len(entries)
        while entries:
            entries, gap, last = await retention.read(ev(keys), "Busy", "r1", 1000)
            seen += len(entries)
            assert gap is None
        assert seen == length and last  # the end: nothing more lost, the last id known
    finally:
        await redis.aclose()


async def test_sync_requests_and_decisions_cut_while_pending_are_dead_lettered(
    bus_settings: BusSettings,
) -> None:
    """keep_and_claim (sync hook workers, coordinator-service replicas): the pending entries
    XAUTOCLAIM names as deleted become dead letters, one each; in-flight ones are still run."""
    keys = Keys(bus_settings.prefix)
    redis = connect(bus_settings)
    stream = keys.requests("Guard")
    try:
        await redis.xgroup_create(stream, WORKERS_GROUP, id="0", mkstream=True)
        for i in range(5):
            await redis.xadd(stream, {DATA_FIELD: f"r{i}".encode()})
        read: Any = await redis.xreadgroup(WORKERS_GROUP, "dead", {stream: ">"}, count=3)
        cut = [entry_id for entry_id, _ in read[0][1]]
        await publish_capped(redis, stream, [b"x"] * 500, 100)  # cuts them
        mine = {cut[0]}  # one of them a live replica is still running
        taken = await keep_and_claim(
            redis,
            stream,
            WORKERS_GROUP,
            "live",
            mine,
            0,
            100,
            dlq=keys.hook_dlq("Guard"),
            hook="Guard",
        )
        assert all(entry_id not in cut for entry_id, _ in taken)
        letters: Any = await redis.xrange(keys.hook_dlq("Guard"))
        assert sorted(f[b"entry_id"] for _, f in letters) == sorted(cut[1:])
        assert {f[b"reason"] for _, f in letters} == {
            f"{TRIMMED}: cut by the cap of {stream} while pending".encode()
        }
        assert {(f[b"hook"], f[b"groups"], f[b"lost"]) for _, f in letters} == {
            (b"Guard", WORKERS_GROUP.encode(), b"1")
        }
    finally:
        await redis.aclose()


# -- real worker processes ---------------------------------------------------------------------


async def test_an_async_group_down_while_three_caps_are_published_gets_all_or_the_exact_loss(
    bus_settings: BusSettings, procs: Processes, tmp_path: Path, receiver: OTLPReceiver
) -> None:
    settings = scaled(bus_settings)
    keys = Keys(settings.prefix)
    redis = Redis.from_url(settings.redis_url)
    record = tmp_path / "late.txt"
    cfg = AsyncConfig(name="Late", record=str(record))
    total = 3 * hard_cap(settings.events_maxlen)
    try:
        first = start_async(procs, settings, cfg)
        await wait_group(redis, keys, "Late")
        stop(first)  # the group exists; its service is down
        payloads = [event(i) for i in range(total)]
        ids = [msgspec.json.decode(p)["id"] for p in payloads]
        await publish_capped(redis, ev(keys), payloads, hard_cap(settings.events_maxlen))
        kept = await redis.xlen(ev(keys))
        lost = total - kept
        assert lost > 0
        assert lag_row(settings, ev(keys))[2:5] == [str(kept), "0", str(lost)]
        [(first_kept, _)] = await redis.xrange(ev(keys), count=1)
        start_async(procs, settings, cfg, **otel(receiver))

        async def all_or_counted() -> bool:
            handled = len(recorded(record))
            return handled + await counted(redis, keys, "Late", ev(keys)) == total

        await wait_for(all_or_counted, 60, "every event handled or counted as lost")
        await wait_for(lambda: caught_up(redis, ev(keys), "Late"), 30, "caught up")
        assert recorded(record) == set(ids[lost:])  # the newest, every one of them
        [letter] = await loss_records(redis, keys, "Late")
        assert int(letter[b"lost"]) == lost and letter[b"groups"] == b"Late"
        assert letter[b"before"] == first_kept
        assert f"{lost} entries of {ev(keys)} cut by its hard cap" in procs.logs()
        await wait_for(lambda: metric_total(receiver, "Late") == lost, 30, "the metric")
        assert lag_row(settings, ev(keys))[2:5] == ["0", "0", str(lost)]
        print(f"group down: {total} published, cap {hard_cap(settings.events_maxlen)}: "
              f"{len(recorded(record))} handled, {lost} lost and reported")  # fmt: skip
    finally:
        await redis.aclose()


async def test_a_killed_replicas_pending_entries_cut_by_the_cap_are_dead_lettered_one_by_one(
    bus_settings: BusSettings, procs: Processes, tmp_path: Path, receiver: OTLPReceiver
) -> None:
    settings = scaled(bus_settings)
    keys = Keys(settings.prefix)
    redis = Redis.from_url(settings.redis_url)
    record = tmp_path / "seen.txt"
    cap = hard_cap(settings.events_maxlen)
    try:
        slow = start_async(procs, settings, AsyncConfig(name="Held", delay_secs=120, timeout=200))
        await wait_group(redis, keys, "Held")
        held = [event(i) for i in range(30)]
        await publish_capped(redis, ev(keys), held, cap)

        async def holding() -> bool:
            return bool((await group_of(redis, ev(keys), "Held"))["pending"] == 30)

        await wait_for(holding, 30, "the slow replica to hold 30 entries")
        pending: Any = await redis.xpending_range(ev(keys), "Held", "-", "+", 100)
        held_ids = {p["message_id"] for p in pending}
        stop(slow, signal.SIGKILL)  # dies with 30 entries in flight
        more = [event(i) for i in range(3 * cap)]
        await publish_capped(redis, ev(keys), more, cap)
        kept = await redis.xlen(ev(keys))
        assert lag_row(settings, ev(keys))[2:5] == [str(kept), "0", str(30 + 3 * cap - kept)]
        start_async(procs, settings, AsyncConfig(name="Held", record=str(record)), **otel(receiver))

        async def all_or_counted() -> bool:
            lost = await counted(redis, keys, "Held", ev(keys))
            return len(recorded(record)) + lost == 30 + 3 * cap

        await wait_for(all_or_counted, 60, "every event handled or counted as lost")
        await wait_for(lambda: caught_up(redis, ev(keys), "Held"), 30, "caught up")
        letters = await loss_records(redis, keys, "Held")
        one_by_one = {f[b"entry_id"] for f in letters if TRIMMED.encode() in f[b"reason"]}
        assert one_by_one == held_ids  # each held entry, named
        assert sum(int(f[b"lost"]) for f in letters) == 30 + 3 * cap - kept
        [record_of_gap] = [f for f in letters if f[b"lost"] != b"1"]
        assert int(record_of_gap[b"lost"]) == 3 * cap - kept
        newest = {msgspec.json.decode(p)["id"] for p in more[-kept:]}
        assert recorded(record) == newest
        assert f"pending entries of group Held on {ev(keys)} were {TRIMMED}" in procs.logs()
        lost = 30 + 3 * cap - kept
        await wait_for(lambda: metric_total(receiver, "Held") == lost, 30, "the metric")
        assert lag_row(settings, ev(keys))[2:5] == ["0", "0", str(30 + 3 * cap - kept)]
        print(f"killed replica: 30 held + {3 * cap} published, cap {cap}: "
              f"{len(recorded(record))} handled, {len(one_by_one)} pending cut (one dead letter "
              f"each), {3 * cap - kept} never delivered cut (one record)")  # fmt: skip
    finally:
        await redis.aclose()


async def test_the_audit_trail_cut_while_the_audit_log_is_down_is_counted_exactly(
    bus_settings: BusSettings, procs: Processes, tmp_path: Path, receiver: OTLPReceiver
) -> None:
    settings = scaled(bus_settings)
    keys = Keys(settings.prefix)
    redis = Redis.from_url(settings.redis_url)
    db = tmp_path / "audit.db"

    def audit_log(**env: str) -> Any:
        return procs.worker(
            settings, "workers.builtins.audit:AsyncAuditLogHook", "audit",
            HOOKBUS_AUDIT_DB=str(db), **caps_env(settings), **env,
        )  # fmt: skip

    group = "AsyncAuditLogHook"
    cap = hard_cap(settings.audit_maxlen)
    total = 3 * cap
    try:
        first = audit_log()
        await wait_group(redis, keys, group)
        stop(first)
        records = [
            AuditRecord(id=new_id(), ts=now_ms(), kind="breakglass", mode="on", detail=f"r{i}")
            for i in range(total)
        ]
        await publish_capped(redis, keys.audit, [encode(r) for r in records], cap)
        kept = await redis.xlen(keys.audit)
        assert lag_row(settings, keys.audit)[2:5] == [str(kept), "0", str(total - kept)]
        audit_log(**otel(receiver))

        async def all_or_counted() -> bool:
            rows = len(audit_events(db, "event_id"))
            return rows + await counted(redis, keys, group, keys.audit) == total

        await wait_for(all_or_counted, 60, "every audit record stored or counted as lost")
        await wait_for(lambda: caught_up(redis, keys.audit, group), 30, "caught up")
        assert {row[0] for row in audit_events(db, "event_id")} == {r.id for r in records[-kept:]}
        [letter] = await loss_records(redis, keys, group)
        assert int(letter[b"lost"]) == total - kept
        assert f"{total - kept} entries of {keys.audit} cut by its hard cap" in procs.logs()
        await wait_for(lambda: metric_total(receiver, group) == total - kept, 30, "the metric")
        assert lag_row(settings, keys.audit)[2:5] == ["0", "0", str(total - kept)]
        print(f"audit trail: {total} records, cap {cap}: {kept} stored, {total - kept} lost and "
              "reported")  # fmt: skip
    finally:
        await redis.aclose()


async def test_retention_keeps_what_a_stopped_group_needs_and_trims_the_rest(
    bus_settings: BusSettings,
) -> None:
    """Below the hard cap nothing a group needs is trimmed, on every stream retention covers."""
    keys = Keys(bus_settings.prefix)
    redis = connect(bus_settings)
    retention = Retention(redis, keys)

    async def drain(stream: str, group: str) -> int:
        """Read and acknowledge everything; how many."""
        total = 0
        while entries := (await retention.read(stream, group, "c", 500))[0]:
            await redis.xack(stream, group, *[i for i, _ in entries])
            total += len(entries)
        return total

    try:
        for stream in (ev(keys), keys.audit, keys.replay("Slow")):
            await retention.create_group(stream, "Slow", "$")
            await retention.create_group(stream, "Fast", "$")
            await publish_capped(redis, stream, [b"x"] * 1500, hard_cap(200))
            assert await drain(stream, "Fast") == 1500
            report = await retention.trim(stream, 200)
            assert report == {"trimmed": 0, "at_risk": ["Slow"], "lost": 0}
            assert await redis.xlen(stream) == 1500  # Slow still needs every entry
            assert await drain(stream, "Slow") == 1500
            report = await retention.trim(stream, 200)
            assert report["lost"] == 0 and report["trimmed"] > 0 and not report["at_risk"]
            assert await redis.xlen(stream) == 1500 - report["trimmed"]
    finally:
        await redis.aclose()


@pytest.mark.parametrize(
    ("replicas", "delay", "total"),
    [(1, 1.5, 20), (6, 4.5, 200)],
    ids=["1 replica, 1.5 s hook, 20 events", "6 replicas, 4.5 s hook, 200 events"],
)
async def test_a_hook_slower_than_the_claim_time_runs_each_event_once_per_group(
    bus_settings: BusSettings,
    procs: Processes,
    tmp_path: Path,
    replicas: int,
    delay: float,
    total: int,
) -> None:
    """A hook taking longer than claim_idle_secs (0.5 s here; timeout 10 s), events published
    at once, no fault: each event is handled exactly once by the group."""
    keys = Keys(bus_settings.prefix)
    redis = Redis.from_url(bus_settings.redis_url)
    record = tmp_path / "slow.txt"
    cfg = AsyncConfig(name="Slow", record=str(record), delay_secs=delay, timeout=10)
    try:
        for _ in range(replicas):
            start_async(procs, bus_settings, cfg)
        await wait_group(redis, keys, "Slow", replicas)
        payloads = [event(i) for i in range(total)]
        ids = {msgspec.json.decode(p)["id"] for p in payloads}
        began = time.monotonic()
        await publish_capped(redis, ev(keys), payloads, hard_cap(bus_settings.events_maxlen))
        await wait_for(lambda: recorded(record) == ids, 120, f"all {total} events handled")
        await wait_for(lambda: caught_up(redis, ev(keys), "Slow"), 30, "all acknowledged")
        elapsed = time.monotonic() - began
        runs = collections.Counter(record.read_text().split())
        assert set(runs.values()) == {1}, runs.most_common(3)
        assert await redis.xlen(keys.hook_dlq("Slow")) == 0
        print(f"{total} events x {delay} s on {replicas} replicas: {elapsed:.1f} s")
    finally:
        await redis.aclose()
