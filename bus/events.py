"""The 12 lifecycle events and the immutable context each one carries.

Wire names are exactly the specification's (``"PreToolUse"``, ``"OnSessionStop"``, …). Contexts
are frozen msgspec Structs; their ``tool_args`` dictionaries are shared between hooks called for
the same event, so hooks must treat them as read-only (return ``MutateInput`` to change them).
"""

from __future__ import annotations

import enum
from typing import Any, TypeVar

import msgspec

from bus.errors import InvalidInputError, UnknownEventError

E = TypeVar("E", bound=enum.StrEnum)


def parse_member(
    kind: type[E],
    value: object,
    what: str,
    error: type[InvalidInputError] = InvalidInputError,
    *,
    fold_case: bool = False,
) -> E:
    """The member of ``kind`` named ``value``, or ``error`` listing the valid names."""
    if isinstance(value, kind):
        return value
    if isinstance(value, str):
        for member in kind:
            if value == member.value or (fold_case and value.strip().lower() == member.lower()):
                return member
    valid = ", ".join(m.value for m in kind)
    raise error(f"unknown {what} {value!r}; expected one of: {valid}")


class HookEvent(enum.StrEnum):
    """One of the 12 points of the ReAct loop where hooks run."""

    ON_SESSION_START = "OnSessionStart"
    PRE_TOOL_USE = "PreToolUse"
    POST_TOOL_USE = "PostToolUse"
    POST_TOOL_USE_FAILURE = "PostToolUseFailure"
    ON_STEP_COMPLETE = "OnStepComplete"
    ON_SESSION_STOP = "OnSessionStop"
    ON_SUBAGENT_START = "OnSubagentStart"
    ON_SUBAGENT_STOP = "OnSubagentStop"
    ON_PRE_COMPACT = "OnPreCompact"
    ON_POST_COMPACT = "OnPostCompact"
    PERMISSION_REQUEST = "PermissionRequest"
    PERMISSION_DENIED = "PermissionDenied"

    @classmethod
    def parse(cls, name: str | HookEvent) -> HookEvent:
        """Return the event called ``name``; raise UnknownEventError for anything else."""
        return parse_member(cls, name, "hook event", UnknownEventError)


#: Events whose hooks are filtered by ``match_filter`` (tool name and arguments).
TOOL_EVENTS: frozenset[HookEvent] = frozenset(
    {HookEvent.PRE_TOOL_USE, HookEvent.POST_TOOL_USE, HookEvent.POST_TOOL_USE_FAILURE}
)


class PermissionDecision(enum.StrEnum):
    """The outcome of a permission check."""

    ALLOW = "Allow"
    ASK = "Ask"
    DENY = "Deny"


class PermissionDenialSource(enum.StrEnum):
    """Who denied a tool call."""

    RULE = "Rule"
    CLASSIFIER = "Classifier"
    USER = "User"
    TIMEOUT = "Timeout"


class TurnTerminal(enum.StrEnum):
    """Why a turn ended."""

    COMPLETED = "Completed"
    MAX_STEPS = "MaxSteps"
    CANCELLED = "Cancelled"
    ERROR = "Error"


class _Context(msgspec.Struct, frozen=True, kw_only=True):
    """Base of every context: immutable, keyword-only.

    ``agent_input``: the agent's own hook input this context was made from, as the agent sent
    it, for hooks that speak the agent's format (``workers.integrations.command_hook:CommandHook``
    hands it to a Claude Code hook script unchanged). Absent (unset) for agents that send HookBus
    contexts themselves. Its ``tool_input`` and ``tool_response`` are left out when the context
    carries them unchanged (``tool_args``; ``output_value``, else ``output_content``): the context
    is bounded as a whole (bus/limits.py), so a large output is not carried twice.
    """

    agent_input: dict[str, Any] | msgspec.UnsetType = msgspec.UNSET


class SessionStartContext(_Context, frozen=True, kw_only=True):
    session_id: str
    turn_index: int = 0
    is_resume: bool = False


class PreToolUseContext(_Context, frozen=True, kw_only=True):
    session_id: str
    tool_name: str
    tool_args: dict[str, Any] = msgspec.field(default_factory=dict)
    step: int = 0


class PostToolUseContext(_Context, frozen=True, kw_only=True):
    session_id: str
    agent_name: str = "main"
    tool_name: str
    tool_args: dict[str, Any] = msgspec.field(default_factory=dict)
    output_content: str = ""
    is_error: bool = False
    step: int = 0
    elapsed_ms: float = 0.0
    # The tool's output as the agent gave it when that is not a string (Claude Code's
    # ``tool_response`` of Read, Bash, …: an object); ``output_content`` is then its compact
    # JSON text. A rewrite must keep its shape: ``MutateOutput.of_value`` (bus/actions.py).
    output_value: Any | msgspec.UnsetType = msgspec.UNSET

    @property
    def structured(self) -> bool:
        """Whether the output is structured (``output_value`` set): rewrites keep its shape."""
        return self.output_value is not msgspec.UNSET


class PostToolUseFailureContext(_Context, frozen=True, kw_only=True):
    session_id: str
    agent_name: str = "main"
    tool_name: str
    error_message: str = ""
    is_interrupt: bool = False
    step: int = 0
    elapsed_ms: float = 0.0
    # Not in the specification's table; carried so that content patterns can filter failures too.
    tool_args: dict[str, Any] = msgspec.field(default_factory=dict)


class StepCompleteContext(_Context, frozen=True, kw_only=True):
    session_id: str
    step: int
    max_steps: int
    messages_count: int = 0
    estimated_tokens: int = 0
    token_limit: int = 0


class SessionStopContext(_Context, frozen=True, kw_only=True):
    session_id: str
    terminal: TurnTerminal = TurnTerminal.COMPLETED
    total_steps: int = 0


class SubagentStartContext(_Context, frozen=True, kw_only=True):
    parent_session_id: str
    subagent_name: str
    prompt: str = ""


class SubagentStopContext(_Context, frozen=True, kw_only=True):
    parent_session_id: str
    subagent_name: str
    result_summary: str = ""
    steps: int = 0
    is_error: bool = False


class PreCompactContext(_Context, frozen=True, kw_only=True):
    session_id: str
    message_count: int = 0
    estimated_tokens: int = 0


class PostCompactContext(_Context, frozen=True, kw_only=True):
    session_id: str
    new_message_count: int = 0
    compression_method: str = ""


class PermissionRequestContext(_Context, frozen=True, kw_only=True):
    session_id: str
    tool_name: str
    tool_args: dict[str, Any] = msgspec.field(default_factory=dict)
    current_decision: PermissionDecision = PermissionDecision.ASK
    permission_mode: str = "default"
    is_subagent: bool = False


class PermissionDeniedContext(_Context, frozen=True, kw_only=True):
    session_id: str
    tool_name: str
    reason: str = ""
    source: PermissionDenialSource = PermissionDenialSource.RULE


HookContext = (
    SessionStartContext
    | PreToolUseContext
    | PostToolUseContext
    | PostToolUseFailureContext
    | StepCompleteContext
    | SessionStopContext
    | SubagentStartContext
    | SubagentStopContext
    | PreCompactContext
    | PostCompactContext
    | PermissionRequestContext
    | PermissionDeniedContext
)

#: The context type each event carries.
CONTEXT_TYPES: dict[HookEvent, type[_Context]] = {
    HookEvent.ON_SESSION_START: SessionStartContext,
    HookEvent.PRE_TOOL_USE: PreToolUseContext,
    HookEvent.POST_TOOL_USE: PostToolUseContext,
    HookEvent.POST_TOOL_USE_FAILURE: PostToolUseFailureContext,
    HookEvent.ON_STEP_COMPLETE: StepCompleteContext,
    HookEvent.ON_SESSION_STOP: SessionStopContext,
    HookEvent.ON_SUBAGENT_START: SubagentStartContext,
    HookEvent.ON_SUBAGENT_STOP: SubagentStopContext,
    HookEvent.ON_PRE_COMPACT: PreCompactContext,
    HookEvent.ON_POST_COMPACT: PostCompactContext,
    HookEvent.PERMISSION_REQUEST: PermissionRequestContext,
    HookEvent.PERMISSION_DENIED: PermissionDeniedContext,
}


_SUBAGENT_CONTEXTS = frozenset({SubagentStartContext, SubagentStopContext})


def session_of(ctx: HookContext) -> str:
    """The session a context belongs to (a subagent's is its parent's)."""
    if type(ctx) in _SUBAGENT_CONTEXTS:  # type() is cheaper than isinstance on msgspec Structs
        return ctx.parent_session_id  # type: ignore[union-attr]
    return ctx.session_id  # type: ignore[union-attr]


def tool_of(ctx: HookContext) -> tuple[str | None, dict[str, Any]]:
    """The tool name and arguments a context is about, or ``(None, {})``."""
    name: str | None = getattr(ctx, "tool_name", None)
    args: dict[str, Any] = getattr(ctx, "tool_args", None) or {}
    return name, args
