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
from agent_adapter.integrations.langchain import (
    HookBusMiddleware,
    ask_by_interrupt,
    decide_interrupt,
)
from bus import (
    Block,
    ConfigError,
    HookEvent,
    HookRegistry,
    MutateInput,
    MutateOutput,
    Override,
    PermissionDecision,
    PermissionRequired,
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


def reviewed(registry: HookRegistry, tools: Tools, calls: list[Any]) -> Any:
    """An agent that makes ``calls``, each file_write reviewed by HumanInTheLoopMiddleware."""
    return create_agent(
        scripted(calls, "done"),
        tools.all,
        middleware=[
            HumanInTheLoopMiddleware(interrupt_on={"file_write": True}),
            HookBusMiddleware(registry),
        ],
        checkpointer=InMemorySaver(),
    )


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
    agent = reviewed(registry, tools, calls)
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


# -- ToolNode, create_react_agent and a hand-built StateGraph ------------------------------


async def test_create_react_agent_with_a_hooked_tool_node() -> None:
    import warnings

    from langgraph.prebuilt import create_react_agent

    tools = Tools()
    middleware = HookBusMiddleware(guard_and_redactor())
    with warnings.catch_warnings():  # LangGraph 1 moved it to langchain's create_agent
        warnings.simplefilter("ignore", DeprecationWarning)
        agent = create_react_agent(read_env_then_config(), tools=middleware.tool_node(tools.all))
    out = await agent.ainvoke(QUESTION, {"configurable": {"thread_id": "s-r"}})
    check_blocked_and_redacted(out, tools)


def hand_built(model: ScriptedChat, middleware: HookBusMiddleware, tools: Tools) -> Any:
    from langgraph.graph import END, START, MessagesState, StateGraph
    from langgraph.prebuilt import tools_condition

    async def call_model(state: MessagesState) -> dict[str, Any]:
        return {"messages": [await model.ainvoke(state["messages"])]}

    graph = StateGraph(MessagesState)
    graph.add_node("model", call_model)
    graph.add_node("tools", middleware.tool_node(tools.all))
    graph.add_edge(START, "model")
    graph.add_conditional_edges("model", tools_condition, ["tools", END])
    graph.add_edge("tools", "model")
    return graph.compile()


async def test_a_hand_built_state_graph_with_a_hooked_tool_node() -> None:
    registry = guard_and_redactor()
    seen = Recorder("seen")
    registry.add(seen)
    tools = Tools()
    graph = hand_built(read_env_then_config(), HookBusMiddleware(registry), tools)
    out = await graph.ainvoke(QUESTION, {"configurable": {"thread_id": "s-h"}})
    check_blocked_and_redacted(out, tools)
    await registry.drain()
    events = [e for e, _ in seen.calls]  # the tool events only: a graph has no agent lifecycle
    assert set(events) == {HookEvent.PRE_TOOL_USE, HookEvent.POST_TOOL_USE,
                           HookEvent.PERMISSION_DENIED}  # fmt: skip
    assert {c.session_id for _, c in seen.calls} == {"s-h"}


def test_a_hooked_tool_node_in_a_synchronous_graph_goes_through_the_portal() -> None:
    tools = Tools()
    with start_blocking_portal() as portal:
        registry = portal.call(_make_guard_and_redactor)
        middleware = HookBusMiddleware(registry, portal=portal)
        model = read_env_then_config()
        from langgraph.graph import END, START, MessagesState, StateGraph
        from langgraph.prebuilt import tools_condition

        graph = StateGraph(MessagesState)
        graph.add_node("model", lambda state: {"messages": [model.invoke(state["messages"])]})
        graph.add_node("tools", middleware.tool_node(tools.all))
        graph.add_edge(START, "model")
        graph.add_conditional_edges("model", tools_condition, ["tools", END])
        graph.add_edge("tools", "model")
        out = graph.compile().invoke(QUESTION)
    check_blocked_and_redacted(out, tools)


async def _make_guard_and_redactor() -> HookRegistry:
    return guard_and_redactor()


# -- a person asked with LangGraph's interrupt: approve, edit, reject ------------------------


class WritePolicy(Recorder):
    """No writes under /etc; writes outside notes/ need a person's approval."""

    async def pre_tool_use(self, ctx: Any) -> Any:
        self.calls.append((HookEvent.PRE_TOOL_USE, ctx))
        path = str(ctx.tool_args.get("path", ""))
        if path.startswith("/etc"):
            return Block(reason="system files")
        if not path.startswith("notes/"):
            return PermissionRequired(permission="write", tool_name=ctx.tool_name)
        return None


def asking_agent(registry: HookRegistry, tools: Tools, path: str) -> Any:
    return create_agent(
        scripted([("file_write", {"path": path, "text": "x"}, "w1")], "done"),
        tools.all,
        middleware=[HookBusMiddleware(registry, approver=ask_by_interrupt)],
        checkpointer=InMemorySaver(),
    )


class Paused:
    """An agent whose file_write of ``path`` WritePolicy sent to a person: paused, waiting."""

    def __init__(self, path: str, thread: str) -> None:
        self.registry = HookRegistry()
        self.policy = WritePolicy("policy", events=(HookEvent.PRE_TOOL_USE,))
        self.registry.add(self.policy)
        self.tools = Tools()
        self.agent = asking_agent(self.registry, self.tools, path)
        self.config = {"configurable": {"thread_id": thread}}

    async def start(self) -> dict[str, Any]:
        first: dict[str, Any] = await self.agent.ainvoke(QUESTION, self.config)
        return first

    async def answer(self, resume: Command) -> dict[str, Any]:  # type: ignore[type-arg]
        out: dict[str, Any] = await self.agent.ainvoke(resume, self.config)
        return out


def edit(path: str) -> Command:  # type: ignore[type-arg]
    action = {"name": "file_write", "args": {"path": path, "text": "x"}}
    return Command(resume={"decisions": [{"type": "edit", "edited_action": action}]})


APPROVE = Command(resume={"decisions": [{"type": "approve"}]})


async def test_an_edited_call_is_checked_by_pre_tool_use_again() -> None:
    paused = Paused("a.txt", "s-e")
    first = await paused.start()
    (asked,) = first["__interrupt__"]
    assert asked.value == {
        "action_requests": [{"name": "file_write", "args": {"path": "a.txt", "text": "x"},
                             "description": "write (file_write)"}],
        "review_configs": [{"action_name": "file_write",
                            "allowed_decisions": ["approve", "edit", "reject"]}],
    }  # fmt: skip
    blocked = await paused.answer(edit("/etc/passwd"))  # the person's edit is refused
    assert paused.tools.ran == []
    assert tool_messages(blocked)["w1"].content == (
        "Tool call blocked by a hook. policy: system files\n\n<system-reminder>\nA person edited "
        'this file_write call: its arguments were {"path": "/etc/passwd", "text": "x"}\n'
        "</system-reminder>"
    )
    # LangGraph re-runs the tools node on resume: the first call's PreToolUse again, then the edit's
    paths = [c.tool_args["path"] for _, c in paused.policy.calls]
    assert paths == ["a.txt", "a.txt", "/etc/passwd"]


async def test_an_edit_that_still_needs_approval_asks_again_and_runs_as_edited() -> None:
    paused = Paused("a.txt", "s-e2")
    await paused.start()
    again = await paused.answer(edit("b.txt"))
    (asked,) = again["__interrupt__"]
    assert asked.value["action_requests"][0]["args"] == {"path": "b.txt", "text": "x"}
    assert paused.tools.ran == []
    out = await paused.answer(APPROVE)
    assert paused.tools.ran == [("file_write", {"path": "b.txt", "text": "x"})]
    assert str(tool_messages(out)["w1"].content).startswith("wrote 1 characters to b.txt\n\n")


async def test_an_edit_runs_as_the_hooks_leave_it_and_a_rejection_is_a_denial() -> None:
    paused = Paused("a.txt", "s-e3")

    class Mover(Recorder):  # a hook that rewrites the edited call
        async def pre_tool_use(self, ctx: Any) -> Any:
            if ctx.tool_args["path"] == "notes/a.txt":
                return MutateInput(updated_args={**ctx.tool_args, "path": "notes/b.txt"})
            return None

    paused.registry.add(Mover("mover", events=(HookEvent.PRE_TOOL_USE,)))
    await paused.start()
    await paused.answer(edit("notes/a.txt"))
    assert paused.tools.ran == [("file_write", {"path": "notes/b.txt", "text": "x"})]

    other = Paused("c.txt", "s-e4")
    await other.start()
    out = await other.answer(Command(resume={"decisions": [{"type": "reject"}]}))
    assert tool_messages(out)["w1"].content == (
        "Permission denied: write (file_write) (the user said no)"
    )
    assert other.tools.ran == []


async def test_an_answer_that_is_not_a_decision_fails_in_one_line() -> None:
    paused = Paused("a.txt", "s-e5")
    await paused.start()
    other_tool = {"name": "file_read", "args": {"path": "x"}}
    bad = Command(resume={"decisions": [{"type": "edit", "edited_action": other_tool}]})
    with pytest.raises(ConfigError, match="the answer to file_write's approval is not one dec"):
        await paused.answer(bad)
    assert paused.tools.ran == []


async def test_a_human_in_the_loop_edit_is_checked_by_pre_tool_use() -> None:
    registry = HookRegistry()
    registry.add(WritePolicy("policy", events=(HookEvent.PRE_TOOL_USE,)))
    tools = Tools()
    agent = reviewed(registry, tools, [("file_write", {"path": "notes/a.txt", "text": "x"}, "w1")])
    config = {"configurable": {"thread_id": "s-hitl"}}
    await agent.ainvoke(QUESTION, config)
    out = await agent.ainvoke(edit("/etc/passwd"), config)
    assert tools.ran == []
    said = str(tool_messages(out)["w1"].content)  # after LangChain's note on the edit
    assert said.endswith("\n\nTool response:\nTool call blocked by a hook. policy: system files")


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


async def test_a_pause_for_a_person_neither_stops_nor_restarts_the_session() -> None:
    paused = Paused("a.txt", "s-p")
    seen = Recorder("seen", events=(HookEvent.ON_SESSION_START, HookEvent.ON_SESSION_STOP))
    paused.registry.add(seen)
    first = await paused.start()
    assert first["__interrupt__"]
    assert [e for e, _ in seen.calls] == [HookEvent.ON_SESSION_START]  # paused: no stop
    await paused.answer(APPROVE)
    assert [(e, c.session_id) for e, c in seen.calls] == [
        (HookEvent.ON_SESSION_START, "s-p"),
        (HookEvent.ON_SESSION_STOP, "s-p"),  # the resumed invocation ends it; no second start
    ]
    assert seen.calls[1][1].terminal == TurnTerminal.COMPLETED
