"""HookBus in LangChain 1.x ``create_agent`` / LangGraph agents
(agent_adapter/integrations/langchain.py).

The model is LangChain's own ``GenericFakeChatModel`` with the ``bind_tools`` it lacks (returning
itself: the scripted messages already name the tools). The distributed tests serve the hooks from
``hookbus worker`` processes over a real redis-server.
"""

from __future__ import annotations

from typing import Any

import pytest
from anyio.from_thread import start_blocking_portal
from langchain.agents import create_agent
from langchain.agents.middleware import HumanInTheLoopMiddleware
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, ToolMessage
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.types import Command

from agent_adapter.client import HookClient
from agent_adapter.integrations.langchain import HookBusMiddleware, decide_interrupt
from bus import (
    Block,
    ConfigError,
    HookEvent,
    HookRegistry,
    MutateInput,
    MutateOutput,
    Override,
    PermissionDecision,
    SessionCancelled,
    ToolMatchFilter,
    TurnTerminal,
)
from bus.settings import BusSettings
from tests.harness import Processes, wait_live
from tests.hooks_for_tests import Recorder
from tests.remote_hooks import HookConfig
from workers.builtins.demo_hooks import Redactor, SecretGuard


class ScriptedChat(GenericFakeChatModel):
    def bind_tools(self, tools: Any, **kwargs: Any) -> ScriptedChat:  # type: ignore[override]
        return self


def scripted(*turns: list[tuple[str, dict[str, Any], str]] | str) -> ScriptedChat:
    """A model answering each call with the next turn: tool calls (name, args, id), or text."""
    messages = [
        AIMessage(content=t)
        if isinstance(t, str)
        else AIMessage(content="", tool_calls=[{"name": n, "args": a, "id": i} for n, a, i in t])
        for t in turns
    ]
    return ScriptedChat(messages=iter(messages))


class Tools:
    """Tools that record what their bodies were called with."""

    def __init__(self) -> None:
        self.ran: list[tuple[str, dict[str, Any]]] = []

        @tool
        def file_read(path: str) -> str:
            """Read a file."""
            self.ran.append(("file_read", {"path": path}))
            return f"{path}: API_KEY=sk-live-123 and the rest"

        @tool
        def file_write(path: str, text: str) -> str:
            """Write a file."""
            self.ran.append(("file_write", {"path": path, "text": text}))
            return f"wrote {len(text)} characters to {path}"

        self.all = [file_read, file_write]


def tool_messages(out: dict[str, Any]) -> dict[str, ToolMessage]:
    return {m.tool_call_id: m for m in out["messages"] if isinstance(m, ToolMessage)}


def read_env_then_config() -> ScriptedChat:
    return scripted(
        [("file_read", {"path": "app/.env"}, "c1"), ("file_read", {"path": "config.txt"}, "c2")],
        "done",
    )


QUESTION = {"messages": [{"role": "user", "content": "read both files"}]}


def guard_and_redactor() -> HookRegistry:
    registry = HookRegistry()
    registry.add(SecretGuard())
    registry.add(Redactor())
    return registry


def check_blocked_and_redacted(out: dict[str, Any], tools: Tools) -> None:
    assert out["messages"][-1].content == "done"
    assert tools.ran == [("file_read", {"path": "config.txt"})]  # .env never read
    sent = tool_messages(out)
    assert sent["c1"].status == "error"
    assert sent["c1"].content == (
        "Tool call blocked by a hook. SecretGuard: .env files hold secrets; "
        "file_read on them is not allowed"
    )
    assert str(sent["c2"].content).startswith("config.txt: API_KEY=[redacted] and the rest")
    assert "sk-live-123" not in str(out["messages"])


async def test_embedded_hooks_block_a_call_and_rewrite_an_output() -> None:
    tools = Tools()
    middleware = HookBusMiddleware(guard_and_redactor())
    agent = create_agent(read_env_then_config(), tools.all, middleware=[middleware])
    out = await agent.ainvoke(QUESTION, {"configurable": {"thread_id": "s-1"}})
    check_blocked_and_redacted(out, tools)


def test_synchronous_invoke_goes_through_a_portal() -> None:
    tools = Tools()
    with start_blocking_portal() as portal:

        async def make() -> HookRegistry:
            return guard_and_redactor()

        registry = portal.call(make)
        middleware = HookBusMiddleware(registry, portal=portal)
        agent = create_agent(read_env_then_config(), tools.all, middleware=[middleware])
        out = agent.invoke(QUESTION)
    check_blocked_and_redacted(out, tools)


def test_synchronous_invoke_without_a_portal_says_what_it_needs() -> None:
    agent = create_agent(
        read_env_then_config(), Tools().all, middleware=[HookBusMiddleware(HookRegistry())]
    )
    with pytest.raises(ConfigError, match="needs portal="):
        agent.invoke(QUESTION)


async def test_a_rewritten_input_is_what_the_tool_runs_with() -> None:
    registry = HookRegistry()
    registry.add(
        Recorder(
            "notes",
            MutateInput(updated_args={"path": "notes/a.txt", "text": "hi"}),
            events=(HookEvent.PRE_TOOL_USE,),
            match_filter=ToolMatchFilter.exact("file_write"),
        )
    )
    tools = Tools()
    model = scripted([("file_write", {"path": "a.txt", "text": "hi"}, "w1")], "ok")
    agent = create_agent(model, tools.all, middleware=[HookBusMiddleware(registry)])
    out = await agent.ainvoke(QUESTION)
    assert tools.ran == [("file_write", {"path": "notes/a.txt", "text": "hi"})]
    assert tool_messages(out)["w1"].content == "wrote 2 characters to notes/a.txt"


async def test_a_failing_tool_gets_post_tool_use_failure() -> None:
    registry = HookRegistry()
    seen = Recorder("seen", events=(HookEvent.POST_TOOL_USE_FAILURE,))
    registry.add(seen)

    @tool
    def flaky(n: int) -> str:
        """Fail."""
        raise ValueError(f"flaky failed on {n}")

    model = scripted([("flaky", {"n": 3}, "f1")], "ok")
    agent = create_agent(model, [flaky], middleware=[HookBusMiddleware(registry)])
    with pytest.raises(ValueError, match="flaky failed on 3"):
        await agent.ainvoke(QUESTION)
    assert [(c.tool_name, c.error_message) for _, c in seen.calls] == [
        ("flaky", "flaky failed on 3")
    ]


async def test_the_lifecycle_reaches_hooks_as_hookbus_events() -> None:
    registry = HookRegistry()
    seen = Recorder("seen")
    registry.add(seen)
    agent = create_agent(
        read_env_then_config(), Tools().all, middleware=[HookBusMiddleware(registry)]
    )
    config = {"configurable": {"thread_id": "s-9"}, "recursion_limit": 40}
    await agent.ainvoke(QUESTION, config)
    events = [e for e, _ in seen.calls]
    assert events[0] == HookEvent.ON_SESSION_START and events[-1] == HookEvent.ON_SESSION_STOP
    assert seen.calls[0][1].turn_index == 0 and not seen.calls[0][1].is_resume
    steps = [c for e, c in seen.calls if e == HookEvent.ON_STEP_COMPLETE]
    assert [(c.step, c.max_steps) for c in steps] == [(1, 40), (2, 40)]
    assert events.count(HookEvent.PRE_TOOL_USE) == events.count(HookEvent.POST_TOOL_USE) == 2
    stop = seen.calls[-1][1]
    assert (stop.session_id, stop.terminal, stop.total_steps) == ("s-9", TurnTerminal.COMPLETED, 2)
    assert {getattr(c, "session_id", None) for _, c in seen.calls} == {"s-9"}


async def test_a_second_turn_on_a_thread_is_a_resumed_session() -> None:
    registry = HookRegistry()
    seen = Recorder("seen", events=(HookEvent.ON_SESSION_START,))
    registry.add(seen)
    agent = create_agent(
        scripted("one", "two"),
        [],
        middleware=[HookBusMiddleware(registry)],
        checkpointer=InMemorySaver(),
    )
    config = {"configurable": {"thread_id": "t-2"}}
    await agent.ainvoke({"messages": [{"role": "user", "content": "a"}]}, config)
    await agent.ainvoke({"messages": [{"role": "user", "content": "b"}]}, config)
    assert [(c.turn_index, c.is_resume) for _, c in seen.calls] == [(0, False), (1, True)]


async def test_human_in_the_loop_interrupts_are_decided_by_permission_request_hooks() -> None:
    class Policy(Recorder):
        async def on_permission_request(self, ctx: Any) -> Any:
            self.calls.append((HookEvent.PERMISSION_REQUEST, ctx))
            if ctx.tool_args["path"].startswith("tmp/"):
                return Override(decision=PermissionDecision.ALLOW)
            if ctx.tool_args["path"].startswith("/etc"):
                return Override(decision=PermissionDecision.DENY, reason="system files")
            return None

    registry = HookRegistry()
    registry.add(Policy("policy", events=(HookEvent.PERMISSION_REQUEST,)))
    tools = Tools()
    calls = [("file_write", {"path": p, "text": "x"}, f"w{i}")
             for i, p in enumerate(["tmp/a", "/etc/passwd", "home/b"])]  # fmt: skip
    agent = create_agent(
        scripted(calls, "done"),
        tools.all,
        middleware=[
            HumanInTheLoopMiddleware(interrupt_on={"file_write": True}),
            HookBusMiddleware(registry),
        ],
        checkpointer=InMemorySaver(),
    )
    config = {"configurable": {"thread_id": "s-4"}}
    first = await agent.ainvoke(QUESTION, config)
    assert tools.ran == []
    (interrupt,) = first["__interrupt__"]

    decisions = await decide_interrupt(registry, interrupt.value, session_id="s-4")
    assert decisions[:2] == [
        {"type": "approve"},
        {"type": "reject", "message": "policy: system files"},
    ]
    assert decisions[2] is None  # left to a person, who says yes
    decisions[2] = {"type": "approve"}
    out = await agent.ainvoke(Command(resume={"decisions": decisions}), config)

    assert [args["path"] for _, args in tools.ran] == ["tmp/a", "home/b"]
    assert tool_messages(out)["w1"].content == (
        "User rejected the tool call for `file_write` with reason: policy: system files"
    )


# -- distributed: the hooks are served by worker processes ----------------------------------


async def test_distributed_hooks_block_a_call_and_rewrite_an_output(
    bus_settings: BusSettings, procs: Processes
) -> None:
    procs.worker(bus_settings, "workers.builtins.demo_hooks:SecretGuard", "guard")
    procs.worker(bus_settings, "workers.builtins.demo_hooks:Redactor", "redactor")
    async with HookClient(bus_settings) as client:
        await wait_live(client, "SecretGuard", "Redactor")
        tools = Tools()
        agent = create_agent(
            read_env_then_config(), tools.all, middleware=[HookBusMiddleware(client)]
        )
        out = await agent.ainvoke(QUESTION, {"configurable": {"thread_id": "s-remote"}})
    check_blocked_and_redacted(out, tools)


async def test_distributed_rewrite_of_input_and_output_by_scripted_workers(
    bus_settings: BusSettings, procs: Processes
) -> None:
    procs.scripted(bus_settings, HookConfig(
        name="mover", events=[HookEvent.PRE_TOOL_USE], names=["file_write"],
        answers={"PreToolUse": MutateInput(updated_args={"path": "notes/a.txt", "text": "hi"})},
    ))  # fmt: skip
    procs.scripted(bus_settings, HookConfig(
        name="summariser", events=[HookEvent.POST_TOOL_USE], names=["file_write"],
        answers={"PostToolUse": MutateOutput(updated_content="written (details withheld)")},
    ))  # fmt: skip
    async with HookClient(bus_settings) as client:
        await wait_live(client, "mover", "summariser")
        tools = Tools()
        model = scripted([("file_write", {"path": "a.txt", "text": "hi"}, "w1")], "ok")
        agent = create_agent(model, tools.all, middleware=[HookBusMiddleware(client)])
        out = await agent.ainvoke(QUESTION)
    assert tools.ran == [("file_write", {"path": "notes/a.txt", "text": "hi"})]
    assert tool_messages(out)["w1"].content == "written (details withheld)"


async def test_a_cancelled_session_stops_the_run_at_its_next_tool_call(
    bus_settings: BusSettings, procs: Processes
) -> None:
    procs.worker(bus_settings, "workers.builtins.cancellation:RedisCancellationHook", "cancel")
    async with HookClient(bus_settings) as client:
        await wait_live(client, "CancellationHook")
        await client.cancel("s-c")  # what `hookbus cancel s-c` does
        tools = Tools()
        agent = create_agent(
            read_env_then_config(), tools.all, middleware=[HookBusMiddleware(client)]
        )
        with pytest.raises(SessionCancelled, match="session s-c was cancelled"):
            await agent.ainvoke(QUESTION, {"configurable": {"thread_id": "s-c"}})
        # The run's OnSessionStop lifts nothing: the cancellation ends with its TTL (set by the
        # CancellationHook when it blocked the call), or an operator.
        assert await client.redis.exists(client.keys.cancelled("s-c"))
        assert await client.redis.ttl(client.keys.cancelled("s-c")) > 0
    assert tools.ran == []


async def test_a_cancelled_session_reports_cancelled_to_session_stop_hooks() -> None:
    registry = HookRegistry()
    registry.add(Recorder("CancellationHook", Block(reason="session s-9 was cancelled by the user"),
                          events=(HookEvent.PRE_TOOL_USE,)))  # fmt: skip
    seen = Recorder("seen", events=(HookEvent.ON_SESSION_STOP,))
    registry.add(seen)
    agent = create_agent(
        read_env_then_config(), Tools().all, middleware=[HookBusMiddleware(registry)]
    )
    with pytest.raises(SessionCancelled):
        await agent.ainvoke(QUESTION, {"configurable": {"thread_id": "s-9"}})
    assert [(c.session_id, c.terminal) for _, c in seen.calls] == [("s-9", TurnTerminal.CANCELLED)]


def test_without_the_extra_the_import_says_which_to_install() -> None:
    import subprocess
    import sys

    code = (
        "import sys; sys.modules['langchain'] = None\n"  # as if the package were not installed
        "import agent_adapter.integrations.langchain"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 1
    assert "pip install 'hookbus[langgraph]'" in out.stderr.splitlines()[-1]
