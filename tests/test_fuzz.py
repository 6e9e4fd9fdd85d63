"""Hostile input: ~10,500 generated malformed messages against every decoder and entry point.

Nothing may crash: each message is decoded or rejected with a ProtocolError that says why, and
the services' entry points (sync worker, async worker, coordinator inbox, coordinator service)
dead-letter or answer it and carry on.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Sequence
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from redis.asyncio import Redis

from agent_adapter.client import HookClient
from bus import (
    AsyncAgentHook,
    HookEvent,
    HookSettings,
    Override,
    PermissionDecision,
    PermissionRequestContext,
    PostToolUseContext,
    PreToolUseContext,
)
from bus.errors import LimitError, ProtocolError
from bus.limits import (
    MAX_CONTEXT_DEPTH,
    MAX_DEPTH,
    MAX_HEAD_BYTES,
    check,
    lone_surrogate,
    shape,
    top_level,
    without_surrogates,
)
from bus.protocol import (
    DecisionReply,
    HookRequest,
    decode,
    decode_context,
    decode_head,
    new_id,
    now_ms,
)
from bus.schema import MESSAGES
from bus.settings import BusSettings
from bus.transport.keys import COORDINATORS_GROUP, WORKERS_GROUP, Keys
from tests.harness import Processes, all_dead_letters, wait_for, wait_live, worker_env
from tests.remote_hooks import AsyncConfig, HookConfig, Scripted
from workers.ops.replay import replay_dead_letters
from workers.services.coordinator_service import Source


def ev(keys: Keys) -> str:
    """The events stream (one partition in these tests)."""
    return keys.event_partitions[0]


def dv(keys: Keys) -> str:
    """The decisions stream (one partition in these tests)."""
    return keys.decision_partitions[0]


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
VALID_REQUEST = {
    "v": 3, "id": "r1", "ts": 1, "hook": "Fuzz", "event": "PreToolUse", "session_id": "s",
    "context": {"session_id": "s", "tool_name": "t", "tool_args": {}}, "deadline": 1,
    "reply_to": "x:inbox:y",
}  # fmt: skip


# Strings full of what a depth scanner could mistake for structure.
tricky_text = st.text(alphabet=st.sampled_from('[]{}"\\:,/ a\n\u00e9\U0001f600'), max_size=12)
tricky_values = st.recursive(
    st.none() | st.integers() | tricky_text,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(tricky_text, inner, max_size=3),
    max_leaves=20,
)


def reference_shape(value: Any) -> tuple[int, int]:
    """Depth and number of containers of a Python JSON value, walked with an explicit stack."""
    depth = containers = 0
    stack = [(value, 1)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, dict | list):
            containers += 1
            depth = max(depth, level)
            children = item.values() if isinstance(item, dict) else item
            stack.extend((child, level + 1) for child in children)
    return depth, containers


def nested(depth: int, leaf: Any = None) -> Any:
    """``[[…[leaf]…]]``, ``depth`` arrays deep (built without recursion)."""
    value = [] if leaf is None else [leaf]
    for _ in range(depth - 1):
        value = [value]
    return value


def deep_json(depth: int, opener: bytes = b"[") -> bytes:
    closer = b"]" if opener == b"[" else b"}"
    inner = b'{"a":' if opener == b"{" else b"["
    return inner * (depth - 1) + b"[]" + closer * (depth - 1)


@settings(max_examples=1500, deadline=None)
@given(value=tricky_values, compact=st.booleans())
def test_the_depth_scanner_agrees_with_a_walk_of_the_value(value: Any, compact: bool) -> None:
    """Escapes, quotes and brackets inside strings never count; both encoders' output."""
    data = msgspec.json.encode(value) if compact else json.dumps(value, indent=1).encode()
    assert shape(data) == reference_shape(value)


@pytest.mark.parametrize("depth", [MAX_DEPTH + 1, 980, 1_000, 100_000])
@pytest.mark.parametrize("kind", sorted(MESSAGES))
def test_every_decoder_refuses_deep_nesting_with_the_limit_named(kind: str, depth: int) -> None:
    """msgspec would raise RecursionError from about 980 levels; here no parser is reached."""
    for data in (
        deep_json(depth),
        deep_json(depth, b"{"),
        b'{"v":3,"id":"x","extra":' + deep_json(depth) + b"}",
        b"[" * depth,  # never closed
    ):
        with pytest.raises(LimitError, match=r"the limit is 128 \(MAX_DEPTH\)"):
            decode(data, MESSAGES[kind])


@pytest.mark.parametrize("event", list(HookEvent))
def test_every_context_decoder_refuses_deep_nesting(event: HookEvent) -> None:
    for depth in (MAX_CONTEXT_DEPTH + 1, 1_000, 100_000):
        data = b'{"session_id":"s","tool_name":"t","tool_args":{"a":' + deep_json(depth) + b"}}"
        with pytest.raises(LimitError, match="MAX_CONTEXT_DEPTH") as caught:
            decode_context(event, data)
        assert caught.value.field == "$.context"


def test_a_message_within_the_bounds_decodes() -> None:
    args = {"a": nested(MAX_CONTEXT_DEPTH - 2, "[[{{")}
    data = json.dumps({**VALID_REQUEST, "context": {**VALID_REQUEST["context"], "tool_args": args}})
    request = decode(data.encode(), MESSAGES["HookRequest"])
    ctx = decode_context(request.event, request.context)
    check(data.encode(), "HookRequest")
    assert reference_shape(ctx.tool_args)[0] == MAX_CONTEXT_DEPTH - 1


def test_nesting_without_a_long_run_of_openers_is_measured_exactly() -> None:
    """``{"x":[],"a":{"x":[],"a":…}}``: no 129 openers in a row, still 200 levels deep."""
    data = b'{"x":[],"a":' * 199 + b"{}" + b"}" * 199
    assert shape(data) == (200, 399)
    with pytest.raises(LimitError, match=r"nests 200 levels deep; the limit is 128"):
        decode(data, MESSAGES["EventMessage"])


def test_too_many_containers_is_refused() -> None:
    data = b"[" + b",".join([b"[]"] * 100_001) + b"]"
    with pytest.raises(LimitError, match=r"100002 arrays and objects; the limit is 100000"):
        decode(data, MESSAGES["EventMessage"])


def test_the_head_of_a_message_too_deep_to_decode_is_still_read() -> None:
    """What the services use to answer a refused request: its top-level scalars only."""

    class Head(msgspec.Struct):
        id: str = ""
        reply_to: str = ""

    for depth in (200, 100_000):
        data = (
            b'{"id":"r-1","context":{"tool_args":' + deep_json(depth) + b"},"
            b'"note":"}]{[\\"","reply_to":"p:inbox:a"}'
        )
        assert decode_head(data, Head) == Head(id="r-1", reply_to="p:inbox:a")
        assert top_level(b'{"id":"r","c":' + b"[" * depth) == b'{"id":"r","c":null'
    assert decode_head(b"[" * 100_000, Head) is None
    # Over MAX_CONTAINERS, shallow: msgspec skips it. A lone surrogate escape (no text can
    # hold it; msgspec refuses the whole message): read around it. A head field of the wrong
    # type, or over MAX_HEAD_BYTES: no head.
    many = b'{"id":"r-2","c":[' + b",".join([b"[]"] * 349_000) + b'],"reply_to":"p:inbox:b"}'
    assert decode_head(many, Head) == Head(id="r-2", reply_to="p:inbox:b")
    lone = b'{"id":"r-3","c":"rm \\ud800 \\ud83d\\ude00","reply_to":"p:inbox:\\udc00"}'
    assert decode_head(lone, Head) == Head(id="r-3", reply_to="p:inbox:\ufffd")
    assert decode_head(b'{"id":3,"reply_to":"p:inbox:c"}', Head) is None
    assert decode_head(b'{"id":"r","x":"' + b"a" * MAX_HEAD_BYTES + b'"}', Head) is None


def test_a_head_msgspec_can_skip_is_never_walked(monkeypatch: pytest.MonkeyPatch) -> None:
    """Over MAX_CONTAINERS but shallow, or holding a lone surrogate: msgspec reads the head (in
    C, milliseconds a megabyte); the Python walk (0.56 s a megabyte of these, on the coordinator
    service's event loop before) is only for what is nested past what msgspec skips."""

    class Head(msgspec.Struct):
        id: str = ""

    def walked(data: bytes) -> bytes:
        raise AssertionError("walked token by token")

    monkeypatch.setattr("bus.limits.top_level", walked)
    many = b'{"id":"r-4","c":[' + b",".join([b"[]"] * 349_000) + b"]}"
    assert decode_head(many, Head) == Head(id="r-4")
    lone = b'{"id":"r-5","c":"' + b"\\\\" * 100_000 + b'\\ud800"}'
    assert decode_head(lone, Head) == Head(id="r-5")
    with pytest.raises(AssertionError, match="walked"):
        decode_head(b'{"id":"r-6","c":' + deep_json(2_000) + b"}", Head)


def test_a_lone_surrogate_escape_is_refused_as_input_no_hook_can_read() -> None:
    """Valid JSON syntax no text can hold (a JavaScript agent's ``JSON.stringify`` writes it for
    a lone surrogate): refused as not encodable, wherever it is, never taken for a typo."""
    text = json.dumps(VALID_REQUEST).replace('"tool_args": {}', '"tool_args": {"a": "\\ud800"}')
    assert "\\ud800" in text
    with pytest.raises(LimitError, match="lone UTF-16 surrogate") as raised:
        decode(text.encode(), HookRequest)
    assert raised.value.limit == "encodable"
    context = b'{"session_id":"s","tool_name":"t","tool_args":{"a":"\\udfff"}}'
    with pytest.raises(LimitError, match="lone UTF-16 surrogate") as raised:
        decode_context(HookEvent.PRE_TOOL_USE, context)
    assert raised.value.field == "$.context"
    # A valid pair is text, and an escaped backslash before "ud800" is not an escape.
    paired = b'{"session_id":"s","tool_name":"t","tool_args":{"a":"\\ud83d\\ude00 \\\\ud800"}}'
    # Runs of escaped backslashes: an odd run escapes the "u" after it, an even one does not.
    for run, lone in ((500_000, False), (500_001, True)):
        text = b'{"a":"' + b"\\" * run + b'ud800"}'
        assert lone_surrogate(text) is lone
        assert msgspec.json.decode(without_surrogates(text)) == {
            "a": "\\" * (run // 2) + ("\ufffd" if lone else "ud800")
        }
    ctx = decode_context(HookEvent.PRE_TOOL_USE, paired)
    assert ctx.tool_args == {"a": "\U0001f600 \\ud800"}


@st.composite
def near_misses(draw: Any) -> bytes:
    """A valid-looking message with one field removed, retyped or replaced."""
    message = json.loads(json.dumps(VALID_REQUEST))
    key = draw(st.sampled_from(sorted(message)))
    if draw(st.booleans()):
        message.pop(key)
    else:
        message[key] = draw(json_values)
    if draw(st.booleans()):
        message["context"] = draw(json_values)
    return json.dumps(message).encode()


payloads = st.one_of(
    st.binary(max_size=200),
    json_values.map(lambda v: json.dumps(v).encode()),
    near_misses(),
)
FUZZ = settings(
    max_examples=3000,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)


@FUZZ
@given(data=payloads, kind=st.sampled_from(sorted(MESSAGES)))
def test_every_decoder_rejects_with_a_reason(data: bytes, kind: str) -> None:
    try:
        decode(data, MESSAGES[kind])
    except ProtocolError as exc:
        assert str(exc)  # a reason, never an empty error


@FUZZ
@given(data=payloads, event=st.sampled_from(list(HookEvent)))
def test_every_context_decoder_rejects_with_a_reason(data: bytes, event: HookEvent) -> None:
    try:
        decode_context(event, data)
    except ProtocolError as exc:
        assert exc.field.startswith("$.context") or exc.field == ""


async def _entry_points(settings: BusSettings) -> Any:
    from bus.transport.coordinator import Coordinator
    from tests.remote_hooks import AsyncConfig, ScriptedAsync
    from workers.services.async_worker import AsyncHookWorker
    from workers.services.coordinator_service import CoordinatorService
    from workers.services.worker import HookWorker

    worker = HookWorker(Scripted(HookConfig(name="Fuzz")), settings)
    async_worker = AsyncHookWorker(ScriptedAsync(AsyncConfig(name="FuzzAsync")), settings)
    trail_worker = AsyncHookWorker(Trail(), settings)
    service = CoordinatorService(settings)
    coordinator = Coordinator(settings)
    return worker, async_worker, trail_worker, service, coordinator


class Trail(AsyncAgentHook):
    """Follows the audit trail (as the audit log hook does)."""

    name = "FuzzTrail"
    follows_audit_trail = True

    async def on_audit(self, records: Sequence[Any]) -> None:
        assert all(r.kind in ("shadowed", "breakglass") for r in records)


@pytest.mark.timeout(300)  # 1,500 examples of five services each: about a minute, more under load
@settings(
    max_examples=1500,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(data=st.lists(payloads, min_size=1, max_size=5))
def test_service_entry_points_never_crash(bus_settings: BusSettings, data: list[bytes]) -> None:
    """1,500 batches (≈4,500 messages) into the sync worker, the async worker (events and the
    audit trail), the coordinator's inbox and the coordinator service: all handled, none
    raises."""

    async def feed() -> None:
        worker, async_worker, trail, service, coordinator = await _entry_points(bus_settings)
        source = Source(service.keys.decision_partitions[0])
        service._register(source)
        try:
            for i, payload in enumerate(data):
                fields = {b"data": payload}
                await worker._handle(f"1-{i}".encode(), fields)
                await service._answer(source, f"1-{i}".encode(), fields)
                coordinator._deliver(payload)
            entries = [(f"1-{i}".encode(), {b"data": p}) for i, p in enumerate(data)]
            await async_worker.process("events", entries)
            await trail.process(trail.keys.audit, entries)
        finally:
            for redis in (worker.redis, async_worker.redis, trail.redis, service.redis):
                await redis.aclose()

    asyncio.run(feed())


# -- real processes: nesting up to 100,000 levels on every stream any role reads ---------------

DEPTHS = (MAX_CONTEXT_DEPTH + 1, MAX_DEPTH + 1, 980, 1_000, 10_000, 100_000)
RAW_DEPTHS = DEPTHS[1:]  # deeper than any message may be: poison to every reader


def poison(depth: int, envelope: dict[str, Any]) -> list[dict[bytes, bytes]]:
    """Entries no reader can use, each nested ``depth`` levels somewhere: bare, unterminated,
    inside an otherwise valid message's context and under an unknown field."""
    head = json.dumps(envelope)[:-1].encode()
    ctx = b'"context":{"session_id":"s","tool_name":"t","tool_args":{"a":' + deep_json(depth)
    return [
        {b"data": deep_json(depth)},
        {b"data": b'{"a":' * depth},
        {b"data": head + b"," + ctx + b"}}}"},
        {b"data": head + b',"junk":' + deep_json(depth, b"{") + b"}"},
    ]


async def test_nesting_up_to_100000_levels_everywhere_with_real_processes(
    bus_settings: BusSettings, procs: Processes, tmp_path: Any
) -> None:
    """Every role as its own process: sync hooks (one answering values nested 100,000 levels
    deep), two async hooks (one following the audit trail), the coordinator service. An agent
    dispatches contexts nested up to 100,000 levels in tool arguments, tool output and
    metadata while raw entries nested as deep are written straight to every stream any role
    reads. No process exits; every entry is acknowledged, dead-lettered exactly once per
    group; every dispatch is decided within its deadline; uninspectable input is Blocked or
    Denied."""
    keys = Keys(bus_settings.prefix)
    procs.scripted(
        bus_settings,
        HookConfig(
            name="Guard", answers={"PermissionRequest": _allow()}, record=str(tmp_path / "g")
        ),
    )
    procs.worker(
        bus_settings, "tests.remote_hooks:DeepAnswers", "Deep",
        HOOKBUS_TEST_NAME="Deep", HOOKBUS_TEST_DEPTH="100000",
    )  # fmt: skip
    procs.worker(
        bus_settings, "tests.remote_hooks:DeepAnswers", "Edge",
        HOOKBUS_TEST_NAME="Edge", HOOKBUS_TEST_DEPTH="126",
    )  # fmt: skip
    ledger = AsyncConfig(name="Ledger", record=str(tmp_path / "ledger"))
    procs.worker(
        bus_settings, "tests.remote_hooks:ScriptedAsync", "Ledger",
        HOOKBUS_TEST_ASYNC=msgspec.json.encode(ledger).decode(),
    )  # fmt: skip
    procs.worker(
        bus_settings, "workers.builtins.audit:AsyncAuditLogHook", "Audit",
        HOOKBUS_AUDIT_DB=str(tmp_path / "audit.db"),
    )  # fmt: skip
    procs.start(["coordinator"], worker_env(bus_settings, HOOKBUS_REFRESH_SECS="0.2"), "coord")
    redis = Redis.from_url(bus_settings.redis_url)
    client = await HookClient(bus_settings, HookSettings(hook_timeout_secs=5)).start()
    try:
        await wait_live(client, "Guard", "Deep", "Edge")

        async def async_hooks_ready() -> bool:
            return all(
                [await redis.zcard(keys.replicas(n)) for n in ("Ledger", "AsyncAuditLogHook")]
            )

        await wait_for(async_hooks_ready, timeout=30, what="the async hooks")

        async def service_ready() -> bool:  # it has made its group
            return bool(await redis.exists(dv(keys)))

        await wait_for(service_ready, what="the coordinator service")

        # 1. Raw entries straight to every stream any role reads.
        request = {**VALID_REQUEST, "hook": "Guard", "reply_to": keys.inbox("nobody")}
        event = {"v": 3, "id": "e", "ts": 1, "event": "PreToolUse", "session_id": "s"}
        audit = {"v": 3, "id": "a", "ts": 1, "kind": "shadowed"}
        decision = {"v": 3, "id": "d", "ts": now_ms(), "event": "PreToolUse"}
        streams = {
            keys.requests("Guard"): (request, [WORKERS_GROUP]),
            keys.requests("Deep"): ({**request, "hook": "Deep"}, [WORKERS_GROUP]),
            ev(keys): (event, ["Ledger", "AsyncAuditLogHook"]),
            keys.replay("Ledger"): (event, ["Ledger"]),
            keys.replay("AsyncAuditLogHook"): (event, ["AsyncAuditLogHook"]),
            keys.audit: (audit, ["AsyncAuditLogHook"]),
            dv(keys): (decision, [COORDINATORS_GROUP]),
        }
        written: dict[str, list[bytes]] = {}
        for stream, (envelope, _) in streams.items():
            entries = [p for d in RAW_DEPTHS for p in poison(d, envelope)] + [{b"other": b"x"}]
            written[stream] = [await redis.xadd(stream, fields) for fields in entries]
        # A reply nested 100,000 levels deep in the agent's own inbox (~200 kB: over its bound).
        deep_reply = b'{"v":3,"id":"r","ts":1,"request_id":"q","hook":"Guard","action":' + (
            b'{"type":"Metadata","key":"k","value":' + deep_json(100_000) + b"}}"
        )
        await redis.rpush(client.inbox, deep_reply)

        # 2. Meanwhile an agent dispatches, in process and through the coordinator service.
        timings: list[float] = []

        async def timed(coro: Any) -> Any:
            t0 = time.monotonic()
            result = await coro
            timings.append(time.monotonic() - t0)
            return result

        deep_args = {"deep": nested(100_000)}
        for depth in DEPTHS:
            args = {"deep": nested(depth)}
            result = await timed(client.run_pre_tool_use(_pre(args)))
            assert result.is_blocked and result.blocking_errors[0].hook_name == "HookBus", depth
            perm = PermissionRequestContext(session_id="s", tool_name="t", tool_args=args)
            result = await timed(client.run_on_permission_request(perm))
            assert result.action.decision == PermissionDecision.DENY, depth
        ok = await timed(client.run_pre_tool_use(_pre({"x": 1})))
        assert (
            not ok.is_blocked
        )  # Guard allowed it; Deep's 100,000-deep answer failed, Edge's did not
        assert [(s.hook_name, s.kind) for s in ok.skipped] == [("Deep", "error")]
        assert "MAX_DEPTH" in ok.skipped[0].detail and ok.final_args == {"deep": nested(125)}
        text = deep_json(100_000).decode()[:90_000]  # tool output: nesting as text is just text
        post = PostToolUseContext(session_id="s", tool_name="t", output_content=text)
        result = await timed(client.run_post_tool_use(post))
        assert result.final_content == text and result.metadata == {"deep": nested(126)}
        assert [(s.hook_name, s.kind) for s in result.skipped] == [("Deep", "error")]
        post = PostToolUseContext(session_id="s", tool_name="t", tool_args=deep_args)
        result = await timed(client.run_post_tool_use(post))
        assert result.final_content.startswith("[output withheld by HookBus")

        # Foreign agents: the coordinator service decides uninspectable input the same way.
        inbox = keys.inbox(f"fuzz-{new_id()[:6]}")
        asked: dict[str, str] = {}
        for depth in (MAX_CONTEXT_DEPTH + 1, 1_000, 100_000):
            for kind in ("PreToolUse", "PermissionRequest", "PostToolUse"):
                rid = new_id()
                asked[rid] = kind
                body = json.dumps(
                    {"v": 3, "id": rid, "ts": now_ms(), "event": kind, "reply_to": inbox,
                     "timeout_ms": 5000}
                )[:-1].encode()  # fmt: skip
                data = body + b"," + poison(depth, {})[2][b"data"][2:]
                await redis.xadd(dv(keys), {"data": data})
        rid = new_id()
        asked[rid] = "fine"
        fine = {"session_id": "s", "tool_name": "t", "output_content": "[{" * 1000}
        await redis.xadd(dv(keys), {"data": json.dumps(
            {"v": 3, "id": rid, "ts": now_ms(), "event": "PostToolUse", "reply_to": inbox,
             "timeout_ms": 5000, "context": fine})})  # fmt: skip
        answered: dict[str, Any] = {}
        t0 = time.monotonic()
        while len(answered) < len(asked):
            popped = await redis.blpop([inbox], timeout=10)
            assert popped is not None, f"unanswered: {set(asked) - set(answered)}\n{procs.logs()}"
            reply = decode(popped[1], DecisionReply)
            answered[reply.request_id] = reply
            timings.append(time.monotonic() - t0)
        for rid, kind in asked.items():
            reply = answered[rid]
            assert reply.status == "ok", reply
            if kind == "PreToolUse":
                assert reply.result["action"]["type"] == "Block", reply
                assert "no hook could inspect it" in reply.result["action"]["reason"]
            elif kind == "PermissionRequest":
                assert reply.result["action"]["decision"] == "Deny", reply
                assert reply.result["overridden_by"] == "HookBus", reply
            elif kind == "PostToolUse":
                assert reply.result["final_content"].startswith("[output withheld"), reply
            else:  # Edge's Metadata fits its reply (128 levels), not the decision (129)
                assert reply.result["final_content"].startswith("[output withheld"), reply
                assert "MAX_DEPTH" in reply.result["final_content"]

        # 3. Nothing stuck: every group on every stream has read and acknowledged everything.
        async def settled() -> bool:
            for stream, (_, groups) in streams.items():
                info = {g["name"].decode(): g for g in await redis.xinfo_groups(stream)}
                for group in groups:
                    g = info.get(group)
                    if g is None or g["pending"] or g["lag"]:
                        return False
            return True

        await wait_for(settled, timeout=60, what="every entry acknowledged")
        letters = await all_dead_letters(redis, keys)
        for stream, (_, groups) in streams.items():
            mine = [f for f in letters if f[b"source"] == stream.encode()]
            per_entry: dict[bytes, int] = {}
            for f in mine:
                if b"entry_id" in f:
                    per_entry[f[b"entry_id"]] = per_entry.get(f[b"entry_id"], 0) + 1
            for entry_id in written[stream]:
                assert per_entry.get(entry_id) == len(groups), (stream, entry_id, per_entry)
        # The deep reply is over what any request of the agent's allows: dropped unread.
        assert client.stats["oversized_replies"] == 1 and client.stats["malformed_replies"] == 0
        assert client.stats["refused"] == 13
        # Re-fed dead letters (hookbus replay --dlq) are dead-lettered again, once each.
        # Only letters holding a whole message are re-fed: one cut to its first 4 KiB (the
        # deepest nestings) or with no message stays (protocol 8.2).
        ledger = [f for _, f in await redis.xrange(keys.hook_dlq("Ledger"))]
        whole = [f for f in ledger if f.get(b"data") and b"cut" not in f and b"lost" not in f]
        assert len(ledger) == len(written[ev(keys)]) + len(written[keys.replay("Ledger")])
        assert 0 < len(whole) < len(ledger)
        assert all(len(f[b"data"]) <= 4096 and f[b"sha256"] for f in ledger if f[b"data"])
        before = (await redis.xrevrange(keys.hook_dlq("Ledger"), count=1))[0][0]
        refed = await replay_dead_letters(redis, keys, "Ledger")
        assert refed == len(whole)
        await wait_for(settled, timeout=60, what="re-fed dead letters acknowledged")
        again = [
            f for _, f in await redis.xrange(keys.hook_dlq("Ledger"), min=b"(" + before)
            if f[b"source"] == keys.replay("Ledger").encode() and f[b"hook"] == b"Ledger"
        ]  # fmt: skip
        assert len(again) == refed
        assert all(p.poll() is None for p in procs.procs), procs.logs()
        assert max(timings) < 5, timings  # each within its deadline (hook timeout 5 s)
        print(
            f"{sum(map(len, written.values()))} raw entries on {len(streams)} streams, "
            f"{len(letters)} dead letters, 0 pending; {len(timings)} decisions, slowest "
            f"{max(timings):.3f} s; {client.stats['refused']} refused in process, "
            f"{sum(k != 'fine' for k in asked.values())} by the service; "
            f"{len(procs.procs)} processes, 0 exited"
        )
    finally:
        await client.close()
        await redis.aclose()


def _allow() -> Override:
    return Override(decision=PermissionDecision.ALLOW, reason="fine")


def _pre(args: dict[str, Any]) -> PreToolUseContext:
    return PreToolUseContext(session_id="s", tool_name="t", tool_args=args)


def flood(i: int, envelope: dict[str, Any]) -> dict[bytes, bytes]:
    """The i-th of a mix of poison entries: too deep, malformed JSON, wrong types, no data."""
    kinds = [
        lambda: {b"data": deep_json(1_000 + i)},
        lambda: {b"data": b'{"v":3,"id":' + str(i).encode()},
        lambda: {b"data": json.dumps({**envelope, "ts": "never"}).encode()},
        lambda: {b"data": json.dumps({**envelope, "junk": nested(200)}).encode()},
        lambda: {b"other": str(i).encode()},
    ]
    return kinds[i % len(kinds)]()


async def test_400_poison_messages_log_a_bounded_number_of_lines(
    bus_settings: BusSettings, procs: Processes
) -> None:
    """400 poison entries each to a hook service, an async hook service and the coordinator
    service: each is dead-lettered once, and each service writes a few lines (the first
    failure of a kind, then one line with the count), never a traceback per message."""
    keys = Keys(bus_settings.prefix)
    procs.scripted(bus_settings, HookConfig(name="Sink"))
    config = msgspec.json.encode(AsyncConfig(name="AsyncSink")).decode()
    procs.worker(
        bus_settings, "tests.remote_hooks:ScriptedAsync", "AsyncSink", HOOKBUS_TEST_ASYNC=config
    )
    procs.start(["coordinator"], worker_env(bus_settings), "coordinator")
    redis = Redis.from_url(bus_settings.redis_url)
    try:

        async def groups_ready() -> bool:
            return all([await redis.exists(k) for k in (dv(keys), keys.requests("Sink"))])

        await wait_for(groups_ready, timeout=30, what="the services' groups")
        await wait_for(lambda: redis.zcard(keys.replicas("AsyncSink")), what="AsyncSink")
        request = {**VALID_REQUEST, "hook": "Sink"}
        event = {"v": 3, "id": "e", "ts": 1, "event": "OnSessionStart", "session_id": "s"}
        streams = {
            keys.requests("Sink"): (request, WORKERS_GROUP),
            ev(keys): (event, "AsyncSink"),
            dv(keys): (
                {"v": 3, "id": "d", "ts": 1, "event": "PreToolUse"},
                COORDINATORS_GROUP,
            ),
        }
        t0 = time.monotonic()
        for stream, (envelope, _) in streams.items():
            async with redis.pipeline(transaction=False) as pipe:
                for i in range(400):
                    pipe.xadd(stream, flood(i, envelope))
                await pipe.execute()

        async def all_dead_lettered() -> bool:
            for stream, (_, group) in streams.items():
                info = {g["name"].decode(): g for g in await redis.xinfo_groups(stream)}
                if info[group]["pending"] or info[group]["lag"]:
                    return False
            return len(await all_dead_letters(redis, keys)) >= 1200

        await wait_for(all_dead_lettered, timeout=60, what="1,200 dead letters")
        handled_in = time.monotonic() - t0
        letters = await all_dead_letters(redis, keys)
        for stream in streams:
            assert sum(f[b"source"] == stream.encode() for f in letters) == 400, stream
        # The count of what was not logged line by line comes at the end of the interval.
        await wait_for(
            lambda: procs.logs().count("times in the last") >= 3, timeout=30, what="the counts"
        )
        assert all(p.poll() is None for p in procs.procs)
        for path in sorted(procs.logdir.glob("*.log")):
            lines = path.read_text().splitlines()
            assert len(lines) < 20, (path.name, lines)
            assert sum("Traceback" in line for line in lines) <= 1, (path.name, lines)
        print(f"1,200 poison entries dead-lettered in {handled_in:.1f}s; log lines: "
              f"{len(procs.logs().splitlines())}")  # fmt: skip
    finally:
        await redis.aclose()
