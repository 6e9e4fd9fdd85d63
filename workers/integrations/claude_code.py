"""Claude Code's hooks and HookBus's 12 events: the one mapping, both ways.

Claude Code runs hooks at its own events (``PreToolUse``, ``SessionStart``, ``Stop``, …), hands
each its input as JSON (``session_id``, ``hook_event_name``, ``tool_name``, ``tool_input``, …) and
reads their answer as JSON (``hookSpecificOutput.permissionDecision``, ``updatedInput``,
``additionalContext``, ``decision: "block"``, ``continue``/``stopReason``). The types are those of
``@anthropic-ai/claude-agent-sdk`` (its ``sdk.d.ts``: ``HookInput``, ``SyncHookJSONOutput``); JSON
Schemas made from them are in ``examples/claude-code/schemas`` and the tests check every message
against them. The table, with what has no counterpart, is in ``docs/integrations.md``.

Towards HookBus (``hookbus gateway``'s ``POST /claude-code``, and so the command bridge):

* ``to_hookbus(body)``: Claude Code's hook input → the HookBus event and context to dispatch,
  or ``None`` for an event without a counterpart (answered with ``{}``: Claude Code goes on as
  if no hook had answered);
* ``to_claude_code(call, result)``: the aggregated HookBus result → Claude Code's hook output.

A structured ``tool_response`` (Read's and Bash's are objects) reaches hooks as it came
(``PostToolUseContext.output_value``) and a rewrite goes back in its shape: Claude Code ignores
an ``updatedToolOutput`` of another shape and shows the original. Claude Code's own input
travels with every context (``agent_input``).

Towards Claude Code's own hook scripts (``workers.integrations.command_hook:CommandHook``):

* ``hook_input(event, ctx, …)``: a HookBus context → the input a Claude Code hook script reads
  (Claude Code's own, unchanged, when the context came from Claude Code: ``original_input``);
* ``from_command(event, ctx, status, stdout, stderr)``: what the script did → the hook's answer.

Why one module: the translation between Claude Code's hook input and output and HookBus's
contexts and results is read side by side, event by event: each direction checks the shapes the
other produces (a rewrite must keep ``tool_response``'s shape).
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass
from typing import Any

import msgspec

from bus import limits
from bus.actions import (
    CONTINUE,
    Block,
    MutateInput,
    MutateOutput,
    NotifyResult,
    Override,
    PermissionRequestResult,
    PermissionRequired,
    PostToolUseResult,
    PreToolUseResult,
    TaggedContext,
    Warn,
    shape_mismatch,
)
from bus.aggregation import refusal
from bus.errors import ProtocolError
from bus.events import (
    HookContext,
    HookEvent,
    PermissionDecision,
    PermissionDenialSource,
    PermissionDeniedContext,
    PermissionRequestContext,
    PostCompactContext,
    PostToolUseContext,
    PostToolUseFailureContext,
    PreCompactContext,
    PreToolUseContext,
    SessionStartContext,
    SessionStopContext,
    StepCompleteContext,
    SubagentStartContext,
    SubagentStopContext,
)
from bus.protocol import decode_head
from workers.builtins.cancellation import RedisCancellationHook
from workers.integrations.claude_code_bridge import event_name

log = logging.getLogger("hookbus.claude_code")

#: Claude Code's hook events that have a HookBus counterpart, and that counterpart.
EVENTS: dict[str, HookEvent] = {
    "SessionStart": HookEvent.ON_SESSION_START,
    "PreToolUse": HookEvent.PRE_TOOL_USE,
    "PostToolUse": HookEvent.POST_TOOL_USE,
    "PostToolUseFailure": HookEvent.POST_TOOL_USE_FAILURE,
    "Stop": HookEvent.ON_STEP_COMPLETE,
    "SessionEnd": HookEvent.ON_SESSION_STOP,
    "SubagentStart": HookEvent.ON_SUBAGENT_START,
    "SubagentStop": HookEvent.ON_SUBAGENT_STOP,
    "PreCompact": HookEvent.ON_PRE_COMPACT,
    "PostCompact": HookEvent.ON_POST_COMPACT,
    "PermissionRequest": HookEvent.PERMISSION_REQUEST,
    "PermissionDenied": HookEvent.PERMISSION_DENIED,
}
#: The other way (the 12 map one to one).
CLAUDE_EVENTS: dict[HookEvent, str] = {hb: cc for cc, hb in EVENTS.items()}
#: The hook whose Block means "this session was cancelled": Claude Code is then told to stop
#: (``continue: false``), not only denied the one tool call.
CANCELLATION_HOOK = RedisCancellationHook.name
#: The key a ``tool_input`` that is not a JSON object is kept under in ``tool_args``.
NON_OBJECT_INPUT = "input"


# -- Claude Code's hook input, as far as HookBus reads it (unknown fields are ignored) ---------


class _Input(msgspec.Struct, kw_only=True):
    session_id: str
    hook_event_name: str
    transcript_path: str = ""
    cwd: str = ""
    permission_mode: str = "default"
    agent_id: str = ""
    agent_type: str = ""


class _ToolInput(_Input, kw_only=True):
    tool_name: str
    tool_input: Any
    tool_use_id: str = ""


class _PostToolUse(_ToolInput, kw_only=True):
    tool_response: Any = None
    duration_ms: float = 0.0


class _PostToolUseFailure(_ToolInput, kw_only=True):
    error: str
    is_interrupt: bool = False
    duration_ms: float = 0.0


class _PermissionDenied(_ToolInput, kw_only=True):
    reason: str = ""


class _SessionStart(_Input, kw_only=True):
    source: str = "startup"


class _Subagent(_Input, kw_only=True):
    agent_id: str
    agent_type: str
    last_assistant_message: str = ""


class _Compact(_Input, kw_only=True):
    trigger: str = "auto"


INPUT_TYPES: dict[str, type[_Input]] = {
    "SessionStart": _SessionStart,
    "PreToolUse": _ToolInput,
    "PostToolUse": _PostToolUse,
    "PostToolUseFailure": _PostToolUseFailure,
    "Stop": _Input,
    "SessionEnd": _Input,
    "SubagentStart": _Subagent,
    "SubagentStop": _Subagent,
    "PreCompact": _Compact,
    "PostCompact": _Compact,
    "PermissionRequest": _ToolInput,
    "PermissionDenied": _PermissionDenied,
}


class _Head(msgspec.Struct):
    hook_event_name: str


@dataclass(frozen=True)
class Call:
    """One Claude Code hook call, as HookBus dispatches it."""

    claude_event: str  # Claude Code's name of the event
    event: HookEvent
    ctx: HookContext
    wrapped_input: bool = False  # tool_input was not an object: tool_args holds it under "input"


def tool_args(tool_input: Any) -> tuple[dict[str, Any], bool]:
    """Claude Code's ``tool_input`` as HookBus's ``tool_args`` (an object), and whether it had
    to be wrapped (Claude Code sends objects; its type says ``unknown``)."""
    if isinstance(tool_input, dict):
        return tool_input, False
    return {NON_OBJECT_INPUT: tool_input}, True


def as_text(value: Any) -> str:
    """A tool's response as HookBus's ``output_content``: a string as is, else compact JSON."""
    return value if isinstance(value, str) else msgspec.json.encode(value).decode()


def to_hookbus(body: bytes) -> Call | None:
    """Claude Code's hook input → what to dispatch; ``None``: the event has no counterpart.

    Raises ProtocolError (naming the field, e.g. ``$.tool_name``) on input that is not Claude
    Code's: not JSON, not an object, a required field missing or of the wrong type.
    """
    limits.check(body, "hook input")  # size, nesting, containers: LimitError, before parsing
    try:
        data = msgspec.json.decode(body)
    except Exception as exc:  # DecodeError, or whatever else the parser raises
        raise ProtocolError(f"the hook input is not JSON: {exc}") from exc
    try:
        head = msgspec.convert(data, _Head)
    except msgspec.ValidationError as exc:
        raise _error("the hook input", exc) from exc
    kind = INPUT_TYPES.get(head.hook_event_name)
    if kind is None:
        return None
    try:
        given = msgspec.convert(data, kind)
    except msgspec.ValidationError as exc:
        raise _error(f"Claude Code's {head.hook_event_name} input", exc) from exc
    return _call(head.hook_event_name, given, data)


_AT = re.compile(r" - at `([^`]*)`$")
_MISSING = re.compile(r"^Object missing required field `([^`]*)`")


def _error(what: str, exc: msgspec.ValidationError) -> ProtocolError:
    """A ProtocolError naming the JSON path of the offending field, as bus.protocol's do."""
    text = str(exc)
    at = _AT.search(text)
    missing = _MISSING.match(text)
    field = at.group(1) if at else ""
    if missing:
        field = f"{field or '$'}.{missing.group(1)}"
    return ProtocolError(f"malformed {what}: {text}", field or "$")


def structured(tool_response: Any) -> bool:
    """Whether a tool's response is structured (an object, an array, a number, …: not text)."""
    return not isinstance(tool_response, str) and tool_response is not None


def _call(name: str, given: _Input, data: dict[str, Any]) -> Call:
    ctx = _context(name, given)
    # Claude Code's own input goes with the context (CommandHook hands it to scripts as it
    # came), less what the context carries unchanged: the tool's input and response.
    wrapped = isinstance(given, _ToolInput) and not isinstance(given.tool_input, dict)
    carried = set()
    if isinstance(ctx, _WITH_ARGS) and not wrapped:
        carried.add("tool_input")
    if isinstance(given, _PostToolUse) and given.tool_response is not None:
        carried.add("tool_response")
    kept = {k: v for k, v in data.items() if k not in carried}
    return Call(name, EVENTS[name], msgspec.structs.replace(ctx, agent_input=kept), wrapped)


def _context(name: str, given: _Input) -> HookContext:
    sid = given.session_id
    agent = given.agent_id or "main"
    ctx: HookContext
    if isinstance(given, _PostToolUse):
        args, _ = tool_args(given.tool_input)
        response = given.tool_response
        ctx = PostToolUseContext(
            session_id=sid, agent_name=agent, tool_name=given.tool_name, tool_args=args,
            output_content=as_text(response), elapsed_ms=given.duration_ms,
            output_value=response if structured(response) else msgspec.UNSET,
        )  # fmt: skip
    elif isinstance(given, _PostToolUseFailure):
        args, _ = tool_args(given.tool_input)
        ctx = PostToolUseFailureContext(
            session_id=sid, agent_name=agent, tool_name=given.tool_name, tool_args=args,
            error_message=given.error, is_interrupt=given.is_interrupt,
            elapsed_ms=given.duration_ms,
        )  # fmt: skip
    elif isinstance(given, _PermissionDenied):
        ctx = PermissionDeniedContext(
            session_id=sid, tool_name=given.tool_name, reason=given.reason,
            source=PermissionDenialSource.CLASSIFIER,  # Claude Code's auto-mode classifier
        )  # fmt: skip
    elif isinstance(given, _ToolInput) and name == "PermissionRequest":
        args, _ = tool_args(given.tool_input)
        ctx = PermissionRequestContext(
            session_id=sid, tool_name=given.tool_name, tool_args=args,
            permission_mode=given.permission_mode, is_subagent=bool(given.agent_id),
        )  # fmt: skip
    elif isinstance(given, _ToolInput):
        args, _ = tool_args(given.tool_input)
        ctx = PreToolUseContext(session_id=sid, tool_name=given.tool_name, tool_args=args)
    elif isinstance(given, _SessionStart):
        ctx = SessionStartContext(session_id=sid, is_resume=given.source == "resume")
    elif isinstance(given, _Subagent) and name == "SubagentStart":
        ctx = SubagentStartContext(parent_session_id=sid, subagent_name=given.agent_type)
    elif isinstance(given, _Subagent):
        ctx = SubagentStopContext(
            parent_session_id=sid, subagent_name=given.agent_type,
            result_summary=given.last_assistant_message,
        )  # fmt: skip
    elif isinstance(given, _Compact) and name == "PreCompact":
        ctx = PreCompactContext(session_id=sid)
    elif isinstance(given, _Compact):
        ctx = PostCompactContext(session_id=sid, compression_method=given.trigger)
    elif name == "Stop":  # Claude Code's turn ended; it sends no step counts
        ctx = StepCompleteContext(session_id=sid, step=0, max_steps=0)
    else:  # SessionEnd
        ctx = SessionStopContext(session_id=sid)
    return ctx


# -- HookBus's result → Claude Code's hook output ------------------------------------------------


def _contexts(tagged: tuple[TaggedContext, ...], leave_out: frozenset[str] = frozenset()) -> str:
    return "\n".join(t.render() for t in tagged if t.content not in leave_out)


def _specific(call: Call, **fields: Any) -> dict[str, Any]:
    return {"hookSpecificOutput": {"hookEventName": call.claude_event, **fields}}


def _unwrap(call: Call, args: dict[str, Any]) -> dict[str, Any] | None:
    """``final_args`` as Claude Code's ``updatedInput`` (an object), or None when it cannot be
    one (a wrapped non-object input)."""
    if not call.wrapped_input:
        return args
    inner = args.get(NON_OBJECT_INPUT)
    return inner if isinstance(inner, dict) else None


def to_claude_code(call: Call, result: Any) -> dict[str, Any]:
    """The aggregated result of ``call`` as Claude Code's hook output (``SyncHookJSONOutput``).

    ``{}`` when HookBus has nothing to say: Claude Code goes on as it would without the hook.
    """
    if isinstance(result, PreToolUseResult):
        return _pre_tool_use(call, result)
    if isinstance(result, PostToolUseResult):
        return _post_tool_use(call, result)
    if isinstance(result, PermissionRequestResult):
        return _permission_request(call, result)
    if result is None or isinstance(result, NotifyResult):
        return {}
    raise TypeError(f"no Claude Code output for a {type(result).__name__}")


def _pre_tool_use(call: Call, result: PreToolUseResult) -> dict[str, Any]:
    assert isinstance(call.ctx, PreToolUseContext)
    fields: dict[str, Any] = {}
    out: dict[str, Any] = {}
    action = result.action
    changed = result.final_args != call.ctx.tool_args
    if isinstance(action, Block):
        reasons = [f"{e.hook_name}: {e.reason}" for e in result.blocking_errors]
        fields["permissionDecision"] = "deny"
        fields["permissionDecisionReason"] = "\n".join(reasons) or action.reason
        for e in result.blocking_errors:
            if e.hook_name == CANCELLATION_HOOK:  # a person stopped the session: stop Claude
                out = {"continue": False, "stopReason": e.reason}
    elif isinstance(action, PermissionRequired) or (isinstance(action, MutateInput) and changed):
        # HookBus never approves at PreToolUse; a rewrite is shown to the person (Claude Code
        # applies updatedInput only with allow or ask, and allow would skip its prompt).
        fields["permissionDecision"] = "ask"
        if isinstance(action, PermissionRequired):
            fields["permissionDecisionReason"] = (
                f"a hook asks for permission {action.permission!r} to run {action.tool_name}"
            )
        else:
            fields["permissionDecisionReason"] = "a hook rewrote this tool call's input"
        if changed and (updated := _unwrap(call, result.final_args)) is not None:
            fields["updatedInput"] = updated
    if context := _contexts(result.tagged_contexts):
        fields["additionalContext"] = context
    return {**out, **_specific(call, **fields)} if fields else out


def _post_tool_use(call: Call, result: PostToolUseResult) -> dict[str, Any]:
    ctx = call.ctx
    warned = frozenset(f"Warning: {w}" for w in result.warnings)
    fields: dict[str, Any] = {}
    out: dict[str, Any] = {}
    if isinstance(ctx, PostToolUseContext):
        warnings = list(result.warnings)
        withheld = ""
        if result.final_content != ctx.output_content:
            updated, withheld = _updated_output(ctx, result.final_content)
            fields["updatedToolOutput"] = updated
            if withheld:
                warnings.append(withheld)
        if warnings:  # Claude Code tells Claude the reason of a PostToolUse "block"
            out = {"decision": "block", "reason": "\n".join(warnings)}
        if withheld:  # should Claude Code not take the rewrite, Claude is stopped before it reads
            out = {"continue": False, "stopReason": withheld, **out}
        context = _contexts(result.tagged_contexts, warned)
    else:  # PostToolUseFailure: Claude Code takes no rewritten error, only context
        assert isinstance(ctx, PostToolUseFailureContext)
        parts = [_contexts(result.tagged_contexts)]
        if result.final_content != ctx.error_message:
            parts.insert(0, result.final_content)
        context = "\n".join(p for p in parts if p)
    if context:
        fields["additionalContext"] = context
    return {**out, **_specific(call, **fields)} if fields else out


#: What replaces every string of a structured output that cannot be given back as rewritten.
WITHHELD_TEXT = "[withheld by HookBus]"
#: How HookBus's own text in place of an output starts (bus.aggregation.WITHHELD and alike).
WITHHELD_BY_HOOKBUS = "[output withheld by HookBus"


def _updated_output(ctx: PostToolUseContext, final: str) -> tuple[Any, str]:
    """``updatedToolOutput`` for ``final``, in ``tool_response``'s shape (Claude Code ignores a
    rewrite of another shape and shows the original), and why it was withheld, if it was.

    Each hook's rewrite was checked when it answered (``bus.actions.rewrite_error``); what can
    still come out of another shape (a Warning that truncated the text, HookBus's own withheld
    text) is withheld: every string of the original replaced (but a ``type``), its keys and
    types kept; and, as Claude Code may check more of a tool's output than that, Claude is
    stopped too (``continue: false``)."""
    if not ctx.structured:
        return final, ""
    try:
        value = msgspec.json.decode(final)
    except msgspec.DecodeError:
        value = msgspec.UNSET
    if value is not msgspec.UNSET and shape_mismatch(ctx.output_value, value) is None:
        return value, ""
    if final.startswith(WITHHELD_BY_HOOKBUS):  # HookBus withheld it (a refusal, no directory)
        why = f"the output of {ctx.tool_name} was withheld: {final}"
    else:  # never quote ``final``: it may be the original, cut (a secret in it)
        why = (
            f"the output of {ctx.tool_name} was withheld: after the hooks it no longer had the "
            "shape of the tool's response (a Warning with truncate_output cuts its JSON text)"
        )
    return _withheld(ctx.output_value), why


def _withheld(value: Any) -> Any:
    """``value`` with every string withheld, but a ``type`` (Claude Code checks it: a Read
    rewritten with another ``type`` is ignored, and the file shown)."""
    if isinstance(value, str):
        return WITHHELD_TEXT
    if isinstance(value, dict):
        return {k: v if k == "type" else _withheld(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_withheld(v) for v in value]
    return value


def _permission_request(call: Call, result: PermissionRequestResult) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if result.additional_contexts:  # no field for Claude here: shown to the person
        out["systemMessage"] = _contexts(result.tagged_contexts)
    action = result.action
    if isinstance(action, Override) and action.decision is PermissionDecision.ALLOW:
        return {**out, **_specific(call, decision={"behavior": "allow"})}
    if isinstance(action, Override) and action.decision is PermissionDecision.DENY:
        message = f"{result.overridden_by}: {action.reason}" if action.reason else ""
        decision = {"behavior": "deny", "message": message or "denied by a hook"}
        return {**out, **_specific(call, decision=decision)}
    return out  # Continue, or Override(Ask): Claude Code shows its dialog


#: What each refused event's answer is built on (the refusal reads only the context's kind).
_BLANK: dict[str, HookContext] = {
    "PreToolUse": PreToolUseContext(session_id="", tool_name=""),
    "PermissionRequest": PermissionRequestContext(session_id="", tool_name=""),
    "PostToolUse": PostToolUseContext(session_id="", tool_name="", output_content=""),
    "PostToolUseFailure": PostToolUseFailureContext(session_id="", tool_name="", error_message=""),
}


def event_named(body: bytes) -> str:
    """The Claude Code event a hook input that could not be read is for: its top-level
    ``hook_event_name`` (msgspec skips the rest, however large, deep or undecodable as text;
    nested past ~1 000 levels it is walked, up to ~1 s a megabyte: call it off the event loop).
    A body cut short or not JSON: the first such key, found without a parser (Claude Code
    writes it before ``tool_input`` and ``tool_response``, which the LLM writes and which may
    name another event). ``""`` when there is none."""
    head = decode_head(body, _Head)
    return head.hook_event_name if head is not None else event_name(body)


def refused(claude_event: str, why: str) -> dict[str, Any] | None:
    """Claude Code's answer to a hook call whose input no hook could inspect (too large, too
    deep, not JSON HookBus can read: ``why``), as for any agent (protocol.md 5.6): the tool
    call denied (PreToolUse, PermissionRequest), the tool's output withheld (PostToolUse),
    ``{}`` for the events that gate nothing; None if ``claude_event`` is not one HookBus knows.
    Claude Code takes every answer but a 2xx as a non-blocking error and runs the tool, so this
    is what the gateway answers, with 200. A PostToolUse also stops Claude (``continue: false``):
    the withheld text cannot replace a structured ``tool_response``, whose shape is unknown
    here."""
    event = EVENTS.get(claude_event)
    if event is None:
        return None
    result = refusal(event, why)
    ctx = _BLANK.get(claude_event)
    if ctx is None or result is None:
        return {}
    answer = to_claude_code(Call(claude_event, event, ctx), result)
    if event is HookEvent.POST_TOOL_USE:
        # The withheld text replaces a text tool_response only: Claude Code ignores it for a
        # structured one (Read's, Bash's) and would show the output unread. Unread, its shape is
        # unknown: Claude is stopped before the output reaches the model.
        answer = {"continue": False, "stopReason": f"HookBus: {why}; output withheld", **answer}
    return answer


def fail_closed(call: Call, reason: str) -> dict[str, Any] | None:
    """The answer when no decision could be reached for a call that gates a tool: deny
    (PreToolUse, PermissionRequest); ``None`` for the other events (nothing to fail closed)."""
    if call.event is HookEvent.PRE_TOOL_USE:
        return _specific(call, permissionDecision="deny", permissionDecisionReason=reason)
    if call.event is HookEvent.PERMISSION_REQUEST:
        return _specific(call, decision={"behavior": "deny", "message": reason})
    return None


# -- a HookBus context → the input of a Claude Code hook script, and its answer back ------------


def hook_input(
    event: HookEvent, ctx: HookContext, *, cwd: str, transcript_path: str = "", tool_use_id: str
) -> dict[str, Any]:
    """What a Claude Code hook script reads on stdin for ``event``: Claude Code's own input,
    unchanged, when the context came from Claude Code (``agent_input``); else made from the
    context, with the ``transcript_path`` and ``tool_use_id`` the caller supplies."""
    if (given := original_input(event, ctx)) is not None:
        return given
    base: dict[str, Any] = {
        "session_id": getattr(ctx, "session_id", "") or getattr(ctx, "parent_session_id", ""),
        "transcript_path": transcript_path,
        "cwd": cwd,
        "hook_event_name": CLAUDE_EVENTS[event],
    }
    if isinstance(ctx, PreToolUseContext | PermissionRequestContext):
        base.update(tool_name=ctx.tool_name, tool_input=ctx.tool_args)
        if isinstance(ctx, PreToolUseContext):
            base["tool_use_id"] = tool_use_id
        else:
            base["permission_mode"] = ctx.permission_mode
    elif isinstance(ctx, PostToolUseContext):
        response = ctx.output_value if ctx.structured else ctx.output_content
        base.update(
            tool_name=ctx.tool_name, tool_input=ctx.tool_args, tool_response=response,
            tool_use_id=tool_use_id, duration_ms=ctx.elapsed_ms,
        )  # fmt: skip
    elif isinstance(ctx, PostToolUseFailureContext):
        base.update(
            tool_name=ctx.tool_name, tool_input=ctx.tool_args, tool_use_id=tool_use_id,
            error=ctx.error_message, is_interrupt=ctx.is_interrupt, duration_ms=ctx.elapsed_ms,
        )  # fmt: skip
    elif isinstance(ctx, PermissionDeniedContext):
        base.update(
            tool_name=ctx.tool_name, tool_input={}, tool_use_id=tool_use_id, reason=ctx.reason
        )
    elif isinstance(ctx, SessionStartContext):
        base["source"] = "resume" if ctx.is_resume else "startup"
    elif isinstance(ctx, SessionStopContext):
        base["reason"] = "other"
    elif isinstance(ctx, StepCompleteContext):
        base["stop_hook_active"] = False
    elif isinstance(ctx, SubagentStartContext | SubagentStopContext):
        base.update(agent_id=ctx.subagent_name, agent_type=ctx.subagent_name)
        if isinstance(ctx, SubagentStopContext):
            base.update(
                stop_hook_active=False, agent_transcript_path="",
                last_assistant_message=ctx.result_summary,
            )  # fmt: skip
    elif isinstance(ctx, PreCompactContext):
        base.update(trigger="auto", custom_instructions=None)
    elif isinstance(ctx, PostCompactContext):
        trigger = ctx.compression_method if ctx.compression_method in ("manual", "auto") else "auto"
        base.update(trigger=trigger, compact_summary="")
    return base


def original_input(event: HookEvent, ctx: HookContext) -> dict[str, Any] | None:
    """Claude Code's hook input ``ctx`` was made from, as it came (``tool_input`` and
    ``tool_response`` put back from the context, where they travel), or None when ``ctx`` did
    not come from Claude Code's ``event``."""
    given = ctx.agent_input
    if given is msgspec.UNSET or given.get("hook_event_name") != CLAUDE_EVENTS[event]:
        return None
    whole = dict(given)
    if "tool_input" not in whole and isinstance(ctx, _WITH_ARGS):
        whole["tool_input"] = ctx.tool_args
    if "tool_response" not in whole and isinstance(ctx, PostToolUseContext):
        whole["tool_response"] = ctx.output_value if ctx.structured else ctx.output_content
    return whole


_WITH_ARGS = (
    PreToolUseContext, PostToolUseContext, PostToolUseFailureContext, PermissionRequestContext
)  # fmt: skip


class CommandFailed(RuntimeError):
    """The script failed without blocking (an exit status other than 0 and 2): as in Claude
    Code, a non-blocking error; HookBus skips the hook under its failure policy."""


def from_command(event: HookEvent, ctx: HookContext, status: int, stdout: str, stderr: str) -> Any:
    """What a Claude Code hook script did (exit status, stdout, stderr) as a HookBus answer.

    Exit 2 blocks, with stderr as the reason; exit 0 with a JSON object on stdout is read as
    Claude Code reads it; other exit statuses raise CommandFailed. Events whose HookBus hooks
    cannot answer get ``None`` whatever the script said (what it said is logged).
    """
    reason = stderr.strip()
    if status == 2:
        return _blocked(event, ctx, reason or "blocked by the hook command (exit 2)")
    if status != 0:
        raise CommandFailed(f"the hook command exited with {status}: {reason[:500]}")
    text = stdout.strip()
    if not text.startswith("{"):
        return _quiet(event, CONTINUE)  # plain text is shown only in Claude Code's transcript
    try:
        limits.check(text.encode(), "the hook command's output")
        answer = json.loads(text)
    except (ValueError, RecursionError) as exc:  # LimitError is a ValueError too
        raise CommandFailed(f"the hook command printed invalid JSON: {exc}") from exc
    if not isinstance(answer, dict):
        raise CommandFailed("the hook command printed JSON that is not an object")
    return _read_output(event, ctx, answer)


def _quiet(event: HookEvent, action: Any) -> Any:
    return action if event in _ANSWERING else None


_ANSWERING = frozenset(
    {
        HookEvent.PRE_TOOL_USE,
        HookEvent.POST_TOOL_USE,
        HookEvent.POST_TOOL_USE_FAILURE,
        HookEvent.PERMISSION_REQUEST,
    }
)


def _blocked(event: HookEvent, ctx: HookContext, reason: str) -> Any:
    if event is HookEvent.PRE_TOOL_USE:
        return Block(reason=reason)
    if event is HookEvent.PERMISSION_REQUEST:
        return Override(decision=PermissionDecision.DENY, reason=reason)
    if event in (HookEvent.POST_TOOL_USE, HookEvent.POST_TOOL_USE_FAILURE):
        return Warn(message=reason)  # the tool already ran: Claude Code tells Claude the reason
    log.info("%s: the hook command blocked (%s); nothing to block at this event", event, reason)
    return None


def _read_output(event: HookEvent, ctx: HookContext, answer: dict[str, Any]) -> Any:
    specific = answer.get("hookSpecificOutput")
    specific = specific if isinstance(specific, dict) else {}
    if answer.get("continue") is False:
        return _blocked(event, ctx, str(answer.get("stopReason") or "the hook command stopped"))
    if answer.get("decision") == "block":
        return _blocked(event, ctx, str(answer.get("reason") or "blocked by the hook command"))
    context = specific.get("additionalContext")
    context = str(context) if context else None
    if isinstance(ctx, PreToolUseContext):
        decision = specific.get("permissionDecision")
        reason = str(specific.get("permissionDecisionReason") or "")
        if decision == "deny":
            return Block(reason=reason or "denied by the hook command")
        updated = specific.get("updatedInput")
        if decision == "ask":
            return PermissionRequired(permission=reason or "ask", tool_name=ctx.tool_name)
        if isinstance(updated, dict) or context:  # allow: HookBus cannot approve; it rewrites
            args = updated if isinstance(updated, dict) else ctx.tool_args
            return MutateInput(updated_args=args, additional_context=context)
        return CONTINUE
    if isinstance(ctx, PostToolUseContext | PostToolUseFailureContext):
        original = ctx.output_content if isinstance(ctx, PostToolUseContext) else ctx.error_message
        replaced = specific.get("updatedToolOutput", specific.get("updatedMCPToolOutput"))
        if replaced is None and context:
            return MutateOutput(updated_content=original, additional_context=context)
        if replaced is not None:
            # a structured response rewritten as a value: kept as its JSON (the shape is
            # checked against the original when the hook's answer arrives); text as text
            return MutateOutput(updated_content=as_text(replaced), additional_context=context)
        return CONTINUE
    if isinstance(ctx, PermissionRequestContext):
        decision = specific.get("decision")
        behavior = decision.get("behavior") if isinstance(decision, dict) else None
        if behavior == "allow":
            return Override(decision=PermissionDecision.ALLOW)
        if behavior == "deny":
            message = str(decision.get("message") or "") if isinstance(decision, dict) else ""
            return Override(decision=PermissionDecision.DENY, reason=message)
        return CONTINUE
    return None


__all__ = [
    "CLAUDE_EVENTS",
    "EVENTS",
    "Call",
    "CommandFailed",
    "event_named",
    "fail_closed",
    "from_command",
    "hook_input",
    "original_input",
    "refused",
    "to_claude_code",
    "to_hookbus",
]
