"""Clients in other languages, built from docs/protocol.md alone, against real processes.

A real Redis (``bus_settings``), real hook services (``hookbus worker``) and the coordinator
service (``hookbus coordinator``) answer:

* the Node.js client (``examples/node``): the conformance vectors' decisions, all 12 events on
  ``{p}:events``, error replies naming the offending field;
* the shell client (``examples/shell/pretooluse.sh``, redis-cli only).

Nothing here is skipped: without ``node`` or the client's npm dependencies the tests fail and
say how to install them (``make node-deps``).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from redis import Redis

from bus import Block, HookEvent, Override, PermissionDecision
from bus.events import session_of
from bus.keys import Keys
from bus.protocol import EventMessage, decode, decode_context, new_id, now_ms
from bus.settings import BusSettings
from tests.harness import Processes, worker_env
from tests.remote_hooks import HookConfig
from tests.test_conformance import VECTOR_FILES, load_vector, mismatches, vector_hooks

ROOT = Path(__file__).resolve().parent.parent
NODE_DIR = ROOT / "examples" / "node"
NODE_CLI = NODE_DIR / "cli.mjs"
SHELL_CLIENT = ROOT / "examples" / "shell" / "pretooluse.sh"
HEX_ID = re.compile(r"^[0-9a-f]{32}$")
READY_SECS = 30.0  # how long the coordinator service may take to see freshly started hooks

BLOCKER = HookConfig(
    name="Guard",
    events=[HookEvent.PRE_TOOL_USE],
    names=["file_*"],
    answers={"PreToolUse": Block(reason=".env files hold secrets")},
)


def node() -> str:
    path = shutil.which("node")
    if path is None:
        pytest.fail("node is not on PATH: the Node.js client tests need Node.js >= 20")
    if not (NODE_DIR / "node_modules" / "redis" / "package.json").is_file():
        pytest.fail(
            "examples/node/node_modules is missing: run `make node-deps` "
            "(npm ci --prefix examples/node --no-audit --no-fund)"
        )
    return path


def run_node(settings: BusSettings, *args: str, timeout: float = 60) -> list[dict[str, Any]]:
    """Run the Node client's CLI; its JSON lines."""
    command = [node(), str(NODE_CLI), "--url", settings.redis_url, "--prefix", settings.prefix]
    proc = subprocess.run(
        [*command, *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout, check=False
    )
    assert proc.returncode == 0, f"node cli.mjs {args} exited {proc.returncode}: {proc.stderr}"
    return [json.loads(line) for line in proc.stdout.splitlines() if line.strip()]


def decisions(lines: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [line["reply"] for line in lines if line["kind"] == "decision"]


def start_services(procs: Processes, settings: BusSettings, *hooks: HookConfig) -> None:
    """The hooks as worker processes and one coordinator service; wait until the hooks are live."""
    for hook in hooks:
        procs.scripted(settings, hook)
    procs.start(["coordinator"], worker_env(settings, HOOKBUS_REFRESH_SECS="0.2"), "coordinator")
    keys = Keys(settings.prefix)
    with Redis.from_url(settings.redis_url) as redis:
        deadline = time.monotonic() + READY_SECS
        while not all(redis.zcard(keys.replicas(h.name)) for h in hooks):
            assert time.monotonic() < deadline, f"hooks did not register:\n{procs.logs()}"
            time.sleep(0.05)


def check_envelope(reply: dict[str, Any]) -> None:
    assert reply["v"] == 1 and HEX_ID.match(reply["id"]), reply
    assert isinstance(reply["ts"], int) and abs(reply["ts"] - now_ms()) < 60_000, reply
    assert HEX_ID.match(reply["request_id"]), reply


# -- Node.js: the conformance vectors --------------------------------------------------------


@pytest.mark.parametrize("path", VECTOR_FILES, ids=lambda p: p.stem)
def test_node_client_decisions_match_the_vectors(
    bus_settings: BusSettings, procs: Processes, path: Path
) -> None:
    vector = load_vector(path)
    start_services(procs, bus_settings, *vector_hooks(vector))
    # The service's directory may lag the hooks' registration by a refresh: ask again until
    # the expected decision arrives, within a deadline.
    deadline = time.monotonic() + READY_SECS
    while True:
        lines = run_node(bus_settings, "--timeout-ms", "10000", "vector", str(path))
        assert [(line["kind"], line["vector"]) for line in lines] == [("decision", path.stem)]
        reply = lines[0]["reply"]
        problems = mismatches(vector["expect"], reply["result"] or {})
        if reply["status"] == "ok" and not problems:
            break
        if time.monotonic() > deadline:
            pytest.fail(f"{path.name}: {problems or reply}\n{procs.logs()}")
        time.sleep(0.2)
    check_envelope(reply)
    assert (reply["event"], reply["error"], reply["field"]) == (vector["event"], "", "")


# -- Node.js: events ---------------------------------------------------------------------------


def test_node_client_emits_all_12_events(bus_settings: BusSettings, procs: Processes) -> None:
    start_services(procs, bus_settings)
    session = f"node-{new_id()[:8]}"
    lines = run_node(bus_settings, "--session", session, "scenario")

    emitted = [line for line in lines if line["kind"] == "emitted"]
    assert [line["event"] for line in emitted] == [e.value for e in HookEvent]  # all 12, in order
    replies = decisions(lines)
    assert [r["event"] for r in replies] == ["PreToolUse", "PermissionRequest"]
    for reply in replies:
        check_envelope(reply)
        assert reply["status"] == "ok", reply
    # No hooks: the defaults of section 5.3.
    assert replies[0]["result"]["action"] == {"type": "Continue"}
    assert replies[0]["result"]["final_args"] == {"path": "app/.env"}
    assert replies[1]["result"]["overridden_by"] is None

    with Redis.from_url(bus_settings.redis_url) as redis:
        entries = redis.xrange(Keys(bus_settings.prefix).events)
    by_source: dict[str, list[EventMessage]] = {}
    for entry_id, fields in entries:
        message = decode(fields[b"data"], EventMessage)  # what an async hook service checks
        ctx = decode_context(message.event, message.context)
        by_source.setdefault(message.source, []).append(message)
        if message.source == "node-example":
            assert message.session_id == session and message.v == 1, message
            assert HEX_ID.match(message.id) and abs(message.ts - now_ms()) < 60_000, message
            assert message.traceparent == "" and message.tracestate == ""
            assert session_of(ctx) == session, ctx
            assert entry_id.decode() in {line["entry"] for line in emitted}
    ours = by_source.get("node-example", [])
    assert [m.event for m in ours] == list(HookEvent), [m.event for m in ours]
    assert [m.id for m in ours] == [line["id"] for line in emitted]
    # The two decisions were published by the service itself (protocol.md, 6.1).
    service = by_source.get("coordinator-service", [])
    assert [m.event.value for m in service] == ["PreToolUse", "PermissionRequest"]


# -- errors ------------------------------------------------------------------------------------


def test_schema_violations_get_error_replies_naming_the_field(
    bus_settings: BusSettings, procs: Processes
) -> None:
    start_services(procs, bus_settings)
    keys = Keys(bus_settings.prefix)
    # A raw foreign message (any language), straight onto the stream.
    bad = {
        "v": 1, "id": "bad-1", "ts": now_ms(), "event": "PreToolUse",
        "context": {"session_id": "s1", "tool_name": 42}, "reply_to": keys.inbox("raw-client"),
    }  # fmt: skip
    with Redis.from_url(bus_settings.redis_url, socket_timeout=30) as redis:
        redis.xadd(keys.decisions, {"data": json.dumps(bad)})
        popped = redis.blpop([keys.inbox("raw-client")], timeout=15)
    assert popped is not None, f"no error reply from the coordinator service\n{procs.logs()}"
    reply = json.loads(popped[1])
    assert reply["status"] == "error" and reply["field"] == "$.context.tool_name", reply
    assert (reply["request_id"], reply["event"], reply["result"]) == ("bad-1", None, None)

    # The same from the Node client, which sends contexts exactly as given.
    (reply,) = decisions(
        run_node(bus_settings, "decide", "PreToolUse", '{"session_id":"s1","tool_name":42}')
    )
    check_envelope(reply)
    assert reply["status"] == "error" and reply["field"] == "$.context.tool_name", reply
    assert "tool_name" in reply["error"] and reply["event"] is None and reply["result"] is None
    (reply,) = decisions(run_node(bus_settings, "decide", "PreToolCall", '{"session_id":"s1"}'))
    assert reply["status"] == "error" and reply["field"] == "$.event", reply
    (reply,) = decisions(run_node(bus_settings, "decide", "PreToolUse", '{"session_id":"s1"}'))
    assert reply["status"] == "error" and reply["field"] == "$.context", reply
    assert "`tool_name`" in reply["error"], reply


def test_node_client_gets_a_refusal_for_a_context_no_hook_can_inspect(
    bus_settings: BusSettings, procs: Processes
) -> None:
    """Tool arguments nested 1,000 levels deep (far below what breaks JSON.stringify): the
    service decides without any hook — Block, Deny — although its only hook would allow all."""
    allow = Override(decision=PermissionDecision.ALLOW, reason="fine")
    start_services(
        procs, bus_settings, HookConfig(name="Allower", answers={"PermissionRequest": allow})
    )
    deep = '{"a":' * 999 + "{}" + "}" * 999
    context = f'{{"session_id":"s1","tool_name":"act","tool_args":{deep}}}'
    (reply,) = decisions(run_node(bus_settings, "decide", "PreToolUse", context))
    check_envelope(reply)
    assert (reply["status"], reply["event"]) == ("ok", "PreToolUse"), reply
    action = reply["result"]["action"]
    assert action["type"] == "Block" and "(MAX_DEPTH)" in action["reason"], reply
    assert [e["hook_name"] for e in reply["result"]["blocking_errors"]] == ["HookBus"]
    (reply,) = decisions(run_node(bus_settings, "decide", "PermissionRequest", context))
    assert reply["result"]["action"]["decision"] == "Deny", reply
    assert reply["result"]["overridden_by"] == "HookBus", reply
    # 10,000 levels: JSON.stringify throws before anything is sent (the README says so).
    keys = Keys(bus_settings.prefix)
    with Redis.from_url(bus_settings.redis_url) as redis:
        sent = redis.xlen(keys.decisions)
        deeper = '{"a":' * 9_999 + "{}" + "}" * 9_999
        command = [node(), str(NODE_CLI), "--url", bus_settings.redis_url, "--prefix",
                   bus_settings.prefix, "decide", "PreToolUse",
                   f'{{"session_id":"s1","tool_name":"act","tool_args":{deeper}}}']  # fmt: skip
        proc = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=60)
        assert proc.returncode == 1 and "call stack" in proc.stderr, proc
        assert redis.xlen(keys.decisions) == sent


# -- shell (redis-cli only) --------------------------------------------------------------------


def run_shell(settings: BusSettings, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    if shutil.which("redis-cli") is None:
        pytest.fail("redis-cli is not on PATH: the shell client needs it (it ships with Redis)")
    environ = {**os.environ, "REDIS_URL": settings.redis_url, "PREFIX": settings.prefix, **env}
    return subprocess.run(
        ["bash", str(SHELL_CLIENT), *args],
        cwd=ROOT,
        env=environ,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_shell_client_pre_tool_use_round_trip(bus_settings: BusSettings, procs: Processes) -> None:
    start_services(procs, bus_settings, BLOCKER)
    deadline = time.monotonic() + READY_SECS
    while True:
        proc = run_shell(bus_settings, "file_read", '{"path":"app/.env"}', SESSION_ID="sh-1")
        assert proc.returncode == 0, (proc.returncode, proc.stdout, proc.stderr)
        reply = json.loads(proc.stdout)
        if reply["result"]["action"]["type"] == "Block":
            break
        assert time.monotonic() < deadline, f"{reply}\n{procs.logs()}"
        time.sleep(0.2)
    check_envelope(reply)
    assert reply["event"] == "PreToolUse" and reply["status"] == "ok", reply
    assert reply["result"]["action"] == {"type": "Block", "reason": ".env files hold secrets"}
    assert reply["result"]["blocking_errors"] == [
        {"hook_name": "Guard", "reason": ".env files hold secrets"}
    ]
    assert reply["result"]["final_args"] == {"path": "app/.env"}

    # A tool the hook does not match: Continue.
    proc = run_shell(bus_settings, "run_shell", '{"command":"ls"}')
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["result"]["action"] == {"type": "Continue"}
    # A schema violation: an error reply (exit 1) naming the field.
    proc = run_shell(bus_settings, "file_read", '"not an object"')
    assert proc.returncode == 1, (proc.stdout, proc.stderr)
    assert json.loads(proc.stdout)["field"] == "$.context.tool_args"


def test_shell_client_fails_on_timeout(bus_settings: BusSettings) -> None:
    # Nobody serves this prefix: no reply, exit status 2 after TIMEOUT_MS + 1 s.
    t0 = time.monotonic()
    proc = run_shell(bus_settings, TIMEOUT_MS="300")
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    assert proc.stdout == "" and "no DecisionReply" in proc.stderr
    assert time.monotonic() - t0 < 10
