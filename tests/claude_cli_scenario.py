"""One offline Claude Code session behind HookBus: run by tests/test_claude_code_cli.py inside
a network namespace of its own (``unshare -n``, loopback only), so nothing leaves the machine.

``python -m tests.claude_cli_scenario OUT_DIR [MODE]``: starts a private redis-server, a
redacting hook service (``hookbus worker``), ``hookbus gateway``, and a Messages-API stand-in
(tests/messages_standin.py) whose script makes Claude Code ``Read`` a file holding an API key
and other lines, then ``cat`` it with ``Bash``. The real Claude Code CLI runs one turn
(``claude -p``) with a PostToolUse hook. MODE:

``http``
    the demo ``Redactor``; Claude Code's ``http`` hook to the gateway (the default);
``bridge``
    the demo ``Redactor``; a ``command`` hook running the bridge ``hookbus-claude-code``;
``command-hook``
    examples/claude-code/hooks/redact-secrets.sh, a Claude Code hook script that redacts by
    shape (``jq``), run unchanged by ``workers.integrations.command_hook:CommandHook`` (the input it
    was given kept in ``OUT_DIR/seen.jsonl``); the ``http`` hook.
``refused``
    the demo ``Redactor`` and the ``http`` hook, but a gateway whose ``--max-body`` is smaller
    than the hook input: HookBus refuses it unread (protocol.md 5.6) and must fail closed.
``truncated``
    a hook that asks for the output to be truncated (a Warning with ``truncate_output``) and a
    gateway that cuts it to 40 characters: the JSON of Read's object no longer has its shape,
    and HookBus must withhold it rather than hand Claude Code text it would ignore.

Writes ``OUT_DIR/report.json``: every request the stand-in got (what the model saw), Claude
Code's exit status and output, and the services' logs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

from bus.actions import Warn
from bus.events import HookEvent
from bus.settings import BusSettings
from tests.harness import ROOT, Processes
from tests.messages_standin import StandIn
from tests.remote_hooks import HookConfig
from tests.test_gateway import live, published_once, start_gateway
from workers.local.redis_server import RedisServer

CLAUDE = ROOT / "tests" / "claude_cli" / "node_modules" / ".bin" / "claude"
SECRET = "sk-live-4f9a2b7c1d8e"
FILE = f"# settings\nREGION=eu-west-1\nAPI_KEY={SECRET}\nDEBUG=false\n"
#: The example Claude Code hook that redacts by shape, run unchanged; its input kept in ``seen``.
REDACT = ROOT / "examples" / "claude-code" / "hooks" / "redact-secrets.sh"
SCRIPT = "input=$(cat); printf '%s\\n' \"$input\" >> {seen}; printf '%s' \"$input\" | {script}"


def main(out: Path, mode: str = "http") -> None:
    (out / "logs").mkdir(parents=True, exist_ok=True)
    project, home = out / "project", out / "home"
    project.mkdir(exist_ok=True)
    home.mkdir(exist_ok=True)
    config = project / "config.env"
    # refused: more settings, so that the hook input is over the gateway's --max-body
    padding = "".join(f"OPTION_{i}=on\n" for i in range(200)) if mode == "refused" else ""
    config.write_text(FILE + padding)
    procs = Processes(out / "logs")
    report: dict[str, object] = {}
    with RedisServer() as redis, StandIn(str(config)) as model:
        try:
            settings = BusSettings(
                redis_url=redis.url, prefix=f"t{uuid.uuid4().hex[:10]}", heartbeat_secs=0.2,
                liveness_secs=1.0, claim_idle_secs=0.5, refresh_secs=0.2,
            )  # fmt: skip
            if mode == "command-hook":
                procs.worker(
                    settings, "workers.integrations.command_hook:CommandHook", "command-hook",
                    HOOKBUS_COMMAND=SCRIPT.format(seen=out / "seen.jsonl", script=REDACT),
                    HOOKBUS_COMMAND_EVENTS="PostToolUse", HOOKBUS_COMMAND_NAME="RedactByShape",
                    HOOKBUS_COMMAND_FAILURE_POLICY="fail",
                )  # fmt: skip
                live(settings, "RedactByShape")
            elif mode == "truncated":
                cut = Warn(message="too long", truncate_output=True)
                config = HookConfig(name="Cutter", events=[HookEvent.POST_TOOL_USE],
                                    answers={"PostToolUse": cut})  # fmt: skip
                procs.scripted(settings, config)
                live(settings, "Cutter")
                os.environ["HOOKBUS_TRUNCATE_CHARS"] = "40"  # the gateway's, through worker_env
            else:
                procs.worker(settings, "workers.builtins.demo_hooks:Redactor", "redactor")
                live(settings, "Redactor")
            limit = ["--max-body", "2048"] if mode == "refused" else []
            gateway = start_gateway(procs, settings, out, *limit, tenant="claude-code")
            hook = {
                "type": "http", "url": f"http://127.0.0.1:{gateway.port}/claude-code",
                "headers": {"Authorization": "Bearer $HOOKBUS_GATEWAY_TOKEN"},
                "allowedEnvVars": ["HOOKBUS_GATEWAY_TOKEN"], "timeout": 35,
            }  # fmt: skip
            if mode == "bridge":
                bridge = Path(sys.executable).parent / "hookbus-claude-code"
                hook = {"type": "command", "command": str(bridge), "timeout": 35}
            claude_settings = project / "hookbus-settings.json"
            # SessionStart too: Claude Code skips an http hook there, not a command hook
            hooks = {"PostToolUse": [{"matcher": "*", "hooks": [hook]}],
                     "SessionStart": [{"hooks": [hook]}]}  # fmt: skip
            claude_settings.write_text(json.dumps({"hooks": hooks}))
            env = {
                "PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home),
                "ANTHROPIC_BASE_URL": f"http://127.0.0.1:{model.port}",
                "ANTHROPIC_API_KEY": "sk-ant-api03-offline-standin-key",
                "HOOKBUS_GATEWAY_TOKEN": gateway.token,
                "HOOKBUS_GATEWAY_URL": f"http://127.0.0.1:{gateway.port}",
                "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "DISABLE_AUTOUPDATER": "1",
                "DISABLE_TELEMETRY": "1", "DISABLE_ERROR_REPORTING": "1", "TERM": "dumb",
            }  # fmt: skip
            ran = subprocess.run(
                [str(CLAUDE), "-p", "What does config.env hold?", "--settings",
                 str(claude_settings), "--allowedTools", "Read", "Bash", "--model",
                 "claude-sonnet-4-5", "--output-format", "json"],
                cwd=project, env=env, capture_output=True, text=True, timeout=240, check=False,
                stdin=subprocess.DEVNULL,
            )  # fmt: skip
            report["claude"] = {"status": ran.returncode, "stdout": ran.stdout[-4000:],
                                "stderr": ran.stderr[-4000:]}  # fmt: skip
            if mode not in ("refused", "truncated"):  # the events HookBus saw, both PostToolUse in
                posts = lambda found: sum(e.event == "PostToolUse" for e in found) >= 2  # noqa: E731
                found = published_once(settings, posts, "both PostToolUse events")
                report["events"] = [e.event.value for e in found]
        finally:
            procs.stop_all()
            report["requests"] = model.requests
            report["logs"] = procs.logs()[-20000:]
            (out / "report.json").write_text(json.dumps(report))


if __name__ == "__main__":
    main(Path(sys.argv[1]), *sys.argv[2:3])
