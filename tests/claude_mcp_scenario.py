"""One offline Claude Code session with Claude Code as the MCP client of ``hookbus mcp``: run by
tests/test_mcp_claude_code.py inside a network namespace of its own (``unshare -n``, loopback
only), so nothing leaves the machine.

``python -m tests.claude_mcp_scenario OUT_DIR``: starts a private redis-server, the hooks as
``hookbus worker``s (SecretGuard over MCP tool names, the demo's Redactor) and a Messages-API
stand-in whose script makes Claude Code call the filesystem server's ``read_text_file`` on
``.env`` then on a file holding a key among other lines; Claude Code (``claude -p``) has the
server configured as ``hookbus mcp --name filesystem -- mcp-server-filesystem DIR``
(``--mcp-config``, ``--strict-mcp-config``). Writes ``OUT_DIR/report.json``: every request the
stand-in got (what the model saw), Claude Code's exit status and output, the services' logs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

from bus.settings import BusSettings
from tests.claude_cli_scenario import CLAUDE
from tests.harness import ROOT, Processes, worker_env
from tests.messages_standin import StandIn, message, tool_results
from tests.test_gateway import live
from workers.local.redis_server import RedisServer

SERVER = ROOT / "tests" / "mcp_server" / "node_modules" / ".bin" / "mcp-server-filesystem"
SECRET = "sk-live-4f9a2b7c1d8e"
NOTES = f"# settings\nREGION=eu-west-1\nAPI_KEY={SECRET}\nDEBUG=false\n"
TOOL = "mcp__filesystem__read_text_file"
ENV_ID, NOTES_ID = "toolu_standin_env", "toolu_standin_notes"


class McpStandIn(StandIn):
    """The script: read ``.env`` through the MCP tool, then the notes, then a closing text."""

    def __init__(self, folder: Path) -> None:
        super().__init__(str(folder))
        self.folder = folder

    def answer(self, body: dict[str, Any]) -> dict[str, Any]:
        tools = {t.get("name") for t in body.get("tools", []) if isinstance(t, dict)}
        if TOOL not in tools:
            return message([{"type": "text", "text": "Config check"}], "end_turn")
        done = tool_results(body)
        for call_id, name in ((ENV_ID, ".env"), (NOTES_ID, "settings.txt")):
            if call_id not in done:
                path = str(self.folder / name)
                call = {"type": "tool_use", "id": call_id, "name": TOOL, "input": {"path": path}}
                return message([call], "tool_use")
        return message([{"type": "text", "text": "Done."}], "end_turn")


def main(out: Path) -> None:
    (out / "logs").mkdir(parents=True, exist_ok=True)
    project, home, folder = out / "project", out / "home", out / "files"
    for d in (project, home, folder):
        d.mkdir(exist_ok=True)
    (folder / ".env").write_text(f"API_KEY={SECRET}\n")
    (folder / "settings.txt").write_text(NOTES)
    procs = Processes(out / "logs")
    report: dict[str, object] = {}
    with RedisServer() as redis, McpStandIn(folder) as model:
        try:
            settings = BusSettings(
                redis_url=redis.url, prefix=f"t{uuid.uuid4().hex[:10]}", heartbeat_secs=0.2,
                liveness_secs=1.0, claim_idle_secs=0.5, refresh_secs=0.2,
            )  # fmt: skip
            procs.worker(settings, "workers.builtins.mcp_guards:McpSecretGuard", "guard")
            procs.worker(settings, "workers.builtins.demo_hooks:Redactor", "redactor")
            live(settings, "McpSecretGuard")
            live(settings, "Redactor")
            hookbus_env = {k: v for k, v in worker_env(settings).items() if k.startswith("HOOKBUS")}
            config = {
                "mcpServers": {
                    "filesystem": {
                        "command": sys.executable,
                        "args": ["-m", "workers.cli", "mcp", "--name", "filesystem", "--",
                                 str(SERVER), str(folder)],
                        "env": {**hookbus_env, "PYTHONPATH": str(ROOT)},
                    }
                }
            }  # fmt: skip
            mcp_config = project / "mcp.json"
            mcp_config.write_text(json.dumps(config))
            env = {
                "PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home),
                "ANTHROPIC_BASE_URL": f"http://127.0.0.1:{model.port}",
                "ANTHROPIC_API_KEY": "sk-ant-api03-offline-standin-key",
                "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "DISABLE_AUTOUPDATER": "1",
                "DISABLE_TELEMETRY": "1", "DISABLE_ERROR_REPORTING": "1", "TERM": "dumb",
                # the MCP tools offered to the model at once (not behind ToolSearch), once the
                # server is connected
                "ENABLE_TOOL_SEARCH": "false", "MCP_CONNECTION_NONBLOCKING": "false",
            }  # fmt: skip
            ran = subprocess.run(
                [str(CLAUDE), "-p", "What do the settings hold?", "--mcp-config",
                 str(mcp_config), "--strict-mcp-config", "--allowedTools", TOOL, "--model",
                 "claude-sonnet-4-5", "--output-format", "json"],
                cwd=project, env=env, capture_output=True, text=True, timeout=240, check=False,
                stdin=subprocess.DEVNULL,
            )  # fmt: skip
            report["claude"] = {"status": ran.returncode, "stdout": ran.stdout[-4000:],
                                "stderr": ran.stderr[-4000:]}  # fmt: skip
        finally:
            procs.stop_all()
            report["requests"] = model.requests
            report["logs"] = procs.logs()[-20000:]
            (out / "report.json").write_text(json.dumps(report))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
