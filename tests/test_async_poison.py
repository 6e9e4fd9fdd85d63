"""One tenant's hostile event poisons no batch of the shared async hooks (red-team finding A4).

A NUL in tool output (any binary file) made the audit log's PostgreSQL batch fail; two
``elapsed_ms`` of 1.7e308 made the metrics' HINCRBYFLOAT fail (inf); each failed batch was
retried and then dead-lettered whole, other tenants' events with it, and the metrics counted
every retry again. Real Redis, real PostgreSQL (tests/test_async_builtins.py's database), real
SQLite; the workers run in this process so that their counts can be read.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import sqlite3
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import msgspec
import pytest
from redis.asyncio import Redis
from redis.exceptions import ResponseError

from bus import HookEvent, PostToolUseContext
from bus.hooks import AsyncAgentHook, DeliveredEvent
from bus.protocol import DATA_FIELD, AuditRecord, EventMessage, encode, new_id, now_ms, raw
from bus.settings import BusSettings
from bus.transport.keys import Keys
from bus.transport.redis_io import connect
from tests.harness import wait_for
from tests.test_async_builtins import postgres_url  # noqa: F401  (a fixture)
from workers.builtins.audit import COLUMNS, AsyncAuditLogHook
from workers.builtins.metrics import AsyncMetricsHook
from workers.services.async_worker import AsyncHookWorker

NUL_OUTPUT = "\x00ELF binary"
BIG = 1.7e308  # two of them add up to inf


@pytest.fixture(params=["sqlite", "postgres"])
def audit_db(request: Any, tmp_path: Path) -> str:
    """Where the audit log goes: a SQLite file or a fresh PostgreSQL database."""
    if request.param == "sqlite":
        return str(tmp_path / "audit.db")
    return str(request.getfixturevalue("postgres_url"))


async def audit_rows(target: str) -> dict[str, dict[str, str]]:
    """Every row of the audit table, by event id."""
    query = f"SELECT {', '.join(COLUMNS)} FROM agent_audit_events"
    if target.startswith("postgresql://"):
        import asyncpg

        conn = await asyncpg.connect(target)
        try:
            rows: Sequence[Any] = await conn.fetch(query)
        finally:
            await conn.close()
    else:
        with contextlib.closing(sqlite3.connect(target)) as db:
            rows = db.execute(query).fetchall()
    return {row[0]: dict(zip(COLUMNS, row, strict=True)) for row in rows}


def tool_event(session: str, output: str = "ok", elapsed_ms: float = 12.0) -> EventMessage:
    ctx = PostToolUseContext(
        session_id=session, tool_name="cat", output_content=output, elapsed_ms=elapsed_ms
    )
    return EventMessage(
        id=new_id(), ts=now_ms(), event=HookEvent.POST_TOOL_USE, session_id=session,
        context=raw(ctx),
    )  # fmt: skip


def audit_record(session: str, detail: str) -> AuditRecord:
    return AuditRecord(
        id=new_id(), ts=now_ms(), kind="shadowed", event=HookEvent.PRE_TOOL_USE,
        session_id=session, tool_name="cat", hook="Guard", mode="warn", action="block",
        detail=detail,
    )  # fmt: skip


async def xadd_all(redis: Redis, stream: str, messages: Sequence[Any]) -> list[bytes]:
    async with redis.pipeline(transaction=False) as pipe:
        for message in messages:
            pipe.xadd(stream, {DATA_FIELD: encode(message)})
        return list(await pipe.execute())


async def settled(redis: Redis, *streams_and_groups: tuple[str, str]) -> bool:
    """Whether each group has read and settled (acknowledged) every entry of its stream."""
    for stream, group in streams_and_groups:
        groups = await redis.xinfo_groups(stream)
        mine = [g for g in groups if g["name"] == group.encode()]
        if not (mine and mine[0]["pending"] == 0 and mine[0]["lag"] == 0):
            return False
    return True


@contextlib.asynccontextmanager
async def running(*workers: AsyncHookWorker) -> AsyncIterator[None]:
    stop = asyncio.Event()
    tasks = [asyncio.create_task(w.run(stop)) for w in workers]
    try:
        yield
    finally:
        stop.set()
        await asyncio.wait_for(asyncio.gather(*tasks), 30)


async def test_one_tenants_nul_and_huge_latency_poison_no_batch_of_audit_and_metrics(
    bus_settings: BusSettings, audit_db: str
) -> None:
    """The red team's A4, in one batch per hook: 10 events of another tenant around a NUL in
    tool output and two latencies of 1.7e308 (one with the NUL); and on the audit trail, a
    record with a NUL beside an ordinary one. Every event is audited and counted once, the NUL
    stored as ``\\u0000``, the metrics exact, nothing dead-lettered, nothing pending."""
    keys = Keys(bus_settings.prefix)
    redis = Redis.from_url(bus_settings.redis_url)
    victims = [tool_event(f"victim-{i}") for i in range(10)]
    attacks = [tool_event("a1", NUL_OUTPUT, BIG), tool_event("a2", "x", BIG)]
    events = victims[:5] + attacks + victims[5:]
    records = [audit_record("victim-0", "would have blocked: ok"), audit_record("a1", "\x00!")]
    # All published before the workers start from "0": each hook reads them as one batch.
    await xadd_all(redis, keys.event_partitions[0], events)
    await xadd_all(redis, keys.audit, records)
    # Three deliveries: the old code dead-lettered both batches after them.
    audit = AsyncHookWorker(AsyncAuditLogHook(audit_db), bus_settings, start="0", max_deliveries=3)
    metrics = AsyncHookWorker(
        AsyncMetricsHook(bus_settings), bus_settings, start="0", max_deliveries=3
    )
    try:
        done = [
            (keys.event_partitions[0], "AsyncAuditLogHook"),
            (keys.audit, "AsyncAuditLogHook"),
            (keys.event_partitions[0], "AsyncMetricsHook"),
        ]
        async with running(audit, metrics):
            await wait_for(lambda: settled(redis, *done), 60, "every entry settled")
        rows = await audit_rows(audit_db)
        assert set(rows) == {m.id for m in events} | {r.id for r in records}
        assert rows[attacks[0].id]["output_preview"] == "\\u0000ELF binary"
        assert rows[records[1].id]["output_preview"] == "Guard: \\u0000!"
        assert {rows[m.id]["session_id"] for m in victims} == {f"victim-{i}" for i in range(10)}
        figures = await redis.hgetall(keys.metrics("AsyncMetricsHook"))
        assert figures == {
            b"events.PostToolUse": b"12",
            b"tool_calls": b"12",
            b"tool_errors": b"0",
            b"tool_latency_rejected": b"2",  # the two 1.7e308: left out, counted
            b"tool_latency_ms_total": b"120",  # the ten victims' 12 ms, exactly
        }
        for worker in (audit, metrics):
            assert await redis.xlen(keys.hook_dlq(worker.group)) == 0
            assert worker.stats["failed"] == worker.stats["dead_lettered"] == 0, worker.stats
        assert audit.stats["handled"] == metrics.stats["handled"] == 12
    finally:
        await redis.aclose()


class AllOrNothing(AsyncAgentHook):
    """A batch hook that applies a batch whole or not at all, and cannot take session
    ``poison``: it records the ids of what it handled and the size of every call."""

    name = "AllOrNothing"
    handles_batches = True
    follows_audit_trail = True

    def __init__(self) -> None:
        self.handled: list[str] = []
        self.calls: list[int] = []

    def _take(self, ids_and_sessions: list[tuple[str, str]]) -> None:
        self.calls.append(len(ids_and_sessions))
        if any(session == "poison" for _, session in ids_and_sessions):
            raise RuntimeError("cannot take session poison")
        self.handled.extend(i for i, _ in ids_and_sessions)

    async def on_batch(self, batch: Sequence[DeliveredEvent]) -> None:
        self._take([(d.id, d.context.session_id) for d in batch])

    async def on_audit(self, records: Sequence[AuditRecord]) -> None:
        self._take([(r.id, r.session_id) for r in records])


async def test_a_poison_entry_fails_alone_and_the_rest_of_its_batch_is_handled(
    bus_settings: BusSettings,
) -> None:
    """A batch of 21 events (and one of 9 audit records) with one the hook cannot take: the
    whole batch is handed over first; it fails, and the others are handled in the same
    delivery, each once; the poison entry alone is retried and dead-lettered, once, with its
    own reason and delivery count, and counted."""
    keys = Keys(bus_settings.prefix)
    redis = Redis.from_url(bus_settings.redis_url)
    events = [tool_event(f"other-{i}") for i in range(20)]
    events.insert(7, tool_event("poison"))
    records = [audit_record(f"other-{i}", "fine") for i in range(8)]
    records.insert(3, audit_record("poison", "no"))
    event_ids = await xadd_all(redis, keys.event_partitions[0], events)
    record_ids = await xadd_all(redis, keys.audit, records)
    hook = AllOrNothing()
    worker = AsyncHookWorker(hook, bus_settings, start="0", max_deliveries=3)
    try:
        done = [(keys.event_partitions[0], hook.name), (keys.audit, hook.name)]
        async with running(worker):
            await wait_for(lambda: settled(redis, *done), 60, "every entry settled")
        good = [m.id for m in events if m.session_id != "poison"]
        good += [r.id for r in records if r.session_id != "poison"]
        assert sorted(hook.handled) == sorted(good)  # each once
        assert {9, 21} <= set(hook.calls)  # each batch was handed over whole first
        dead = {f[b"entry_id"]: f for _, f in await redis.xrange(keys.hook_dlq("AllOrNothing"))}
        assert set(dead) == {event_ids[7], record_ids[3]}
        for fields in dead.values():
            assert fields[b"hook"] == b"AllOrNothing" and fields[b"deliveries"] == b"3"
            assert b"RuntimeError: cannot take session poison" in fields[b"reason"]
        assert dead[event_ids[7]][b"source"] == keys.event_partitions[0].encode()
        assert dead[record_ids[3]][b"source"] == keys.audit.encode()
        assert worker.stats["dead_lettered"] == 2
        assert worker.stats["handled"] == 20  # events (audit records are not in this count)
    finally:
        await redis.aclose()


def tool_call(elapsed_ms: float, error: bool = False) -> DeliveredEvent:
    ctx = PostToolUseContext(session_id="s", tool_name="t", is_error=error, elapsed_ms=elapsed_ms)
    return DeliveredEvent(new_id(), HookEvent.POST_TOOL_USE, now_ms(), ctx)


@contextlib.asynccontextmanager
async def metrics_of(settings: BusSettings) -> AsyncIterator[tuple[AsyncMetricsHook, Any, str]]:
    """The metrics hook, a client of its Redis (single node or cluster) and its hash's key."""
    hook, redis = AsyncMetricsHook(settings), connect(settings)
    try:
        yield hook, redis, Keys(settings.prefix).metrics("AsyncMetricsHook")
    finally:
        await hook.close()
        await redis.aclose()


async def test_metrics_leave_out_latencies_that_are_not_latencies_and_count_them(
    bus_settings: BusSettings,
) -> None:
    async with metrics_of(bus_settings) as (hook, redis, key):
        odd = [math.inf, -math.inf, math.nan, -1.0, 1e308, BIG, BIG, 8 * 24 * 3600 * 1000.0]
        await hook.on_batch([tool_call(x) for x in [12.0, 0.0, 7.5, *odd]])
        await hook.on_batch([tool_call(BIG), tool_call(0.5, error=True)])
        figures = await redis.hgetall(key)
        assert figures[b"tool_calls"] == b"13" and figures[b"tool_errors"] == b"1"
        assert figures[b"tool_latency_rejected"] == b"9"
        assert float(figures[b"tool_latency_ms_total"]) == 20.0


@pytest.mark.parametrize("broken", ["tool_latency_ms_total", "tool_errors"])
@pytest.mark.parametrize("redis_of", ["bus_settings", "cluster_settings"])
async def test_a_metrics_batch_is_counted_whole_or_not_at_all(
    request: Any, redis_of: str, broken: str
) -> None:
    """A figure Redis cannot add to (here: a field someone overwrote) fails the batch before
    anything of it is counted, so the retry counts it once; the old pipeline had added the
    other figures at every try. On one node and on a Redis Cluster (the script's one key)."""
    settings: BusSettings = request.getfixturevalue(redis_of)
    async with metrics_of(settings) as (hook, redis, key):
        batch = [tool_call(10.0), tool_call(5.0, error=True)]
        await hook.on_batch(batch)
        before = await redis.hgetall(key)
        await redis.hset(key, broken, "garbage")
        for _ in range(2):
            with pytest.raises(ResponseError):
                await hook.on_batch(batch)
        assert await redis.hgetall(key) == before | {broken.encode(): b"garbage"}
        await redis.hset(key, broken, before[broken.encode()])  # an operator repairs it
        await hook.on_batch(batch)  # the retry that succeeds
        figures = await redis.hgetall(key)
        assert figures[b"tool_calls"] == b"4" and figures[b"tool_errors"] == b"2"
        assert figures[b"events.PostToolUse"] == b"4"
        assert float(figures[b"tool_latency_ms_total"]) == 30.0


async def test_audit_stores_what_a_text_column_refuses_escaped_alike_in_both_backends(
    audit_db: str,
) -> None:
    """NUL and lone surrogates, in every column, and a timestamp out of the calendar's range:
    each row is stored, the characters as their JSON escapes, the timestamp as its number."""
    hook = AsyncAuditLogHook(audit_db)
    try:
        ctx = PostToolUseContext(
            session_id="s\ud800", tool_name="cat\x00", output_content="a\x00b\udfffc"
        )
        event = DeliveredEvent(new_id(), HookEvent.POST_TOOL_USE, now_ms(), ctx)
        late = DeliveredEvent(new_id(), HookEvent.POST_TOOL_USE, 10**18, ctx)
        await hook.on_batch([event, late])
        record = msgspec.structs.replace(audit_record("s", "\x00"), session_id="\x00\ud800")
        await hook.on_audit([record])
        rows = await audit_rows(audit_db)
        assert rows[event.id]["session_id"] == "s\\ud800"
        assert rows[event.id]["tool_name"] == "cat\\u0000"
        assert rows[event.id]["output_preview"] == "a\\u0000b\\udfffc"
        assert rows[late.id]["ts"] == str(10**18)
        assert rows[record.id]["session_id"] == "\\u0000\\ud800"
        assert rows[record.id]["output_preview"] == "Guard: \\u0000"
    finally:
        await hook.close()
