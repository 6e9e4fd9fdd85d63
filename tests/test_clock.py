"""Clock skew: every process reads Redis's clock; a skewed one is corrected, reported, never silent.

A worker runs under libfaketime (Debian package ``faketime``) with its wall clock 5 s ahead;
Redis, the agent and this test keep the real one. Before bus/transport/clock.py that worker dropped
every request as expired, silently, while ``--check`` called it healthy: an ignore-policy guard was
quietly off. These tests FAIL (never skip) when libfaketime is missing.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import time

import msgspec
import pytest
import redis as redis_sync

from agent_adapter.client import HookClient
from bus import Block, HookEvent, HookSettings, PreToolUseContext
from bus.protocol import DATA_FIELD, HookRequest, encode, new_id, now_ms, raw
from bus.settings import BusSettings
from bus.transport.clock import MAX_SKEW_MS, ExpiredDrops, RedisClock, is_skewed
from bus.transport.keys import COORDINATORS_GROUP, WORKERS_GROUP, Keys
from tests.faketime import faked
from tests.harness import ROOT, Processes, until, wait_for, wait_live, worker_env
from tests.remote_hooks import HookConfig

pytestmark = pytest.mark.redis


def ctx(tool: str = "act") -> PreToolUseContext:
    return PreToolUseContext(session_id="s1", tool_name=tool, tool_args={"x": 1})


def check(settings: BusSettings, config: HookConfig, **env: str) -> subprocess.CompletedProcess:
    payload = msgspec.json.encode(config).decode()
    return subprocess.run(
        [sys.executable, "-m", "workers.cli", "worker", "tests.remote_hooks:Scripted", "--check"],
        env=worker_env(settings, HOOKBUS_TEST_HOOK=payload, **env),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_libfaketime_moves_only_the_wall_clock_of_the_process_it_is_loaded_into(
    bus_settings: BusSettings,
) -> None:
    """The premise of the tests below: the faked process is 5 s ahead, Redis and this test are
    not (redis-server was started without LD_PRELOAD)."""
    assert "faketime" not in os.environ.get("LD_PRELOAD", "")
    client = redis_sync.Redis.from_url(bus_settings.redis_url)
    try:
        secs, micros = client.time()
    finally:
        client.close()
    assert abs(secs * 1000 + micros // 1000 - now_ms()) < MAX_SKEW_MS  # Redis: the real clock
    probe = "import time; print(time.time_ns() // 1_000_000, time.monotonic_ns())"
    out = subprocess.run(
        [sys.executable, "-c", probe], env={**os.environ, **faked()}, capture_output=True,
        text=True, timeout=30, check=True,
    ).stdout.split()  # fmt: skip
    assert int(out[0]) - now_ms() > 4000  # the faked process: its wall clock 5 s ahead...
    assert abs(int(out[1]) - time.monotonic_ns()) < 10**9 * 30  # ...its monotonic clock true


async def test_a_worker_5s_ahead_keeps_guarding_fails_its_check_and_is_named_skewed(
    bus_settings: BusSettings, procs: Processes
) -> None:
    guard = HookConfig(
        name="Guard",
        events=[HookEvent.PRE_TOOL_USE],
        answers={"PreToolUse": Block(reason="guarded")},
        failure_policy="ignore",  # the case of the issue: a timeout would let the tool run
    )
    slow = HookConfig(
        name="Slow", events=[HookEvent.PRE_TOOL_USE], delay=30, timeout=1.0, failure_policy="fail"
    )
    procs.scripted(bus_settings, guard, **faked())
    procs.scripted(bus_settings, slow, **faked())
    keys = Keys(bus_settings.prefix)
    client = await HookClient(bus_settings, HookSettings(hook_timeout_secs=5)).start()
    try:
        await wait_live(client, "Guard", "Slow")

        # Each replica published its offset beside its heartbeat; the coordinator sees it.
        def skewed() -> bool:
            return {"Guard", "Slow"} <= client.directory.skewed.keys()

        await wait_for(skewed, what="the coordinator to see both hooks as skewed")
        offsets = [int(v) for v in (await client.redis.hgetall(keys.clocks("Guard"))).values()]
        assert len(offsets) == 1 and is_skewed(offsets[0]) and offsets[0] > 0, offsets
        assert is_skewed(client.directory.skewed["Guard"])

        # The guard stays on: its deadlines are checked on Redis's clock, not dropped as expired.
        for tool in ("act", "other"):
            result = await client.run_pre_tool_use(ctx(tool))
            assert result.is_blocked, result
            guard_block = [e for e in result.blocking_errors if e.hook_name == "Guard"]
            assert guard_block and guard_block[0].reason == "guarded", result
            # A hook that does not answer is named as skewed, not as timed out.
            (skip,) = [s for s in result.skipped if s.hook_name == "Slow"]
            assert skip.kind == "error" and skip.detail.startswith("skewed: "), skip
            assert "ahead of Redis's" in skip.detail and "no answer within" in skip.detail
            slow_block = [e for e in result.blocking_errors if e.hook_name == "Slow"]
            assert slow_block and "hook Slow failed: skewed: " in slow_block[0].reason
        assert client.skewed_calls == {"Guard": 2, "Slow": 2}
        assert client.stats["skewed_calls"] == 4
    finally:
        await client.close()

    # --check fails, and says why: run where the worker runs (same faked clock)...
    here = check(bus_settings, guard, **faked())
    assert here.returncode == 1, here
    said = re.search(r"this host's clock is (\d+\.\d{3}) s ahead of Redis's", here.stderr)
    assert said and is_skewed(int(float(said[1]) * 1000)), here.stderr  # +5 s, as measured
    assert "beyond the 1 s bound" in here.stderr, here.stderr
    # ...and from a host whose clock is right, from the offset the replica published.
    there = check(bus_settings, guard)
    assert there.returncode == 1, there
    assert "hook Guard: 1 live replica reports a clock beyond the 1 s bound" in there.stderr
    assert re.search(r"Guard: .*: \S+ [45]\.\d{3} s ahead of Redis's$", there.stderr), there.stderr
    # The worker logged an error about its clock; no request was dropped as expired.
    logs = procs.logs()
    assert re.search(
        r"ERROR hookbus\.clock: hook Guard replica \S+'s clock is [45]\.\d{3} s ahead", logs
    )
    assert "requests for Guard dropped" not in logs, logs


def test_a_worker_with_a_true_clock_passes_its_check(
    bus_settings: BusSettings, procs: Processes
) -> None:
    guard = HookConfig(name="OnTime", events=[HookEvent.PRE_TOOL_USE])
    procs.scripted(bus_settings, guard)
    keys = Keys(bus_settings.prefix)
    client = redis_sync.Redis.from_url(bus_settings.redis_url)
    try:
        until(lambda: client.hgetall(keys.clocks("OnTime")), "the replica's clock offset", 30)
        (offset,) = [int(v) for v in client.hgetall(keys.clocks("OnTime")).values()]
        assert not is_skewed(offset)
    finally:
        client.close()
    ok = check(bus_settings, guard)
    assert ok.returncode == 0 and ok.stdout.startswith("ok: hook OnTime: 1 live replica"), ok


async def test_requests_dropped_as_expired_are_counted_and_logged_once_per_interval(
    bus_settings: BusSettings, procs: Processes
) -> None:
    proc = procs.scripted(bus_settings, HookConfig(name="Late"))
    keys = Keys(bus_settings.prefix)
    client = await HookClient(bus_settings).start()
    n = 300
    try:
        await wait_live(client, "Late")
        async with client.redis.pipeline(transaction=False) as pipe:
            for _ in range(n):
                request = HookRequest(
                    id=new_id(), ts=now_ms(), hook="Late", event=HookEvent.PRE_TOOL_USE,
                    session_id="s", context=raw(ctx()), deadline=now_ms() - 1000,
                    reply_to=keys.inbox("probe"),
                )  # fmt: skip
                pipe.xadd(keys.requests("Late"), {DATA_FIELD: encode(request)})
            await pipe.execute()

        async def all_acknowledged() -> bool:
            info = await client.redis.xinfo_groups(keys.requests("Late"))
            group = next(g for g in info if g["name"] == WORKERS_GROUP.encode())
            return bool(group["pending"] == 0 and group["lag"] == 0)

        await wait_for(all_acknowledged, what="every expired request to be acknowledged")
        assert await client.redis.llen(keys.inbox("probe")) == 0  # none answered
    finally:
        await client.close()
    proc.send_signal(signal.SIGTERM)  # the last count is said at shutdown
    assert proc.wait(30) == 0
    logs = procs.logs()
    line = r"requests for Late dropped past their deadline: (\d+) since the last report"
    counts = [int(c) for c in re.findall(line, logs)]
    assert sum(counts) == n, counts  # every drop counted...
    assert len(counts) <= 3, counts  # ...in a line per interval, not a line per request
    assert f"'expired': {n}" in logs


async def test_an_agent_clock_behind_by_more_than_timeout_ms_is_still_answered(
    bus_settings: BusSettings, procs: Processes
) -> None:
    """A foreign agent stamps ``ts`` with its own clock; a minute behind, its requests were
    dropped as expired. The coordinator service counts ``timeout_ms`` from when Redis took the
    request instead, and says the agent's clock is off."""
    procs.start(["coordinator"], worker_env(bus_settings), "coordinator")
    keys = Keys(bus_settings.prefix)
    client = redis_sync.Redis.from_url(bus_settings.redis_url)
    try:

        def coordinator_group() -> bool:
            try:
                groups = client.xinfo_groups(keys.decision_partitions[0])
            except redis_sync.ResponseError:
                return False
            return any(g["name"] == COORDINATORS_GROUP.encode() for g in groups)

        until(coordinator_group, "the coordinator service to start", 30)
        inbox = keys.inbox("late-agent")
        for request_id, skew_ms in (("behind", -60_000), ("ahead", 60_000)):
            request = {
                "v": 3, "id": request_id, "ts": now_ms() + skew_ms, "event": "PreToolUse",
                "context": {"session_id": "s", "tool_name": "act", "tool_args": {}, "step": 1},
                "reply_to": inbox, "timeout_ms": 5000,
            }  # fmt: skip
            client.xadd(keys.decision_partitions[0], {DATA_FIELD: json.dumps(request)})
            reply = client.blpop([inbox], timeout=20)
            assert reply is not None, f"request {request_id} was dropped"
            answer = json.loads(reply[1])
            assert answer["request_id"] == request_id and answer["status"] == "ok", answer
    finally:
        client.close()
    until(lambda: "the agent's clock is not in sync" in procs.logs(), "the skew logged", 10)


async def test_redis_clock_measures_an_offset_near_zero_here_and_counts_drops(
    bus_settings: BusSettings, caplog: pytest.LogCaptureFixture
) -> None:
    from bus.transport.redis_io import connect

    redis = connect(bus_settings)
    try:
        clock = RedisClock("this test")
        assert clock.now_ms() - now_ms() == 0 and not clock.measured
        offset = await clock.measure(redis, 3)
        assert offset is not None and not is_skewed(offset) and not clock.skewed
        assert clock.rtt_ms is not None and clock.rtt_ms >= 0
    finally:
        await redis.aclose()
    import logging

    drops = ExpiredDrops(logging.getLogger("test.drops"), "things", interval=3600)
    with caplog.at_level(logging.WARNING, "test.drops"):
        for i in range(50):
            drops.drop(f"thing {i}")
        drops.tick()  # the interval is not over: nothing more said
        assert [r.getMessage() for r in caplog.records] == [
            "things dropped past their deadline: 1 since the last report, 1 in all (last: thing 0)"
        ]
        drops.flush()
        assert caplog.records[-1].getMessage() == (
            "things dropped past their deadline: 49 since the last report, 50 in all "
            "(last: thing 49)"
        )
        drops.flush()  # nothing new: nothing said
    assert len(caplog.records) == 2 and drops.total == 50


def test_the_bound_is_the_documented_one() -> None:
    text = (ROOT / "docs" / "protocol.md").read_text()
    assert f"`MAX_SKEW_MS` = {MAX_SKEW_MS}" in text


async def test_a_redis_user_without_time_is_said_once_and_fails_the_check(
    bus_settings: BusSettings, caplog: pytest.LogCaptureFixture
) -> None:
    """A deployment whose ACL lacks +time: the process says so once and keeps its own clock;
    ``--check`` fails, naming the missing permission."""
    import logging

    from bus.transport.redis_io import connect

    user = f"notime-{bus_settings.prefix}"
    admin = redis_sync.Redis.from_url(bus_settings.redis_url)
    admin.acl_setuser(
        user, enabled=True, passwords=["+pw"], keys=["*"], commands=["+@all", "-time"]
    )
    try:
        url = bus_settings.redis_url.replace("redis://", f"redis://{user}:pw@", 1)
        settings = msgspec.structs.replace(bus_settings, redis_url=url)
        redis = connect(settings)
        try:
            clock = RedisClock("this test")
            with caplog.at_level(logging.ERROR, "hookbus.clock"):
                assert await clock.measure(redis) is None
                assert await clock.measure(redis) is None
            assert clock.refused and not clock.measured and clock.offset_ms == 0
            (said,) = [r.getMessage() for r in caplog.records]
            assert "cannot read Redis's clock" in said and "+time" in said
        finally:
            await redis.aclose()
        refused = check(settings, HookConfig(name="NoTime"))
        assert refused.returncode == 1, refused
        assert "TIME refused" in refused.stderr and "allow +time" in refused.stderr, refused
    finally:
        admin.acl_deluser(user)
        admin.close()


def test_a_skewed_clock_is_an_error_repeated_at_most_once_a_minute(
    caplog: pytest.LogCaptureFixture,
) -> None:
    import logging

    clock = RedisClock("this test")
    clock.measured = True
    with caplog.at_level(logging.INFO, "hookbus.clock"):
        for offset in (5000, 5001, -4000, 20):
            clock.offset_ms = offset
            clock._report(first=False)
    said = [(r.levelname, r.getMessage()) for r in caplog.records]
    assert said[0][0] == "ERROR" and "5.000 s ahead of Redis's: beyond the 1 s bound" in said[0][1]
    assert said[1] == (
        "WARNING",
        "this test's clock is back within 1 s of Redis's (0.020 s ahead of Redis's)",
    )
    assert len(said) == 2


async def test_a_reading_slower_than_the_bound_is_not_used() -> None:
    """A ``TIME`` whose round trip exceeds the bound cannot bound its error: the offset measured
    before stands. (A private redis-server, frozen for longer than the bound.)"""
    from bus.transport.redis_io import connect
    from workers.local.redis_server import RedisServer, find_redis_server

    if not find_redis_server():
        pytest.fail("this test freezes a private redis-server: none on PATH")
    server = RedisServer().start()
    redis = connect(BusSettings(redis_url=server.url))
    try:
        clock = RedisClock("this test")
        before = await clock.measure(redis)
        assert before is not None and clock.rtt_ms is not None
        rtt = clock.rtt_ms
        assert server.proc is not None
        server.proc.send_signal(signal.SIGSTOP)
        try:
            reading = asyncio.create_task(clock.measure(redis))
            await asyncio.sleep(MAX_SKEW_MS / 1000 + 0.3)  # the freeze's length, not a wait
        finally:
            server.proc.send_signal(signal.SIGCONT)
        assert await reading is None
        assert (clock.offset_ms, clock.rtt_ms) == (before, rtt)
    finally:
        await redis.aclose()
        server.close()
