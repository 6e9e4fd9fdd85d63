"""ContextDeduplicator and render_system_reminder (bus/context_dedup.py)."""

from __future__ import annotations

import datetime as dt

from bus.actions import TaggedContext
from bus.context_dedup import ContextDeduplicator, render_system_reminder
from bus.events import HookEvent

_T0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


def _tagged(hook: str, content: str, event: HookEvent = HookEvent.PRE_TOOL_USE) -> TaggedContext:
    return TaggedContext(hook_name=hook, source_event=event, content=content, timestamp=_T0)


def test_context_deduplication() -> None:
    # same content twice in one cycle: the second is a duplicate
    dedup = ContextDeduplicator()
    assert not dedup.is_duplicate("remember the budget")
    assert dedup.is_duplicate("remember the budget")
    assert dedup.is_duplicate("remember the budget")
    assert not dedup.is_duplicate("remember the budget ")  # different content

    # a fresh deduplicator (next cycle) forgets
    assert not ContextDeduplicator().is_duplicate("remember the budget")

    # tagged contexts compare by content alone, whatever the hook, event or timestamp
    dedup = ContextDeduplicator()
    a = _tagged("hook_a", "same text")
    b = TaggedContext("hook_b", HookEvent.POST_TOOL_USE, "same text", _T0 + dt.timedelta(hours=1))
    assert not dedup.is_duplicate(a)
    assert dedup.is_duplicate(b)
    assert dedup.is_duplicate("same text")  # a plain string with that content too

    # unique() keeps order, drops repeats, renders tagged contexts
    contents: list[str | TaggedContext] = [
        _tagged("audit", "first"),
        "second",
        _tagged("other", "first"),
        _tagged("budget", "third", HookEvent.POST_TOOL_USE),
        "second",
    ]
    assert ContextDeduplicator().unique(contents) == [
        "[Hook: audit | PreToolUse] first",
        "second",
        "[Hook: budget | PostToolUse] third",
    ]


def test_context_dedup_unique_shares_state_with_is_duplicate() -> None:
    dedup = ContextDeduplicator()
    assert dedup.unique(["x", "y"]) == ["x", "y"]
    assert dedup.unique(["y", "z"]) == ["z"]
    assert dedup.is_duplicate("z")
    assert dedup.unique([]) == []


def test_render_system_reminder_wraps_on_own_lines() -> None:
    assert render_system_reminder("hello") == "<system-reminder>\nhello\n</system-reminder>"
    rendered = render_system_reminder(_tagged("audit", "line one\nline two"))
    assert rendered.splitlines() == [
        "<system-reminder>",
        "[Hook: audit | PreToolUse] line one",
        "line two",
        "</system-reminder>",
    ]
