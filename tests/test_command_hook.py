"""``workers.integrations.command_hook:CommandHook``: Claude Code hook scripts, unchanged, as
HookBus hooks.

The scripts in ``examples/claude-code/hooks`` are written for Claude Code (``jq`` on stdin, exit
2 or JSON on stdout) and know nothing of HookBus. They run embedded (a ``HookRegistry``) and as a
real ``hookbus worker`` process answering a Python agent and the HTTP gateway.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from agent_adapter.client import HookClient
from bus import Block, HookRegistry, PermissionRequired, PreToolUseContext
from bus.actions import Continue
from bus.errors import ConfigError
from bus.events import (
    PostToolUseContext,
    SessionStartContext,
    SubagentStopContext,
)
from bus.hooks import spec_of
from bus.matcher import MATCH_ALL, ToolMatchFilter
from bus.settings import BusSettings, HookSettings
from tests.claude_code_types import ROOT, check_input, check_output, pre_tool_use
from tests.harness import Processes, wait_for, wait_live, worker_env
from tests.test_gateway import live, start_gateway
from workers.integrations.command_hook import CommandHook, manifest_filter

HOOKS = ROOT / "examples" / "claude-code" / "hooks"
BLOCK_RM = HOOKS / "block-rm.sh"
PROTECT = HOOKS / "protect-files.sh"


@pytest.fixture(autouse=True)
def _jq() -> None:
    if shutil.which("jq") is None:
        pytest.fail("jq is not on PATH: the example Claude Code hooks use it (apt install jq)")


def hook(command: str, **env: str) -> CommandHook:
    return CommandHook({**os.environ, "HOOKBUS_COMMAND": command, **env})


def registry(*hooks: CommandHook, timeout: float = 10) -> HookRegistry:
    r = HookRegistry(HookSettings(hook_timeout_secs=timeout))
    for h in hooks:
        r.add(h)
    return r


def bash(command: str) -> PreToolUseContext:
    return PreToolUseContext(session_id="s1", tool_name="Bash", tool_args={"command": command})


async def test_exit_2_blocks_with_stderr_as_the_reason() -> None:
    hooks = registry(hook(str(BLOCK_RM), HOOKBUS_COMMAND_NAME="BlockRm",
                          HOOKBUS_COMMAND_MATCHER="Bash"))  # fmt: skip
    result = await hooks.run_pre_tool_use(bash("rm -rf build"))
    assert result.action == Block(reason="Blocked: rm -rf is not allowed here")
    assert result.blocking_errors[0].hook_name == "BlockRm"
    result = await hooks.run_pre_tool_use(bash("ls"))
    assert isinstance(result.action, Continue) and not result.skipped


async def test_json_output_is_honoured() -> None:
    guard = hook(str(PROTECT), HOOKBUS_COMMAND_NAME="Protect", HOOKBUS_COMMAND_MATCHER="Edit|Write")
    assert spec_of(guard).match_filter == ToolMatchFilter.parse(["Edit", "Write"])
    hooks = registry(guard)

    def edit(path: str, tool: str = "Edit") -> PreToolUseContext:
        return PreToolUseContext(session_id="s1", tool_name=tool, tool_args={"file_path": path})

    result = await hooks.run_pre_tool_use(edit("app/poetry.lock"))
    assert result.action == Block(reason="app/poetry.lock is generated: edit its source instead")
    result = await hooks.run_pre_tool_use(edit("/srv/config/prod.yaml", "Write"))
    assert result.action == PermissionRequired(
        permission="/srv/config/prod.yaml configures production", tool_name="Write"
    )
    assert isinstance((await hooks.run_pre_tool_use(edit("src/a.py"))).action, Continue)
    # Read is not in the matcher: the command does not run at all.
    assert isinstance((await hooks.run_pre_tool_use(edit("x.lock", "Read"))).action, Continue)


async def test_the_script_reads_claude_codes_input(tmp_path: Path) -> None:
    record = tmp_path / "inputs.jsonl"
    events = "PreToolUse,PostToolUse,SessionStart,SubagentStop"
    recorder = hook(f"cat >> {record}; echo >> {record}", HOOKBUS_COMMAND_EVENTS=events,
                    HOOKBUS_COMMAND_CWD=str(tmp_path))  # fmt: skip
    hooks = registry(recorder)
    await hooks.run_pre_tool_use(bash("ls"))
    await hooks.run_post_tool_use(
        PostToolUseContext(session_id="s1", tool_name="Bash", output_content="a\nb")
    )
    await hooks.run_on_session_start(SessionStartContext(session_id="s1", is_resume=True))
    await hooks.run_on_subagent_stop(
        SubagentStopContext(parent_session_id="s1", subagent_name="reviewer", result_summary="ok")
    )
    seen = [json.loads(line) for line in record.read_text().splitlines() if line]
    assert [s["hook_event_name"] for s in seen] == events.split(",")
    for given in seen:
        check_input(given)
        assert (given["session_id"], given["cwd"]) == ("s1", str(tmp_path))
    assert seen[0]["tool_input"] == {"command": "ls"}
    assert seen[1]["tool_response"] == "a\nb"
    assert seen[2]["source"] == "resume"


async def test_the_script_does_not_get_the_services_redis_credential(tmp_path: Path) -> None:
    seen = tmp_path / "env"
    secret = "redis://worker:s3cret@127.0.0.1:6379/0"
    spy = hook(f"env > {seen}", HOOKBUS_REDIS_URL=secret, HOOKBUS_COMMAND_CWD=str(tmp_path),
               SOMETHING_ELSE="kept")  # fmt: skip
    await registry(spy).run_pre_tool_use(bash("ls"))
    env = dict(line.split("=", 1) for line in seen.read_text().splitlines() if "=" in line)
    assert "s3cret" not in seen.read_text()
    assert not [k for k in env if k.startswith("HOOKBUS_")], env
    assert (env["SOMETHING_ELSE"], env["CLAUDE_PROJECT_DIR"]) == ("kept", str(tmp_path))


async def test_failures_follow_the_failure_policy(tmp_path: Path) -> None:
    pidfile = tmp_path / "pid"
    cases = {
        "exit 1": "exit 1",
        "bad json": "echo '{nope'",
        "too much": "head -c 2000000 /dev/zero | tr '\\0' x",
        "too slow": f"echo $$ > {pidfile}; exec sleep 60",
    }
    for label, command in cases.items():
        quiet = hook(command, HOOKBUS_COMMAND_NAME="Quiet", HOOKBUS_COMMAND_TIMEOUT="1")
        result = await registry(quiet).run_pre_tool_use(bash("ls"))
        assert isinstance(result.action, Continue), label
        assert [s.hook_name for s in result.skipped] == ["Quiet"], label
        strict = hook(command, HOOKBUS_COMMAND_NAME="Strict", HOOKBUS_COMMAND_TIMEOUT="1",
                      HOOKBUS_COMMAND_FAILURE_POLICY="fail")  # fmt: skip
        result = await registry(strict).run_pre_tool_use(bash("ls"))
        assert isinstance(result.action, Block), label
        assert "hook Strict" in result.action.reason, label
        assert "(failure_policy=fail)" in result.action.reason, label
    # The slow command was killed, not left running.
    pid = int(pidfile.read_text())

    def gone() -> bool:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        return False

    await wait_for(gone, 10, f"the timed-out hook command (pid {pid}) to be killed")


@pytest.mark.parametrize(
    ("env", "said"),
    [
        ({"HOOKBUS_COMMAND": ""}, "needs HOOKBUS_COMMAND"),
        ({"HOOKBUS_COMMAND_EVENTS": "PreToolUse,UserPromptSubmit"}, "'UserPromptSubmit' is not"),
        ({"HOOKBUS_COMMAND_MATCHER": "Bash("}, "HOOKBUS_COMMAND_MATCHER"),
        ({"HOOKBUS_COMMAND_TIMEOUT": "soon"}, "number of seconds"),
        ({"HOOKBUS_COMMAND_TIMEOUT": "0"}, "must be positive"),
        ({"HOOKBUS_COMMAND_FAILURE_POLICY": "block"}, "'ignore' or 'fail'"),
    ],
    ids=["no-command", "no-counterpart", "bad-regex", "bad-timeout", "zero", "bad-policy"],
)
def test_bad_configuration_is_said_at_start(env: dict[str, str], said: str) -> None:
    with pytest.raises(ConfigError, match=said.replace("(", r"\(")):
        CommandHook({"HOOKBUS_COMMAND": "true", **env})


def test_manifest_filters_from_matchers() -> None:
    assert manifest_filter("") == MATCH_ALL and manifest_filter("*") == MATCH_ALL
    assert manifest_filter("Bash") == ToolMatchFilter.exact("Bash")
    assert manifest_filter("Notebook.*|Write") == ToolMatchFilter.parse(["Notebook*", "Write"])
    assert manifest_filter("mcp__.*__write") == MATCH_ALL  # checked by the hook itself


async def test_a_regex_matcher_the_manifest_cannot_say_is_applied_by_the_hook() -> None:
    hooks = registry(hook("echo no >&2; exit 2", HOOKBUS_COMMAND_MATCHER="mcp__.*__write"))
    call = PreToolUseContext(session_id="s", tool_name="mcp__files__write")
    assert isinstance((await hooks.run_pre_tool_use(call)).action, Block)
    other = PreToolUseContext(session_id="s", tool_name="mcp__files__read")
    assert isinstance((await hooks.run_pre_tool_use(other)).action, Continue)


# -- as a hook service ---------------------------------------------------------------------


async def test_an_unmodified_claude_code_hook_blocks_through_hookbus(
    bus_settings: BusSettings, procs: Processes, tmp_path: Path
) -> None:
    procs.worker(
        bus_settings, "workers.integrations.command_hook:CommandHook", "block-rm",
        HOOKBUS_COMMAND=str(BLOCK_RM), HOOKBUS_COMMAND_NAME="BlockRm",
        HOOKBUS_COMMAND_MATCHER="Bash",
    )  # fmt: skip
    # A Python agent on the bus.
    async with HookClient(bus_settings, HookSettings(hook_timeout_secs=10)) as client:
        await wait_live(client, "BlockRm")
        result = await client.run_pre_tool_use(bash("rm -rf /srv/data"))
        assert result.action == Block(reason="Blocked: rm -rf is not allowed here"), result
        assert isinstance((await client.run_pre_tool_use(bash("ls"))).action, Continue)
    # Claude Code itself, through the gateway: its own script, now one service for a fleet.
    live(bus_settings, "BlockRm")
    gateway = start_gateway(procs, bus_settings, tmp_path)
    status, out, _ = gateway.post("/claude-code", pre_tool_use("Bash", {"command": "rm -rf /"}))
    assert status == 200, out
    check_output(out)
    assert out["hookSpecificOutput"]["permissionDecision"] == "deny"
    assert out["hookSpecificOutput"]["permissionDecisionReason"] == (
        "BlockRm: Blocked: rm -rf is not allowed here"
    )


def test_a_misconfigured_command_hook_service_says_why_in_one_line(
    bus_settings: BusSettings,
) -> None:
    import subprocess
    import sys

    env: dict[str, Any] = worker_env(bus_settings, HOOKBUS_COMMAND_EVENTS="Notification",
                                     HOOKBUS_COMMAND="true")  # fmt: skip
    proc = subprocess.run(
        [sys.executable, "-m", "workers.cli", "worker",
         "workers.integrations.command_hook:CommandHook"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert proc.returncode == 2, proc
    assert proc.stderr.startswith("hookbus: HOOKBUS_COMMAND_EVENTS: 'Notification' is not")
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
