"""decode_event (the async consumer's parse): its one-pass fast path accepts exactly what the
two-step path accepts, and refuses the same things, naming them the same way."""

from __future__ import annotations

import json
from typing import Any

import pytest

from bus import HookEvent
from bus.errors import LimitError, ProtocolError
from bus.events import (
    PermissionRequestContext,
    PostToolUseContext,
    PreToolUseContext,
    StepCompleteContext,
)
from bus.limits import MAX_CONTEXT_DEPTH
from bus.protocol import EventMessage, decode, decode_context, decode_event, encode, new_id, raw

CONTEXTS: list[tuple[HookEvent, Any]] = [
    (
        HookEvent.PRE_TOOL_USE,
        PreToolUseContext(session_id="s", tool_name="t", tool_args={"a": [1]}),
    ),
    (
        HookEvent.POST_TOOL_USE,
        PostToolUseContext(session_id="s", tool_name="t", output_content="o"),
    ),
    (
        HookEvent.ON_STEP_COMPLETE,
        StepCompleteContext(session_id="s", step=3, max_steps=10, messages_count=2),
    ),
    (HookEvent.PERMISSION_REQUEST, PermissionRequestContext(session_id="s", tool_name="t")),
]


def message(event: HookEvent, context: Any, **envelope: Any) -> bytes:
    fields = {"id": new_id(), "ts": 1, "event": event, "session_id": "s", "context": raw(context)}
    return encode(EventMessage(**(fields | envelope)))


def two_step(data: bytes) -> tuple[HookEvent, Any]:
    plain = decode(data, EventMessage)
    return plain.event, decode_context(plain.event, plain.context)


@pytest.mark.parametrize(("event", "context"), CONTEXTS)
def test_a_well_formed_event_parses_as_the_two_steps_parse_it(
    event: HookEvent, context: Any
) -> None:
    data = message(event, context, traceparent="00-" + "1" * 32 + "-" + "2" * 16 + "-01")
    got, kind, ctx = decode_event(data)
    assert (kind, ctx) == two_step(data) == (event, context)
    assert (got.id, got.ts, got.traceparent) == (
        json.loads(data)["id"],
        1,
        json.loads(data)["traceparent"],
    )


def edited(event: HookEvent, context: Any, edit: Any) -> bytes:
    body = json.loads(message(event, context))
    edit(body)
    return json.dumps(body).encode()


DEEP = "[" * (MAX_CONTEXT_DEPTH + 2) + "]" * (MAX_CONTEXT_DEPTH + 2)  # within a message's bound
REFUSED = {
    "a context field of the wrong type": lambda b: b["context"].update(step="three"),
    "an unknown kind of event": lambda b: b.update(event="OnTeaBreak"),
    "an older protocol version": lambda b: b.update(v=1),
    "no context": lambda b: b.pop("context"),
    "a context nested past its bound": lambda b: b["context"].update(
        tool_args={
            "deep": json.loads("[" * (MAX_CONTEXT_DEPTH + 2) + "]" * (MAX_CONTEXT_DEPTH + 2))
        }
    ),
}


@pytest.mark.parametrize("what", list(REFUSED))
def test_a_bad_event_is_refused_as_the_two_steps_refuse_it(what: str) -> None:
    event, context = CONTEXTS[0] if what != "a context field of the wrong type" else CONTEXTS[2]
    data = edited(event, context, REFUSED[what])
    with pytest.raises(ProtocolError) as slow:
        two_step(data)
    with pytest.raises(ProtocolError) as fast:
        decode_event(data)
    assert (type(fast.value), str(fast.value), fast.value.field) == (
        type(slow.value),
        str(slow.value),
        slow.value.field,
    )
    if what == "a context nested past its bound":
        assert isinstance(fast.value, LimitError)
