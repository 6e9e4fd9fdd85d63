"""The async built-ins (audit log on SQLite and PostgreSQL, metrics), retention and replay."""

from __future__ import annotations

import datetime as dt
import os
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg
import pytest
from redis.asyncio import Redis

from bus import HookEvent, PostToolUseContext, SessionStopContext, TurnTerminal
from bus.hooks import DeliveredEvent
from bus.protocol import DATA_FIELD, new_id, now_ms
from bus.settings import BusSettings
from bus.transport.keys import Keys
from bus.transport.retention import Retention
from workers.builtins.audit import AsyncAuditLogHook
from workers.builtins.metrics import AsyncMetricsHook
from workers.ops.replay import parse_position, replay_range


def ev(keys: Keys) -> str:
    """The events stream (one partition in these tests)."""
    return keys.event_partitions[0]


POSTGRES = os.environ.get("HOOKBUS_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432")


def delivered(i: int) -> DeliveredEvent:
    ctx = PostToolUseContext(
        session_id="s", tool_name="t", output_content="x" * 300, is_error=i % 3 == 0,
        elapsed_ms=2.0,
    )  # fmt: skip
    return DeliveredEvent(new_id(), HookEvent.POST_TOOL_USE, now_ms(), ctx)


@pytest.fixture
async def postgres_url() -> AsyncIterator[str]:
    """A fresh PostgreSQL database for one test (PostgreSQL runs on these machines)."""
    name = f"hookbus_{uuid.uuid4().hex[:10]}"
    admin = await asyncpg.connect(f"{POSTGRES}/postgres")
    try:
        await admin.execute(f"CREATE DATABASE {name}")
        yield f"{POSTGRES}/{name}"
    finally:
        await admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        await admin.close()


async def test_audit_is_idempotent_on_the_event_id_in_sqlite(tmp_path: Path) -> None:
    await check_idempotent(str(tmp_path / "audit.db"))


async def test_audit_is_idempotent_on_the_event_id_in_postgres(postgres_url: str) -> None:
    await check_idempotent(postgres_url)


async def check_idempotent(target: str) -> None:
    hook = AsyncAuditLogHook(target)
    try:
        batch = [delivered(i) for i in range(10)]
        await hook.on_batch(batch)
        await hook.on_batch(batch[:5])  # a redelivery after a crash
        stop = SessionStopContext(session_id="s", terminal=TurnTerminal.CANCELLED)
        await hook.on_batch([DeliveredEvent(new_id(), HookEvent.ON_SESSION_STOP, now_ms(), stop)])
        assert await hook.count() == 11
    finally:
        await hook.close()


async def test_metrics_hook_adds_up_into_redis(bus_settings: BusSettings) -> None:
    hook = AsyncMetricsHook(bus_settings)
    redis = Redis.from_url(bus_settings.redis_url)
    try:
        await hook.on_batch([delivered(i) for i in range(6)])
        figures = await redis.hgetall(Keys(bus_settings.prefix).metrics("AsyncMetricsHook"))
        assert figures[b"tool_calls"] == b"6" and figures[b"tool_errors"] == b"2"
        assert figures[b"events.PostToolUse"] == b"6"
        assert float(figures[b"tool_latency_ms_total"]) == 12.0
    finally:
        await hook.close()
        await redis.aclose()


async def test_retention_trims_history_but_never_what_a_group_still_needs(
    bus_settings: BusSettings,
) -> None:
    keys = Keys(bus_settings.prefix)
    redis = Redis.from_url(bus_settings.redis_url)
    try:
        ids = []
        for i in range(300):
            ids.append(await redis.xadd(ev(keys), {DATA_FIELD: b"{}"}, id=f"{1000 + i}-0"))
        await redis.xgroup_create(ev(keys), "slow", id=ids[49])  # handled the first 50
        await redis.xgroup_create(ev(keys), "fast", id="$")
        retention = Retention(redis, keys)
        done = await retention.trim(ev(keys), maxlen=100)
        first = (await redis.xrange(ev(keys), count=1))[0][0]
        assert int(first.split(b"-")[0]) <= 1050  # "slow" still needs entry 51 onwards
        assert done["trimmed"] <= 50
        # once "slow" catches up, history beyond maxlen goes (approximately)
        await redis.xgroup_setid(ev(keys), "slow", id="$")
        assert (await retention.trim(ev(keys), maxlen=100))["lost"] == 0
        assert await redis.xlen(ev(keys)) < 300
    finally:
        await redis.aclose()


async def test_replay_range_copies_to_the_hooks_replay_stream(bus_settings: BusSettings) -> None:
    keys = Keys(bus_settings.prefix)
    redis = Redis.from_url(bus_settings.redis_url)
    try:
        for i in range(1, 1201):
            await redis.xadd(ev(keys), {DATA_FIELD: f'{{"n": {i}}}'}, id=f"{i}-0")
        count = await replay_range(redis, keys, "Hook", "100", "1150")
        assert count == 1051
        copied = await redis.xrange(keys.replay("Hook"), count=1)
        assert copied[0][1][DATA_FIELD.encode()] == b'{"n": 100}'
        moment = dt.datetime(2026, 11, 30, tzinfo=dt.UTC)
        assert parse_position(moment.isoformat()) == f"{int(moment.timestamp() * 1000)}-0"
        assert parse_position("1700000000000") == "1700000000000-0"
        with pytest.raises(ValueError, match="not a stream position"):
            parse_position("yesterday")
    finally:
        await redis.aclose()
