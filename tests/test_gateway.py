"""``hookbus gateway``: decisions over HTTP, against real processes.

A real Redis, real hook services (``hookbus worker``) and the gateway (``hookbus gateway``, on
uvicorn) answer plain HTTP requests (``http.client``); Claude Code's inputs and the gateway's
outputs are checked against the schemas made from ``@anthropic-ai/claude-agent-sdk``.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from redis import Redis

from bus import HookEvent
from bus.protocol import AuditRecord, EventMessage, decode, new_id, now_ms
from bus.settings import BusSettings
from bus.transport.coordinator import Coordinator
from bus.transport.keys import Keys
from tests.claude_code_types import INPUTS, ROOT, check_output, pre_tool_use
from tests.harness import Processes, until, worker_env
from workers.local.redis_server import RedisServer, free_port
from workers.services.gateway import Gateway, Tokens, digest


@dataclass
class Running:
    """A gateway process: where it listens and a token it accepts."""

    port: int
    token: str
    tokens: Path
    proc: subprocess.Popen[bytes]

    def post(self, path: str, body: Any, token: str | None = "", **headers: str) -> Any:
        return post(self.port, path, body, self.token if token == "" else token, **headers)


def post(port: int, path: str, body: Any, token: str | None, **headers: str) -> Any:
    """(status, decoded JSON body, response headers) of one POST."""
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    sent = {"Content-Type": "application/json", **headers}
    if token is not None:
        sent["Authorization"] = f"Bearer {token}"
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request("POST", path, data, sent)
        response = conn.getresponse()
        return response.status, json.loads(response.read() or b"null"), dict(response.headers)
    finally:
        conn.close()


def get(port: int, path: str) -> tuple[int, Any]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        return response.status, json.loads(response.read())
    finally:
        conn.close()


def hookbus(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "workers.cli", *args],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


def new_token(tokens: Path, tenant: str, settings: BusSettings | None = None) -> str:
    """A new token for ``tenant`` in the file ``tokens``; with ``settings``, ``--new-token``
    also makes ``tenant`` one that bus serves (without, it finds no Redis: the token only)."""
    url = settings.redis_url if settings else f"redis://127.0.0.1:{free_port()}/0"
    env = worker_env(settings) if settings else {**os.environ, "HOOKBUS_REDIS_URL": url}
    proc = hookbus("gateway", "--new-token", tenant, "--tokens", str(tokens), env=env)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


def live(settings: BusSettings, *hooks: str) -> None:
    """Wait until each hook service has a live replica."""
    keys = Keys(settings.prefix)
    with Redis.from_url(settings.redis_url) as redis:
        until(lambda: all(redis.zcard(keys.replicas(h)) for h in hooks), f"hooks {hooks} live")


def start_gateway(
    procs: Processes, settings: BusSettings, tmp_path: Path, *args: str, tenant: str = "laptop"
) -> Running:
    """A gateway on a free port, with a token for ``tenant``; once /healthz answers 200 (by then
    it has read the hook directory: its coordinator starts before it listens)."""
    tokens = tmp_path / "tokens"
    token = new_token(tokens, tenant, settings)
    port = free_port()
    env = worker_env(settings, HOOKBUS_REFRESH_SECS="0.2")
    proc = procs.start(
        ["gateway", "--tokens", str(tokens), "--port", str(port), *args], env, "gateway"
    )

    def up() -> bool:
        assert proc.poll() is None, f"the gateway exited:\n{procs.logs()}"
        try:
            return get(port, "/healthz")[0] == 200
        except OSError:
            return False

    until(up, "the gateway to answer /healthz", explain=procs.logs)
    return Running(port, token, tokens, proc)


def published_once(
    settings: BusSettings, done: Callable[[list[EventMessage]], bool], what: str
) -> list[EventMessage]:
    """The events published so far, once ``done`` holds of them: a coordinator publishes a
    dispatch's event after it answers, so it may not be there the moment the answer is."""

    def ready() -> list[EventMessage] | None:
        found = events_of(settings)
        return found if done(found) else None

    return list(until(ready, what))


def events_of(settings: BusSettings) -> list[EventMessage]:
    with Redis.from_url(settings.redis_url) as redis:
        entries = redis.xrange(Keys(settings.prefix).event_partitions[0])
    return [decode(fields[b"data"], EventMessage) for _, fields in entries]


# -- Claude Code over HTTP -------------------------------------------------------------------


def test_secret_guard_denies_claude_code_reading_env_over_http(
    bus_settings: BusSettings, procs: Processes, tmp_path: Path
) -> None:
    procs.worker(bus_settings, "workers.builtins.demo_hooks:SecretGuard", "guard")
    live(bus_settings, "SecretGuard")
    gateway = start_gateway(procs, bus_settings, tmp_path)

    message = pre_tool_use("Read", {"file_path": "/work/app/.env"}, session="cc-http-1")
    status, out, _ = gateway.post("/claude-code", message)
    assert status == 200, out
    check_output(out)
    assert out == {
        "hookSpecificOutput": {
            "hookEventName": "PreToolUse",
            "permissionDecision": "deny",
            "permissionDecisionReason": "SecretGuard: .env files hold secrets; Read on them is "
            "not allowed",
        }
    }
    # Another file: no opinion. An event without counterpart: no opinion either.
    status, out, _ = gateway.post("/claude-code", pre_tool_use("Read", {"file_path": "a.py"}))
    assert (status, out) == (200, {})
    prompt = {**INPUTS["Stop"], "hook_event_name": "UserPromptSubmit", "prompt": "hi"}
    assert gateway.post("/claude-code", prompt)[:2] == (200, {})

    # The dispatch was published like any other: its session inside the tenant's namespace,
    # its source the token's tenant.
    events = published_once(
        bus_settings, lambda es: any(m.session_id == "laptop/cc-http-1" for m in es), "the event"
    )
    ours = [m for m in events if m.session_id == "laptop/cc-http-1"]
    assert [(m.event, m.source) for m in ours] == [(HookEvent.PRE_TOOL_USE, "tenant:laptop")]


def test_every_mapped_event_is_answered_in_claude_codes_format(
    bus_settings: BusSettings, procs: Processes, tmp_path: Path
) -> None:
    for target in ("SecretGuard", "Redactor", "ShellPolicy", "FailureAdvisor"):
        procs.worker(bus_settings, f"workers.builtins.demo_hooks:{target}", target)
    live(bus_settings, "SecretGuard", "Redactor", "ShellPolicy", "FailureAdvisor")
    gateway = start_gateway(procs, bus_settings, tmp_path)
    answers = {}
    for name, message in INPUTS.items():
        status, out, _ = gateway.post("/claude-code", message)
        assert status == 200, (name, out)
        check_output(out)
        answers[name] = out
    assert answers["PreToolUse"]["hookSpecificOutput"]["permissionDecision"] == "deny"
    post = answers["PostToolUse"]["hookSpecificOutput"]
    assert post["updatedToolOutput"] == "API_KEY=[redacted] HOME=/root"
    assert answers["PermissionRequest"]["hookSpecificOutput"]["decision"] == {"behavior": "allow"}
    assert "Try search_corpus" in answers["PostToolUseFailure"]["hookSpecificOutput"][
        "additionalContext"]  # fmt: skip
    for name in ("SessionStart", "SessionEnd", "Stop", "SubagentStart", "SubagentStop",
                 "PreCompact", "PostCompact", "PermissionDenied"):  # fmt: skip
        assert answers[name] == {}, name
    events = published_once(
        bus_settings, lambda es: len({m.event for m in es}) == len(HookEvent), "12 kinds"
    )
    published = {m.event for m in events if m.source == "tenant:laptop"}
    assert published == set(HookEvent)  # all 12, each from its Claude Code counterpart


def test_a_cancelled_session_stops_claude_code(
    bus_settings: BusSettings, procs: Processes, tmp_path: Path
) -> None:
    procs.worker(bus_settings, "workers.builtins.cancellation:RedisCancellationHook", "cancel")
    live(bus_settings, "CancellationHook")
    gateway = start_gateway(procs, bus_settings, tmp_path)
    bash = pre_tool_use("Bash", {"command": "ls"}, session="cc-cancel")
    assert gateway.post("/claude-code", bash)[:2] == (200, {})
    proc = hookbus("cancel", "laptop/cc-cancel", env=worker_env(bus_settings))
    assert proc.returncode == 0, proc.stderr
    status, out, _ = gateway.post("/claude-code", bash)
    check_output(out)
    assert (status, out["continue"]) == (200, False), out
    assert out["stopReason"] == "session laptop/cc-cancel was cancelled by the user"
    # Another session goes on.
    other = pre_tool_use("Bash", {"command": "ls"}, session="cc-other")
    assert gateway.post("/claude-code", other)[:2] == (200, {})


# -- /v1/decisions: the protocol's JSON --------------------------------------------------------


def decision_request(**fields: Any) -> dict[str, Any]:
    return {
        "v": 3, "id": f"req-{new_id()[:6]}", "ts": now_ms(), "event": "PreToolUse",
        "context": {"session_id": "s-http", "tool_name": "file_read",
                    "tool_args": {"path": "app/.env"}},
        "timeout_ms": 5000, **fields,
    }  # fmt: skip


def test_decisions_endpoint_answers_like_the_coordinator_service(
    bus_settings: BusSettings, procs: Processes, tmp_path: Path
) -> None:
    procs.worker(bus_settings, "workers.builtins.demo_hooks:SecretGuard", "guard")
    live(bus_settings, "SecretGuard")
    gateway = start_gateway(procs, bus_settings, tmp_path)
    request = decision_request(reply_to="hookbus:inbox:ignored")
    status, reply, headers = gateway.post("/v1/decisions", request)
    assert status == 200 and headers["content-type"] == "application/json", reply
    assert (reply["v"], reply["request_id"], reply["event"], reply["status"]) == (
        3, request["id"], "PreToolUse", "ok")  # fmt: skip
    assert reply["result"]["action"] == {
        "type": "Block",
        "reason": ".env files hold secrets; file_read on them is not allowed",
    }
    assert reply["result"]["blocking_errors"][0]["hook_name"] == "SecretGuard"
    # id and ts may be left out; reply_to is not needed.
    bare = {"event": "PreToolUse", "context": {"session_id": "s", "tool_name": "run_shell"}}
    status, reply, _ = gateway.post("/v1/decisions", bare)
    assert status == 200 and reply["result"]["action"] == {"type": "Continue"}, reply
    assert len(reply["request_id"]) == 32


@pytest.mark.parametrize(
    ("body", "field", "text"),
    [
        (b'{"event": "PreToolUse", ', "", "malformed"),
        (json.dumps(decision_request(event="PreToolCall")).encode(), "$.event", "PreToolCall"),
        (json.dumps(decision_request(context={"session_id": "s", "tool_name": 3})).encode(),
         "$.context.tool_name", "Expected `str`, got `int`"),
        (json.dumps(decision_request(v=4)).encode(), "$.v", "protocol version 4"),
    ],
    ids=["not-json", "unknown-event", "wrong-type", "version"],
)  # fmt: skip
def test_bad_requests_get_400_naming_the_field(
    bus_settings: BusSettings, procs: Processes, tmp_path: Path, body: bytes, field: str, text: str
) -> None:
    gateway = start_gateway(procs, bus_settings, tmp_path)
    status, reply, _ = gateway.post("/v1/decisions", body)
    assert status == 400, reply
    assert (reply["status"], reply["field"], reply["result"]) == ("error", field, None), reply
    assert text in reply["error"], reply
    if field:
        assert reply["request_id"] == json.loads(body)["id"]
    # Claude Code's endpoint: the same, in its own words, for an event that gates nothing.
    status, out, _ = gateway.post("/claude-code", {**INPUTS["SessionStart"], "session_id": 3})
    assert (status, out["field"]) == (400, "$.session_id"), out
    assert gateway.post("/claude-code", b"{oops")[0] == 400
    # A tool call's input HookBus cannot read is denied, with 200: Claude Code runs the tool
    # on any other status.
    status, out, _ = gateway.post("/claude-code", {**INPUTS["PreToolUse"], "tool_name": 3})
    assert status == 200, out
    check_output(out)
    decision = out["hookSpecificOutput"]
    assert decision["permissionDecision"] == "deny", out
    assert "$.tool_name" in decision["permissionDecisionReason"], out


def test_deadlines_sizes_and_credentials(
    bus_settings: BusSettings, procs: Processes, tmp_path: Path
) -> None:
    gateway = start_gateway(procs, bus_settings, tmp_path, "--max-body", "4096")
    # A request whose deadline has passed: 504, nothing dispatched.
    late = decision_request(ts=now_ms() - 10_000, timeout_ms=5_000)
    status, reply, _ = gateway.post("/v1/decisions", late)
    assert (status, reply["status"], reply["request_id"]) == (504, "error", late["id"]), reply
    assert reply["error"] == "no decision within timeout_ms=5000"
    assert not [m for m in events_of(bus_settings) if m.session_id.endswith("s-http")]
    # Too large, declared or not: 413 (the body is read no further).
    huge = decision_request(context={"session_id": "s", "tool_name": "t", "tool_args":
                                     {"blob": "x" * 5000}})  # fmt: skip
    status, reply, _ = gateway.post("/v1/decisions", huge)
    assert (status, reply["status"]) == (413, "error") and "4096-byte limit" in reply["error"]
    status, out, _ = gateway.post("/claude-code", {**INPUTS["SessionStart"], "x": "y" * 5000})
    assert status == 413 and "4096-byte limit" in out["error"], out
    # A tool call's, though, is denied with 200 (Claude Code runs the tool on any other status).
    status, out, _ = gateway.post("/claude-code", {**INPUTS["PreToolUse"], "x": "y" * 5000})
    assert status == 200 and out["hookSpecificOutput"]["permissionDecision"] == "deny", out
    assert "4096-byte limit" in out["hookSpecificOutput"]["permissionDecisionReason"], out
    # A Claude Code tool call with no token or a wrong one: denied with 200, naming why
    # (Claude Code would run the tool on a 401); nothing is dispatched.
    for token in (None, "not-the-token"):
        status, out, _ = gateway.post("/claude-code", INPUTS["PreToolUse"], token)
        assert status == 200 and out["hookSpecificOutput"]["permissionDecision"] == "deny", out
    # No token, a wrong one, another scheme: 401, with a challenge.
    for token, extra in [(None, {}), ("not-the-token", {}),
                         (None, {"Authorization": f"Basic {gateway.token}"})]:  # fmt: skip
        for path in ("/v1/decisions", "/claude-code"):
            status, reply, headers = gateway.post(path, decision_request(), token, **extra)
            assert status == 401, (path, reply)
            assert headers["www-authenticate"] == 'Bearer realm="hookbus"'
    assert not [m for m in events_of(bus_settings) if m.session_id.endswith("s-http")]


def nested(levels: int) -> Any:
    value: Any = "rm -rf /"
    for _ in range(levels):
        value = [value]
    return value


def test_input_no_hook_can_inspect_is_refused_with_200_never_left_to_claude_code(
    bus_settings: BusSettings, procs: Processes, tmp_path: Path
) -> None:
    """The LLM writes a tool call's input and what a tool returns, and can make them too deep,
    too large or not decodable. Claude Code runs the tool on any answer but a 2xx, so each such
    call, posted with the tenant's own token, is denied (or its output withheld) with 200, by
    HookBus, naming why; nothing of it is dispatched. /v1/decisions answers an uninspectable
    context with the coordinator service's refusal, not an error."""
    gateway = start_gateway(procs, bus_settings, tmp_path)
    pre = {k: v for k, v in INPUTS["PreToolUse"].items() if k != "tool_input"}
    assert gateway.post("/claude-code", {**pre, "tool_input": {"command": "ls"}})[:2] == (200, {})
    surrogate = json.dumps({**pre, "tool_input": {"command": "rm -rf / #"}}).encode()
    # tool_input written before hook_event_name, naming another event inside it.
    first = {"tool_input": {"hook_event_name": "PostCompact", "d": nested(70)}, **pre}
    attacks = {
        "nested 70 levels (a context over 64)": {**pre, "tool_input": {"d": nested(70)}},
        "nested 130 levels (a message over 128)": {**pre, "tool_input": {"d": nested(130)}},
        "a 1.04 MB context in a body under 1 MiB": {**pre, "tool_input": {"p": "A" * 1_040_000}},
        "a body over 1 MiB": {**pre, "tool_input": {"p": "A" * 1_100_000}},
        "a lone surrogate": surrogate.replace(b"#", b"\\ud800"),
        "another event named inside tool_input": first,
    }
    for what, body in attacks.items():
        status, out, _ = gateway.post("/claude-code", body)
        assert status == 200, (what, out)
        check_output(out)
        decision = out["hookSpecificOutput"]
        assert decision["permissionDecision"] == "deny", (what, out)
        assert decision["permissionDecisionReason"].startswith("HookBus: input refused"), out
    permission = {**INPUTS["PermissionRequest"], "tool_input": {"d": nested(70)}}
    status, out, _ = gateway.post("/claude-code", permission)
    assert status == 200 and out["hookSpecificOutput"]["decision"]["behavior"] == "deny", out
    # The LLM's tool_input names a tool-gating event: the answer is still PostToolUse's.
    output = {**INPUTS["PostToolUse"], "tool_input": {"hook_event_name": "PreToolUse"},
              "tool_response": {"stdout": "A" * 1_040_000}}  # fmt: skip
    status, out, _ = gateway.post("/claude-code", output)
    assert status == 200 and out["decision"] == "block", out
    assert out["hookSpecificOutput"]["updatedToolOutput"].startswith("[output withheld by HookBus")
    check_output(out)

    deep = decision_request(context={"session_id": "s", "tool_name": "Bash",
                                     "tool_args": {"d": nested(70)}})  # fmt: skip
    status, reply, _ = gateway.post("/v1/decisions", deep)
    assert (status, reply["status"], reply["request_id"]) == (200, "ok", deep["id"]), reply
    assert reply["result"]["action"]["type"] == "Block", reply
    assert reply["result"]["blocking_errors"][0]["hook_name"] == "HookBus", reply
    assert get(gateway.port, "/healthz")[1]["stats"]["refused"] == len(attacks) + 3
    events = published_once(
        bus_settings, lambda es: any(m.event is HookEvent.PRE_TOOL_USE for m in es), "the event"
    )
    published = [m.event for m in events]
    assert published.count(HookEvent.PRE_TOOL_USE) == 1  # the readable one only
    assert (
        HookEvent.POST_TOOL_USE not in published and HookEvent.PERMISSION_REQUEST not in published
    )


def test_the_tenant_comes_from_the_token_never_the_body(
    bus_settings: BusSettings, procs: Processes, tmp_path: Path
) -> None:
    tokens = tmp_path / "tokens"
    mallory = new_token(tokens, "mallory", bus_settings)  # the attacker's own, valid credential
    gateway = start_gateway(procs, bus_settings, tmp_path, tenant="acme")
    assert gateway.tokens == tokens
    # Mallory claims to be acme in every way a request allows.
    forged = decision_request(source="tenant:acme", tenant="acme")
    forged["context"]["session_id"] = "s-forged"
    status, reply, _ = gateway.post("/v1/decisions", forged, mallory, **{"X-Tenant": "acme"})
    assert status == 200, reply
    claude = {**pre_tool_use("Bash", {"command": "ls"}, "s-forged"), "source": "tenant:acme"}
    assert gateway.post("/claude-code", claude, mallory, **{"X-Tenant": "acme"})[0] == 200
    events = published_once(bus_settings, lambda es: len(es) >= 2, "2 events")
    assert [(m.session_id, m.source) for m in events] == [
        ("mallory/s-forged", "tenant:mallory")
    ] * 2


def test_health_follows_redis(procs: Processes, tmp_path: Path) -> None:
    with RedisServer() as server:
        settings = BusSettings(redis_url=server.url, prefix=f"t{new_id()[:8]}")
        gateway = start_gateway(procs, settings, tmp_path)
        status, health = get(gateway.port, "/healthz")
        assert (status, health["status"]) == (200, "ok"), health
        check = hookbus("gateway", "--check", "--port", str(gateway.port))
        assert check.returncode == 0 and check.stdout.startswith("ok:"), check
        server.stop()
        status, health = get(gateway.port, "/healthz")
        assert (status, health["status"]) == (503, "unavailable"), health
        check = hookbus("gateway", "--check", "--port", str(gateway.port))
        assert check.returncode == 1 and "503" in check.stdout, check
        # SIGTERM: a clean stop (exit 0), counters logged.
        gateway.proc.terminate()
        assert gateway.proc.wait(30) == 0, procs.logs()
        assert "gateway stopped: {'decisions': 0" in procs.logs()
    unused = free_port()
    check = hookbus("gateway", "--check", "--port", str(unused))
    assert check.returncode == 1 and "no gateway answers" in check.stdout, check


@pytest.mark.parametrize(
    ("content", "said"),
    [
        (None, "cannot read the token file"),
        ("", "holds no token"),
        ("laptop\n", ":1: expected `tenant:sha256hex`"),
        (f"# ops\nok:{digest('x')}\nbad tenant:{digest('y')}\n", ":3: expected"),
    ],
    ids=["missing", "empty", "no-digest", "bad-tenant"],
)
def test_a_bad_token_file_stops_the_gateway_with_one_line(
    tmp_path: Path, content: str | None, said: str
) -> None:
    path = tmp_path / "tokens"
    if content is not None:
        path.write_text(content)
    proc = hookbus("gateway", "--tokens", str(path), "--port", str(free_port()))
    assert proc.returncode == 2, proc
    assert said in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert hookbus("gateway", "--port", "1").stderr.startswith("hookbus: the gateway needs a token")


def test_tokens_are_stored_hashed_and_compared_whole(tmp_path: Path) -> None:
    path = tmp_path / "tokens"
    token = new_token(path, "laptop")
    assert path.stat().st_mode & 0o777 == 0o600
    assert path.read_text() == f"laptop:{digest(token)}\n" and token not in path.read_text()
    tokens = Tokens.load(path)
    assert tokens.tenant(f"Bearer {token}") == "laptop"
    assert tokens.tenant(f"bearer   {token}") == "laptop"
    for wrong in (None, "", token, f"Bearer {token[:-1]}", f"Bearer {token}x", "Bearer ",
                  f"Token {token}"):  # fmt: skip
        assert tokens.tenant(wrong) is None, wrong


# -- a dispatch that overruns its deadline: fail closed where Claude Code waits ---------------


def overloaded(coordinator: Coordinator) -> None:
    """The coordinator of an overloaded service: each dispatch starts only after the event loop
    was held past any deadline (no hook is to blame, so none is skipped for it)."""
    run = coordinator.run

    async def held(event: HookEvent, ctx: Any) -> Any:
        time.sleep(0.1)  # blocks the loop: no timer of this dispatch can fire meanwhile
        await asyncio.sleep(0)
        return await run(event, ctx)

    coordinator.run = held  # type: ignore[method-assign]


async def test_claude_code_calls_fail_closed_when_no_decision_comes_in_time(
    bus_settings: BusSettings,
) -> None:
    async with Coordinator(bus_settings, source="gateway") as coordinator:
        overloaded(coordinator)
        gateway = Gateway(coordinator, Tokens((("t", b""),)), claude_timeout_ms=20)
        answer = await gateway.claude_code("t", json.dumps(INPUTS["PreToolUse"]).encode())
        out = json.loads(answer.body)
        check_output(out)
        assert answer.status == 200 and out["hookSpecificOutput"]["permissionDecision"] == "deny"
        assert "no decision within 20 ms; denied (fail closed)" in out["hookSpecificOutput"][
            "permissionDecisionReason"]  # fmt: skip
        # PostToolUse: the output no redactor saw in time is withheld, never shown (a 504
        # would be a non-blocking error to Claude Code, which then shows the original).
        post = {**INPUTS["PostToolUse"], "tool_response": "API_KEY=sk-live-123"}
        answer = await gateway.claude_code("t", json.dumps(post).encode())
        out = json.loads(answer.body)
        assert answer.status == 200, answer
        assert "sk-live" not in answer.body.decode(), out
        assert "no decision within 20 ms" in json.dumps(out), out
        assert gateway.stats["timed_out"] == 2 and gateway.stats["failed_closed"] == 2


def test_a_warn_mode_answer_reaches_claude_as_context_and_the_audit_trail_names_the_tenant(
    bus_settings: BusSettings, procs: Processes, tmp_path: Path
) -> None:
    procs.worker(bus_settings, "workers.builtins.demo_hooks:SecretGuard", "guard")
    live(bus_settings, "SecretGuard")
    proc = hookbus("hooks", "mode", "SecretGuard", "warn", env=worker_env(bus_settings))
    assert proc.returncode == 0, proc.stderr
    gateway = start_gateway(procs, bus_settings, tmp_path, tenant="team-a")
    status, out, _ = gateway.post("/claude-code", pre_tool_use("Read", {"file_path": ".env"}))
    assert status == 200, out
    check_output(out)
    assert out == {"hookSpecificOutput": {
        "hookEventName": "PreToolUse",
        "additionalContext": "[Hook: SecretGuard | PreToolUse] Warning: this hook would have "
        "blocked: .env files hold secrets; Read on them is not allowed",
    }}  # fmt: skip
    with Redis.from_url(bus_settings.redis_url) as redis:
        entries = redis.xrange(Keys(bus_settings.prefix).audit)
    added, record = [decode(fields[b"data"], AuditRecord) for _, fields in entries]
    assert (added.kind, added.mode, added.detail) == ("tenant", "add", "team-a")  # --new-token
    assert (record.kind, record.hook, record.mode, record.by) == (
        "shadowed", "SecretGuard", "warn", "tenant:team-a")  # fmt: skip


def test_a_token_reaches_only_its_own_tenants_sessions(
    bus_settings: BusSettings, procs: Processes, tmp_path: Path
) -> None:
    """The attack of issue 16, over HTTP: lift another tenant's cancellation by ending its
    session, with the attacker's own valid token."""
    procs.worker(bus_settings, "workers.builtins.cancellation:RedisCancellationHook", "cancel")
    live(bus_settings, "CancellationHook")
    tokens = tmp_path / "tokens"
    mallory = new_token(tokens, "mallory", bus_settings)
    gateway = start_gateway(procs, bus_settings, tmp_path, tenant="team-b")
    proc = hookbus("cancel", "team-b/victim", env=worker_env(bus_settings))
    assert proc.returncode == 0, proc.stderr
    bash = pre_tool_use("Bash", {"command": "ls"}, session="victim")
    assert gateway.post("/claude-code", bash)[1]["continue"] is False
    # Mallory ends the victim's session every way a session id can be written.
    for session in ("victim", "team-b/victim", "../team-b/victim"):
        end = {**INPUTS["SessionEnd"], "session_id": session}
        assert gateway.post("/claude-code", end, mallory)[:2] == (200, {})
        stop = decision_request(event="OnSessionStop", context={"session_id": session})
        status, reply, _ = gateway.post("/v1/decisions", stop, mallory)
        assert (status, reply["status"]) == (200, "ok"), reply
    # The victim's session is still cancelled; Mallory only ended sessions of her own.
    status, out, _ = gateway.post("/claude-code", bash)
    assert (status, out["continue"]) == (200, False), out
    stops = published_once(
        bus_settings,
        lambda es: sum(m.event == HookEvent.ON_SESSION_STOP for m in es) >= 6,  # 2 of each
        "6 session stops",
    )
    ended = {m.session_id for m in stops if m.event == HookEvent.ON_SESSION_STOP}
    assert ended == {"mallory/victim", "mallory/team-b/victim", "mallory/../team-b/victim"}


# -- issue 30, item 6: removed tenants, revoked tokens, a tenant's own cancel ---------------------


def answered(gateway: Running, token: str) -> int:
    """The status of one decision request (no hook: Continue) with ``token``."""
    return int(gateway.post("/v1/decisions", decision_request(), token)[0])


def within_2s(condition: Callable[[], bool], what: str, explain: Callable[[], str]) -> None:
    """``condition`` holds within the 2 s the gateway promises, counted from now."""
    until(condition, what, timeout=2.0, explain=explain)


def test_a_removed_tenant_and_a_revoked_token_get_401_within_2_s_without_a_restart(
    bus_settings: BusSettings, procs: Processes, tmp_path: Path
) -> None:
    """Each attack with the credential the attacker still holds: the token of a tenant the
    operator removed, and a token revoked from the token file, against the running gateway."""
    gateway = start_gateway(procs, bus_settings, tmp_path, tenant="laptop")
    # A token whose tenant the bus never served (written into the file by hand): refused.
    ghost = "ghost-token"
    with gateway.tokens.open("a") as f:
        f.write(f"ghost:{digest(ghost)}\n")
    acme = new_token(gateway.tokens, "acme", bus_settings)
    spare = new_token(gateway.tokens, "laptop", bus_settings)  # a second token of laptop
    within_2s(lambda: answered(gateway, acme) == 200 and answered(gateway, spare) == 200,
              "the new tokens to be read", procs.logs)  # fmt: skip
    status, reply, headers = gateway.post("/v1/decisions", decision_request(), ghost)
    assert status == 401 and "not served" in reply["error"], reply
    assert headers["www-authenticate"].startswith("Bearer")
    env = worker_env(bus_settings)

    removed = hookbus("tenants", "remove", "acme", env=env)
    assert removed.returncode == 0 and "acme removed" in removed.stdout, removed.stderr
    within_2s(lambda: answered(gateway, acme) == 401, "acme's token to get 401", procs.logs)
    cancel = post(gateway.port, "/v1/sessions/s1/cancel", {}, acme)
    assert cancel[0] == 401, cancel
    # Claude Code's http hooks run the tool on a 401: a tool call is denied with 200 instead.
    claude = gateway.post("/claude-code", pre_tool_use("Bash", {"command": "ls"}, "s1"), acme)
    decision = claude[1]["hookSpecificOutput"]
    assert claude[0] == 200 and decision["permissionDecision"] == "deny", claude
    assert "does not accept this token" in decision["permissionDecisionReason"], claude
    assert answered(gateway, gateway.token) == 200  # another tenant goes on

    revoked = hookbus("gateway", "--revoke-token", digest(spare), "--tokens", str(gateway.tokens))
    assert revoked.returncode == 0 and "revoked 1 token of laptop" in revoked.stdout, revoked
    within_2s(lambda: answered(gateway, spare) == 401, "the revoked token to get 401", procs.logs)
    assert answered(gateway, gateway.token) == 200  # laptop's other token is still good
    assert gateway.tokens.stat().st_mode & 0o777 == 0o600

    # Served again once the operator adds it back; every token of a tenant revoked at once.
    assert hookbus("tenants", "add", "acme", env=env).returncode == 0
    within_2s(lambda: answered(gateway, acme) == 200, "acme to be served again", procs.logs)
    revoked = hookbus("gateway", "--revoke-token", "acme", "--tokens", str(gateway.tokens))
    assert revoked.returncode == 0, revoked
    within_2s(lambda: answered(gateway, acme) == 401, "acme's token revoked", procs.logs)
    missing = hookbus("gateway", "--revoke-token", "acme", "--tokens", str(gateway.tokens))
    assert missing.returncode == 2 and "no token of tenant 'acme'" in missing.stderr, missing
    assert gateway.proc.poll() is None  # one gateway process all along: no restart
    assert "tenant acme removed: its tokens get 401" in procs.logs()


def cancel_over_http(gateway: Running, session: str, token: str) -> tuple[int, Any]:
    from urllib.parse import quote

    status, body, _ = post(gateway.port, f"/v1/sessions/{quote(session, safe='')}/cancel", {},
                           token)  # fmt: skip
    return status, body


def test_a_tenant_cancels_its_own_session_over_http_and_never_another_tenants(
    bus_settings: BusSettings, procs: Processes, tmp_path: Path
) -> None:
    """acme (the attacker, with its own valid token) tries to cancel beta's session every way a
    session id can be written; only sessions of its own are cancelled."""
    procs.worker(bus_settings, "workers.builtins.cancellation:RedisCancellationHook", "cancel")
    live(bus_settings, "CancellationHook")
    gateway = start_gateway(procs, bus_settings, tmp_path, tenant="beta")
    acme = new_token(gateway.tokens, "acme", bus_settings)
    within_2s(lambda: answered(gateway, acme) == 200, "acme's token to be read", procs.logs)
    bash = pre_tool_use("Bash", {"command": "ls"}, session="s1")

    def runs(token: str) -> bool:
        status, out, _ = gateway.post("/claude-code", bash, token)
        assert status == 200, out
        return out == {}

    assert runs(gateway.token) and runs(acme)
    for session in ("beta/s1", "../beta/s1", "s1/../../beta/s1"):
        assert cancel_over_http(gateway, session, acme) == (200, {"cancelled": f"acme/{session}"})
    assert runs(gateway.token)  # beta's s1 goes on
    assert cancel_over_http(gateway, "s1", acme) == (200, {"cancelled": "acme/s1"})
    status, out, _ = gateway.post("/claude-code", bash, acme)
    assert (status, out["continue"]) == (200, False), out
    assert out["stopReason"] == "session acme/s1 was cancelled by the user"
    assert runs(gateway.token)  # still: acme's cancel was of acme's own s1
    # beta cancels its own.
    assert cancel_over_http(gateway, "s1", gateway.token) == (200, {"cancelled": "beta/s1"})
    assert not runs(gateway.token)
    # No token, a wrong one: 401, nothing cancelled.
    for token in (None, "not-a-token"):
        status, body, headers = post(gateway.port, "/v1/sessions/s2/cancel", {}, token)
        assert status == 401 and "www-authenticate" in headers, body
    with Redis.from_url(bus_settings.redis_url) as r:
        assert not r.keys(f"{bus_settings.prefix}:cancelled:*s2")


def test_a_changed_token_file_is_read_again_and_a_broken_one_keeps_the_tokens_before(
    tmp_path: Path,
) -> None:
    from workers.services.gateway import TokenFile

    path = tmp_path / "tokens"
    path.write_text(f"laptop:{digest('a')}\nacme:{digest('b')}\n")
    tokens = TokenFile(path)
    assert tokens.check() is False  # unchanged: not read again
    assert tokens.tokens.tenant("Bearer b") == "acme"
    # Rewritten whole and renamed over, as --revoke-token does: acme's token is gone.
    fresh = tmp_path / "tokens.new"
    fresh.write_text(f"laptop:{digest('a')}\n")
    fresh.replace(path)
    assert tokens.check() is True
    assert tokens.tokens.tenant("Bearer b") is None and tokens.tokens.tenant("Bearer a")
    # A change that cannot be used leaves the tokens before in force (said in the log).
    path.write_text(f"laptop:{digest('a')}\nbroken line\n")
    assert tokens.check() is False and tokens.tokens.tenant("Bearer a") == "laptop"
    # A file with no token left: none is accepted.
    path.write_text("# every token revoked\n")
    assert tokens.check() is True and tokens.tokens.tenant("Bearer a") is None
