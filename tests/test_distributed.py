"""Distributed mode under failure, with real processes and a real Redis."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import msgspec
from redis.asyncio import Redis

from agent_adapter.client import HookClient
from agent_adapter.executor import ToolExecutor
from agent_adapter.llm import call
from agent_adapter.permissions import ToolKind
from agent_adapter.tools import Tool, Toolbox
from bus import (
    AgentHook,
    Block,
    HookEvent,
    HookSettings,
    MutateInput,
    PreToolUseContext,
    SessionStopContext,
)
from bus.protocol import DATA_FIELD, HookRequest, encode, new_id, now_ms, raw
from bus.settings import BusSettings
from bus.transport.keys import WORKERS_GROUP, Keys
from bus.transport.redis_io import held_connection, read_group, release_held
from tests.harness import ROOT, Processes, wait_for, wait_live, worker_env
from tests.remote_hooks import HookConfig

PRE = HookEvent.PRE_TOOL_USE.value


def ctx(session: str = "s1", tool: str = "act") -> PreToolUseContext:
    return PreToolUseContext(session_id=session, tool_name=tool, tool_args={"x": 1})


async def client_for(settings: BusSettings, timeout: float = 10.0) -> HookClient:
    return await HookClient(settings, HookSettings(hook_timeout_secs=timeout)).start()


async def _at_least(count: Any, n: int) -> bool:
    return bool(await count >= n)


def lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


async def test_worker_killed_mid_request_is_decided_by_its_policy_within_its_timeout(
    bus_settings: BusSettings, procs: Processes, tmp_path: Path
) -> None:
    record = tmp_path / "calls.txt"
    cfg = HookConfig(
        name="Guard", delay=30, timeout=3, failure_policy="fail", record=str(record),
        events=[HookEvent.PRE_TOOL_USE],
    )  # fmt: skip
    worker = procs.scripted(bus_settings, cfg)
    client = await client_for(bus_settings)
    try:
        await wait_live(client, "Guard")
        ran: list[Any] = []

        async def act(args: dict[str, Any]) -> str:
            ran.append(args)
            return "ran"

        executor = ToolExecutor(client, Toolbox([Tool("act", "", ToolKind.READ, {"x": int}, act)]))
        batch = asyncio.create_task(executor.execute_parallel("s1", [call("act", x=1)], step=1))
        await wait_for(lambda: lines(record), what="the hook to start")
        t0 = time.monotonic()
        worker.send_signal(signal.SIGKILL)
        result = await batch
        assert time.monotonic() - t0 < 3 + 2  # within the hook's timeout (+ margin)
        assert ran == []  # failure_policy="fail": the tool did not run
        assert result.denials[0].level == 3
        assert "hook Guard timed out" in result.messages[0].content
    finally:
        await client.close()


async def test_no_live_replica_is_decided_at_once(
    bus_settings: BusSettings, procs: Processes
) -> None:
    strict = procs.scripted(bus_settings, HookConfig(name="Strict", failure_policy="fail"))
    lax = procs.scripted(bus_settings, HookConfig(name="Lax", answers={PRE: Block(reason="x")}))
    client = await client_for(bus_settings, timeout=20)
    try:
        await wait_live(client, "Strict", "Lax")
        for p in (strict, lax):
            p.send_signal(signal.SIGTERM)  # a clean stop deregisters at once
            p.wait(10)
        await wait_for(
            lambda: not client.directory.live("Strict") and not client.directory.live("Lax")
        )
        t0 = time.monotonic()
        result = await client.run_pre_tool_use(ctx())
        assert time.monotonic() - t0 < 5  # far below the 20 s timeout
        assert result.is_blocked and "Strict is unreachable" in result.action.reason
        assert {(s.hook_name, s.kind, s.enforced) for s in result.skipped} == {
            ("Strict", "unreachable", True),
            ("Lax", "unreachable", False),
        }
    finally:
        await client.close()


async def test_two_replicas_share_requests_and_a_killed_one_loses_no_decision(
    bus_settings: BusSettings, procs: Processes, tmp_path: Path
) -> None:
    record = tmp_path / "calls.txt"
    cfg = HookConfig(
        name="Shared", delay=0.05, timeout=8, record=str(record),
        answers={PRE: MutateInput(updated_args={"ok": 1})}, events=[HookEvent.PRE_TOOL_USE],
    )  # fmt: skip
    a = procs.scripted(bus_settings, cfg)
    b = procs.scripted(bus_settings, cfg)
    client = await client_for(bus_settings)
    try:
        await wait_live(client, "Shared", replicas=2)
        results = await asyncio.gather(*(client.run_pre_tool_use(ctx(f"s{i}")) for i in range(40)))
        assert all(r.final_args == {"ok": 1} for r in results)
        pids = {line.split()[1] for line in lines(record)}
        assert pids == {str(a.pid), str(b.pid)}  # both replicas served requests

        slow = msgspec.structs.replace(cfg, delay=1.5)
        a.kill(), b.kill(), a.wait(), b.wait()
        await wait_for(lambda: not client.directory.live("Shared"), what="old replicas to expire")
        record.unlink()
        a = procs.scripted(bus_settings, slow)
        b = procs.scripted(bus_settings, slow)
        await wait_live(client, "Shared", replicas=2)
        batch = asyncio.gather(*(client.run_pre_tool_use(ctx(f"k{i}")) for i in range(6)))
        await wait_for(lambda: lines(record), what="a replica to take requests")
        victim = int(lines(record)[0].split()[1])
        os.kill(victim, signal.SIGKILL)  # dies holding requests: the other claims and answers
        results = await batch
        assert [r.final_args for r in results] == [{"ok": 1}] * 6
        survivor = ({a.pid, b.pid} - {victim}).pop()
        assert str(survivor) in {line.split()[1] for line in lines(record)}
        assert all(not r.skipped for r in results)
    finally:
        await client.close()


async def test_a_request_past_its_deadline_is_never_executed(
    bus_settings: BusSettings, procs: Processes, tmp_path: Path
) -> None:
    record = tmp_path / "calls.txt"
    procs.scripted(bus_settings, HookConfig(name="Late", record=str(record)))
    client = await client_for(bus_settings)
    keys = Keys(bus_settings.prefix)
    try:
        await wait_live(client, "Late")
        redis = client.redis
        for deadline in (now_ms() - 1, now_ms() + 10_000):
            request = HookRequest(
                id=new_id(), ts=now_ms(), hook="Late", event=HookEvent.PRE_TOOL_USE,
                session_id="s", context=raw(ctx()), deadline=deadline,
                reply_to=keys.inbox("probe"),
            )  # fmt: skip
            await redis.xadd(keys.requests("Late"), {DATA_FIELD: encode(request)})
        reply = await redis.blpop([keys.inbox("probe")], timeout=10)
        assert reply is not None  # the live request was answered...
        assert json.loads(reply[1])["hook"] == "Late"

        async def nothing_pending() -> bool:
            pending = await redis.xpending(keys.requests("Late"), WORKERS_GROUP)
            return bool(pending["pending"] == 0)

        # ...and the expired one acknowledged, not run
        await wait_for(nothing_pending, what="the expired request to be acknowledged")
        assert lines(record) == ["PreToolUse " + lines(record)[0].split()[1]]
    finally:
        await client.close()


class _Gate(AgentHook):
    """Answers at once, unless the tool's arguments say ``wait``: then when released."""

    name = "Gate"

    def __init__(self) -> None:
        self.release = asyncio.Event()

    async def pre_tool_use(self, ctx: PreToolUseContext) -> None:
        if ctx.tool_args.get("wait"):
            await self.release.wait()


async def _one_read(worker: Any, requests: list[tuple[dict[str, Any], str]]) -> list[Any]:
    """XADD a PreToolUse request per (tool arguments, inbox) to ``worker``'s stream; the entries
    of one read of them, as the worker's read loop would get them; and the request ids."""
    ids = []
    for args, inbox in requests:
        context = PreToolUseContext(session_id="s", tool_name="t", tool_args=args)
        request = HookRequest(
            id=new_id(), ts=now_ms(), hook=worker.spec.name, event=HookEvent.PRE_TOOL_USE,
            session_id="s", context=raw(context), deadline=now_ms() + 60_000, reply_to=inbox,
        )  # fmt: skip
        ids.append(request.id)
        await worker.redis.xadd(worker.stream, {DATA_FIELD: encode(request)})
    read: Any = await worker.redis.xreadgroup(
        WORKERS_GROUP, worker.replica, {worker.stream: ">"}, count=10
    )
    entries = read[0][1]
    assert len(entries) == len(requests)  # one read: the batch a worker answers together
    return [entries, ids]


async def test_answers_ready_in_a_read_are_not_held_behind_a_request_waiting_for_a_slot(
    bus_settings: BusSettings,
) -> None:
    """A worker answers the requests of one read together; when the next one must wait for a
    free slot (a slow hook holds them all), the answers already made go out first."""
    from workers.services.worker import HookWorker

    gate = _Gate()
    worker = HookWorker(gate, bus_settings, concurrency=1)
    inbox = Keys(bus_settings.prefix).inbox("probe")
    redis = worker.redis
    try:
        await worker.register()
        entries, ids = await _one_read(worker, [({}, inbox), ({"wait": True}, inbox), ({}, inbox)])
        started = asyncio.create_task(worker._start_all(entries))
        first = await redis.blpop([inbox], timeout=4)  # the slow one holds the only slot
        assert first is not None and json.loads(first[1])["request_id"] == ids[0]
        assert not started.done()
        gate.release.set()
        await asyncio.wait_for(started, 4)
        rest = [json.loads(data)["request_id"] for data in await redis.lrange(inbox, 0, -1)]
        assert sorted(rest) == sorted(ids[1:])
    finally:
        await redis.aclose()


async def test_an_inbox_that_is_not_a_list_loses_only_its_own_answer_and_is_counted(
    bus_settings: BusSettings,
) -> None:
    """Anyone who can write an inbox key can make it a string: the worker's RPUSH to it fails.
    The other answers of the same batch still arrive, every request is acknowledged (retrying
    cannot help; that asker times out under its hooks' failure policies) and the lost answer is
    counted."""
    from workers.services.worker import HookWorker

    worker = HookWorker(_Gate(), bus_settings)
    keys = Keys(bus_settings.prefix)
    good, spoiled = keys.inbox("good"), keys.inbox("spoiled")
    redis = worker.redis
    try:
        await worker.register()
        await redis.set(spoiled, "not a list")
        entries, ids = await _one_read(worker, [({}, spoiled), ({}, good)])
        await worker._start_all(entries)
        answered = [json.loads(data)["request_id"] for data in await redis.lrange(good, 0, -1)]
        assert answered == [ids[1]]
        assert (worker.stats["unsent"], worker.stats["handled"]) == (1, 1)
        # Both are acknowledged, by the read that follows (it carries the batch's XACK).
        conn = await held_connection(redis)
        await read_group(redis, WORKERS_GROUP, worker.replica, worker.stream, count=1,
                         block_ms=None, conn=conn, acks=worker._acks)  # fmt: skip
        await release_held(redis, conn)
        pending: Any = await redis.xpending(worker.stream, WORKERS_GROUP)
        assert pending["pending"] == 0
    finally:
        await redis.aclose()


async def test_a_decision_inbox_that_is_not_a_list_loses_only_its_own_answer_and_is_counted(
    bus_settings: BusSettings,
) -> None:
    """The coordinator service's RPUSH of a decision to an inbox made a string fails: that
    request is still acknowledged (retrying cannot help), the loss is counted, and the next
    agent gets its decision."""
    from bus.transport.keys import COORDINATORS_GROUP
    from bus.transport.redis_io import ensure_group
    from workers.services.coordinator_service import CoordinatorService, Source

    service = CoordinatorService(bus_settings)
    keys, redis = service.keys, service.redis
    source = Source(keys.decision_partitions[0])
    good, spoiled = keys.inbox("good"), keys.inbox("spoiled")
    try:
        await ensure_group(redis, source.stream, COORDINATORS_GROUP, start="0")
        service._register(source)
        await redis.set(spoiled, "not a list")
        ids = []
        for inbox in (spoiled, good):
            request = {
                "id": new_id(), "ts": now_ms(), "event": PRE, "reply_to": inbox,
                "context": {"session_id": "s", "tool_name": "t", "tool_args": {}},
            }  # fmt: skip
            ids.append(request["id"])
            await redis.xadd(source.stream, {DATA_FIELD: json.dumps(request)})
        read: Any = await redis.xreadgroup(
            COORDINATORS_GROUP, service.coordinator.id, {source.stream: ">"}, count=10
        )
        for entry_id, fields in read[0][1]:
            await service._answer(source, entry_id, fields)
        answered = [json.loads(data)["request_id"] for data in await redis.lrange(good, 0, -1)]
        assert answered == [ids[1]]
        assert (service.stats["unsent"], service.stats["answered"]) == (1, 1)
        # Both are acknowledged, by the source reader's next read (it carries the XACK).
        conn = await held_connection(redis)
        await read_group(redis, COORDINATORS_GROUP, service.coordinator.id, source.stream,
                         count=1, block_ms=None, conn=conn, acks=service._acks[source])  # fmt: skip
        await release_held(redis, conn)
        pending: Any = await redis.xpending(source.stream, COORDINATORS_GROUP)
        assert pending["pending"] == 0
    finally:
        await service.coordinator.close()
        await redis.aclose()


async def test_a_read_from_a_frozen_redis_times_out_and_the_client_recovers(
    monkeypatch: Any,
) -> None:
    """Sends and reads are bounded by one sweeping timer per event loop (bus/transport/redis_io.py),
    not a timer each: a Redis that stops answering still gives redis-py's TimeoutError, and the
    client works again once it answers."""
    from redis.exceptions import TimeoutError as RedisTimeoutError

    import bus.transport.redis_io
    from workers.local.redis_server import RedisServer

    monkeypatch.setattr(bus.transport.redis_io, "SOCKET_TIMEOUT", 1.0)
    server = RedisServer().start()
    redis = bus.transport.redis_io.connect(BusSettings(redis_url=server.url))
    try:
        await redis.set("k", "v")
        pid = int((await redis.info("server"))["process_id"])
        os.kill(pid, signal.SIGSTOP)
        try:
            try:
                await asyncio.wait_for(redis.get("k"), 30)
                raise AssertionError("a frozen Redis answered")
            except RedisTimeoutError:
                pass
        finally:
            os.kill(pid, signal.SIGCONT)
        assert await redis.get("k") == b"v"
    finally:
        await redis.aclose()
        server.close()


async def test_malformed_request_reply_and_manifest_are_rejected_and_counted(
    bus_settings: BusSettings, procs: Processes
) -> None:
    cfg = HookConfig(name="Sturdy", answers={PRE: Block(reason="still here")})
    procs.scripted(bus_settings, cfg)
    client = await client_for(bus_settings)
    keys = Keys(bus_settings.prefix)
    redis = client.redis
    try:
        await wait_live(client, "Sturdy")
        # a malformed request: dead-lettered with its reason, and the worker goes on
        await redis.xadd(keys.requests("Sturdy"), {DATA_FIELD: b'{"id": 7}'})
        await redis.xadd(keys.requests("Sturdy"), {b"other": b"x"})
        # a malformed reply in the coordinator's inbox: dropped and counted
        await redis.rpush(client.inbox, b"not json")
        # a malformed manifest: left out of the directory and counted
        for name, data in (
            ("Broken", b'{"name": "Broken", "tool_names": ["a*b"]}'),
            ("Junk", b"{{{"),
        ):
            await redis.set(keys.manifest(name), data)
            await redis.sadd(keys.hooks, name)
        await wait_for(lambda: client.stats["malformed_replies"] == 1, what="reply rejected")
        await wait_for(lambda: client.directory.malformed >= 2, what="manifests rejected")
        dlq: list[Any] = []

        async def dead_letters() -> int:
            dlq[:] = await redis.xrange(keys.hook_dlq("Sturdy"))  # the hook's own unit
            return len(dlq)

        await wait_for(lambda: _at_least(dead_letters(), 2), timeout=10, what="2 dead letters")
        reasons = [fields[b"reason"].decode() for _, fields in dlq]
        assert any("malformed HookRequest" in r and "`$.id`" in r for r in reasons), reasons
        assert any("no 'data' field" in r for r in reasons)
        result = await client.run_pre_tool_use(ctx())
        assert result.action == Block(reason="still here")
        assert "Broken" not in client.directory.by_name
    finally:
        await client.close()


async def test_redis_stopped_mid_session_then_back(procs: Processes, tmp_path: Path) -> None:
    from workers.local.redis_server import RedisServer

    server = RedisServer().start()
    settings = BusSettings(
        redis_url=server.url, prefix="restart", heartbeat_secs=0.2, liveness_secs=2,
        claim_idle_secs=0.5, refresh_secs=0.2,
    )  # fmt: skip
    procs.scripted(settings, HookConfig(name="Up", answers={PRE: Block(reason="ok")}))
    client = await client_for(settings, timeout=2)
    try:
        await wait_live(client, "Up")
        assert (await client.run_pre_tool_use(ctx())).is_blocked
        server.stop()
        t0 = time.monotonic()
        result = await client.run_pre_tool_use(ctx())
        assert time.monotonic() - t0 < 2 + 1.5  # never past the deadline
        assert not result.is_blocked and result.skipped[0].hook_name == "Up"
        server.start()
        await wait_live(client, "Up")

        async def decided() -> bool:
            return (await client.run_pre_tool_use(ctx())).is_blocked

        await wait_for(decided, timeout=20, what="the session to recover after Redis came back")
    finally:
        await client.close()
        server.close()


async def test_session_hooks_answer_for_their_session_and_are_removed_at_stop(
    bus_settings: BusSettings, procs: Processes
) -> None:
    cfg = HookConfig(name="Temp", answers={PRE: Block(reason="session rule")})
    procs.scripted(bus_settings, cfg, "--scope", "session")
    client = await client_for(bus_settings)
    keys = Keys(bus_settings.prefix)
    try:
        await wait_live(client, "Temp")
        assert not (await client.run_pre_tool_use(ctx("s1"))).is_blocked  # never global
        await client.add_session_hook("s1", "Temp")
        assert 0 < await client.redis.ttl(keys.session_hooks("s1")) <= bus_settings.session_ttl_secs
        assert (await client.run_pre_tool_use(ctx("s1"))).is_blocked
        assert not (await client.run_pre_tool_use(ctx("s2"))).is_blocked
        # another coordinator (a second client) sees it too, through Redis
        other = await client_for(bus_settings)
        try:
            await wait_live(other, "Temp")
            assert (await other.run_pre_tool_use(ctx("s1"))).is_blocked
            await client.run_on_session_stop(SessionStopContext(session_id="s1"))
            assert not await client.redis.exists(keys.session_hooks("s1"))

            async def detached() -> bool:  # the other coordinator learns it from the control note
                return not (await other.run_pre_tool_use(ctx("s1"))).is_blocked

            await wait_for(detached, what="the other coordinator to drop the session hook")
        finally:
            await other.close()
    finally:
        await client.close()


async def test_a_failed_session_lookup_keeps_the_hooks_known_before(
    bus_settings: BusSettings, procs: Processes
) -> None:
    """If Redis does not answer the lookup of a session's hooks, the set known before stands:
    a session's own `fail` hook is never skipped because Redis was slow for a moment."""
    from redis.exceptions import TimeoutError as RedisTimeoutError

    cfg = HookConfig(name="Temp", answers={PRE: Block(reason="session rule")})
    procs.scripted(bus_settings, cfg, "--scope", "session")
    client = await client_for(bus_settings)
    try:
        await wait_live(client, "Temp")
        await client.add_session_hook("s1", "Temp")  # known here without a lookup
        calls = []

        async def slow(*args: Any) -> Any:
            calls.append(args)
            raise RedisTimeoutError("Timeout reading from socket")

        client.redis.smembers = slow  # type: ignore[method-assign]
        client.session_changed("s1")  # as after a control note: read it again
        assert (await client.run_pre_tool_use(ctx("s1"))).is_blocked
        assert calls  # it did try
        assert not (await client.run_pre_tool_use(ctx("s2"))).is_blocked  # never read: none
    finally:
        await client.close()


async def test_hookbus_cancel_blocks_the_sessions_next_tool_call(
    bus_settings: BusSettings, procs: Processes
) -> None:
    procs.worker(bus_settings, "workers.builtins.cancellation:RedisCancellationHook", "cancel")
    client = await client_for(bus_settings)
    try:
        await wait_live(client, "CancellationHook")
        assert not (await client.run_pre_tool_use(ctx("victim"))).is_blocked
        out = subprocess.run(
            [sys.executable, "-m", "workers.cli", "cancel", "victim"],
            env=worker_env(bus_settings), cwd=ROOT, capture_output=True, text=True, timeout=30,
        )  # fmt: skip
        assert out.returncode == 0 and "cancelled" in out.stdout
        result = await client.run_pre_tool_use(ctx("victim"))
        assert result.is_blocked and "cancelled by the user" in result.action.reason
        assert not (await client.run_pre_tool_use(ctx("bystander"))).is_blocked
        # No OnSessionStop lifts an operator's cancellation: only its TTL ends it.
        await client.run_on_session_stop(SessionStopContext(session_id="victim"))
        assert (await client.run_pre_tool_use(ctx("victim"))).is_blocked
        ttl = await client.redis.ttl(Keys.of(bus_settings).cancelled("victim"))
        assert 0 < ttl <= bus_settings.session_ttl_secs
    finally:
        await client.close()


async def test_events_are_published_to_the_events_stream(bus_settings: BusSettings) -> None:
    client = await client_for(bus_settings)
    try:
        await client.run_pre_tool_use(ctx())
        await client.run_on_session_stop(SessionStopContext(session_id="s1"))
        await client.drain()
        keys = Keys(bus_settings.prefix)

        async def both_events() -> list[Any]:
            entries = await client.redis.xrange(keys.event_partitions[0])
            return entries if len(entries) >= 2 else []

        entries = await wait_for(both_events, timeout=5, what="both events on the stream")
        events = [json.loads(f[DATA_FIELD.encode()]) for _, f in entries]
        assert [e["event"] for e in events] == ["PreToolUse", "OnSessionStop"]
        assert events[0]["context"]["tool_name"] == "act" and events[0]["v"] == 3
    finally:
        await client.close()


def test_worker_with_a_bad_hook_path_says_so_in_one_line(bus_settings: BusSettings) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "workers.cli", "worker", "no.such.module:Hook"],
        env=worker_env(bus_settings), cwd=ROOT, capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert out.returncode == 2
    assert out.stderr.strip().startswith("hookbus: cannot import 'no.such.module'")
    assert "Traceback" not in out.stderr


async def test_coordinator_service_answers_foreign_agents(
    bus_settings: BusSettings, procs: Processes
) -> None:
    procs.scripted(bus_settings, HookConfig(name="Guard", answers={PRE: Block(reason="nope")}))
    procs.start(["coordinator"], worker_env(bus_settings), "coordinator")
    keys = Keys(bus_settings.prefix)
    redis = Redis.from_url(bus_settings.redis_url, socket_timeout=60)
    try:

        async def ask(message: dict[str, Any]) -> dict[str, Any]:
            await redis.xadd(keys.decision_partitions[0], {"data": json.dumps(message)})
            reply = await redis.blpop([message.get("reply_to", keys.inbox("node"))], timeout=15)
            assert reply is not None, "no reply from the coordinator service"
            return json.loads(reply[1])

        request = {
            "id": "r1", "ts": now_ms(), "event": "PreToolUse", "reply_to": keys.inbox("node"),
            "context": {"session_id": "s1", "tool_name": "file_read", "tool_args": {}},
        }  # fmt: skip
        deadline = time.monotonic() + 20
        while True:  # until the service has the hook in its directory
            answer = await ask({**request, "id": new_id()})
            if answer["status"] == "ok" and answer["result"]["action"]["type"] == "Block":
                break
            assert time.monotonic() < deadline, answer
        assert answer["result"]["blocking_errors"] == [{"hook_name": "Guard", "reason": "nope"}]
        bad = {**request, "id": "bad", "context": {"session_id": "s1", "tool_name": 42}}
        answer = await ask(bad)
        assert answer["status"] == "error" and answer["field"] == "$.context.tool_name"
        assert answer["request_id"] == "bad"
    finally:
        await redis.aclose()


async def test_the_control_channel_names_sessions_by_digest_only(bus_settings: BusSettings) -> None:
    """Every trusted process subscribes to the control channel: a session-hook change names the
    session by its digest, so a subscriber learns no session id; coordinators that know the
    session still re-read its hooks."""
    from bus.transport.keys import session_digest

    keys = Keys(bus_settings.prefix)
    client, other = await client_for(bus_settings), await client_for(bus_settings)
    listener = Redis.from_url(bus_settings.redis_url)
    pubsub = listener.pubsub()
    try:
        await pubsub.subscribe(keys.control)
        await other.run_pre_tool_use(ctx("secret-session-42"))  # another coordinator knows it
        assert "secret-session-42" not in other._stale_sessions
        await client.add_session_hook("secret-session-42", "SessOnly")

        async def note() -> Any:
            message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=0.5)
            return message if message and message["type"] == "message" else None

        heard = await wait_for(note, timeout=10, what="the session note")
        assert b"secret-session-42" not in heard["data"]
        assert json.loads(heard["data"])["session_id"] == session_digest("secret-session-42")
        await wait_for(
            lambda: "secret-session-42" in other._stale_sessions, timeout=10,
            what="the other coordinator to mark the session's hooks stale",
        )  # fmt: skip
    finally:
        await pubsub.aclose()  # type: ignore[no-untyped-call]
        await listener.aclose()
        await client.close()
        await other.close()


async def test_clients_started_together_refresh_their_directories_apart(
    bus_settings: BusSettings,
) -> None:
    """Each client's first periodic refresh of the hook directory comes at a random part of
    the period: clients an agent host starts together do not all stall at the same moment."""
    settings = msgspec.structs.replace(bus_settings, refresh_secs=1.0)
    loop = asyncio.get_running_loop()
    firsts: dict[int, float] = {}
    clients = [HookClient(settings) for _ in range(6)]
    for i, client in enumerate(clients):
        refresh = client.directory.refresh

        async def timed(i: int = i, refresh: Any = refresh) -> None:
            firsts.setdefault(i, loop.time())
            await refresh()

        client.directory.refresh = timed  # type: ignore[method-assign]
    try:
        await asyncio.gather(*(c.start() for c in clients))
        firsts.clear()  # start()'s own read: every client at once, as it must
        await wait_for(lambda: len(firsts) == len(clients), timeout=5)
        assert max(firsts.values()) - min(firsts.values()) > 0.1
    finally:
        await asyncio.gather(*(c.close() for c in clients))


async def test_a_decision_answered_after_its_reader_stopped_is_acknowledged_at_once(
    bus_settings: BusSettings,
) -> None:
    """The coordinator service's reply goes out alone and its XACK with the source reader's
    next read; a dispatch that ends after that reader stopped (its tenant removed, the service
    stopping) acknowledges its request itself: nothing is left pending for another replica to
    answer again."""
    from bus.transport.keys import COORDINATORS_GROUP
    from bus.transport.redis_io import consume, ensure_group
    from workers.services.coordinator_service import CoordinatorService, Source

    service = CoordinatorService(bus_settings)
    keys, redis = service.keys, service.redis
    source = Source(keys.decision_partitions[0])
    inbox = keys.inbox("agent")
    try:
        await ensure_group(redis, source.stream, COORDINATORS_GROUP, start="0")
        service._register(source)
        stopped = asyncio.Event()
        stopped.set()  # the reader stops at once, as when its tenant is removed
        await consume(redis, source.stream, COORDINATORS_GROUP, service.coordinator.id, count=1,
                      stop=stopped, handle=_nothing, recreate=_nothing,
                      acks=service._acks[source])  # fmt: skip
        request = {
            "id": new_id(), "ts": now_ms(), "event": PRE, "reply_to": inbox,
            "context": {"session_id": "s", "tool_name": "t", "tool_args": {}},
        }  # fmt: skip
        await redis.xadd(source.stream, {DATA_FIELD: json.dumps(request)})
        read: Any = await redis.xreadgroup(
            COORDINATORS_GROUP, service.coordinator.id, {source.stream: ">"}, count=10
        )
        [(entry_id, fields)] = read[0][1]
        await service._answer(source, entry_id, fields)
        [reply] = await redis.lrange(inbox, 0, -1)
        assert json.loads(reply)["request_id"] == request["id"]
        pending: Any = await redis.xpending(source.stream, COORDINATORS_GROUP)
        assert pending["pending"] == 0
    finally:
        await service.coordinator.close()
        await redis.aclose()


async def _nothing(*_: Any) -> None:
    return None
