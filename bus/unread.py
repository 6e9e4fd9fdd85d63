"""What a coordinator decides before it has read the hook directory once.

A coordinator that has never read the directory (Redis unreachable since it started) knows no
hook, not even that there are none: for all it knows a guard with ``failure_policy="fail"`` is
registered. So it decides as if every hook it may need were unreachable under ``fail``:
PreToolUse Blocked, PermissionRequest Denied, tool output withheld (PostToolUse and
PostToolUseFailure), the reason naming why in one line. Notifications have nothing to decide.
Once the directory has been read, the hooks decide as usual, without a restart.

The operator's opt-out is ``HOOKBUS_FAIL_OPEN_UNTIL_DIRECTORY`` (bus/settings.py): decide as if
no hook service were registered, logged as a warning each time (rate-limited).
"""

from __future__ import annotations

from typing import Any

from bus.actions import (
    Block,
    BlockingError,
    NotifyResult,
    Override,
    PermissionRequestResult,
    PostToolUseResult,
    PreToolUseResult,
)
from bus.aggregation import REFUSER
from bus.events import HookEvent, PermissionDecision

#: The events a coordinator decides, and what failing closed does to each (for its log).
EFFECT = {
    HookEvent.PRE_TOOL_USE: "blocked",
    HookEvent.PERMISSION_REQUEST: "denied",
    HookEvent.POST_TOOL_USE: "output withheld",
    HookEvent.POST_TOOL_USE_FAILURE: "output withheld",
}
#: What replaces tool output while the directory is unread.
WITHHELD = "[output withheld by HookBus: {reason}]"
#: The longest cause quoted in a reason (a Redis error can be long).
MAX_CAUSE_CHARS = 200


def cause(error: BaseException) -> str:
    """``error`` as a short single line, for a reason."""
    text = " ".join(str(error).split()) or type(error).__name__
    return text if len(text) <= MAX_CAUSE_CHARS else text[: MAX_CAUSE_CHARS - 1] + "…"


def reason(why: str) -> str:
    """The one-line reason of a decision taken before the directory was read; ``why`` says why
    it has not been (e.g. "Redis unreachable since start: Connection refused")."""
    return f"HookBus has not read the hook directory yet ({why}): failing closed"


def decision(event: HookEvent, why: str) -> Any:
    """The result of ``event`` before the directory was read: PreToolUse Blocked,
    PermissionRequest Denied, tool output withheld; an empty report for a notification."""
    text = reason(why)
    if event == HookEvent.PRE_TOOL_USE:
        return PreToolUseResult(
            action=Block(reason=text),
            final_args={},
            blocking_errors=(BlockingError(REFUSER, text),),
        )
    if event == HookEvent.PERMISSION_REQUEST:
        return PermissionRequestResult(
            action=Override(decision=PermissionDecision.DENY, reason=text),
            overridden_by=REFUSER,
        )
    if event in (HookEvent.POST_TOOL_USE, HookEvent.POST_TOOL_USE_FAILURE):
        return PostToolUseResult(final_content=WITHHELD.format(reason=text), warnings=(text,))
    return NotifyResult(called=(), skipped=())
