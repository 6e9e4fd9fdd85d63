"""An agent that starts while Redis is down fails closed until it has read the hook directory.

A guard with ``failure_policy="fail"`` (``workers.builtins.demo_hooks:SecretGuard``, a real
``hookbus worker``) registers, then Redis is killed, then the agent starts: through ``HookClient``,
both framework adapters and the HTTP gateway, no tool runs while the directory was never read, and
once Redis is back (restarted from its append-only file) the guard decides, without a restart
of the agent (docs/reliability.md, promise 1; bus/unread.py).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from redis import Redis

from agent_adapter.client import HookClient
from bus import (
    ConfigError,
    HookEvent,
    PermissionDecision,
    PermissionRequestContext,
    PostToolUseContext,
    PostToolUseFailureContext,
    PreToolUseContext,
    SessionStartContext,
)
from bus.ratelog import RateLimitedLog
from bus.settings import BusSettings, HookSettings
from bus.transport.keys import Keys
from tests.harness import Processes, until, wait_for, wait_live, worker_env
from workers.local.redis_server import RedisServer, free_port

UNREAD = "HookBus has not read the hook directory yet (Redis unreachable since start: "
CLOSED = "): failing closed"
SECRET = "API_KEY=sk-live-123"


@pytest.fixture
def guarded_then_down(procs: Processes) -> Iterator[tuple[RedisServer, BusSettings]]:
    """A SecretGuard service registered on a private Redis (append-only file on), then Redis
    killed: what an agent starting now finds. ``server.start()`` brings Redis back, with the
    guard's registration."""
    server = RedisServer(extra=["--appendonly", "yes", "--appendfsync", "always"]).start()
    settings = BusSettings(
        redis_url=server.url, prefix="startup", heartbeat_secs=0.2, liveness_secs=1.0,
        claim_idle_secs=0.5, refresh_secs=0.2,
    )  # fmt: skip
    try:
        procs.worker(settings, "workers.builtins.demo_hooks:SecretGuard", "guard")
        keys = Keys(settings.prefix)
        with Redis.from_url(settings.redis_url) as redis:
            until(lambda: redis.zcard(keys.replicas("SecretGuard")), "SecretGuard registered",
                  explain=procs.logs)  # fmt: skip
        server.kill()
        yield server, settings
    finally:
        server.close()


@pytest.fixture
def fresh_log(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> Any:
    """The coordinator's warnings, with its rate limit reset: a line another test logged less
    than 10 s ago is not held back here."""
    import bus.transport.coordinator

    logger = logging.getLogger("hookbus.coordinator")
    monkeypatch.setattr(bus.transport.coordinator, "_failures", RateLimitedLog(logger))
    caplog.set_level(logging.WARNING, logger="hookbus")
    return caplog


def pre(tool: str, **args: Any) -> PreToolUseContext:
    return PreToolUseContext(session_id="s-start", tool_name=tool, tool_args=args)


def closed_reason(reason: str) -> bool:
    """The one line that says why: the directory was not read, Redis's error, failing closed."""
    return reason.startswith(UNREAD) and reason.endswith(CLOSED) and "\n" not in reason


async def test_a_client_started_while_redis_is_down_fails_closed_then_its_guard_decides(
    guarded_then_down: tuple[RedisServer, BusSettings], fresh_log: pytest.LogCaptureFixture
) -> None:
    server, settings = guarded_then_down
    async with HookClient(settings, HookSettings(hook_timeout_secs=5)) as client:
        assert not client.directory.known
        # PreToolUse: blocked, whatever the tool (the guard would not even look at this one).
        blocked = await client.run_pre_tool_use(pre("run_shell", command="rm -rf /"))
        assert blocked.is_blocked and closed_reason(blocked.action.reason), blocked
        assert [e.hook_name for e in blocked.blocking_errors] == ["HookBus"]
        assert (await client.run(HookEvent.PRE_TOOL_USE, pre("file_read", path="a"))).is_blocked
        # PermissionRequest: denied.
        asked = await client.run_on_permission_request(
            PermissionRequestContext(session_id="s-start", tool_name="run_shell")
        )
        assert asked.action.decision == PermissionDecision.DENY, asked
        assert closed_reason(asked.action.reason) and asked.overridden_by == "HookBus"
        # PostToolUse and PostToolUseFailure: the output withheld.
        for result in (
            await client.run_post_tool_use(
                PostToolUseContext(session_id="s-start", tool_name="t", output_content=SECRET)
            ),
            await client.run_on_post_tool_use_failure(
                PostToolUseFailureContext(session_id="s-start", tool_name="t", error_message=SECRET)
            ),
        ):
            assert "sk-live" not in result.final_content, result
            assert result.final_content.startswith("[output withheld by HookBus: " + UNREAD)
        # A notification has nothing to decide: it goes on.
        assert (await client.run_on_session_start(SessionStartContext(session_id="s"))).called == ()
        said = fresh_log.text
        assert "Redis unreachable at start" in said and "tool calls are blocked" in said, said
        assert "PreToolUse of run_shell blocked: " + UNREAD in said, said

        server.start()  # back, with the guard's registration (its append-only file)
        await wait_for(lambda: client.directory.known, what="the directory to be read")
        await wait_live(client, "SecretGuard")
        guarded = await client.run_pre_tool_use(pre("file_read", path="app/.env"))
        assert guarded.action.reason == ".env files hold secrets; file_read on them is not allowed"
        assert not (await client.run_pre_tool_use(pre("file_read", path="config.txt"))).is_blocked
        output = await client.run_post_tool_use(
            PostToolUseContext(session_id="s-start", tool_name="file_read", output_content="ok")
        )
        assert output.final_content == "ok"
        assert "hook directory read at last" in fresh_log.text


async def test_the_coordinator_service_answers_an_unread_directory_closed(
    guarded_then_down: tuple[RedisServer, BusSettings],
) -> None:
    """The coordinator service (and the gateway) decide with ``decide()`` on a Coordinator of
    their own: before it has read the directory, the reply is a Block, never a Continue."""
    from bus.protocol import DecisionRequest, new_id, now_ms, raw
    from bus.transport.coordinator import Coordinator
    from workers.services.coordinator_service import decide

    _, settings = guarded_then_down
    ctx = pre("run_shell", command="rm -rf /")
    request = DecisionRequest(
        id=new_id(), ts=now_ms(), event=HookEvent.PRE_TOOL_USE, context=raw(ctx),
        timeout_ms=5000, reply_to="inbox",
    )  # fmt: skip
    async with Coordinator(settings, source="coordinator-service") as coordinator:
        reply = await decide(coordinator, request, ctx, now=now_ms)
    assert reply is not None and reply.status == "ok", reply
    assert reply.result.is_blocked and closed_reason(reply.result.action.reason), reply


async def test_a_coordinator_service_is_not_ready_until_it_has_read_the_directory(
    guarded_then_down: tuple[RedisServer, BusSettings],
) -> None:
    """Its /readyz follows what it decides: while every tool call is refused (directory never
    read), a fresh heartbeat does not make it ready, so a load balancer sends it no agent;
    once Redis is back and the directory read, it is."""
    from workers.services.coordinator_service import CoordinatorService

    server, settings = guarded_then_down
    service = CoordinatorService(settings)
    await service.coordinator.start()
    try:
        service.health.beat()  # as if its heartbeat had reached Redis
        ready, why = service.health.ready()
        assert not ready and closed_reason(why), why
        server.start()
        await wait_for(lambda: service.coordinator.directory.known, what="the directory read")
        service.health.beat()
        ready, why = service.health.ready()
        assert ready, why
    finally:
        await service.coordinator.close()


async def test_an_operator_may_opt_out_and_is_warned(fresh_log: pytest.LogCaptureFixture) -> None:
    """``HOOKBUS_FAIL_OPEN_UNTIL_DIRECTORY=1``: decided as if no hook service were registered
    (the behaviour before), with a warning at start and at each such decision."""
    env = {"HOOKBUS_REDIS_URL": f"redis://127.0.0.1:{free_port()}/0"}
    for on in ("1", "true", "YES", "on"):
        assert BusSettings.from_env({**env, "HOOKBUS_FAIL_OPEN_UNTIL_DIRECTORY": on})
    for off in ("", "0", "false", "No", "off"):
        flag = BusSettings.from_env({**env, "HOOKBUS_FAIL_OPEN_UNTIL_DIRECTORY": off})
        assert not flag.fail_open_until_directory
    assert not BusSettings.from_env(env).fail_open_until_directory  # fail closed by default
    with pytest.raises(ConfigError, match="HOOKBUS_FAIL_OPEN_UNTIL_DIRECTORY='maybe' must be 1"):
        BusSettings.from_env({**env, "HOOKBUS_FAIL_OPEN_UNTIL_DIRECTORY": "maybe"})

    settings = BusSettings.from_env({**env, "HOOKBUS_FAIL_OPEN_UNTIL_DIRECTORY": "1"})
    assert settings.fail_open_until_directory
    async with HookClient(settings, HookSettings(hook_timeout_secs=1)) as client:
        result = await client.run_pre_tool_use(pre("run_shell", command="rm -rf /"))
        assert not result.is_blocked and not client.directory.known, result
    said = fresh_log.text
    assert "HOOKBUS_FAIL_OPEN_UNTIL_DIRECTORY is set: until the hook directory is read" in said
    assert "PreToolUse of run_shell decided without hook services" in said, said


# -- through the framework adapters ----------------------------------------------------------


async def test_openai_agents_run_no_tool_before_the_directory_is_read(
    guarded_then_down: tuple[RedisServer, BusSettings],
) -> None:
    from agents import Agent
    from agents.testing import ScriptedModel, assistant_message, function_call

    from agent_adapter.integrations.openai_agents import HookBusAgents
    from tests.test_openai_agents import Tools, outputs, read_env_then_config

    server, settings = guarded_then_down
    async with HookClient(settings, HookSettings(hook_timeout_secs=5)) as client:
        bus = HookBusAgents(client)
        tools = Tools()
        model = ScriptedModel(
            [[function_call("file_read", {"path": "config.txt"}, call_id="c0")],
             [assistant_message("done")]]
        )  # fmt: skip
        agent = bus.wrap(Agent(name="main", model=model, tools=[tools.file_read]))
        await bus.run(agent, "read a file", session_id="s-down")
        assert tools.ran == []  # not even a file the guard allows
        sent = outputs(model)["c0"]
        assert sent.startswith("Tool call blocked by a hook. HookBus: " + UNREAD), sent

        server.start()
        await wait_live(client, "SecretGuard")
        model = read_env_then_config()
        agent = bus.wrap(Agent(name="main", model=model, tools=[tools.file_read]))
        await bus.run(agent, "read both files", session_id="s-up")
        assert tools.ran == [("file_read", {"path": "config.txt"})]  # .env never read
        assert outputs(model)["c1"] == (
            "Tool call blocked by a hook. SecretGuard: .env files hold secrets; "
            "file_read on them is not allowed"
        )


async def test_langgraph_runs_no_tool_before_the_directory_is_read(
    guarded_then_down: tuple[RedisServer, BusSettings],
) -> None:
    from langchain.agents import create_agent

    from agent_adapter.integrations.langchain import HookBusMiddleware
    from tests.test_langgraph import QUESTION, Tools, read_env_then_config, scripted, tool_messages

    server, settings = guarded_then_down
    async with HookClient(settings, HookSettings(hook_timeout_secs=5)) as client:
        tools = Tools()
        model = scripted([("file_read", {"path": "config.txt"}, "c0")], "done")
        agent = create_agent(model, tools.all, middleware=[HookBusMiddleware(client)])
        out = await agent.ainvoke(QUESTION, {"configurable": {"thread_id": "s-down"}})
        assert tools.ran == []  # not even a file the guard allows
        sent = tool_messages(out)["c0"]
        assert sent.status == "error" and str(sent.content).startswith(
            "Tool call blocked by a hook. HookBus: " + UNREAD
        ), sent

        server.start()
        await wait_live(client, "SecretGuard")
        agent = create_agent(
            read_env_then_config(), tools.all, middleware=[HookBusMiddleware(client)]
        )
        out = await agent.ainvoke(QUESTION, {"configurable": {"thread_id": "s-up"}})
        assert tools.ran == [("file_read", {"path": "config.txt"})]  # .env never read
        assert tool_messages(out)["c1"].content == (
            "Tool call blocked by a hook. SecretGuard: .env files hold secrets; "
            "file_read on them is not allowed"
        )


# -- through the HTTP gateway -------------------------------------------------------------------


def test_the_gateway_started_while_redis_is_down_denies_until_the_guard_decides(
    guarded_then_down: tuple[RedisServer, BusSettings], procs: Processes, tmp_path: Path
) -> None:
    from tests.claude_code_types import INPUTS, pre_tool_use
    from tests.test_gateway import decision_request, get, new_token, post

    server, settings = guarded_then_down
    tokens = tmp_path / "tokens"
    token = new_token(tokens, "laptop")
    port = free_port()
    env = worker_env(settings, HOOKBUS_REFRESH_SECS="0.2")
    proc = procs.start(["gateway", "--tokens", str(tokens), "--port", str(port)], env, "gateway")

    def listening() -> bool:
        assert proc.poll() is None, f"the gateway exited:\n{procs.logs()}"
        try:
            return get(port, "/healthz")[0] == 503  # up, Redis not
        except OSError:
            return False

    until(listening, "the gateway to listen", explain=procs.logs)

    def claude(message: dict[str, Any]) -> Any:
        status, out, _ = post(port, "/claude-code", message, token)
        assert status == 200, out
        return out.get("hookSpecificOutput", {})

    rm = claude(pre_tool_use("Bash", {"command": "rm -rf /"}))
    assert rm["permissionDecision"] == "deny", rm
    assert rm["permissionDecisionReason"].startswith("HookBus: " + UNREAD), rm
    assert closed_reason(rm["permissionDecisionReason"].removeprefix("HookBus: ")), rm
    asked = claude({**INPUTS["PermissionRequest"], "tool_name": "Bash"})
    assert asked["decision"]["behavior"] == "deny", asked
    status, reply, _ = post(port, "/v1/decisions", decision_request(
        event="PostToolUse", context={"session_id": "s", "tool_name": "file_read",
                                      "output_content": SECRET}), token)  # fmt: skip
    assert status == 200 and reply["status"] == "ok", reply
    assert reply["result"]["final_content"].startswith("[output withheld by HookBus: " + UNREAD)

    server.start()

    def read(path: str) -> Any:
        return claude(pre_tool_use("Read", {"file_path": path}, session="cc-up"))

    until(lambda: read("a.py") == {}, "the gateway to read the directory", explain=procs.logs)
    guarded = until(
        lambda: read("/work/app/.env").get("permissionDecisionReason", "").startswith(
            "SecretGuard: "
        ),
        "the guard to decide", explain=procs.logs,
    )  # fmt: skip
    assert guarded
    assert "Redis unreachable at start" in procs.logs()


# -- a session whose own hooks could not be read -------------------------------------------


async def test_a_new_session_whose_hooks_cannot_be_read_fails_closed_for_fail_hooks(
    procs: Processes,
) -> None:
    """The same doubt for one session: its hooks never read and Redis not answering, any
    session-scoped hook with ``failure_policy="fail"`` may be one of them: it stands in,
    unreachable, and blocks. (A session read before keeps the set it had.)"""
    from bus import Block
    from tests.remote_hooks import HookConfig

    with RedisServer() as server:
        settings = BusSettings(
            redis_url=server.url, prefix="sessions", heartbeat_secs=0.2, liveness_secs=1.0,
            claim_idle_secs=0.5, refresh_secs=0.2,
        )  # fmt: skip
        watch = HookConfig(
            name="Watch", answers={"PreToolUse": Block(reason="session rule")},
            failure_policy="fail",
        )  # fmt: skip
        procs.scripted(settings, watch, "--scope", "session")
        async with HookClient(settings, HookSettings(hook_timeout_secs=5)) as client:
            await wait_live(client, "Watch")
            seen = PreToolUseContext(session_id="s-seen", tool_name="run_shell")
            assert not (await client.run_pre_tool_use(seen)).is_blocked  # none attached
            server.kill()
            new = PreToolUseContext(session_id="s-new", tool_name="run_shell")
            result = await client.run_pre_tool_use(new)
            assert result.is_blocked, result
            assert result.action.reason.startswith(
                "hook Watch is unreachable: the hooks of session s-new could not be read: "
            ), result
            assert not (await client.run_pre_tool_use(seen)).is_blocked
