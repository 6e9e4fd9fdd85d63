"""The Claude Code mapping (workers/integrations/claude_code.py), against Claude Code's published
types.

Every input here is checked against ``HookInput`` and every output against
``SyncHookJSONOutput``, the JSON Schemas made from ``@anthropic-ai/claude-agent-sdk``'s
``sdk.d.ts``; the results come from real dispatches (an embedded ``HookRegistry``), so the
aggregation is HookBus's own.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from typing import Any

import pytest

from bus import (
    AgentHook,
    Block,
    HookEvent,
    HookRegistry,
    MutateInput,
    PermissionRequired,
    PreToolUseContext,
    ToolMatchFilter,
)
from bus.actions import CONTINUE, MutateOutput, Override, PreToolUseAction, Warn
from bus.errors import ProtocolError
from bus.events import (
    PermissionDecision,
    PermissionRequestContext,
    PostToolUseContext,
    PostToolUseFailureContext,
    SessionStopContext,
)
from tests.claude_code_types import (
    INPUTS,
    ROOT,
    check_input,
    check_output,
    claude_events,
    pre_tool_use,
)
from workers.builtins.demo_hooks import (
    FailureAdvisor,
    LongOutputWarning,
    Redactor,
    SecretGuard,
    ShellPolicy,
)
from workers.integrations import claude_code
from workers.integrations.claude_code import (
    CommandFailed,
    from_command,
    hook_input,
    to_claude_code,
    to_hookbus,
)

GENERATOR = ROOT / "examples" / "claude-code" / "generate-schemas.mjs"


def body(message: dict[str, Any]) -> bytes:
    check_input(message)
    return json.dumps(message).encode()


async def answer(registry: HookRegistry, message: dict[str, Any]) -> dict[str, Any]:
    """Claude Code's input → a real dispatch → Claude Code's output, both checked."""
    call = to_hookbus(body(message))
    assert call is not None
    result = await registry.run(call.event, call.ctx)
    output = to_claude_code(call, result)
    check_output(output)
    return output


def registry(*hooks: AgentHook) -> HookRegistry:
    r = HookRegistry()
    for hook in hooks:
        r.add(hook)
    return r


# -- the schemas are Claude Code's ----------------------------------------------------------


def test_the_committed_schemas_are_what_the_sdk_declares() -> None:
    node = shutil.which("node")
    if node is None:
        pytest.fail("node is not on PATH: the schema check needs Node.js >= 20")
    if not (ROOT / "examples/claude-code/node_modules/@anthropic-ai/claude-agent-sdk").is_dir():
        pytest.fail("examples/claude-code/node_modules is missing: run `make node-deps`")
    proc = subprocess.run(
        [node, str(GENERATOR), "--check"], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_the_fixtures_are_valid_claude_code_inputs_and_invalid_ones_are_caught() -> None:
    for message in INPUTS.values():
        check_input(message)
    with pytest.raises(AssertionError):  # the schemas do reject: a field of the wrong type
        check_input({**INPUTS["PreToolUse"], "tool_name": 3})
    with pytest.raises(AssertionError):
        check_output({"hookSpecificOutput": {"hookEventName": "PreToolUse",
                                             "permissionDecision": "Deny"}})  # fmt: skip


def test_every_claude_code_event_is_mapped_or_documented_as_without_counterpart() -> None:
    events = claude_events()
    assert set(claude_code.EVENTS) <= set(events)
    assert len(set(claude_code.EVENTS.values())) == 12  # one Claude Code event per HookBus event
    doc = (ROOT / "docs" / "integrations.md").read_text()
    for name in events:
        row = re.search(rf"^\| `{name}` \| (.*)$", doc, re.M)
        assert row, f"docs/integrations.md's table lacks Claude Code's {name}"
        if name in claude_code.EVENTS:
            assert f"`{claude_code.EVENTS[name].value}`" in row.group(1), row.group(0)
        else:
            assert "no counterpart" in row.group(1), row.group(0)
            assert (
                to_hookbus(json.dumps({**INPUTS["Stop"], "hook_event_name": name}).encode()) is None
            )


# -- Claude Code → HookBus ------------------------------------------------------------------


def test_each_mapped_event_becomes_its_hookbus_context() -> None:
    contexts = {name: to_hookbus(body(message)) for name, message in INPUTS.items()}
    assert {n: c.event for n, c in contexts.items() if c} == claude_code.EVENTS
    pre = contexts["PreToolUse"]
    assert pre and pre.ctx == PreToolUseContext(
        session_id="cc-7f3a", tool_name="Read", tool_args={"file_path": "/work/app/.env"},
        agent_input={k: v for k, v in INPUTS["PreToolUse"].items() if k != "tool_input"},
    )  # fmt: skip
    post = contexts["PostToolUse"]
    assert post and isinstance(post.ctx, PostToolUseContext)
    assert (post.ctx.output_content, post.ctx.elapsed_ms) == ("API_KEY=abc123 HOME=/root", 12)
    failure = contexts["PostToolUseFailure"]
    assert failure and isinstance(failure.ctx, PostToolUseFailureContext)
    assert failure.ctx.error_message == "make: *** No targets.  Stop."
    permission = contexts["PermissionRequest"]
    assert permission and isinstance(permission.ctx, PermissionRequestContext)
    assert (permission.ctx.tool_args, permission.ctx.is_subagent) == ({"command": "ls -la"}, False)
    start = contexts["SessionStart"]
    assert start and start.ctx.is_resume is True  # type: ignore[union-attr]
    stop = contexts["SubagentStop"]
    assert stop and stop.ctx.result_summary == "two issues found"  # type: ignore[union-attr]
    assert stop.ctx.parent_session_id == "cc-7f3a"  # type: ignore[union-attr]


def test_a_structured_tool_response_becomes_json_text() -> None:
    message = {**INPUTS["PostToolUse"], "tool_response": {"stdout": "ok", "exit": 0}}
    call = to_hookbus(body(message))
    assert call and isinstance(call.ctx, PostToolUseContext)
    assert json.loads(call.ctx.output_content) == {"stdout": "ok", "exit": 0}


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        (b"{not json", ""),
        (b"[1, 2]", "$"),
        (b'{"session_id": "s"}', "$.hook_event_name"),
        (json.dumps({**INPUTS["PreToolUse"], "tool_name": 7}).encode(), "$.tool_name"),
        (json.dumps({k: v for k, v in INPUTS["PreToolUse"].items() if k != "tool_name"}).encode(),
         "$.tool_name"),
        (json.dumps({**INPUTS["PostToolUseFailure"], "error": None}).encode(), "$.error"),
        (b" " * (1_048_576 + 1), ""),
        (b'{"tool_input":' + b"[" * 100_000 + b"]" * 100_000 + b"}", ""),
    ],
    ids=["not-json", "not-object", "no-event", "wrong-type", "missing", "null", "too-big",
         "too-deep"],
)  # fmt: skip
def test_input_that_is_not_claude_codes_is_refused_naming_the_field(raw: bytes, field: str) -> None:
    with pytest.raises(ProtocolError) as caught:
        to_hookbus(raw)
    assert caught.value.field == field, caught.value


# -- HookBus → Claude Code ------------------------------------------------------------------


class Cancelled(AgentHook):
    """Answers as the cancellation hook does for a cancelled session."""

    name = claude_code.CANCELLATION_HOOK
    subscribed_events = (HookEvent.PRE_TOOL_USE,)

    async def pre_tool_use(self, ctx: PreToolUseContext) -> PreToolUseAction:
        return Block(reason=f"session {ctx.session_id} was cancelled by the user")


class Sandbox(AgentHook):
    """Rewrites Bash commands to run in a sandbox, with context."""

    subscribed_events = (HookEvent.PRE_TOOL_USE,)
    match_filter = ToolMatchFilter.exact("Bash")

    async def pre_tool_use(self, ctx: PreToolUseContext) -> PreToolUseAction:
        command = ctx.tool_args["command"]
        return MutateInput(
            updated_args={"command": f"sandbox -- {command}"}, additional_context="sandboxed"
        )


class NeedsNet(AgentHook):
    subscribed_events = (HookEvent.PRE_TOOL_USE,)

    async def pre_tool_use(self, ctx: PreToolUseContext) -> PreToolUseAction:
        return PermissionRequired(permission="net", tool_name=ctx.tool_name)


class Remark(AgentHook):
    """Adds context without changing anything."""

    subscribed_events = (HookEvent.PRE_TOOL_USE,)

    async def pre_tool_use(self, ctx: PreToolUseContext) -> PreToolUseAction:
        return MutateInput(updated_args=ctx.tool_args, additional_context="read-only repo")


async def test_secret_guard_denies_reading_env_in_claude_codes_format() -> None:
    out = await answer(registry(SecretGuard()), pre_tool_use("Read", {"file_path": "/a/.env"}))
    assert out == {
        "hookSpecificOutput": {
            "hookEventName": "PreToolUse",
            "permissionDecision": "deny",
            "permissionDecisionReason": "SecretGuard: .env files hold secrets; Read on them is "
            "not allowed",
        }
    }
    for tool, args in [("Write", {"file_path": ".env", "content": "x"}),
                       ("Edit", {"file_path": "/x/.env.local", "old_string": "a",
                                 "new_string": "b"})]:  # fmt: skip
        out = await answer(registry(SecretGuard()), pre_tool_use(tool, args))
        assert out["hookSpecificOutput"]["permissionDecision"] == "deny", (tool, out)
    # Other files, other tools: no opinion, Claude Code's own permissions decide.
    assert await answer(registry(SecretGuard()), pre_tool_use("Read", {"file_path": "a.py"})) == {}
    assert await answer(registry(SecretGuard()), pre_tool_use("Bash", {"command": "ls"})) == {}


async def test_a_cancelled_session_stops_claude() -> None:
    out = await answer(
        registry(Cancelled(), SecretGuard()), pre_tool_use("Bash", {"command": "ls"})
    )
    assert out["continue"] is False
    assert out["stopReason"] == "session cc-7f3a was cancelled by the user"
    assert out["hookSpecificOutput"]["permissionDecision"] == "deny"


async def test_a_rewrite_is_asked_about_with_the_updated_input() -> None:
    out = await answer(registry(Sandbox()), pre_tool_use("Bash", {"command": "rm -r build"}))
    specific = out["hookSpecificOutput"]
    assert specific["permissionDecision"] == "ask"
    assert specific["updatedInput"] == {"command": "sandbox -- rm -r build"}
    assert specific["additionalContext"] == "[Hook: Sandbox | PreToolUse] sandboxed"


async def test_context_without_a_change_is_only_context() -> None:
    out = await answer(registry(Remark()), pre_tool_use("Read", {"file_path": "a.py"}))
    assert out == {"hookSpecificOutput": {
        "hookEventName": "PreToolUse",
        "additionalContext": "[Hook: Remark | PreToolUse] read-only repo",
    }}  # fmt: skip


async def test_permission_required_asks() -> None:
    out = await answer(registry(NeedsNet(), Sandbox()), pre_tool_use("Bash", {"command": "curl"}))
    specific = out["hookSpecificOutput"]
    assert specific["permissionDecision"] == "ask"
    assert "'net'" in specific["permissionDecisionReason"]
    assert specific["updatedInput"] == {"command": "sandbox -- curl"}  # ask about final_args


async def test_post_tool_use_rewrites_the_output_and_tells_claude_of_warnings() -> None:
    warner = LongOutputWarning()
    warner.limit = 10
    out = await answer(registry(Redactor(), warner), INPUTS["PostToolUse"])
    specific = out["hookSpecificOutput"]
    assert specific["updatedToolOutput"] == "API_KEY=[redacted] HOME=/root"
    assert specific["additionalContext"] == (
        "[Hook: Redactor | PostToolUse] a secret was redacted from the output of Bash"
    )
    assert out["decision"] == "block"  # PostToolUse "block": Claude is told the reason
    assert out["reason"] == "Bash returned 25 characters; truncated"
    # Nothing to say: nothing said.
    quiet = {**INPUTS["PostToolUse"], "tool_response": "fine"}
    assert await answer(registry(Redactor()), quiet) == {}


async def test_a_failure_rewrite_becomes_context() -> None:
    out = await answer(registry(FailureAdvisor()), INPUTS["PostToolUseFailure"])
    assert out["hookSpecificOutput"]["additionalContext"] == (
        "Bash failed: make: *** No targets.  Stop.. Try search_corpus to find what you need."
    )


async def test_permission_request_overrides() -> None:
    out = await answer(registry(ShellPolicy()), INPUTS["PermissionRequest"])
    assert out == {"hookSpecificOutput": {"hookEventName": "PermissionRequest",
                                          "decision": {"behavior": "allow"}}}  # fmt: skip

    class NoShell(AgentHook):
        subscribed_events = (HookEvent.PERMISSION_REQUEST,)

        async def on_permission_request(self, ctx: PermissionRequestContext) -> Any:
            return Override(decision=PermissionDecision.DENY, reason="no shell today")

    out = await answer(registry(NoShell()), INPUTS["PermissionRequest"])
    assert out["hookSpecificOutput"]["decision"] == {
        "behavior": "deny", "message": "NoShell: no shell today"}  # fmt: skip
    # InjectContext has no field for Claude at this event: the person sees it.
    other = {**INPUTS["PermissionRequest"], "tool_input": {"command": "make"}}
    out = await answer(registry(ShellPolicy()), other)
    assert out == {"systemMessage": "[Hook: ShellPolicy | PermissionRequest] shell commands other "
                   "than ls and echo need a person"}  # fmt: skip


async def test_events_without_answers_get_an_empty_output() -> None:
    for name in ("SessionStart", "SessionEnd", "Stop", "SubagentStart", "SubagentStop",
                 "PreCompact", "PostCompact", "PermissionDenied"):  # fmt: skip
        assert await answer(registry(SecretGuard()), INPUTS[name]) == {}, name


def test_fail_closed_denies_only_where_a_tool_waits() -> None:
    denied = {"behavior": "deny", "message": "no decision"}
    for name, expected in [
        ("PreToolUse", {"permissionDecision": "deny", "permissionDecisionReason": "no decision"}),
        ("PermissionRequest", {"decision": denied}),
    ]:
        call = to_hookbus(body(INPUTS[name]))
        assert call is not None
        out = claude_code.fail_closed(call, "no decision")
        assert out == {"hookSpecificOutput": {"hookEventName": name, **expected}}
        check_output(out)
    call = to_hookbus(body(INPUTS["PostToolUse"]))
    assert call is not None and claude_code.fail_closed(call, "x") is None


# -- a Claude Code hook script's answer → HookBus --------------------------------------------


def test_every_hookbus_context_becomes_a_valid_script_input() -> None:
    for name, message in INPUTS.items():
        call = to_hookbus(body(message))
        assert call is not None
        given = hook_input(call.event, call.ctx, cwd="/work/app", tool_use_id="hookbus-1")
        check_input(given)
        assert given["hook_event_name"] == name
        assert to_hookbus(json.dumps(given).encode()) == call, name  # round trip


PRE = PreToolUseContext(session_id="s", tool_name="Bash", tool_args={"command": "ls"})
POST = PostToolUseContext(session_id="s", tool_name="Bash", output_content="out")


@pytest.mark.parametrize(
    ("status", "stdout", "stderr", "expected"),
    [
        (2, "", "no rm please\n", Block(reason="no rm please")),
        (0, "", "", CONTINUE),
        (0, "looks fine", "", CONTINUE),
        (0, '{"hookSpecificOutput": {"hookEventName": "PreToolUse", "permissionDecision": "deny",'
            ' "permissionDecisionReason": "nope"}}', "", Block(reason="nope")),
        (0, '{"hookSpecificOutput": {"hookEventName": "PreToolUse", "permissionDecision": "ask",'
            ' "permissionDecisionReason": "sure?"}}', "",
         PermissionRequired(permission="sure?", tool_name="Bash")),
        (0, '{"hookSpecificOutput": {"hookEventName": "PreToolUse", "permissionDecision": "allow",'
            ' "updatedInput": {"command": "ls -a"}}}', "",
         MutateInput(updated_args={"command": "ls -a"})),
        (0, '{"hookSpecificOutput": {"hookEventName": "PreToolUse",'
            ' "permissionDecision": "allow"}}', "", CONTINUE),
        (0, '{"continue": false, "stopReason": "enough"}', "", Block(reason="enough")),
        (0, '{"decision": "block", "reason": "old style"}', "", Block(reason="old style")),
    ],
    ids=["exit2", "silent", "text", "deny", "ask", "rewrite", "allow", "stop", "legacy-block"],
)  # fmt: skip
def test_script_answers_to_pre_tool_use(
    status: int, stdout: str, stderr: str, expected: Any
) -> None:
    assert from_command(HookEvent.PRE_TOOL_USE, PRE, status, stdout, stderr) == expected


def test_script_answers_to_other_events() -> None:
    post = HookEvent.POST_TOOL_USE
    assert from_command(post, POST, 2, "", "bad output") == Warn(message="bad output")
    rewrite = (
        '{"hookSpecificOutput": {"hookEventName": "PostToolUse", "updatedToolOutput": "x",'
        ' "additionalContext": "cut"}}'
    )
    assert from_command(post, POST, 0, rewrite, "") == MutateOutput(
        updated_content="x", additional_context="cut")  # fmt: skip
    permission = PermissionRequestContext(session_id="s", tool_name="Bash")
    allow = (
        '{"hookSpecificOutput": {"hookEventName": "PermissionRequest", '
        '"decision": {"behavior": "allow"}}}'
    )
    assert from_command(HookEvent.PERMISSION_REQUEST, permission, 0, allow, "") == Override(
        decision=PermissionDecision.ALLOW)  # fmt: skip
    assert from_command(HookEvent.PERMISSION_REQUEST, permission, 2, "", "no") == Override(
        decision=PermissionDecision.DENY, reason="no")  # fmt: skip
    stop = SessionStopContext(session_id="s")
    assert from_command(HookEvent.ON_SESSION_STOP, stop, 2, "", "ignored") is None
    assert from_command(HookEvent.ON_SESSION_STOP, stop, 0, "{}", "") is None


@pytest.mark.parametrize(("status", "stdout"), [(1, ""), (127, ""), (0, "{oops"), (0, "{]")])
def test_script_failures_are_not_answers(status: int, stdout: str) -> None:
    with pytest.raises(CommandFailed):
        from_command(HookEvent.PRE_TOOL_USE, PRE, status, stdout, "boom")
