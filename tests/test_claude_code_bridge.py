"""``hookbus-claude-code``, the command-hook bridge, run as Claude Code runs a command hook: a
new process per call, the hook input on stdin, the answer on stdout and the exit status.

A real Redis, real hook services and a real gateway answer; outputs are checked against the
schemas made from ``@anthropic-ai/claude-agent-sdk``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from bus.settings import BusSettings
from tests.claude_code_types import INPUTS, ROOT, check_output, pre_tool_use
from tests.harness import Processes
from tests.test_gateway import live, start_gateway
from workers.integrations import claude_code_bridge as bridge
from workers.local.redis_server import free_port

BRIDGE = Path(sys.executable).parent / "hookbus-claude-code"


def run_bridge(message: Any, url: str, token: str | None) -> subprocess.CompletedProcess[str]:
    if not BRIDGE.is_file():
        pytest.fail(f"{BRIDGE} is missing: install hookbus (make lint, or pip install -e .)")
    env = {k: v for k, v in os.environ.items() if not k.startswith("HOOKBUS_")}
    env["HOOKBUS_GATEWAY_URL"] = url
    if token is not None:
        env["HOOKBUS_GATEWAY_TOKEN"] = token
    data = message if isinstance(message, str) else json.dumps(message)
    return subprocess.run(
        [str(BRIDGE)], input=data, env=env, capture_output=True, text=True, timeout=60,
        check=False,
    )  # fmt: skip


def test_secret_guard_denies_claude_code_reading_env_through_the_bridge(
    bus_settings: BusSettings, procs: Processes, tmp_path: Path
) -> None:
    procs.worker(bus_settings, "workers.builtins.demo_hooks:SecretGuard", "guard")
    live(bus_settings, "SecretGuard")
    gateway = start_gateway(procs, bus_settings, tmp_path)
    url = f"http://127.0.0.1:{gateway.port}"

    proc = run_bridge(pre_tool_use("Read", {"file_path": "/work/app/.env"}), url, gateway.token)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    check_output(out)
    assert out["hookSpecificOutput"]["permissionDecision"] == "deny"
    assert out["hookSpecificOutput"]["permissionDecisionReason"] == (
        "SecretGuard: .env files hold secrets; Read on them is not allowed"
    )
    proc = run_bridge(pre_tool_use("Read", {"file_path": "app.py"}), url, gateway.token)
    assert (proc.returncode, json.loads(proc.stdout)) == (0, {}), proc.stderr
    # A prefix in the URL is kept (here: none configured, so 404, and so blocked).
    proc = run_bridge(pre_tool_use("Read", {"file_path": "app.py"}), url + "/nope", gateway.token)
    assert proc.returncode == 2 and "answered 404" in proc.stderr, proc


def test_no_answer_blocks_tool_calls_and_only_warns_otherwise(
    bus_settings: BusSettings, procs: Processes, tmp_path: Path
) -> None:
    gateway = start_gateway(procs, bus_settings, tmp_path)
    url = f"http://127.0.0.1:{gateway.port}"
    down = f"http://127.0.0.1:{free_port()}"
    cases = [
        (down, gateway.token, "no answer from the HookBus gateway"),
        (url, None, "HOOKBUS_GATEWAY_TOKEN is not set"),
        ("https://127.0.0.1:1", gateway.token, "must be http://HOST:PORT"),
    ]
    for where, token, said in cases:
        for name, status in [("PreToolUse", 2), ("PermissionRequest", 2), ("Stop", 1),
                             ("PostToolUse", 1)]:  # fmt: skip
            proc = run_bridge(INPUTS[name], where, token)
            assert (proc.returncode, proc.stdout) == (status, ""), (name, said, proc)
            assert said in proc.stderr, (name, proc.stderr)
            if status == 2:
                assert "blocked, since nothing could inspect it" in proc.stderr
    # A wrong token: the gateway's denial of a tool call (PostToolUse: its output withheld),
    # printed as it came; the other events, its 401, a non-blocking error.
    for name in ("PreToolUse", "PermissionRequest", "PostToolUse"):
        proc = run_bridge(INPUTS[name], url, "wrong-token")
        assert proc.returncode == 0 and "does not accept this token" in proc.stdout, proc
    proc = run_bridge(INPUTS["Stop"], url, "wrong-token")
    assert (proc.returncode, proc.stdout) == (1, "") and "answered 401" in proc.stderr, proc
    # A tool call's input that is not Claude Code's: the gateway's denial, printed as it came.
    proc = run_bridge('{"hook_event_name": "PreToolUse"}', url, gateway.token)
    assert proc.returncode == 0, proc
    decision = json.loads(proc.stdout)["hookSpecificOutput"]
    assert decision["permissionDecision"] == "deny", proc
    assert "missing required field `session_id`" in decision["permissionDecisionReason"], proc
    # Any other event's: the gateway's 400, a non-blocking error.
    proc = run_bridge('{"hook_event_name": "Stop"}', url, gateway.token)
    assert proc.returncode == 1 and "answered 400" in proc.stderr, proc


def test_the_bridge_imports_nothing_heavy() -> None:
    """What keeps it fast to start: only os, sys and the C socket module, no site-packages."""
    code = (
        f"import sys; sys.path.insert(0, {str(ROOT)!r}); before = set(sys.modules); "
        "import workers.integrations.claude_code_bridge; "
        "print(' '.join(sorted(set(sys.modules) - before)))"
    )
    proc = subprocess.run(
        [sys.executable, "-I", "-S", "-c", code], cwd=ROOT, capture_output=True, text=True,
        timeout=30, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    imported = set(proc.stdout.split())
    tops = {name.split(".")[0] for name in imported} - {"workers"}
    assert tops <= set(sys.stdlib_module_names), tops - set(sys.stdlib_module_names)
    assert "_socket" in imported, imported
    heavy = {"socket", "json", "re", "enum", "selectors", "urllib", "http", "ssl", "asyncio"}
    assert not tops & heavy, tops & heavy


def test_url_and_response_parsing() -> None:
    assert bridge.split_url("http://gw:9000") == ("gw", 9000, "")
    assert bridge.split_url("http://gw") == ("gw", 80, "")
    assert bridge.split_url("http://[::1]:8787/hooks/") == ("::1", 8787, "/hooks")
    for bad in ("https://gw", "gw:80", "http://:80", "http://gw:x"):
        with pytest.raises(bridge.Failed):
            bridge.split_url(bad)
    assert bridge.event_name(b'{"a": 1, "hook_event_name" : "Stop"}') == "Stop"
    assert bridge.event_name(b'{"hook_event_name": 3}') == ""
    plain = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}"
    assert bridge.parse_response(plain) == (200, b"{}")
    chunked = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1\r\n{\r\n1\r\n}\r\n0\r\n\r\n"
    assert bridge.parse_response(chunked) == (200, b"{}")
    for broken in (b"", b"garbage", b"HTTP/1.1 200 OK\r\ncontent-length: 9\r\n\r\n{}",
                   b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\n{}"):  # fmt: skip
        with pytest.raises(bridge.Failed):
            bridge.parse_response(broken)
