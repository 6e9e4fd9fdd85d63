"""Pure aggregation: from the hooks' answers, in hook order, to one result.

No I/O, no clock, no randomness: every function takes the outcomes already ordered by hook
order (priority, then registration) and the timestamp to stamp contexts with. The embedded
registry and the Redis coordinator both call these, so the two modes decide alike.

Rules (specification, with HookBus's two additions, ``priority`` and ``failure_policy``):

* PreToolUse: Block > PermissionRequired > MutateInput > Continue. Every Block is kept in
  ``blocking_errors``; MutateInput is applied in order (last wins); contexts all kept.
* PostToolUse / PostToolUseFailure: MutateOutput applied in order (last wins); warnings,
  post-permission requests, metadata (last value per key wins) and contexts all kept; a
  Warning with ``truncate_output`` cuts the final output to ``truncate_chars``.
* PermissionRequest: the first Override in hook order wins; InjectContext accumulates.
* A hook that failed (timeout, crash, unreachable, wrong answer type) is skipped and listed in
  ``skipped``; with ``failure_policy="fail"`` it becomes a Block (PreToolUse) or a Deny that no
  other hook's Override can lift (PermissionRequest), with a reason that names the hook.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any

import msgspec

from bus import limits
from bus.actions import (
    CONTINUE,
    Block,
    BlockingError,
    Continue,
    InjectContext,
    Metadata,
    MutateInput,
    MutateOutput,
    NotifyResult,
    Override,
    PermissionRequestResult,
    PermissionRequired,
    PostToolUseResult,
    PreToolUseResult,
    ShadowedAnswer,
    SkippedHook,
    TaggedContext,
    Warn,
)
from bus.errors import FailureKind, LimitError
from bus.events import HookEvent, PermissionDecision
from bus.hooks import HookSpec

TRUNCATION_MARKER = "\n…[output truncated by hook]"

#: The answer types each event accepts; None (no answer) is accepted everywhere.
ALLOWED_ACTIONS: dict[HookEvent, tuple[type, ...]] = {
    HookEvent.PRE_TOOL_USE: (Continue, Block, MutateInput, PermissionRequired),
    HookEvent.POST_TOOL_USE: (Continue, MutateOutput, Warn, PermissionRequired, Metadata),
    HookEvent.POST_TOOL_USE_FAILURE: (Continue, MutateOutput, Warn, PermissionRequired, Metadata),
    HookEvent.PERMISSION_REQUEST: (Continue, Override, InjectContext),
}


class Outcome(msgspec.Struct, frozen=True):
    """One hook's part in a dispatch: its answer, or why there is none."""

    spec: HookSpec
    action: Any = None
    failure: FailureKind | None = None
    detail: str = ""
    elapsed: float = 0.0  # seconds, for timelines and spans


#: Answers that carry values of the hook's choosing, whose size and depth are checked.
_FREE_FORM = (MutateInput, Metadata)


def check_answer(event: HookEvent, spec: HookSpec, answer: Any, elapsed: float) -> Outcome:
    """Wrap a hook's answer, turning an answer of the wrong type, or one that carries a value
    too deep or too large to send (bus/limits.py), into a failure."""
    allowed = ALLOWED_ACTIONS.get(event)
    if answer is None or allowed is None or isinstance(answer, allowed):
        if type(answer) in _FREE_FORM:
            try:
                limits.check_answer(answer)
            except LimitError as exc:
                why = f"the hook's answer could not be sent: {exc}"
                return Outcome(spec, None, "error", why, elapsed)
        return Outcome(spec, answer, None, "", elapsed)
    names = ", ".join(str(t.__struct_config__.tag) for t in allowed)  # type: ignore[attr-defined]
    return Outcome(
        spec, None, "error", f"answered {type(answer).__name__}; {event} accepts {names}", elapsed
    )


_ENFORCING = (HookEvent.PRE_TOOL_USE, HookEvent.PERMISSION_REQUEST)


def _why(o: Outcome) -> str:
    what = {"timeout": "timed out", "error": "failed", "unreachable": "is unreachable"}
    return f"hook {o.spec.name} {what[o.failure or 'error']}: {o.detail}"


def skipped_of(event: HookEvent, outcomes: Sequence[Outcome]) -> tuple[SkippedHook, ...]:
    """Every failed hook, with whether its failure policy enforced a Block/Deny."""
    enforcing = event in (HookEvent.PRE_TOOL_USE, HookEvent.PERMISSION_REQUEST)
    return tuple(
        SkippedHook(
            o.spec.name,
            event,
            o.failure,
            o.detail,
            enforcing and o.spec.failure_policy == "fail",
        )
        for o in outcomes
        if o.failure is not None
    )


_WOULD = {
    "Block": "would have blocked",
    "MutateInput": "would have changed the input",
    "MutateOutput": "would have changed the output",
    "PermissionRequired": "would have asked for permission",
    "Warning": "would have warned",
    "Metadata": "would have added metadata",
    "Override": "would have overridden the permission decision",
    "InjectContext": "would have added context",
}


def _tag_of(action: Any) -> str:
    return str(type(action).__struct_config__.tag)


def would_do(event: HookEvent, o: Outcome) -> tuple[str, str] | None:
    """What an answer would have done (its tag and a sentence), or None if nothing."""
    if o.failure is not None:
        if o.spec.failure_policy == "fail" and event in _ENFORCING:
            verb = "blocked" if event == HookEvent.PRE_TOOL_USE else "denied"
            return "failure", f"would have {verb}: {_why(o)} (failure_policy=fail)"
        return None
    a = o.action
    if a is None or isinstance(a, Continue):
        return None
    tag = _tag_of(a)
    detail = _WOULD.get(tag, f"would have answered {tag}")
    if isinstance(a, Block):
        detail += f": {a.reason}"
    elif isinstance(a, Override):
        detail += f" to {a.decision.value}" + (f": {a.reason}" if a.reason else "")
    return tag, detail


def _softened(event: HookEvent, o: Outcome) -> bool:
    """In ``warn`` mode only a Block, a Deny, or a failure that would enforce one, is softened."""
    if o.failure is not None:
        return o.spec.failure_policy == "fail" and event in _ENFORCING
    a = o.action
    return isinstance(a, Block) or (
        isinstance(a, Override) and a.decision == PermissionDecision.DENY
    )


def apply_modes(
    event: HookEvent, outcomes: Sequence[Outcome], now: dt.datetime
) -> tuple[list[Outcome], tuple[ShadowedAnswer, ...], list[TaggedContext]]:
    """Outcomes as the hooks' enforcement modes let them count, what was held back, and the
    warnings ``warn`` mode injects for the agent."""
    if all(o.spec.mode == "enforce" for o in outcomes):
        return list(outcomes), (), []
    effective: list[Outcome] = []
    shadowed: list[ShadowedAnswer] = []
    warnings: list[TaggedContext] = []
    for o in outcomes:
        mode = o.spec.mode
        would = would_do(event, o) if mode != "enforce" else None
        if would is None or (mode == "warn" and not _softened(event, o)):
            effective.append(o)
            continue
        tag, detail = would
        shadowed.append(ShadowedAnswer(o.spec.name, event, mode, tag, detail))
        if mode == "warn":
            warnings.append(_tag(o.spec.name, event, f"Warning: this hook {detail}", now))
        # Still listed in skipped if it failed, but never enforced: it is not enforcing yet.
        lenient = msgspec.structs.replace(o.spec, failure_policy="ignore")
        effective.append(msgspec.structs.replace(o, spec=lenient, action=None))
    return effective, tuple(shadowed), warnings


def shadowed_answers(event: HookEvent, outcomes: Sequence[Outcome]) -> tuple[ShadowedAnswer, ...]:
    """The answers of hooks not enforcing (``warn``, ``dryrun``) that were not applied."""
    for o in outcomes:  # a plain loop: this runs on every dispatch, usually all "enforce"
        if o.spec.mode != "enforce":
            return apply_modes(event, outcomes, _EPOCH)[1]
    return ()


_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


def _all_continue(outcomes: Sequence[Outcome]) -> bool:
    """The common case: every hook answered Continue (or nothing) — nothing to aggregate."""
    return all(
        o.failure is None and (o.action is None or type(o.action) is Continue) for o in outcomes
    )


def _tag(name: str, event: HookEvent, content: str, now: dt.datetime) -> TaggedContext:
    return TaggedContext(name, event, content, now)


def aggregate_pre_tool_use(
    tool_args: dict[str, Any], outcomes: Sequence[Outcome], now: dt.datetime
) -> PreToolUseResult:
    """Aggregate PreToolUse answers given in hook order."""
    if _all_continue(outcomes):
        return PreToolUseResult(action=CONTINUE, final_args=tool_args)
    event = HookEvent.PRE_TOOL_USE
    outcomes, shadowed, tagged = apply_modes(event, outcomes, now)
    args = tool_args
    mutated = False
    permission: PermissionRequired | None = None
    blocks: list[BlockingError] = []
    contexts: list[str] = []
    for o in outcomes:
        name, a = o.spec.name, o.action
        if o.failure is not None:
            if o.spec.failure_policy == "fail":
                blocks.append(BlockingError(name, f"{_why(o)} (failure_policy=fail)"))
        elif isinstance(a, Block):
            blocks.append(BlockingError(name, a.reason))
        elif isinstance(a, MutateInput):
            args, mutated = a.updated_args, True
            if a.additional_context:
                contexts.append(a.additional_context)
                tagged.append(_tag(name, event, a.additional_context, now))
        elif isinstance(a, PermissionRequired) and permission is None:
            permission = a
    action: Any
    if blocks:
        action = Block(reason=blocks[0].reason)
    elif permission is not None:
        action = permission
    elif mutated:
        action = MutateInput(updated_args=args, additional_context="\n".join(contexts) or None)
    else:
        action = CONTINUE
    return PreToolUseResult(
        action=action,
        final_args=args,
        additional_contexts=tuple(contexts),
        blocking_errors=tuple(blocks),
        tagged_contexts=tuple(tagged),
        skipped=skipped_of(event, outcomes),
        shadowed=shadowed,
    )


def truncate(content: str, limit: int, marker: str = TRUNCATION_MARKER) -> str:
    """Cut ``content`` to ``limit`` characters, with a visible marker when it was cut."""
    return content if len(content) <= limit else content[:limit] + marker


def aggregate_post_tool_use(
    event: HookEvent,
    content: str,
    outcomes: Sequence[Outcome],
    now: dt.datetime,
    truncate_chars: int,
) -> PostToolUseResult:
    """Aggregate PostToolUse or PostToolUseFailure answers given in hook order."""
    if _all_continue(outcomes):
        return PostToolUseResult(final_content=content)
    outcomes, shadowed, tagged = apply_modes(event, outcomes, now)
    warnings: list[str] = []
    contexts: list[str] = []
    requests: list[tuple[str, str]] = []
    metadata: dict[str, Any] = {}
    cut = False
    for o in outcomes:
        name, a = o.spec.name, o.action
        if o.failure is not None:
            continue
        if isinstance(a, MutateOutput):
            content = a.updated_content
            if a.additional_context:
                contexts.append(a.additional_context)
                tagged.append(_tag(name, event, a.additional_context, now))
        elif isinstance(a, Warn):
            warnings.append(a.message)
            tagged.append(_tag(name, event, f"Warning: {a.message}", now))
            cut = cut or a.truncate_output
        elif isinstance(a, PermissionRequired):
            requests.append((a.permission, a.tool_name))
        elif isinstance(a, Metadata):
            metadata[a.key] = a.value
    return PostToolUseResult(
        final_content=truncate(content, truncate_chars) if cut else content,
        additional_contexts=tuple(contexts),
        tagged_contexts=tuple(tagged),
        warnings=tuple(warnings),
        post_permission_requests=tuple(requests),
        metadata=metadata,
        skipped=skipped_of(event, outcomes),
        shadowed=shadowed,
    )


def aggregate_permission_request(
    outcomes: Sequence[Outcome], now: dt.datetime
) -> PermissionRequestResult:
    """Aggregate PermissionRequest answers given in hook order.

    A failed ``fail`` hook denies, and that Deny outranks every Override: a hook that could not
    check the call never lets it through.
    """
    event = HookEvent.PERMISSION_REQUEST
    outcomes, shadowed, tagged = apply_modes(event, outcomes, now)
    winner: Override | None = None
    winner_name: str | None = None
    forced: Override | None = None
    forced_name: str | None = None
    contexts: list[str] = []
    for o in outcomes:
        name, a = o.spec.name, o.action
        if o.failure is not None:
            if o.spec.failure_policy == "fail" and forced is None:
                forced = Override(
                    decision=PermissionDecision.DENY, reason=f"{_why(o)} (failure_policy=fail)"
                )
                forced_name = name
        elif isinstance(a, Override) and winner is None:
            winner, winner_name = a, name
        elif isinstance(a, InjectContext):
            contexts.append(a.context)
            tagged.append(_tag(name, event, a.context, now))
    if forced is not None:
        winner, winner_name = forced, forced_name
    return PermissionRequestResult(
        action=winner if winner is not None else CONTINUE,
        overridden_by=winner_name,
        additional_contexts=tuple(contexts),
        tagged_contexts=tuple(tagged),
        skipped=skipped_of(event, outcomes),
        shadowed=shadowed,
    )


def aggregate_notify(event: HookEvent, outcomes: Sequence[Outcome]) -> NotifyResult:
    """Report of an event without answers: who was called, who was skipped."""
    return NotifyResult(
        called=tuple(o.spec.name for o in outcomes), skipped=skipped_of(event, outcomes)
    )


#: The name a refusal gives as the blocker: the dispatcher itself, not a hook.
REFUSER = "HookBus"
#: What replaces tool output that no hook could be shown.
WITHHELD = "[output withheld by HookBus: no hook could inspect it ({reason})]"


def refusal(event: HookEvent, why: str) -> Any:
    """The result of a dispatch whose context no hook could be shown (too large, too deep, not
    encodable: ``why`` names the limit). Input no hook inspected is never approved by default,
    whatever the hooks' failure policies: PreToolUse is blocked, PermissionRequest denied,
    tool output withheld; a notification reaches no hook (``None`` for PermissionDenied)."""
    reason = f"input refused: {why}; no hook could inspect it"
    if event == HookEvent.PRE_TOOL_USE:
        return PreToolUseResult(
            action=Block(reason=reason),
            final_args={},
            blocking_errors=(BlockingError(REFUSER, reason),),
        )
    if event == HookEvent.PERMISSION_REQUEST:
        return PermissionRequestResult(
            action=Override(decision=PermissionDecision.DENY, reason=reason),
            overridden_by=REFUSER,
        )
    if event in (HookEvent.POST_TOOL_USE, HookEvent.POST_TOOL_USE_FAILURE):
        return PostToolUseResult(final_content=WITHHELD.format(reason=why), warnings=(reason,))
    return NotifyResult(called=(), skipped=())
