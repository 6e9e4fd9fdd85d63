"""The real Claude Code CLI (2.1.332, from npm) behind HookBus, offline: the model never sees the
secret a PostToolUse Redactor hid, from Read or from Bash, and the other lines arrive.

tests/claude_cli_scenario.py runs the session inside ``unshare -n`` (a network namespace with
only loopback): a private Redis, the demo ``Redactor`` as a ``hookbus worker``, ``hookbus
gateway``, a Messages-API stand-in (tests/messages_standin.py) and ``claude -p`` with an
``http`` hook. What the model saw is what Claude Code sent the stand-in next.
Every prerequisite missing is a failure saying what to install (``make node-deps`` installs
the CLI into tests/claude_cli), never a skip.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.claude_cli_scenario import CLAUDE, SECRET
from tests.harness import ROOT
from tests.messages_standin import BASH_ID, READ_ID, tool_results
from workers.local.redis_server import MISSING, find_redis_server

LINES = ("# settings", "REGION=eu-west-1", "API_KEY=[redacted]", "DEBUG=false")


def prerequisites() -> None:
    if not CLAUDE.exists():
        pytest.fail(f"{CLAUDE.relative_to(ROOT)} is missing: run `make node-deps` (npm)")
    for tool, why in (("unshare", "util-linux"), ("ip", "iproute2")):
        if shutil.which(tool) is None:
            pytest.fail(f"{tool} is not on PATH: the offline Claude Code test needs it ({why})")
    if find_redis_server() is None:
        pytest.fail(MISSING)
    probe = subprocess.run(
        ["unshare", "-n", "--", "ip", "link", "set", "lo", "up"], capture_output=True, text=True
    )
    if probe.returncode != 0:
        why = (probe.stderr.strip().splitlines() or ["no reason given"])[-1]
        pytest.fail(f"`unshare -n` is not allowed here (needs root or user namespaces): {why}")


def run_session(out: Path, mode: str) -> dict[str, Any]:
    prerequisites()
    if mode == "command-hook" and shutil.which("jq") is None:
        pytest.fail("jq is not on PATH: the Claude Code hook script here uses it (apt install jq)")
    ran = subprocess.run(
        ["unshare", "-n", "--", "sh", "-c",
         'ip link set lo up && exec "$0" -m tests.claude_cli_scenario "$1" "$2"',
         sys.executable, str(out), mode],
        cwd=ROOT, capture_output=True, text=True, timeout=400, check=False,
    )  # fmt: skip
    assert ran.returncode == 0, f"the scenario failed:\n{ran.stdout}\n{ran.stderr}"
    report: dict[str, Any] = json.loads((out / "report.json").read_text())
    return report


@pytest.mark.parametrize("mode", ["refused", "truncated"])
def test_output_hookbus_withholds_never_reaches_the_model(tmp_path: Path, mode: str) -> None:
    """``refused``: the gateway refuses the Read's hook input unread (over its --max-body);
    ``truncated``: a Warning cuts the JSON of Read's object. Withheld text could not replace
    Read's object: Claude Code is stopped (``continue: false``) before the model reads it."""
    report = run_session(tmp_path, mode)
    claude = report["claude"]
    assert claude["status"] == 0, claude
    assert json.loads(claude["stdout"])["terminal_reason"] == "hook_stopped", claude
    requests = [r["body"] for r in report["requests"]]
    assert not any(tool_results(r) for r in requests), "a tool's output reached the model"
    assert SECRET not in json.dumps(requests)


@pytest.mark.parametrize("mode", ["http", "bridge", "command-hook"])
def test_claude_code_never_shows_the_model_a_redacted_secret(tmp_path: Path, mode: str) -> None:
    """``http``/``bridge``: the demo Redactor, through Claude Code's http hook or the command
    bridge; ``command-hook``: a Claude Code script that redacts by shape, behind CommandHook."""
    report = run_session(tmp_path, mode)
    claude = report["claude"]
    why = f"claude: {claude}\nlogs:\n{report['logs']}"
    assert claude["status"] == 0, why
    requests = [r["body"] for r in report["requests"]]
    seen = tool_results(requests[-1])  # the last request holds both tool results
    assert seen.keys() == {READ_ID, BASH_ID}, why
    for tool_use_id, text in seen.items():
        assert SECRET not in text, f"{tool_use_id}: the model saw the secret:\n{text}"
        at = [text.find(line) for line in LINES]
        assert -1 not in at and at == sorted(at), f"{tool_use_id}: lines lost:\n{text}"
    assert SECRET not in json.dumps(requests), "the secret reached the model in some request"
    # Claude Code skips http hooks at SessionStart (docs/integrations.md): the bridge gets it
    starts = report["events"].count("OnSessionStart")
    assert starts == (1 if mode == "bridge" else 0), report["events"]
    if mode == "command-hook":  # the script was given Claude Code's own input, unchanged
        session = json.loads(claude["stdout"])["session_id"]
        seen = [json.loads(line) for line in (tmp_path / "seen.jsonl").read_text().splitlines()]
        assert [s["tool_use_id"] for s in seen] == [READ_ID, BASH_ID]
        for given in seen:
            assert given["session_id"] == session and given["hook_event_name"] == "PostToolUse"
            assert Path(given["transcript_path"]).name == f"{session}.jsonl", given
            assert given["permission_mode"] and given["cwd"] == str(tmp_path / "project")
            assert isinstance(given["tool_response"], dict), given
