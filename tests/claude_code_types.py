"""Claude Code's hook types for the tests: the JSON Schemas made from
``@anthropic-ai/claude-agent-sdk``'s declarations (``examples/claude-code/schemas``), and one
input per event with a HookBus counterpart, each checked against them."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

from jsonschema import Draft7Validator

ROOT = Path(__file__).resolve().parent.parent
SCHEMAS = ROOT / "examples" / "claude-code" / "schemas"


@cache
def _validator(name: str) -> Draft7Validator:
    schema = json.loads((SCHEMAS / f"{name}.json").read_text())
    Draft7Validator.check_schema(schema)
    return Draft7Validator(schema)


def problems(name: str, message: Any) -> list[str]:
    """What makes ``message`` not a valid ``name`` (HookInput or SyncHookJSONOutput)."""
    errors = sorted(_validator(name).iter_errors(message), key=lambda e: list(e.path))
    found = [f"{'/'.join(map(str, e.path)) or '$'}: {e.message}" for e in errors]
    # anyOf failures say little: add the branch with this message's event, if there is one
    event = message.get("hook_event_name") if isinstance(message, dict) else None
    if found and event:
        branch = _validator(name).schema["definitions"].get(f"{event}HookInput")
        if branch is not None:
            found += [e.message for e in Draft7Validator(branch).iter_errors(message)]
    return found


def check_input(message: Any) -> None:
    assert not problems("HookInput", message), problems("HookInput", message)


def check_output(message: Any) -> None:
    assert not problems("SyncHookJSONOutput", message), problems("SyncHookJSONOutput", message)


def claude_events() -> list[str]:
    """Every hook event the SDK declares (``hook_event_name`` of each ``HookInput`` branch)."""
    definitions = _validator("HookInput").schema["definitions"]
    names = []
    for branch in definitions["HookInput"]["anyOf"]:
        definition = definitions[branch["$ref"].rsplit("/", 1)[1]]
        names.append(definition["properties"]["hook_event_name"]["const"])
    return names


BASE = {"session_id": "cc-7f3a", "transcript_path": "/tmp/cc-7f3a.jsonl", "cwd": "/work/app"}

#: One input per Claude Code event that has a HookBus counterpart, as Claude Code sends it.
INPUTS: dict[str, dict[str, Any]] = {
    "SessionStart": {**BASE, "hook_event_name": "SessionStart", "source": "resume"},
    "PreToolUse": {
        **BASE, "hook_event_name": "PreToolUse", "permission_mode": "default",
        "tool_name": "Read", "tool_input": {"file_path": "/work/app/.env"},
        "tool_use_id": "toolu_01",
    },
    "PostToolUse": {
        **BASE, "hook_event_name": "PostToolUse", "tool_name": "Bash",
        "tool_input": {"command": "env"}, "tool_response": "API_KEY=abc123 HOME=/root",
        "tool_use_id": "toolu_02", "duration_ms": 12,
    },
    "PostToolUseFailure": {
        **BASE, "hook_event_name": "PostToolUseFailure", "tool_name": "Bash",
        "tool_input": {"command": "make"}, "tool_use_id": "toolu_03",
        "error": "make: *** No targets.  Stop.", "is_interrupt": False,
    },
    "PermissionRequest": {
        **BASE, "hook_event_name": "PermissionRequest", "permission_mode": "default",
        "tool_name": "Bash", "tool_input": {"command": "ls -la"},
    },
    "PermissionDenied": {
        **BASE, "hook_event_name": "PermissionDenied", "tool_name": "Bash",
        "tool_input": {"command": "rm -rf /"}, "tool_use_id": "toolu_04",
        "reason": "destructive command",
    },
    "Stop": {**BASE, "hook_event_name": "Stop", "stop_hook_active": False},
    "SessionEnd": {**BASE, "hook_event_name": "SessionEnd", "reason": "logout"},
    "SubagentStart": {
        **BASE, "hook_event_name": "SubagentStart", "agent_id": "ag-1",
        "agent_type": "code-reviewer",
    },
    "SubagentStop": {
        **BASE, "hook_event_name": "SubagentStop", "stop_hook_active": False, "agent_id": "ag-1",
        "agent_transcript_path": "/tmp/ag-1.jsonl", "agent_type": "code-reviewer",
        "last_assistant_message": "two issues found",
    },
    "PreCompact": {
        **BASE, "hook_event_name": "PreCompact", "trigger": "auto", "custom_instructions": None,
    },
    "PostCompact": {
        **BASE, "hook_event_name": "PostCompact", "trigger": "manual",
        "compact_summary": "the conversation so far",
    },
}  # fmt: skip


def pre_tool_use(tool_name: str, tool_input: Any, session: str = "cc-7f3a") -> dict[str, Any]:
    """A PreToolUse input for ``tool_name``."""
    return {**INPUTS["PreToolUse"], "session_id": session, "tool_name": tool_name,
            "tool_input": tool_input}  # fmt: skip
