"""What hooks answer (actions) and what a dispatch returns (results).

Actions are tagged unions: on the wire each carries ``"type"`` set to the specification's
variant name (``{"type": "Block", "reason": "…"}``). ``Continue`` and ``PermissionRequired``
are shared by the unions that contain them. The specification's ``Warning`` variant is
``Warn`` in Python (so as not to shadow the builtin); its wire tag stays ``"Warning"``.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import msgspec

from bus.errors import FailureKind
from bus.events import HookEvent, PermissionDecision


class _Action(msgspec.Struct, frozen=True, kw_only=True, tag_field="type"):
    """Base of every hook action."""


class Continue(_Action, tag="Continue", frozen=True, kw_only=True):
    """Do not intervene."""


class Block(_Action, tag="Block", frozen=True, kw_only=True):
    """Stop this one tool call (PreToolUse)."""

    reason: str


class MutateInput(_Action, tag="MutateInput", frozen=True, kw_only=True):
    """Replace the tool's arguments (PreToolUse)."""

    updated_args: dict[str, Any]
    additional_context: str | None = None


class PermissionRequired(_Action, tag="PermissionRequired", frozen=True, kw_only=True):
    """Ask for permission (PreToolUse: escalates Allow to Ask; PostToolUse: advisory)."""

    permission: str
    tool_name: str


class MutateOutput(_Action, tag="MutateOutput", frozen=True, kw_only=True):
    """Replace the tool's output (PostToolUse, PostToolUseFailure)."""

    updated_content: str
    additional_context: str | None = None


class Warn(_Action, tag="Warning", frozen=True, kw_only=True):
    """Flag the output without blocking; injected as a system reminder.

    With ``truncate_output`` the final output is cut to the registry's truncation limit.
    """

    message: str
    truncate_output: bool = False


class Metadata(_Action, tag="Metadata", frozen=True, kw_only=True):
    """Attach a structured value to the result under ``key``."""

    key: str
    value: Any = None


class Override(_Action, tag="Override", frozen=True, kw_only=True):
    """Replace the permission decision (PermissionRequest)."""

    decision: PermissionDecision
    reason: str = ""


class InjectContext(_Action, tag="InjectContext", frozen=True, kw_only=True):
    """Add context for the LLM (PermissionRequest)."""

    context: str


PreToolUseAction = Continue | Block | MutateInput | PermissionRequired
PostToolUseAction = Continue | MutateOutput | Warn | PermissionRequired | Metadata
PermissionRequestAction = Continue | Override | InjectContext
HookAction = PreToolUseAction | PostToolUseAction | PermissionRequestAction

CONTINUE = Continue()


class BlockingError(msgspec.Struct, frozen=True):
    """A Block answered by one hook."""

    hook_name: str
    reason: str


class TaggedContext(msgspec.Struct, frozen=True):
    """Context injected by a hook, with its source."""

    hook_name: str
    source_event: HookEvent
    content: str
    timestamp: dt.datetime

    def render(self) -> str:
        """``[Hook: name | Event] content``, the form the LLM sees."""
        return f"[Hook: {self.hook_name} | {self.source_event.value}] {self.content}"


class SkippedHook(msgspec.Struct, frozen=True):
    """A hook that did not answer: which one, why, and what its failure policy made of it."""

    hook_name: str
    event: HookEvent
    kind: FailureKind
    detail: str
    enforced: bool = False  # True when failure_policy="fail" turned it into Block/Deny


class ShadowedAnswer(msgspec.Struct, frozen=True):
    """An answer a hook in ``warn`` or ``dryrun`` mode gave that was not applied as given."""

    hook_name: str
    event: HookEvent
    mode: str  # "warn" | "dryrun"
    action: str  # the answer's wire tag, or "failure"
    detail: str  # "would have blocked: …"


class PreToolUseResult(msgspec.Struct, frozen=True, kw_only=True):
    """The aggregated answer of every PreToolUse hook."""

    action: PreToolUseAction
    final_args: dict[str, Any]
    additional_contexts: tuple[str, ...] = ()
    blocking_errors: tuple[BlockingError, ...] = ()
    tagged_contexts: tuple[TaggedContext, ...] = ()
    skipped: tuple[SkippedHook, ...] = ()
    shadowed: tuple[ShadowedAnswer, ...] = ()

    @property
    def additional_context(self) -> str | None:
        """All additional contexts joined by newlines, or None."""
        return "\n".join(self.additional_contexts) if self.additional_contexts else None

    @property
    def is_blocked(self) -> bool:
        return isinstance(self.action, Block)


class PostToolUseResult(msgspec.Struct, frozen=True, kw_only=True):
    """The aggregated answer of every PostToolUse (or PostToolUseFailure) hook."""

    final_content: str
    additional_contexts: tuple[str, ...] = ()
    tagged_contexts: tuple[TaggedContext, ...] = ()
    warnings: tuple[str, ...] = ()
    post_permission_requests: tuple[tuple[str, str], ...] = ()
    metadata: dict[str, Any] = msgspec.field(default_factory=dict)
    skipped: tuple[SkippedHook, ...] = ()
    shadowed: tuple[ShadowedAnswer, ...] = ()


class PermissionRequestResult(msgspec.Struct, frozen=True, kw_only=True):
    """The aggregated answer of every PermissionRequest hook.

    ``action`` is the first Override in hook order, else Continue; injected contexts accumulate.
    """

    action: Continue | Override
    overridden_by: str | None = None
    additional_contexts: tuple[str, ...] = ()
    tagged_contexts: tuple[TaggedContext, ...] = ()
    skipped: tuple[SkippedHook, ...] = ()
    shadowed: tuple[ShadowedAnswer, ...] = ()


class NotifyResult(msgspec.Struct, frozen=True, kw_only=True):
    """What a dispatch of an event without an answer (OnSessionStart, …) reports."""

    called: tuple[str, ...] = ()
    skipped: tuple[SkippedHook, ...] = ()
