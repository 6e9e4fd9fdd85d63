"""Claude Code's structured tool output, kept structured both ways (issue 30, item 5).

Claude Code 2.1.332 applies ``updatedToolOutput`` only when it has ``tool_response``'s shape
(docs/integrations.md); its Read and Bash answer objects. Hooks see that object
(``PostToolUseContext.output_value``), a rewrite goes back in its shape, and a rewrite of
another shape is refused (the hook fails, named) instead of being passed on to be ignored.
CommandHook hands a Claude Code script the input Claude Code sent, unchanged.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from bus import AgentHook, HookEvent, HookRegistry
from bus.actions import MutateOutput, PostToolUseAction, PostToolUseResult, Warn, shape_mismatch
from bus.events import PostToolUseContext
from bus.settings import BusSettings, HookSettings
from tests.claude_code_types import INPUTS, ROOT, check_input, check_output, pre_tool_use
from tests.harness import Processes
from tests.remote_hooks import HookConfig
from tests.test_gateway import live, start_gateway
from workers.builtins.demo_hooks import LongOutputWarning, Redactor
from workers.integrations.claude_code import (
    WITHHELD_TEXT,
    original_input,
    to_claude_code,
    to_hookbus,
)
from workers.integrations.command_hook import CommandHook

SECRET = "sk-live-4f9a2b7c1d8e"
FILE = f"# settings\nREGION=eu-west-1\nAPI_KEY={SECRET}\nDEBUG=false\n"
READ: dict[str, Any] = {
    **INPUTS["PostToolUse"], "tool_name": "Read", "tool_input": {"file_path": "/work/app/cfg"},
    "tool_response": {
        "type": "text",
        "file": {"filePath": "/work/app/cfg", "content": FILE, "numLines": 4, "startLine": 1,
                 "totalLines": 4},
    },
}  # fmt: skip
BASH: dict[str, Any] = {
    **INPUTS["PostToolUse"], "tool_input": {"command": "cat cfg", "description": "show cfg"},
    "tool_response": {"stdout": FILE.rstrip("\n"), "stderr": "", "interrupted": False,
                      "isImage": False},
}  # fmt: skip


def registry(*hooks: AgentHook) -> HookRegistry:
    r = HookRegistry(HookSettings(hook_timeout_secs=10))
    for h in hooks:
        r.add(h)
    return r


async def dispatch(r: HookRegistry, message: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    check_input(message)
    call = to_hookbus(json.dumps(message).encode())
    assert call is not None
    result = await r.run(call.event, call.ctx)
    out = to_claude_code(call, result)
    check_output(out)
    return result, out


def strings(value: Any) -> str:
    return json.dumps(value)


@pytest.mark.parametrize("message", [READ, BASH], ids=["Read", "Bash"])
def test_hooks_get_the_tool_response_as_claude_code_sent_it(message: dict[str, Any]) -> None:
    call = to_hookbus(json.dumps(message).encode())
    assert call and isinstance(call.ctx, PostToolUseContext)
    assert call.ctx.structured and call.ctx.output_value == message["tool_response"]
    assert json.loads(call.ctx.output_content) == message["tool_response"]  # text, as before


@pytest.mark.parametrize("message", [READ, BASH], ids=["Read", "Bash"])
async def test_the_demo_redactor_keeps_the_shape_and_the_other_lines(
    message: dict[str, Any],
) -> None:
    _, out = await dispatch(registry(Redactor()), message)
    updated = out["hookSpecificOutput"]["updatedToolOutput"]
    original = message["tool_response"]
    assert isinstance(updated, dict) and updated.keys() == original.keys()
    text = updated["file"]["content"] if "file" in updated else updated["stdout"]
    assert SECRET not in strings(updated)
    assert text.splitlines() == [
        "# settings", "REGION=eu-west-1", "API_KEY=[redacted]", "DEBUG=false"
    ]  # fmt: skip
    assert {k: v for k, v in updated.items() if k not in ("file", "stdout")} == {
        k: v for k, v in original.items() if k not in ("file", "stdout")
    }


class TextRedactor(AgentHook):
    """Rewrites the output as text, as hooks written for text do."""

    name = "text-redactor"
    subscribed_events = (HookEvent.POST_TOOL_USE,)

    async def post_tool_use(self, ctx: PostToolUseContext) -> PostToolUseAction:
        return MutateOutput(updated_content=ctx.output_content.replace(SECRET, "x")[:40])


class KeyDropper(AgentHook):
    """Rewrites a structured output as a value of another shape (a key left out)."""

    name = "key-dropper"
    subscribed_events = (HookEvent.POST_TOOL_USE,)

    async def post_tool_use(self, ctx: PostToolUseContext) -> PostToolUseAction:
        assert isinstance(ctx.output_value, dict)
        return MutateOutput.of_value({k: v for k, v in ctx.output_value.items() if k != "type"})


class Retyper(AgentHook):
    """Rewrites a structured output keeping its keys but not its tag (``type``)."""

    name = "retyper"
    subscribed_events = (HookEvent.POST_TOOL_USE,)

    async def post_tool_use(self, ctx: PostToolUseContext) -> PostToolUseAction:
        assert isinstance(ctx.output_value, dict)
        return MutateOutput.of_value({**ctx.output_value, "type": "redacted"})


@pytest.mark.parametrize(
    ("hook", "why"),
    [(TextRedactor(), "MutateOutput gave text for Read's structured output (object)"),
     (Retyper(), "MutateOutput changed the shape of Read's structured output ($.type is "
                 "'redacted', the original is 'text')"),
     (KeyDropper(), "MutateOutput changed the shape of Read's structured output ($ has other "
                    "keys than the original (missing ['type'], added [])")],
    ids=["text", "other-type", "other-keys"],
)  # fmt: skip
async def test_a_rewrite_of_another_shape_is_the_hooks_failure_never_passed_on(
    hook: AgentHook, why: str
) -> None:
    result, out = await dispatch(registry(hook), READ)
    assert isinstance(result, PostToolUseResult)
    [skipped] = result.skipped
    assert (skipped.hook_name, skipped.kind) == (hook.name, "error")
    assert skipped.detail.startswith(why), skipped.detail
    assert "updatedToolOutput" not in json.dumps(out)  # nothing Claude Code would ignore


async def test_output_that_lost_its_shape_after_the_hooks_is_withheld_in_its_shape() -> None:
    """A Warning that truncates cuts the JSON text: Claude Code gets every string withheld."""

    class Long(AgentHook):
        subscribed_events = (HookEvent.POST_TOOL_USE,)

        async def post_tool_use(self, ctx: PostToolUseContext) -> PostToolUseAction:
            return Warn(message="too long", truncate_output=True)

    r = HookRegistry(HookSettings(hook_timeout_secs=10, truncate_chars=30))
    r.add(Long())
    _, out = await dispatch(r, READ)
    updated = out["hookSpecificOutput"]["updatedToolOutput"]
    assert updated["file"]["content"] == WITHHELD_TEXT and updated["file"]["numLines"] == 4
    assert SECRET not in json.dumps(out) and out["decision"] == "block"
    assert "no longer had the shape" in out["reason"] and out["continue"] is False


@pytest.mark.parametrize("name", [*INPUTS, "Read"])
def test_claude_codes_own_input_travels_with_the_context_unchanged(name: str) -> None:
    message = READ if name == "Read" else INPUTS[name]
    call = to_hookbus(json.dumps(message).encode())
    if call is None:
        pytest.fail(f"{name} has no counterpart")  # INPUTS holds only mapped events
    assert original_input(call.event, call.ctx) == message


@pytest.fixture
def jq() -> str:
    found = shutil.which("jq")
    if found is None:
        pytest.fail("jq is not on PATH: the Claude Code hook scripts here use it (apt install jq)")
    return found


@pytest.mark.parametrize("name", ["Read", "Bash", "Stop", "PermissionRequest", "SubagentStop"])
async def test_command_hook_gives_the_script_claude_codes_input_unchanged(
    name: str, tmp_path: Path, jq: str
) -> None:
    message = {"Read": READ, "Bash": BASH}.get(name) or INPUTS[name]
    if name == "Stop":
        message = {**message, "last_assistant_message": "done: API_KEY rotated"}
    seen = tmp_path / "stdin.json"
    event = message["hook_event_name"]
    hook = CommandHook(
        {**os.environ, "HOOKBUS_COMMAND": f"cat > {seen}", "HOOKBUS_COMMAND_EVENTS": event}
    )
    call = to_hookbus(json.dumps(message).encode())
    assert call is not None
    # the context as the gateway hands it on: the session id qualified by the tenant
    from workers.services.coordinator_service import qualify

    await registry(hook).run(call.event, qualify(call.ctx, "claude-code"))
    assert json.loads(seen.read_text()) == message


#: A Claude Code hook script that redacts within tool_response's strings, keeping its shape.
REDACT_BY_SHAPE = str(ROOT / "examples" / "claude-code" / "hooks" / "redact-secrets.sh")


@pytest.mark.parametrize("message", [READ, BASH], ids=["Read", "Bash"])
async def test_a_script_that_redacts_by_shape_works_behind_command_hook(
    message: dict[str, Any], jq: str
) -> None:
    hook = CommandHook(
        {**os.environ, "HOOKBUS_COMMAND": REDACT_BY_SHAPE, "HOOKBUS_COMMAND_EVENTS": "PostToolUse"}
    )
    result, out = await dispatch(registry(hook), message)
    assert not result.skipped, result.skipped
    updated = out["hookSpecificOutput"]["updatedToolOutput"]
    assert updated.keys() == message["tool_response"].keys()
    assert SECRET not in json.dumps(out) and "DEBUG=false" in json.dumps(updated)


async def test_a_script_that_answers_text_for_a_structured_output_fails_by_name(jq: str) -> None:
    command = (
        'echo \'{"hookSpecificOutput": {"hookEventName": "PostToolUse",'
        ' "updatedToolOutput": "[redacted]"}}\''
    )
    hook = CommandHook(
        {**os.environ, "HOOKBUS_COMMAND": command, "HOOKBUS_COMMAND_EVENTS": "PostToolUse",
         "HOOKBUS_COMMAND_NAME": "text-script"}
    )  # fmt: skip
    result, out = await dispatch(registry(hook), READ)
    [skipped] = result.skipped
    assert skipped.hook_name == "text-script" and "structured output" in skipped.detail
    assert "updatedToolOutput" not in json.dumps(out)


def doc_example() -> type[AgentHook]:
    """docs/integrations.md's ReadGuard, exactly as the page shows it."""
    page = (ROOT / "docs" / "integrations.md").read_text()
    section = page.split("### Claude Code: hooks for its tools", 1)[1]
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    scope: dict[str, Any] = {"__name__": "docs_read_guard"}
    exec(compile(code, "docs/integrations.md", "exec"), scope)
    hook: type[AgentHook] = scope["ReadGuard"]
    return hook


async def test_the_integrations_pages_read_hook_blocks_and_redacts_in_shape() -> None:
    r = registry(doc_example()())
    _, denied = await dispatch(r, pre_tool_use("Read", {"file_path": "/home/u/.ssh/id_ed25519"}))
    assert denied["hookSpecificOutput"]["permissionDecision"] == "deny"
    _, allowed = await dispatch(r, pre_tool_use("Read", {"file_path": "/work/app/cfg"}))
    assert allowed == {}
    token = FILE.replace(f"API_KEY={SECRET}", f"GITHUB_TOKEN={SECRET}")
    message = {**READ, "tool_response": {**READ["tool_response"],
               "file": {**READ["tool_response"]["file"], "content": token}}}  # fmt: skip
    _, out = await dispatch(r, message)
    updated = out["hookSpecificOutput"]["updatedToolOutput"]
    assert updated["file"]["content"] == token.replace(SECRET, "[redacted]")
    assert {**updated, "file": None} == {**message["tool_response"], "file": None}


def test_a_refused_post_tool_use_stops_claude_as_well_as_withholding_the_text() -> None:
    """Unread, the tool_response's shape is unknown: a withheld text would be ignored for an
    object, so Claude is stopped before the output reaches the model."""
    from workers.integrations.claude_code import refused

    out = refused("PostToolUse", "the hook input is over the 2048-byte limit")
    assert out is not None
    check_output(out)
    assert out["continue"] is False and "2048-byte limit" in out["stopReason"]
    assert out["hookSpecificOutput"]["updatedToolOutput"].startswith("[output withheld by HookBus")


def test_a_hook_service_rewriting_a_structured_output_as_text_fails_through_the_gateway(
    bus_settings: BusSettings, procs: Processes, tmp_path: Path
) -> None:
    """The same refusal in the distributed mode: a ``hookbus worker`` answers text for Read's
    object; the gateway answers Claude Code without it, and logs the hook's failure."""
    text = MutateOutput(updated_content="API_KEY=[redacted]")
    procs.scripted(
        bus_settings, HookConfig(name="Texter", events=[HookEvent.POST_TOOL_USE],
                                 answers={"PostToolUse": text}),
    )  # fmt: skip
    live(bus_settings, "Texter")
    gateway = start_gateway(procs, bus_settings, tmp_path)
    status, out, _ = gateway.post("/claude-code", READ)
    assert status == 200, out
    check_output(out)
    assert "updatedToolOutput" not in json.dumps(out), out
    # logged by the gateway's coordinator before it answered
    assert (
        "hook Texter skipped for PostToolUse (error): MutateOutput gave text for Read's "
        "structured output (object)" in procs.logs()
    )


async def test_the_demo_long_output_warning_leaves_a_structured_output_whole() -> None:
    """Cutting Read's JSON text would cost its shape, and so all of it: it only warns."""
    warner = LongOutputWarning()
    warner.limit = 10
    r = HookRegistry(HookSettings(hook_timeout_secs=10, truncate_chars=30))
    r.add(warner)
    _, out = await dispatch(r, READ)
    size = len(json.dumps(READ["tool_response"], separators=(",", ":")))
    assert out == {"decision": "block", "reason": f"Read returned {size} characters"}


def test_output_hookbus_withholds_reaches_claude_code_withheld_in_its_shape() -> None:
    """HookBus's own withheld text (no hook could inspect it, the hook directory not read yet)
    in place of Read's object: Claude Code would ignore the text and show the file."""
    call = to_hookbus(json.dumps(READ).encode())
    assert call is not None
    why = "HookBus has not read the hook directory yet (Redis unreachable): failing closed"
    withheld = f"[output withheld by HookBus: {why}]"
    out = to_claude_code(call, PostToolUseResult(final_content=withheld, warnings=(why,)))
    check_output(out)
    updated = out["hookSpecificOutput"]["updatedToolOutput"]
    assert updated["file"]["content"] == WITHHELD_TEXT and updated["type"] == "text"
    assert updated["file"]["numLines"] == 4 and SECRET not in json.dumps(out)
    assert out["decision"] == "block" and why in out["reason"], out
    assert out["continue"] is False and why in out["stopReason"], out


@pytest.mark.parametrize(
    ("value", "why"),
    [
        ([{"type": "text", "text": "[redacted]"}, {"type": "image", "data": "AA=="}], None),
        ([{"type": "text", "text": "a"}], None),  # an item left out
        ([{"type": "image", "data": "AA=="}, {"type": "text", "text": "b"}],
         "$[0] has other keys than the original (missing ['text'], added ['data'])"),
        ([{"type": "code", "text": "a"}, {"type": "image", "data": "AA=="}],
         "$[0].type is 'code', the original is 'text'"),
        ([{"type": "text", "text": 1}], "$[0] is of the shape of none of the original's items"),
        ({"type": "text"}, "$ is object, the original is array"),
    ],
)  # fmt: skip
def test_the_shape_of_mixed_arrays_is_checked_item_by_item(value: Any, why: str | None) -> None:
    """MCP results are arrays of content blocks of different types (tagged by ``type``)."""
    original = [{"type": "text", "text": "API_KEY=sk-1"}, {"type": "image", "data": "AA=="}]
    assert shape_mismatch(original, value) == why
