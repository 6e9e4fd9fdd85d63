"""The example hooks of ``hookbus demo``: one of each kind of intervention.

Each has a no-argument constructor, so any of them can also run as a hook service:
``hookbus worker workers.builtins.demo_hooks:SecretGuard``.
"""

from __future__ import annotations

import logging
import re

from bus import (
    CONTINUE,
    AgentHook,
    AsyncAgentHook,
    Block,
    HookContext,
    HookEvent,
    InjectContext,
    MutateInput,
    MutateOutput,
    Override,
    PermissionDecision,
    PermissionDeniedContext,
    PermissionRequestAction,
    PermissionRequestContext,
    PostToolUseAction,
    PostToolUseContext,
    PostToolUseFailureContext,
    PreToolUseAction,
    PreToolUseContext,
    SessionStopContext,
    ToolMatchFilter,
    Warn,
)
from workers.builtins.redaction import within_strings

log = logging.getLogger("hookbus.demo")
#: An API key's value: up to a space, a line's end, a quote or a backslash (JSON's escapes).
SECRET = re.compile(r"(API_KEY=)[^\s\"'\\]+")


class SecretGuard(AgentHook):
    """Blocks reading or writing ``.env`` files: the reference runtime's ``file_*`` tools (argument
    ``path``) and Claude Code's ``Read``, ``Write``, ``Edit`` and ``MultiEdit`` (``file_path``)."""

    subscribed_events = (HookEvent.PRE_TOOL_USE,)
    match_filter = ToolMatchFilter.parse(
        ["file_*", "Read", "Write", "Edit", "MultiEdit"], ["path:.env", "file_path:.env"]
    )
    failure_policy = "fail"

    async def pre_tool_use(self, ctx: PreToolUseContext) -> PreToolUseAction:
        return Block(reason=f".env files hold secrets; {ctx.tool_name} on them is not allowed")


class NotesFolder(AgentHook):
    """Moves every file the agent writes under ``notes/``."""

    subscribed_events = (HookEvent.PRE_TOOL_USE,)
    match_filter = ToolMatchFilter.exact("file_write")

    async def pre_tool_use(self, ctx: PreToolUseContext) -> PreToolUseAction:
        path = str(ctx.tool_args.get("path", ""))
        if path.startswith("notes/"):
            return CONTINUE
        return MutateInput(
            updated_args={**ctx.tool_args, "path": f"notes/{path}"},
            additional_context=f"file writes are kept under notes/: {path} became notes/{path}",
        )


def _redact(text: str) -> str:
    return SECRET.sub(r"\1[redacted]", text)


class Redactor(AgentHook):
    """Redacts API keys from tool output: only the key's value, the rest of the line and the
    other lines kept. A structured output (Claude Code's Read and Bash give objects) is redacted
    within its strings and given back in the same shape."""

    subscribed_events = (HookEvent.POST_TOOL_USE,)

    async def post_tool_use(self, ctx: PostToolUseContext) -> PostToolUseAction:
        if not SECRET.search(ctx.output_content):
            return CONTINUE
        why = f"a secret was redacted from the output of {ctx.tool_name}"
        if ctx.structured:
            return MutateOutput.of_value(within_strings(ctx.output_value, _redact), why)
        return MutateOutput(updated_content=_redact(ctx.output_content), additional_context=why)


class LongOutputWarning(AgentHook):
    """Warns about long output and asks for it to be truncated (text only: a structured output,
    such as Claude Code's Read's object, is only warned about)."""

    subscribed_events = (HookEvent.POST_TOOL_USE,)
    limit = 300

    async def post_tool_use(self, ctx: PostToolUseContext) -> PostToolUseAction:
        if len(ctx.output_content) <= self.limit:
            return CONTINUE
        said = f"{ctx.tool_name} returned {len(ctx.output_content)} characters"
        if ctx.structured:  # cutting its JSON text would lose its shape (and so all of it)
            return Warn(message=said)
        return Warn(message=f"{said}; truncated", truncate_output=True)


class ShellPolicy(AgentHook):
    """Lets read-only shell commands through without asking a person (the reference runtime's
    ``run_shell`` and Claude Code's ``Bash``)."""

    subscribed_events = (HookEvent.PERMISSION_REQUEST,)

    async def on_permission_request(self, ctx: PermissionRequestContext) -> PermissionRequestAction:
        if ctx.tool_name not in ("run_shell", "Bash"):
            return CONTINUE
        command = str(ctx.tool_args.get("command", ""))
        if command.split()[:1] in (["ls"], ["echo"]):
            return Override(decision=PermissionDecision.ALLOW, reason="read-only shell command")
        return InjectContext(context="shell commands other than ls and echo need a person")


class FailureAdvisor(AgentHook):
    """Turns a failed tool's error into advice."""

    subscribed_events = (HookEvent.POST_TOOL_USE_FAILURE,)

    async def on_post_tool_use_failure(self, ctx: PostToolUseFailureContext) -> PostToolUseAction:
        return MutateOutput(
            updated_content=f"{ctx.tool_name} failed: {ctx.error_message}. "
            "Try search_corpus to find what you need.",
        )


class DenialAlarm(AgentHook):
    """Logs every denied tool call (PermissionDenied is fire-and-forget)."""

    subscribed_events = (HookEvent.PERMISSION_DENIED,)

    async def on_permission_denied(self, ctx: PermissionDeniedContext) -> None:
        log.info("denied %s (%s): %s", ctx.tool_name, ctx.source.value, ctx.reason)


class EventCounter(AsyncAgentHook):
    """Counts every event it sees, in the background."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}

    def _count(self, event: HookEvent, ctx: HookContext) -> None:
        self.counts[event.value] = self.counts.get(event.value, 0) + 1

    async def on_post_tool_use_async(self, ctx: PostToolUseContext) -> None:
        self._count(HookEvent.POST_TOOL_USE, ctx)

    async def on_post_tool_use_failure_async(self, ctx: PostToolUseFailureContext) -> None:
        self._count(HookEvent.POST_TOOL_USE_FAILURE, ctx)

    async def on_session_stop_async(self, ctx: SessionStopContext) -> None:
        self._count(HookEvent.ON_SESSION_STOP, ctx)


DEMO_HOOKS: tuple[type[AgentHook], ...] = (
    SecretGuard,
    NotesFolder,
    Redactor,
    LongOutputWarning,
    ShellPolicy,
    FailureAdvisor,
    DenialAlarm,
)
