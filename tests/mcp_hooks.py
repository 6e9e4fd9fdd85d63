"""Hooks for tests/test_mcp_proxy.py, over the MCP filesystem server's tools as ``hookbus mcp``
(and Claude Code) name MCP tools, ``mcp__SERVER__tool``."""

from __future__ import annotations

from pathlib import Path

from bus import (
    CONTINUE,
    AgentHook,
    HookEvent,
    MutateInput,
    MutateOutput,
    PermissionRequired,
    PostToolUseAction,
    PostToolUseContext,
    PreToolUseAction,
    PreToolUseContext,
    ToolMatchFilter,
)


class McpNotesFolder(AgentHook):
    """Moves every file the filesystem server's write_file writes into ``notes/`` (MutateInput),
    and asks permission for move_file (PermissionRequired: no hook nor person allows it)."""

    subscribed_events = (HookEvent.PRE_TOOL_USE,)
    match_filter = ToolMatchFilter.parse(
        ["mcp__filesystem__write_file", "mcp__filesystem__move_file"]
    )

    async def pre_tool_use(self, ctx: PreToolUseContext) -> PreToolUseAction:
        if ctx.tool_name.endswith("move_file"):
            return PermissionRequired(permission="move files", tool_name=ctx.tool_name)
        path = Path(str(ctx.tool_args["path"]))
        if path.parent.name == "notes":
            return CONTINUE
        moved = str(path.parent / "notes" / path.name)
        return MutateInput(
            updated_args={**ctx.tool_args, "path": moved},
            additional_context=f"file writes are kept under notes/: {path} became {moved}",
        )


class TextOnlyRedactor(AgentHook):
    """A redactor that replaces any output holding a key with a text, whatever its shape (a
    structured output included): the proxy cannot put that back in structuredContent."""

    subscribed_events = (HookEvent.POST_TOOL_USE,)

    async def post_tool_use(self, ctx: PostToolUseContext) -> PostToolUseAction:
        if "sk-live" not in ctx.output_content:
            return CONTINUE
        return MutateOutput(updated_content="[a file with a key: contents hidden]")
