"""Hostile input: ~10,500 generated malformed messages against every decoder and entry point.

Nothing may crash: each message is decoded or rejected with a ProtocolError that says why, and
the services' entry points (sync worker, async worker, coordinator inbox, coordinator service)
dead-letter or answer it and carry on.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bus import AsyncAgentHook, HookEvent
from bus.errors import LimitError, ProtocolError
from bus.limits import MAX_CONTEXT_DEPTH, MAX_DEPTH, check, shape, top_level
from bus.protocol import decode, decode_context, decode_head
from bus.schema import MESSAGES
from bus.settings import BusSettings
from tests.remote_hooks import HookConfig, Scripted

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
VALID_REQUEST = {
    "v": 2, "id": "r1", "ts": 1, "hook": "Fuzz", "event": "PreToolUse", "session_id": "s",
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
    import msgspec

    data = msgspec.json.encode(value) if compact else json.dumps(value, indent=1).encode()
    assert shape(data) == reference_shape(value)


@pytest.mark.parametrize("depth", [MAX_DEPTH + 1, 980, 1_000, 100_000])
@pytest.mark.parametrize("kind", sorted(MESSAGES))
def test_every_decoder_refuses_deep_nesting_with_the_limit_named(kind: str, depth: int) -> None:
    """msgspec would raise RecursionError from about 980 levels; here no parser is reached."""
    for data in (
        deep_json(depth),
        deep_json(depth, b"{"),
        b'{"v":2,"id":"x","extra":' + deep_json(depth) + b"}",
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


def test_too_many_containers_is_refused() -> None:
    data = b"[" + b",".join([b"[]"] * 100_001) + b"]"
    with pytest.raises(LimitError, match=r"100002 arrays and objects; the limit is 100000"):
        decode(data, MESSAGES["EventMessage"])


def test_the_head_of_a_message_too_deep_to_decode_is_still_read() -> None:
    """What the services use to answer a refused request: its top-level scalars only."""
    import msgspec

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
    from bus.coordinator import Coordinator
    from tests.remote_hooks import AsyncConfig, ScriptedAsync
    from workers.async_worker import AsyncHookWorker
    from workers.coordinator_service import CoordinatorService
    from workers.worker import HookWorker

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
        try:
            for i, payload in enumerate(data):
                fields = {b"data": payload}
                await worker._handle(f"1-{i}".encode(), fields)
                await service._answer(f"1-{i}".encode(), fields)
                coordinator._deliver(payload)
            entries = [(f"1-{i}".encode(), {b"data": p}) for i, p in enumerate(data)]
            await async_worker.process("events", entries)
            await trail.process(trail.keys.audit, entries)
        finally:
            for redis in (worker.redis, async_worker.redis, trail.redis, service.redis):
                await redis.aclose()

    asyncio.run(feed())
