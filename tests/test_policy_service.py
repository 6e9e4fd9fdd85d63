"""The Policy hook as a service (a real ``hookbus worker`` process on a real Redis, asked over
the wire protocol): its decisions name their rule, and a changed rules file is reloaded, a bad
one refused with one log line while the last good rules keep deciding. Then ``hookbus policy
check`` and ``hookbus policy test``: their output and exit codes."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from agent_adapter.client import HookClient
from bus import AsyncAgentHook, SessionStopContext
from bus.settings import BusSettings, HookSettings
from tests.harness import until, worker_env
from workers.testing import context, wait_for_hooks

ROOT = Path(__file__).resolve().parent.parent
STARTER = ROOT / "examples" / "policy" / "starter.toml"
TARGET = "workers.builtins.policy:Policy"


def hookbus(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "workers.cli", *args],
        capture_output=True, text=True, timeout=60, cwd=cwd or ROOT,
    )  # fmt: skip


def test_the_service_decides_and_reloads(
    bus_settings: BusSettings, procs: Any, tmp_path: Path
) -> None:
    rules = tmp_path / "rules.toml"
    rules.write_text(STARTER.read_text())
    proc = procs.worker(bus_settings, TARGET, "policy", "--set", f"rules={rules}")
    read_env = context("PreToolUse", tool_name="Read", tool_args={"file_path": "a/../.env"})
    read_pem = context("PreToolUse", tool_name="Read", tool_args={"file_path": "id.pem"})

    async def scenario() -> None:
        async with HookClient(bus_settings, HookSettings(hook_timeout_secs=10)) as client:
            await wait_for_hooks(client, "Policy")
            blocked = await client.run_pre_tool_use(read_env)
            assert blocked.is_blocked, procs.logs()
            assert blocked.blocking_errors[0].hook_name == "Policy"
            assert blocked.action.reason == (
                "policy rule no-env-files: .env files hold secrets; ask a person for what you need"
            )
            output = context("PostToolUse", tool_name="Bash", output_content="API_KEY=k1 ok")
            redacted = await client.run_post_tool_use(output)
            assert redacted.final_content == "API_KEY=[redacted] ok"

            # a good change is used from the next call on
            rules.write_text(STARTER.read_text().replace('"Read(*.env)"', '"Read(*.pem)"'))
            assert (await client.run_pre_tool_use(read_pem)).is_blocked
            # a bad one is refused, in one log line, and the last good rules keep deciding
            rules.write_text(STARTER.read_text().replace("decision =", "decison =", 1))
            kept = await client.run_pre_tool_use(read_pem)
            assert kept.is_blocked and kept.action.reason.startswith("policy rule no-env-files:")

    asyncio.run(scenario())
    assert proc.poll() is None, procs.logs()
    refused = [line for line in procs.logs().splitlines() if "refused, keeping" in line]
    assert len(refused) == 1, procs.logs()
    assert "ERROR hookbus.policy: policy Policy:" in refused[0]
    assert refused[0].endswith(
        "refused, keeping the last good rules (5): rule 1 (no-env-files): unknown key 'decison' "
        "(known: any_arg, args, context, decision, description, events, name, output, reason, "
        "rewrite, session, tenants, tools); rule 1 (no-env-files): decision must be one of deny, "
        "ask, allow, context, rewrite, redact, not None"
    )


def policy_row(settings: BusSettings, hook: str = "Policy") -> list[str]:
    """The cells of ``hook``'s row of ``hookbus hooks list`` (wide enough for one line each)."""
    out = subprocess.run(
        [sys.executable, "-m", "workers.cli", "hooks", "list"],
        env=worker_env(settings, COLUMNS="3000", NO_COLOR="1"),
        capture_output=True, text=True, timeout=60, cwd=ROOT,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    for line in out.stdout.splitlines():
        cells = [c.strip() for c in line.strip().strip("│").split("│")]
        if cells[0] == hook:
            return cells
    return []


def test_hooks_list_says_why_a_changed_file_was_refused_until_a_good_one_is_read(
    bus_settings: BusSettings, procs: Any, tmp_path: Path
) -> None:
    """The service publishes the hook's problem() with its heartbeats: no call is needed for
    a refused file to show, nor for the reason to go once the file is good again."""
    rules = tmp_path / "rules.toml"
    rules.write_text(STARTER.read_text())
    procs.worker(bus_settings, TARGET, "policy", "--set", f"rules={rules}")
    row = until(lambda: (r := policy_row(bus_settings)) and r[8] == "1" and r, "a live Policy")
    assert len(row) == 11, row  # no problem column: nothing to say

    rules.write_text(STARTER.read_text().replace("decision =", "decison =", 1))
    said = until(lambda: policy_row(bus_settings)[11:], "hooks list to say why", 30, procs.logs)
    assert said == [
        f"policy Policy: {rules} refused, keeping the last good rules (5): rule 1 "
        "(no-env-files): unknown key 'decison' (known: any_arg, args, context, decision, "
        "description, events, name, output, reason, rewrite, session, tenants, tools); rule 1 "
        "(no-env-files): decision must be one of deny, ask, allow, context, rewrite, redact, "
        "not None"
    ]

    rules.write_text(STARTER.read_text().replace('"Read(*.env)"', '"Read(*.pem)"'))
    until(lambda: len(policy_row(bus_settings)) == 11, "the reason gone", 30, procs.logs)
    assert "reloaded 5 rules" in procs.logs()


class Troubled(AsyncAgentHook):
    """An async hook whose ``problem()`` is what the file ``$TROUBLE_FILE`` says, while it is
    there: any hook can say what is wrong with it, not only the policy hook."""

    name = "Troubled"

    async def on_session_stop_async(self, ctx: SessionStopContext) -> None:
        pass

    def problem(self) -> str:
        path = Path(os.environ["TROUBLE_FILE"])
        return path.read_text() if path.exists() else ""


def test_any_hook_s_problem_is_shown_while_it_has_one(
    bus_settings: BusSettings, procs: Any, tmp_path: Path
) -> None:
    trouble = tmp_path / "trouble"
    trouble.write_text("the disk\nis full")
    procs.worker(
        bus_settings, "tests.test_policy_service:Troubled", "troubled", TROUBLE_FILE=str(trouble)
    )
    said = until(lambda: policy_row(bus_settings, "Troubled")[11:], "the problem", 30, procs.logs)
    assert said == ["the disk is full"]  # one line
    trouble.unlink()
    until(lambda: len(policy_row(bus_settings, "Troubled")) == 11, "no problem", 30, procs.logs)


def test_a_bad_rules_file_stops_the_worker_at_start(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('[[rule]]\nname = "x"\ndecision = "deny"\nany_arg = \'(a)\\1\'\n')
    out = hookbus("worker", TARGET, "--set", f"rules={bad}", "--check")
    assert out.returncode == 2, out
    assert "any_arg: '(a)\\\\1' is not an RE2 pattern" in out.stderr, out.stderr


# -- hookbus policy check / test ------------------------------------------------------------------


def test_check_passes_the_starter_file() -> None:
    out = hookbus("policy", "check", str(STARTER))
    assert (out.returncode, out.stdout, out.stderr) == (0, f"{STARTER}: ok, 5 rules\n", "")


LINTED = """
version = 1

[[rule]]
name = "everything"
decision = "deny"
tools = ["*"]

[[rule]]
name = "shadowed"
decision = "ask"
tools = ["Bash(git push:*)"]

[[rule]]
name = "never"
decision = "redact"
output = 'token$x'

[[rule]]
name = "nobody"
decision = "deny"
events = ["PermissionRequest"]
tenants = ["acme/x"]

[[rule]]
name = "rm"
decision = "deny"
tools = ["Bash(rm:*)"]
events = ["PermissionRequest"]

[[rule]]
name = "rm-rf"
decision = "deny"
tools = ["Bash(rm -rf:*)"]
events = ["PermissionRequest"]
"""


def test_check_reports_one_line_per_problem(tmp_path: Path) -> None:
    path = tmp_path / "p.toml"
    path.write_text(LINTED)
    out = hookbus("policy", "check", "p.toml", cwd=tmp_path)
    assert out.returncode == 1, out
    assert out.stdout.splitlines() == [
        "p.toml: rule 2 (shadowed): unreachable: rule 1 (everything, deny) decides every call "
        "it matches first",
        "p.toml: rule 3 (never): output 'token$x' can never match anything",
        "p.toml: rule 4 (nobody): tenant 'acme/x' can never match (a tenant is letters, "
        "digits, _ and -)",
        "p.toml: rule 6 (rm-rf): unreachable: rule 5 (rm, deny) decides every call it matches "
        "first",
    ]


def test_check_reports_a_file_it_cannot_load(tmp_path: Path) -> None:
    path = tmp_path / "p.toml"
    path.write_text('[[rule]]\nname = "a"\ndecision = "deny"\ntool = ["Read"]\nargs = {p = "("}\n')
    out = hookbus("policy", "check", "p.toml", cwd=tmp_path)
    assert out.returncode == 1
    lines = out.stdout.splitlines()
    assert lines[0].startswith("p.toml: rule 1 (a): unknown key 'tool' (known: any_arg, args")
    assert lines[1].startswith("p.toml: rule 1 (a): args.p: '(' is not an RE2 pattern (")
    assert len(lines) == 2
    missing = hookbus("policy", "check", "nowhere.toml", cwd=tmp_path)
    assert missing.returncode == 1
    assert missing.stdout == "nowhere.toml: nowhere.toml: No such file or directory\n"


def test_test_shows_each_rules_verdict(tmp_path: Path) -> None:
    payload = tmp_path / "read.json"
    payload.write_text(
        json.dumps(
            {
                "hook_event_name": "PreToolUse",
                "session_id": "s-1",
                "transcript_path": "/tmp/t.jsonl",
                "cwd": "/home/dev/app",
                "tool_name": "Read",
                "tool_input": {"file_path": "/home/dev/app/config/../.env"},
            }
        )
    )
    out = hookbus("policy", "test", str(STARTER), str(payload))
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [
        "PreToolUse Read",
        "  no-env-files                deny     matches",
        "  no-destructive-shell        deny     no: Read "
        '{"file_path":"/home/dev/app/config/../.env"} matches none of its tools',
        "  read-only-shell             allow    no: not for PreToolUse (for PermissionRequest)",
        "  other-shell-needs-a-person  context  no: not for PreToolUse (for PermissionRequest)",
        "  redact-secrets              redact   no: not for PreToolUse (for PostToolUse, "
        "PostToolUseFailure)",
        'answer: {"type":"Block","reason":"policy rule no-env-files: .env files hold secrets; '
        'ask a person for what you need"}',
    ]
    hookbus_form = tmp_path / "ls.json"
    hookbus_form.write_text(
        json.dumps(
            {
                "event": "PermissionRequest",
                "context": {"session_id": "s", "tool_name": "Bash", "tool_args": {"command": "ls"}},
            }
        )
    )
    out = hookbus("policy", "test", str(STARTER), str(hookbus_form))
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[-1] == (
        'answer: {"type":"Override","decision":"Allow",'
        '"reason":"policy rule read-only-shell: read-only shell command"}'
    )


def test_test_refuses_what_it_cannot_read(tmp_path: Path) -> None:
    payload = tmp_path / "p.json"
    payload.write_text('{"tool_name": "Read"}')
    out = hookbus("policy", "test", str(STARTER), str(payload))
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.startswith(f'hookbus: {payload}: give {{"event": "PreToolUse"')
    bad = tmp_path / "bad.toml"
    bad.write_text("rule = 3\n")
    out = hookbus("policy", "test", str(bad), str(payload))
    assert out.returncode == 2
    assert out.stderr == f"{bad}: rule: must be an array of tables ([[rule]])\n"
