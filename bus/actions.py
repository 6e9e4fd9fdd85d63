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
from bus.events import HookEvent, PermissionDecision, PostToolUseContext


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
    """Replace the tool's output (PostToolUse, PostToolUseFailure).

    A structured output (``PostToolUseContext.output_value`` set: Claude Code's Read, Bash, …)
    is replaced by a value of the same shape, given as its JSON text: ``MutateOutput.of_value``
    builds that. Text that is not JSON of the same shape is refused (``rewrite_error``): the
    hook fails under its failure policy, because an agent ignores such a rewrite and would show
    the original output.
    """

    updated_content: str
    additional_context: str | None = None

    @classmethod
    def of_value(cls, value: Any, additional_context: str | None = None) -> MutateOutput:
        """Replace a structured output with ``value`` (same keys and types as ``output_value``)."""
        return cls(
            updated_content=msgspec.json.encode(value).decode(),
            additional_context=additional_context,
        )


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


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list | tuple):
        return "array"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__


def shape_mismatch(original: Any, value: Any, at: str = "$") -> str | None:
    """Where ``value`` is not of ``original``'s shape, or None: the same JSON type at every
    node; objects with the same keys, and the same ``type`` string where the original has one
    (a tagged union's tag: Claude Code ignores a Read rewritten with another); arrays item by
    item (of another length: each item of the shape of one of the original's). ``null`` in the
    original accepts anything (the agent's type is not known there)."""
    want, got = _kind(original), _kind(value)
    if original is None:
        return None
    if want != got:
        return f"{at} is {got}, the original is {want}"
    if isinstance(original, dict):
        if set(original) != set(value):
            lost = sorted(set(original) - set(value))
            new = sorted(set(value) - set(original))
            return f"{at} has other keys than the original (missing {lost}, added {new})"
        tag = original.get("type")
        if isinstance(tag, str) and value["type"] != tag:
            return f"{at}.type is {value['type']!r}, the original is {tag!r}"
        for key, item in original.items():
            if (why := shape_mismatch(item, value[key], f"{at}.{key}")) is not None:
                return why
    elif isinstance(original, list | tuple) and len(original) == len(value):
        for i, (was, item) in enumerate(zip(original, value, strict=True)):
            if (why := shape_mismatch(was, item, f"{at}[{i}]")) is not None:
                return why
    elif isinstance(original, list | tuple) and original:  # items left out or added
        for i, item in enumerate(value):
            if all(shape_mismatch(was, item) is not None for was in original):
                return f"{at}[{i}] is of the shape of none of the original's items"
    return None


def rewrite_error(ctx: PostToolUseContext, action: Any) -> str | None:
    """Why ``action`` cannot replace ``ctx``'s structured output (None if it can, or if it is
    not a MutateOutput, or the output is text): a rewrite of a structured output must be JSON
    of the same shape (``MutateOutput.of_value``)."""
    if not isinstance(action, MutateOutput) or not ctx.structured:
        return None
    try:
        value = msgspec.json.decode(action.updated_content)
    except msgspec.DecodeError:
        return (
            f"MutateOutput gave text for {ctx.tool_name}'s structured output "
            f"({_kind(ctx.output_value)}); the agent would ignore it and show the original: "
            "answer MutateOutput.of_value(<a value of output_value's shape>)"
        )
    why = shape_mismatch(ctx.output_value, value)
    if why is None:
        return None
    return (
        f"MutateOutput changed the shape of {ctx.tool_name}'s structured output ({why}); the "
        "agent would ignore it and show the original: keep output_value's keys and types"
    )


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
