"""One backoff policy for every retry (bus/transport/backoff.py), and where it is used.

* The policy: delays grow (doubling), are jittered within [ceiling/2, ceiling], stop at the cap
  and start over after a reset.
* The three retry loops that had their own hand-written doubling (the coordinator's inbox
  reader, ``redis_io.consume``, the sync worker's registration) draw their delays from it:
  against a port where nothing listens, each logs one line per retry whose delay lies within
  the policy's bounds for that retry, is not the bare ceiling every time (the old loops logged
  exactly 0.1, 0.2, 0.4, …), grows, and stops at the loop's cap.
* An async hook's failed delivery is claimed again only once idle past the backoff for its
  delivery count (:func:`redelivery_idle_ms`), and dead-lettered once after the last try.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
from redis.asyncio import Redis

from bus import AsyncAgentHook, HookEvent, PostToolUseContext
from bus.errors import ConfigError
from bus.protocol import DATA_FIELD, EventMessage, encode, new_id, now_ms, raw
from bus.settings import BusSettings
from bus.transport import coordinator as coordinator_module
from bus.transport import redis_io
from bus.transport.backoff import REDELIVERY_CAP_SECS, Backoff, redelivery_idle_ms
from bus.transport.coordinator import Coordinator
from bus.transport.keys import Keys
from bus.transport.redis_io import TRIMMED
from bus.transport.retention import Retention
from tests.harness import wait_for
from tests.hooks_for_tests import Recorder
from workers.ops.acl import HookUser, hook_rules
from workers.services import worker as worker_module
from workers.services.async_worker import AsyncHookWorker
from workers.services.worker import HookWorker

RETRIES = 7  # enough retries to reach every loop's cap (the 6th ceiling is past it)


# -- the policy ----------------------------------------------------------------------------------


def test_delays_grow_jittered_within_bounds_up_to_the_cap_and_start_over_after_a_reset() -> None:
    backoff = Backoff(0.1, 2.0)
    ceilings = [min(2.0, 0.1 * 2**k) for k in range(12)]
    assert [backoff.ceiling(k) for k in range(12)] == pytest.approx(ceilings)
    runs = []
    for _ in range(200):
        delays = [backoff.next() for _ in range(12)]
        assert backoff.failures == 12
        for delay, ceiling in zip(delays, ceilings, strict=True):
            assert ceiling / 2 <= delay <= ceiling <= 2.0
        # growing: each delay's floor is the ceiling before it, until the cap
        uncapped = [d for d, c in zip(delays, ceilings, strict=True) if c < 2.0]
        assert uncapped == sorted(uncapped)
        runs.append(delays)
        backoff.reset()
        assert backoff.failures == 0
        assert 0.05 <= backoff.next() <= 0.1  # the shortest again
        backoff.reset()
    # jittered: the draws differ from run to run and spread over each interval
    firsts = sorted(run[2] for run in runs)
    assert len(set(firsts)) > 190
    assert firsts[0] < 0.25 and firsts[-1] > 0.35  # within [0.4/2, 0.4]
    capped = sorted(run[-1] for run in runs)
    assert capped[0] < 1.25 and capped[-1] > 1.75  # within [2.0/2, 2.0]


def test_a_backoff_needs_a_positive_first_delay_within_its_cap() -> None:
    for first, cap in [(0, 1.0), (-1, 1.0), (2.0, 1.0)]:
        with pytest.raises(ConfigError):
            Backoff(first, cap)


def test_the_redelivery_idle_time_grows_with_the_delivery_count_jittered_by_the_entry() -> None:
    """claim_idle_secs after the first delivery; after delivery n ≥ 2, in
    [claim_idle · 2^(n-2), claim_idle · 2^(n-1)], at most REDELIVERY_CAP_SECS; the same for
    an entry whatever asks (every replica, every claim pass), different across entries."""
    ids = [f"{1700000000000 + i}-{i % 3}".encode() for i in range(300)]
    for claim_idle in (0.2, 0.5, 1.0):
        floor = int(claim_idle * 1000)
        for entry_id in ids:
            idles = [redelivery_idle_ms(n, entry_id, claim_idle) for n in range(1, 16)]
            assert idles == [redelivery_idle_ms(n, entry_id, claim_idle) for n in range(1, 16)]
            assert idles[0] == floor  # the first retry: as the takeover of a silent replica's
            for n, idle in enumerate(idles[1:], start=2):
                low = min(claim_idle * 2 ** (n - 2), REDELIVERY_CAP_SECS / 2)
                high = min(claim_idle * 2 ** (n - 1), REDELIVERY_CAP_SECS)
                assert int(low * 1000) <= idle <= int(high * 1000), (n, idle)
            assert idles[:6] == sorted(idles[:6])  # grows (below the cap at these counts)
            assert idles[-1] <= REDELIVERY_CAP_SECS * 1000
        spread = {redelivery_idle_ms(4, entry_id, claim_idle) for entry_id in ids}
        assert len(spread) > 150  # jittered across entries, not one threshold for all
    assert redelivery_idle_ms(0, b"1-0", 0.5) == 500


# -- the loops that use it -------------------------------------------------------------------------


@contextlib.contextmanager
def refused_port() -> Iterator[int]:
    """A local port bound but not listening: every connection to it is refused."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield sock.getsockname()[1]


def unreachable(port: int, prefix: str) -> BusSettings:
    return BusSettings(redis_url=f"redis://127.0.0.1:{port}/0", prefix=prefix)


def delays(caplog: pytest.LogCaptureFixture, logger: str, text: str) -> list[float]:
    """The delay (the last argument, unrounded) of each retry line ``logger`` wrote."""
    return [
        float(record.args[-1])  # type: ignore[index]
        for record in caplog.records
        if record.name == logger and text in record.msg and isinstance(record.args, tuple)
    ]


def assert_backoff(found: list[float], first: float, cap: float) -> None:
    """``found``: the delays of one loop's first retries, all drawn from Backoff(first, cap)."""
    ceilings = [min(cap, first * 2**k) for k in range(len(found))]
    assert len(found) >= RETRIES - 1, found
    for delay, ceiling in zip(found, ceilings, strict=True):
        assert ceiling / 2 <= delay <= ceiling, (found, ceilings)
    assert found != pytest.approx(ceilings)  # jittered: the old loops logged the ceilings
    uncapped = [d for d, c in zip(found, ceilings, strict=True) if c < cap]
    assert uncapped == sorted(uncapped) and len(uncapped) >= 4  # grows
    assert ceilings[-1] == cap and max(found) <= cap  # reached the cap, never past it


async def retried_delays(
    caplog: pytest.LogCaptureFixture, logger: str, text: str, loop: asyncio.Task[Any], what: str
) -> list[float]:
    """The first ``RETRIES`` delays ``loop`` logged (``logger``, lines holding ``text``), then
    ``loop`` stopped."""
    try:
        await wait_for(
            lambda: len(delays(caplog, logger, text)) >= RETRIES, 30, f"{RETRIES} retries of {what}"
        )
    finally:
        loop.cancel()
        await asyncio.gather(loop, return_exceptions=True)
    return delays(caplog, logger, text)[:RETRIES]


async def test_the_coordinators_inbox_reader_backs_off_with_the_policy(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, "hookbus.coordinator")
    text = "inbox reader lost Redis"
    with refused_port() as port:
        coordinator = Coordinator(unreachable(port, "backoff-inbox"))
        reader = asyncio.create_task(coordinator._read_inbox())
        try:
            found = await retried_delays(
                caplog, "hookbus.coordinator", text, reader, "the inbox reader"
            )
        finally:
            await coordinator.redis.aclose()
    assert_backoff(found, 0.05, 1.0)
    # the hand-written loop's figures, kept, named
    named = coordinator_module.INBOX_RETRY_FIRST_SECS, coordinator_module.INBOX_RETRY_CAP_SECS
    assert named == (0.05, 1.0)


async def test_the_consumer_loop_backs_off_with_the_policy(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, "hookbus.redis")
    text = "Redis unreachable (%s); retrying in"
    stop = asyncio.Event()

    async def nothing(*_: Any) -> None:
        raise AssertionError("nothing can be read from a port where nothing listens")

    with refused_port() as port:
        redis = redis_io.connect(unreachable(port, "backoff-consume"))
        loop = asyncio.create_task(
            redis_io.consume(
                redis, "s", "g", "c", count=1, stop=stop, handle=nothing, recreate=nothing
            )
        )
        try:
            found = await retried_delays(caplog, "hookbus.redis", text, loop, "the consumer loop")
        finally:
            stop.set()
            await redis.aclose()
    assert_backoff(found, 0.1, 2.0)
    assert (redis_io.CONSUME_RETRY_FIRST_SECS, redis_io.CONSUME_RETRY_CAP_SECS) == (0.1, 2.0)


async def test_the_sync_workers_registration_backs_off_with_the_policy(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, "hookbus.worker")
    text = "Redis unreachable (%s); retrying in"
    stop = asyncio.Event()
    with refused_port() as port:
        worker = HookWorker(Recorder("Patient"), unreachable(port, "backoff-worker"))
        run = asyncio.create_task(worker.run(stop))
        try:
            found = await retried_delays(
                caplog, "hookbus.worker", text, run, "the worker's registration"
            )
        finally:
            stop.set()
    assert_backoff(found, 0.1, 2.0)
    assert (worker_module.RETRY_FIRST_SECS, worker_module.RETRY_CAP_SECS) == (0.1, 2.0)


# -- async redelivery ----------------------------------------------------------------------------


class Failing(AsyncAgentHook):
    """Fails on every event of session ``poison`` and records when it was called."""

    name = "Failing"
    subscribed_events = (HookEvent.POST_TOOL_USE,)

    def __init__(self) -> None:
        self.calls: list[float] = []
        self.handled: list[str] = []

    async def on_post_tool_use_async(self, ctx: PostToolUseContext) -> None:
        if ctx.session_id == "poison":
            self.calls.append(time.monotonic())
            raise RuntimeError("cannot take session poison")
        self.handled.append(ctx.session_id)


def tool_event(session: str) -> EventMessage:
    ctx = PostToolUseContext(session_id=session, tool_name="cat", output_content="ok")
    return EventMessage(
        id=new_id(), ts=now_ms(), event=HookEvent.POST_TOOL_USE, session_id=session,
        context=raw(ctx),
    )  # fmt: skip


async def test_a_failing_async_hook_is_retried_at_growing_intervals_then_dead_lettered_once(
    bus_settings: BusSettings, caplog: pytest.LogCaptureFixture
) -> None:
    """A hook that fails on one event, five deliveries at most: each redelivery is claimed only
    once the entry is idle past :func:`redelivery_idle_ms` for its count, never sooner: each
    interval between two calls is at least its threshold less 0.25 s (a lower bound Redis's
    ``XCLAIM`` min-idle enforces, whatever the machine's speed; the slack covers the time from
    Redis's delivery to the hook's call). The thresholds the worker used (its log) are those,
    and grow. After the fifth failure the entry is dead-lettered once, with its reason and
    count, and the hook is not called again. The old worker claimed every retry once idle past
    ``claim_idle_secs``, whatever the count: its fourth interval was at most about 1 s.
    A pending entry that was cut from the stream meanwhile (a dead replica's) is still a dead
    letter, "trimmed before it was handled", counted as lost."""
    caplog.set_level(logging.DEBUG, "hookbus.async")
    keys = Keys(bus_settings.prefix)
    redis = Redis.from_url(bus_settings.redis_url)
    hook = Failing()
    worker = AsyncHookWorker(hook, bus_settings, start="0", max_deliveries=5)
    stream = keys.event_partitions[0]
    cut = await redis.xadd(stream, {DATA_FIELD: encode(tool_event("cut"))})
    await Retention(redis, keys).create_group(stream, "Failing", "0")
    await redis.xreadgroup("Failing", "dead-replica", {stream: ">"}, count=1)  # pending there
    assert await redis.xdel(stream, cut) == 1  # as the hard cap cuts
    entry_id = await redis.xadd(stream, {DATA_FIELD: encode(tool_event("poison"))})
    await redis.xadd(stream, {DATA_FIELD: encode(tool_event("fine"))})
    stop = asyncio.Event()
    run = asyncio.create_task(worker.run(stop))
    try:

        async def poison_letter() -> list[Any]:
            letters: Any = await redis.xrange(keys.hook_dlq("Failing"))
            return [f for _, f in letters if f[b"entry_id"] == entry_id]

        await wait_for(poison_letter, 60, "the poison event's dead letter")
        await wait_for(lambda: _settled(redis, stream), 30, "nothing of the group pending")
    finally:
        stop.set()
        await asyncio.wait_for(run, 30)
    try:
        claim_idle = bus_settings.claim_idle_secs
        thresholds = [redelivery_idle_ms(n, entry_id, claim_idle) for n in (1, 2, 3, 4)]
        assert len(hook.calls) == 5 and hook.handled == ["fine"]
        intervals = [b - a for a, b in zip(hook.calls, hook.calls[1:], strict=False)]
        for interval, threshold in zip(intervals, thresholds, strict=True):
            assert interval >= threshold / 1000 - 0.25, (intervals, thresholds)

        letters: Any = await redis.xrange(keys.hook_dlq("Failing"))
        by_entry = {f[b"entry_id"]: f for _, f in letters}
        assert len(letters) == len(by_entry) == 2  # once each
        fields = by_entry[entry_id]
        assert fields[b"deliveries"] == b"5"
        assert b"RuntimeError: cannot take session poison" in fields[b"reason"]
        assert by_entry[cut][b"reason"].startswith(TRIMMED.encode())
        assert worker.stats["dead_lettered"] == 1 and worker.stats["lost"] == 1

        claims = [
            record.args
            for record in caplog.records
            if record.name == "hookbus.async"
            and "idle past" in record.msg
            and isinstance(record.args, tuple)
            and record.args[1] == entry_id.decode()
        ]
        # (group, entry, stream, deliveries so far, idle threshold in ms) of each claim
        counts = [int(args[3]) for args in claims]  # type: ignore[call-overload]
        used = [int(args[4]) for args in claims]  # type: ignore[call-overload]
        assert counts == [1, 2, 3, 4, 5]
        assert used == [*thresholds, int(claim_idle * 1000)]  # the last: dead-lettered
        assert used[0] <= used[1] < used[2] < used[3]  # growing
        assert used[3] >= 2 * claim_idle * 1000  # the fourth at least 2 × claim_idle
    finally:
        await redis.aclose()


async def _settled(redis: Redis, stream: str) -> bool:
    groups = await redis.xinfo_groups(stream)
    mine = [g for g in groups if g["name"] == b"Failing"]
    return bool(mine and mine[0]["pending"] == 0 and mine[0]["lag"] == 0)


def test_the_figures_in_the_docs_are_the_policys() -> None:
    """docs/reliability.md, docs/writing-hooks.md and docs/protocol.md state the redelivery
    schedule at the defaults and the loops' figures; they are these."""
    claim_idle = BusSettings().claim_idle_secs
    assert claim_idle == 1.0
    ids = [f"{1700000000000 + i}-0".encode() for i in range(2000)]
    bounds = [
        (min(redelivery_idle_ms(n, i, claim_idle) for i in ids),
         max(redelivery_idle_ms(n, i, claim_idle) for i in ids))
        for n in range(1, 5)
    ]  # fmt: skip
    assert bounds[0] == (1000, 1000)
    assert [(round(lo / 1000), round(hi / 1000)) for lo, hi in bounds[1:]] == [
        (1, 2), (2, 4), (4, 8)
    ]  # fmt: skip
    assert REDELIVERY_CAP_SECS == 60.0 and AsyncHookWorker.__init__.__kwdefaults__ is not None
    assert AsyncHookWorker.__init__.__kwdefaults__["max_deliveries"] == 5
    root = Path(__file__).resolve().parent.parent
    docs = {name: " ".join((root / "docs" / name).read_text().split()) for name in
            ("reliability.md", "writing-hooks.md", "protocol.md")}  # fmt: skip
    assert (
        "delivered again 1 s after the failure (`claim_idle_secs`), then 1–2 s, 2–4 s and 4–8 s"
        in docs["reliability.md"]
    )
    assert "at most 60 s apart" in docs["reliability.md"]
    assert (
        "dead-lettered once, 1 s after its fifth failure (`max_deliveries`)"
        in docs["reliability.md"]
    )
    assert (
        "delivered again, 1 s after the failure, then 1–2 s, 2–4 s and 4–8 s"
        in docs["writing-hooks.md"]
    )
    assert "at most 60 s apart); after its fifth failure" in docs["writing-hooks.md"]
    assert "at the defaults 1 s, then 1–2 s, 2–4 s, 4–8 s" in docs["protocol.md"]
    assert "redelivered 1 s, then 1–2 s, 2–4 s, 4–8 s after each failure" in docs["protocol.md"]
    assert (coordinator_module.INBOX_RETRY_FIRST_SECS, coordinator_module.INBOX_RETRY_CAP_SECS) == (
        0.05,
        1.0,
    )
    assert "inbox reader from 0.05 s to at most 1 s" in docs["reliability.md"]
    assert (redis_io.CONSUME_RETRY_FIRST_SECS, redis_io.CONSUME_RETRY_CAP_SECS) == (0.1, 2.0)
    assert (worker_module.RETRY_FIRST_SECS, worker_module.RETRY_CAP_SECS) == (0.1, 2.0)
    assert "registration, from 0.1 s to at most 2 s" in docs["reliability.md"]


@contextlib.asynccontextmanager
async def cut_under_the_hooks_user(bus_settings: BusSettings) -> Any:
    """The settings of a Redis user made as ``hookbus acl`` makes the async hook ``Failing``'s,
    and an entry of the first partition that a dead replica left pending and the hard cap then
    cut: yields (settings, stream, entry id, admin client, keys)."""
    admin = Redis.from_url(bus_settings.redis_url)
    keys = Keys(bus_settings.prefix)
    user = f"hook-acl-{new_id()[:6]}"
    generated = hook_rules(HookUser(name="Failing", kind="async"))  # for the prefix hookbus
    rules = generated.replace("hookbus:", f"{bus_settings.prefix}:").split()[1:]  # but "on"
    await admin.execute_command("ACL", "SETUSER", user, "reset", "on", ">pw", *rules)
    url = bus_settings.redis_url.replace("redis://", f"redis://{user}:pw@", 1)
    stream = keys.event_partitions[0]
    try:
        cut = await admin.xadd(stream, {DATA_FIELD: encode(tool_event("cut"))})
        await Retention(admin, keys).create_group(stream, "Failing", "0")
        await admin.xreadgroup("Failing", "dead-replica", {stream: ">"}, count=1)
        await admin.xdel(stream, cut)  # as the hard cap cuts
        yield msgspec.structs.replace(bus_settings, redis_url=url), stream, cut, admin, keys
    finally:
        await admin.execute_command("ACL", "DELUSER", user)
        await admin.aclose()


async def test_a_pending_entry_the_cap_cut_is_dead_lettered_under_the_hooks_own_acl_user(
    bus_settings: BusSettings,
) -> None:
    """The async worker's claim pass runs with the Redis user ``hookbus acl`` generates for
    the hook: a pending entry the hard cap cut (a dead replica's) becomes a dead letter, counted
    as lost (the check that it is gone, an XRANGE, was refused to that user, and the entry was
    lost with no record at all)."""
    async with cut_under_the_hooks_user(bus_settings) as (settings, stream, cut, admin, keys):
        worker = AsyncHookWorker(Failing(), settings, start="0", max_deliveries=5)
        stop = asyncio.Event()
        run = asyncio.create_task(worker.run(stop))
        try:
            await wait_for(
                lambda: admin.xlen(keys.hook_dlq("Failing")), 30, "the cut entry's dead letter"
            )
        finally:
            stop.set()
            await asyncio.wait_for(run, 30)
        (letter,) = [f for _, f in await admin.xrange(keys.hook_dlq("Failing"))]
        assert letter[b"entry_id"] == cut and TRIMMED.encode() in letter[b"reason"]
        assert worker.stats["lost"] == 1
        assert (await admin.xpending(stream, "Failing"))["pending"] == 0


async def test_a_due_entry_behind_a_window_of_entries_backing_off_is_claimed(
    bus_settings: BusSettings,
) -> None:
    """Ten entries the hook keeps failing (backing off), then a dead replica's entry, with
    ``batch_size`` 1 (a claim pass looks at ten entries): each pass looks after the last one's
    window, so the dead replica's entry is taken over and handled (it waited until the ten
    were dead-lettered: 20 s and more)."""
    admin = Redis.from_url(bus_settings.redis_url)
    keys = Keys(bus_settings.prefix)
    stream = keys.event_partitions[0]
    hook = Failing()
    worker = AsyncHookWorker(hook, bus_settings, start="$", batch_size=1, max_deliveries=20)
    try:
        await Retention(admin, keys).create_group(stream, "Failing", "$")
        for _ in range(10):
            await admin.xadd(stream, {DATA_FIELD: encode(tool_event("poison"))})
        await admin.xreadgroup("Failing", "failed-here", {stream: ">"}, count=10)
        await admin.xadd(stream, {DATA_FIELD: encode(tool_event("orphan"))})
        await admin.xreadgroup("Failing", "dead-replica", {stream: ">"}, count=1)
        stop = asyncio.Event()
        run = asyncio.create_task(worker.run(stop))
        try:
            await wait_for(lambda: "orphan" in hook.handled, 15, "the dead replica's entry")
        finally:
            stop.set()
            await asyncio.wait_for(run, 30)
    finally:
        await admin.aclose()


async def test_a_cut_pending_entry_two_replicas_both_find_gone_is_recorded_once(
    bus_settings: BusSettings,
) -> None:
    """Two replicas' claim passes can both XCLAIM one pending entry the hard cap cut: the first
    drops it from the group, the second finds it gone, and each sees it missing. It is one loss:
    one dead letter, counted once (it was recorded by both), under the hook's own ACL user."""
    async with cut_under_the_hooks_user(bus_settings) as (settings, stream, cut, admin, keys):
        replicas = [AsyncHookWorker(Failing(), settings, start="0") for _ in range(2)]
        try:
            for replica in replicas:  # each one's XCLAIM did not return it
                await replica._record_cut(stream, [cut])
        finally:
            for replica in replicas:
                await replica.redis.aclose()
        (letter,) = [f for _, f in await admin.xrange(keys.hook_dlq("Failing"))]
        assert letter[b"entry_id"] == cut and TRIMMED.encode() in letter[b"reason"]
        assert await admin.hget(keys.lost("Failing"), stream) == b"1"
        assert [r.stats["lost"] for r in replicas] == [1, 0]
