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

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bus import AsyncAgentHook, HookEvent
from bus.errors import ProtocolError
from bus.protocol import decode, decode_context
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
    "v": 1, "id": "r1", "ts": 1, "hook": "Fuzz", "event": "PreToolUse", "session_id": "s",
    "context": {"session_id": "s", "tool_name": "t", "tool_args": {}}, "deadline": 1,
    "reply_to": "x:inbox:y",
}  # fmt: skip


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
