"""Async hooks as consumer-group workers: at least once, dead letters, replay, backfill."""

from __future__ import annotations

import asyncio
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import msgspec
from redis.asyncio import Redis

from bus import PostToolUseContext, StepCompleteContext
from bus.events import HookEvent
from bus.protocol import DATA_FIELD, EventMessage, encode, new_id, now_ms, raw
from bus.settings import BusSettings
from bus.transport.keys import Keys
from tests.harness import ROOT, Processes, wait_for, worker_env
from tests.remote_hooks import AsyncConfig

SQLITE_ROWS = "SELECT count(*) FROM agent_audit_events"


def event(i: int, session: str = "s") -> bytes:
    if i % 2:
        ctx: Any = StepCompleteContext(session_id=session, step=i, max_steps=10**6)
        name = HookEvent.ON_STEP_COMPLETE
    else:
        ctx = PostToolUseContext(session_id=session, tool_name="t", output_content=f"out {i}")
        name = HookEvent.POST_TOOL_USE
    message = EventMessage(
        id=new_id(), ts=now_ms(), event=name, session_id=session, context=raw(ctx)
    )
    return encode(message)


async def publish(redis: Redis, keys: Keys, payloads: list[bytes], pace: float = 0) -> None:
    """XADD in pipelined chunks of 1000, ``pace`` seconds apart (a steady agent load)."""
    for start in range(0, len(payloads), 1000):
        async with redis.pipeline(transaction=False) as pipe:
            for p in payloads[start : start + 1000]:
                pipe.xadd(keys.event_partitions[0], {DATA_FIELD: p})
            await pipe.execute()
        if pace:
            await asyncio.sleep(pace)


def async_worker(procs: Processes, settings: BusSettings, cfg: AsyncConfig, *args: str) -> Any:
    payload = msgspec.json.encode(cfg).decode()
    return procs.worker(
        settings, "tests.remote_hooks:ScriptedAsync", cfg.name, *args, HOOKBUS_TEST_ASYNC=payload
    )


def audit_worker(procs: Processes, settings: BusSettings, db: Path, *args: str) -> Any:
    return procs.worker(
        settings,
        "workers.builtins.audit:AsyncAuditLogHook",
        "audit",
        *args,
        HOOKBUS_AUDIT_DB=str(db),
    )


def count_rows(db: Path) -> int:
    if not db.exists():
        return 0
    try:
        with sqlite3.connect(db, timeout=30) as conn:
            return int(conn.execute(SQLITE_ROWS).fetchone()[0])
    except sqlite3.OperationalError:  # the table is created by the first batch
        return 0


def recorded(path: Path) -> set[str]:
    return set(path.read_text().split()) if path.exists() else set()


async def wait_group(redis: Redis, keys: Keys, group: str, replicas: int = 1) -> None:
    """Until ``replicas`` replicas of the async hook have registered (its group exists)."""

    async def registered() -> bool:
        # Replica members only: the `stopped` marker of a clean shutdown scores below 0.
        return bool(await redis.zcount(keys.replicas(group), 0, "+inf") >= replicas)

    await wait_for(registered, timeout=30, what=f"{replicas} replicas of {group}")


async def test_every_event_handled_at_least_once_while_replicas_are_killed(
    bus_settings: BusSettings, procs: Processes, tmp_path: Path
) -> None:
    """20,000 events, 2 async hooks x 2 replicas, one replica SIGKILLed every 2 s."""
    total = 20_000
    keys = Keys(bus_settings.prefix)
    redis = Redis.from_url(bus_settings.redis_url)
    db, record = tmp_path / "audit.db", tmp_path / "recorder.txt"
    cfg = AsyncConfig(name="Recorder", record=str(record))
    audits = [audit_worker(procs, bus_settings, db) for _ in range(2)]
    recorders = [async_worker(procs, bus_settings, cfg) for _ in range(2)]
    try:
        await wait_group(redis, keys, "AsyncAuditLogHook", 2)
        await wait_group(redis, keys, "Recorder", 2)
        payloads = [event(i) for i in range(total)]
        ids = {msgspec.json.decode(p)["id"] for p in payloads}
        publisher = asyncio.create_task(publish(redis, keys, payloads, pace=0.6))
        kills = 0
        deadline = time.monotonic() + 240
        while not publisher.done() or count_rows(db) < total or len(recorded(record)) < total:
            assert time.monotonic() < deadline, (count_rows(db), len(recorded(record)))
            await asyncio.sleep(2)  # the chaos cadence, not a synchronisation
            group, index = (audits, kills % 2) if kills % 4 < 2 else (recorders, kills % 2)
            group[index].send_signal(signal.SIGKILL)
            group[index].wait()
            group[index] = (
                audit_worker(procs, bus_settings, db)
                if group is audits
                else async_worker(procs, bus_settings, cfg)
            )
            kills += 1
        await publisher
        assert kills >= 4
        assert count_rows(db) == total  # exactly once in the table: idempotent on the event id
        assert recorded(record) == ids  # every event handled at least once
    finally:
        await redis.aclose()


async def test_a_poison_event_is_dead_lettered_after_n_deliveries_then_replayed(
    bus_settings: BusSettings, procs: Processes, tmp_path: Path
) -> None:
    keys = Keys(bus_settings.prefix)
    redis = Redis.from_url(bus_settings.redis_url)
    record, fixed = tmp_path / "seen.txt", tmp_path / "fixed"
    cfg = AsyncConfig(
        name="Picky", fail_session="poison", fixed_flag=str(fixed), record=str(record)
    )
    async_worker(procs, bus_settings, cfg, "--max-deliveries", "3")
    try:
        await wait_group(redis, keys, "Picky")
        payloads = [event(i) for i in range(20)] + [event(0, session="poison")]
        await publish(redis, keys, payloads)
        poison_id = msgspec.json.decode(payloads[-1])["id"]

        async def dlq() -> list[Any]:
            return list(await redis.xrange(keys.hook_dlq("Picky")))

        entries = await wait_for(dlq, timeout=60, what="the poison event in the DLQ")
        [(_, fields)] = entries
        assert fields[b"hook"] == b"Picky" and fields[b"deliveries"] == b"3"
        assert b"cannot handle session poison" in fields[b"reason"]
        assert len(recorded(record)) == 20 and poison_id not in recorded(record)

        fixed.touch()  # the fix is deployed
        out = subprocess.run(
            [sys.executable, "-m", "workers.cli", "replay", "Picky", "--dlq", "--yes"],
            env=worker_env(bus_settings), cwd=ROOT, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert out.returncode == 0 and "re-fed 1 dead letter to Picky" in out.stdout, out.stderr
        await wait_for(lambda: poison_id in recorded(record), what="the replayed event")
        assert await dlq() == []
    finally:
        await redis.aclose()


async def test_malformed_entries_are_dead_lettered_and_the_worker_goes_on(
    bus_settings: BusSettings, procs: Processes, tmp_path: Path
) -> None:
    keys = Keys(bus_settings.prefix)
    redis = Redis.from_url(bus_settings.redis_url)
    record = tmp_path / "seen.txt"
    async_worker(procs, bus_settings, AsyncConfig(name="Sturdy", record=str(record)))
    try:
        await wait_group(redis, keys, "Sturdy")
        bad = [
            {DATA_FIELD: b"not json"},
            {DATA_FIELD: b'{"id": "x", "ts": 1, "event": "Nope", "session_id": "s", '
             b'"context": {}}'},
            {"other": b"field"},
            {DATA_FIELD: b'{"id": "x", "ts": 1, "event": "PreToolUse", "session_id": "s", '
             b'"context": {"session_id": "s", "tool_name": 5}}'},
        ]  # fmt: skip
        async with redis.pipeline(transaction=False) as pipe:
            for i in range(1000):
                pipe.xadd(keys.event_partitions[0], bad[i % len(bad)])
            await pipe.execute()
        good = event(2)
        await publish(redis, keys, [good])
        good_id = msgspec.json.decode(good)["id"]
        await wait_for(lambda: good_id in recorded(record), what="the good event after the bad")

        async def all_dead_lettered() -> bool:
            return bool(await redis.xlen(keys.hook_dlq("Sturdy")) >= 1000)

        await wait_for(all_dead_lettered, timeout=30, what="1000 dead letters")
        reasons = {
            f[b"reason"].decode() for _, f in await redis.xrange(keys.hook_dlq("Sturdy"), count=8)
        }
        assert any("JSON is malformed" in r for r in reasons)
        assert any("Invalid enum value 'Nope'" in r for r in reasons)
        assert any("no 'data' field" in r for r in reasons)
        assert any("$.context.tool_name" in r for r in reasons)
        assert await redis.xlen(keys.hook_dlq("Sturdy")) == 1000
    finally:
        await redis.aclose()


async def test_a_new_hook_started_from_0_handles_the_whole_retained_history(
    bus_settings: BusSettings, procs: Processes, tmp_path: Path
) -> None:
    keys = Keys(bus_settings.prefix)
    redis = Redis.from_url(bus_settings.redis_url)
    try:
        payloads = [event(i) for i in range(500)]
        await publish(redis, keys, payloads)
        record_new, record_late = tmp_path / "new.txt", tmp_path / "late.txt"
        async_worker(procs, bus_settings, AsyncConfig(name="Backfill", record=str(record_new)),
                     "--from", "0")  # fmt: skip
        async_worker(procs, bus_settings, AsyncConfig(name="Tail", record=str(record_late)))
        ids = {msgspec.json.decode(p)["id"] for p in payloads}
        await wait_for(lambda: recorded(record_new) == ids, timeout=60, what="the backfill")
        await wait_group(redis, keys, "Tail")
        after = event(3)
        await publish(redis, keys, [after])
        after_id = msgspec.json.decode(after)["id"]
        await wait_for(lambda: after_id in recorded(record_late), what="the new event")
        assert recorded(record_late) == {after_id}  # "$" (the default) skips history
    finally:
        await redis.aclose()


async def test_nogroup_is_recreated_and_logged(
    bus_settings: BusSettings, procs: Processes, tmp_path: Path
) -> None:
    keys = Keys(bus_settings.prefix)
    redis = Redis.from_url(bus_settings.redis_url)
    record = tmp_path / "seen.txt"
    async_worker(procs, bus_settings, AsyncConfig(name="Phoenix", record=str(record)))
    try:
        await wait_group(redis, keys, "Phoenix")
        await redis.delete(keys.event_partitions[0])  # the stream is wiped, groups and all
        payload = event(4)

        async def handled_after_republishing() -> bool:
            await publish(redis, keys, [payload])  # until the recreated group sees one
            return bool(recorded(record))

        await wait_for(handled_after_republishing, timeout=30, what="the recreated group")
        assert "recreating it" in procs.logs()
    finally:
        await redis.aclose()


async def test_redis_lost_mid_batch_does_not_stop_the_worker(
    bus_settings: BusSettings, tmp_path: Path
) -> None:
    """The connection drops while a batch is being settled: the worker logs it and goes on;
    the batch, never acknowledged, is handled again (at least once)."""
    from redis.exceptions import ConnectionError as RedisConnectionError

    from tests.remote_hooks import ScriptedAsync
    from workers.services.async_worker import AsyncHookWorker

    record = tmp_path / "seen.txt"
    worker = AsyncHookWorker(
        ScriptedAsync(AsyncConfig(name="Sturdy", record=str(record))), bus_settings
    )
    real_settle, failures = worker._settle, []

    async def settle_once_broken(*args: Any) -> None:
        if not failures:
            failures.append(args)
            raise RedisConnectionError("Connection closed by server.")
        await real_settle(*args)

    worker._settle = settle_once_broken  # type: ignore[method-assign]
    keys, redis = Keys(bus_settings.prefix), Redis.from_url(bus_settings.redis_url)
    stop = asyncio.Event()
    running = asyncio.create_task(worker.run(stop))
    try:
        await wait_for(worker.registered.is_set, what="the worker to register")
        payload = event(3)
        await publish(redis, keys, [payload])
        message_id = msgspec.json.decode(payload)["id"]

        async def settled() -> bool:
            groups = await redis.xinfo_groups(keys.event_partitions[0])
            mine = [g for g in groups if g["name"] == b"Sturdy"]
            return bool(mine) and mine[0]["pending"] == 0 and mine[0]["lag"] == 0

        await wait_for(settled, 30, "the batch to be handled again and acknowledged")
        assert failures and not running.done()
        assert list(recorded(record)) == [message_id]  # handled twice, one id
        assert record.read_text().split().count(message_id) == 2
    finally:
        stop.set()
        await asyncio.wait_for(running, 30)
        await redis.aclose()


async def test_each_call_sees_its_own_event_and_a_batch_leaves_current_event_as_it_was(
    bus_settings: BusSettings,
) -> None:
    """In one batch, every call of the hook reads its own event from ``current_event``, whether
    it finishes at once or really suspends (and so runs in a task of its own); events the hook
    does not take are acknowledged as skipped; after the batch ``current_event`` holds what it
    held before."""
    from bus.events import PreToolUseContext
    from bus.hooks import AsyncAgentHook, DeliveredEvent, current_event
    from workers.services.async_worker import AsyncHookWorker

    seen: list[tuple[int, str, str]] = []

    class Recorder(AsyncAgentHook):
        name = "current-event-recorder"
        subscribed_events = (HookEvent.PRE_TOOL_USE,)

        async def on_pre_tool_use_async(self, ctx: Any) -> None:
            before = current_event.get()
            if ctx.step % 2:  # suspends: finished in a task, under the hook's timeout
                await asyncio.sleep(0)
            after = current_event.get()
            assert before is not None and after is not None
            seen.append((ctx.step, before.id, after.id))

    ids, entries = [], []
    for step in range(6):
        ctx: Any = PreToolUseContext(session_id="s", tool_name="file_read", step=step)
        event = HookEvent.PRE_TOOL_USE
        if step == 5:  # one event the hook does not take
            ctx = StepCompleteContext(session_id="s", step=step, max_steps=10)
            event = HookEvent.ON_STEP_COMPLETE
        message = EventMessage(id=new_id(), ts=now_ms(), event=event, session_id="s",
                               context=raw(ctx))  # fmt: skip
        ids.append(message.id)
        entries.append((f"1-{step}".encode(), {DATA_FIELD.encode(): encode(message)}))
    worker = AsyncHookWorker(Recorder(), bus_settings)
    outer = DeliveredEvent("outer", HookEvent.ON_SESSION_START, 0, None)
    token = current_event.set(outer)
    try:
        await worker.process(worker.events[0], entries)
        assert current_event.get() is outer
    finally:
        current_event.reset(token)
        await worker.redis.aclose()
    assert sorted(seen) == [(step, ids[step], ids[step]) for step in range(5)]
    assert (worker.stats["handled"], worker.stats["skipped"]) == (5, 1)


async def test_a_replica_acknowledges_what_it_handled_when_it_stops_right_after(
    bus_settings: BusSettings,
) -> None:
    """A lane's XACK goes with its next read (one round trip a batch); a lane that stops
    after a batch, with no read to follow, acknowledges it as it stops: nothing it handled is
    left pending for another replica to run again."""
    from bus.hooks import AsyncAgentHook
    from workers.services.async_worker import AsyncHookWorker

    stop = asyncio.Event()
    handled: list[int] = []

    class StopsAtTheLast(AsyncAgentHook):
        name = "stops-at-the-last"
        subscribed_events = (HookEvent.POST_TOOL_USE,)

        async def on_post_tool_use_async(self, ctx: Any) -> None:
            handled.append(int(ctx.output_content.split()[1]))
            if len(handled) == 5:
                stop.set()  # the lane ends after this batch: no read follows it

    keys = Keys(bus_settings.prefix)
    worker = AsyncHookWorker(StopsAtTheLast(), bus_settings, start="0")
    redis = Redis.from_url(bus_settings.redis_url)
    try:
        await publish(redis, keys, [event(2 * i) for i in range(5)])
        await asyncio.wait_for(worker.run(stop), 30)
        assert sorted(handled) == [0, 2, 4, 6, 8]
        pending: Any = await redis.xpending(keys.event_partitions[0], "stops-at-the-last")
        assert pending["pending"] == 0
    finally:
        await redis.aclose()


async def test_a_claimed_batch_after_another_does_not_run_the_first_again(
    bus_settings: BusSettings,
) -> None:
    """A lane sends a batch's XACK with its next read; between two claimed batches there is no
    read, so the first one's acknowledgement goes before the second runs. Else its entries,
    pending and no longer kept fresh while a slow second batch runs, were claimed and run again
    with no failure anywhere."""
    from bus import AsyncAgentHook
    from workers.services.async_worker import AsyncHookWorker

    class SlowThird(AsyncAgentHook):
        name = "SlowThird"

        def __init__(self) -> None:
            self.seen: list[int] = []

        async def on_step_complete_async(self, ctx: Any) -> None:
            self.seen.append(ctx.step)
            if ctx.step == 3:
                await asyncio.sleep(3)  # within the 5 s async timeout, past claim_idle_secs

    hook = SlowThird()
    worker = AsyncHookWorker(hook, bus_settings)
    keys, redis = Keys(bus_settings.prefix), Redis.from_url(bus_settings.redis_url)
    stream = keys.event_partitions[0]
    stop = asyncio.Event()
    running = None
    try:
        await worker.register()  # its group, at "$"
        await publish(redis, keys, [event(1), event(3)])
        # A replica that died holding them, one a read; taken over as _claim does, two passes.
        reads = [await redis.xreadgroup(worker.group, "gone", {stream: ">"}, count=1) for _ in "12"]
        running = asyncio.create_task(worker.run(stop))
        for read in reads:
            entries = list(read[0][1])
            await redis.xclaim(stream, worker.group, worker.replica, 0, [i for i, _ in entries])
            worker._in_flight[stream].update(i for i, _ in entries)
            worker._claimed[stream].append(entries)
        worker._wake[stream].set()

        async def settled() -> bool:
            groups = await redis.xinfo_groups(stream)
            mine = [g for g in groups if g["name"] == worker.group.encode()]
            return 3 in hook.seen and bool(mine) and mine[0]["pending"] == 0

        await wait_for(settled, 20, "both batches handled and acknowledged")
        assert sorted(hook.seen) == [1, 3]
        assert worker.stats["claimed"] == 0
    finally:
        stop.set()
        if running is not None:
            await asyncio.wait_for(running, 30)
        await redis.aclose()
