"""The real Claude Code CLI (2.1.332, npm) as the MCP client of ``hookbus mcp``, offline: the
model sees the refusal of a ``.env`` read and the redacted file, never the key — in the text
blocks nor in ``structuredContent``, which Claude Code shows the model.

tests/claude_mcp_scenario.py runs the session inside ``unshare -n`` (loopback only), as
tests/test_claude_code_cli.py does; every prerequisite missing is a failure saying what to
install (``make node-deps``), never a skip.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.claude_mcp_scenario import ENV_ID, NOTES_ID, SECRET, SERVER
from tests.harness import ROOT
from tests.messages_standin import tool_results
from tests.test_claude_code_cli import prerequisites

pytestmark = pytest.mark.redis


def run_session(out: Path) -> dict[str, Any]:
    prerequisites()
    if not SERVER.exists():
        pytest.fail(f"{SERVER.relative_to(ROOT)} is missing: run `make node-deps` (npm)")
    ran = subprocess.run(
        ["unshare", "-n", "--", "sh", "-c",
         'ip link set lo up && exec "$0" -m tests.claude_mcp_scenario "$1"',
         sys.executable, str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=400, check=False,
    )  # fmt: skip
    assert ran.returncode == 0, f"the scenario failed:\n{ran.stdout}\n{ran.stderr}"
    report: dict[str, Any] = json.loads((out / "report.json").read_text())
    return report


def test_claude_code_through_hookbus_mcp(tmp_path: Path) -> None:
    report = run_session(tmp_path)
    claude = report["claude"]
    assert claude["status"] == 0, claude
    requests = [r["body"] for r in report["requests"]]
    seen: dict[str, str] = {}
    for body in requests:
        seen.update(tool_results(body))
    assert ENV_ID in seen and NOTES_ID in seen, (seen, report["logs"][-3000:])
    assert ".env files hold secrets" in seen[ENV_ID]
    for line in ("# settings", "REGION=eu-west-1", "API_KEY=[redacted]", "DEBUG=false"):
        assert line in seen[NOTES_ID], seen[NOTES_ID]
    assert SECRET not in json.dumps(requests)
