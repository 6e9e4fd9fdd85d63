"""Pure hook selection: which hooks an event reaches, in which order.

* A global hook is called for an event if it subscribes to it (no events = all) and, for
  PreToolUse, PostToolUse and PostToolUseFailure, its match filter accepts the tool call.
* A session hook answers only for its session, for the events it subscribes to, and skips the
  match filter (as the specification says).
* Order is (priority, registration sequence); global and session hooks share one sequence.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol, TypeVar

from bus.events import TOOL_EVENTS, HookEvent
from bus.hooks import HookSpec


class Target(Protocol):
    """Anything the dispatcher can call: a hook's spec and its place in the order."""

    @property
    def spec(self) -> HookSpec: ...

    @property
    def order(self) -> tuple[int, int]: ...


T = TypeVar("T", bound=Target)


def select(
    event: HookEvent,
    global_targets: Sequence[T],
    session_targets: Iterable[T],
    tool_name: str | None,
    tool_args: Mapping[str, Any],
) -> list[T]:
    """The hooks to call, in hook order.

    ``global_targets`` are the global hooks subscribed to ``event``, already in order (the
    registry's event index); ``session_targets`` are the hooks of the event's session.
    """
    if event in TOOL_EVENTS and tool_name is not None:
        chosen = [
            t
            for t in global_targets
            if t.spec.match_filter.is_match_all()
            or t.spec.match_filter.matches(tool_name, tool_args)
        ]
    else:
        chosen = list(global_targets)
    extra = [t for t in session_targets if t.spec.subscribes(event)]
    if extra:
        chosen.extend(extra)
        chosen.sort(key=lambda t: t.order)
    return chosen
