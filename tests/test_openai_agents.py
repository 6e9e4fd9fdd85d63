"""HookBus around OpenAI Agents SDK agents (agent_adapter/integrations/openai_agents.py).

Each agent runs offline on the SDK's own test model (``agents.testing.ScriptedModel``), with the
SDK's tracing switched off (it would try to export traces over the network at exit). The
distributed tests serve the hooks from ``hookbus worker`` processes over a real redis-server.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from agents import Agent, function_tool, set_tracing_disabled
from agents.exceptions import MaxTurnsExceeded
from agents.testing import ScriptedModel, assistant_message, function_call

from agent_adapter.client import HookClient
from agent_adapter.integrations.openai_agents import HookBusAgents
from bus import (
    Block,
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
from workers.builtins.demo_hooks import Redactor, SecretGuard

set_tracing_disabled(True)


class Tools:
    """Function tools that record what their bodies were called with."""

    def __init__(self) -> None:
        self.ran: list[tuple[str, dict[str, Any]]] = []

        @function_tool
        def file_read(path: str) -> str:
            """Read a file."""
            self.ran.append(("file_read", {"path": path}))
            return f"{path}: API_KEY=sk-live-123 and the rest"

        @function_tool
        def file_write(path: str, text: str) -> str:
            """Write a file."""
            self.ran.append(("file_write", {"path": path, "text": text}))
            return f"wrote {len(text)} characters to {path}"

        self.file_read = file_read
        self.file_write = file_write


def outputs(model: ScriptedModel) -> dict[str, str]:
    """The tool outputs the model was sent on its last call, by call id."""
    call = model.last_call
    assert call is not None
    return {
        item["call_id"]: item["output"]
        for item in call.input
        if isinstance(item, dict) and item.get("type") == "function_call_output"
    }


def read_env_then_config() -> ScriptedModel:
    return ScriptedModel(
        [
            [
                function_call("file_read", {"path": "app/.env"}, call_id="c1"),
                function_call("file_read", {"path": "config.txt"}, call_id="c2"),
            ],
            [assistant_message("done")],
        ]
    )


async def test_embedded_hooks_block_a_call_and_rewrite_an_output() -> None:
    registry = HookRegistry()
    registry.add(SecretGuard())
    registry.add(Redactor())
    tools = Tools()
    model = read_env_then_config()
    bus = HookBusAgents(registry)
    agent = bus.wrap(Agent(name="main", model=model, tools=[tools.file_read]))

    result = await bus.run(agent, "read both files", session_id="s-1")

    assert result.final_output == "done"
    assert tools.ran == [("file_read", {"path": "config.txt"})]  # .env never read
    sent = outputs(model)
    assert sent["c1"].startswith("Tool call blocked by a hook. SecretGuard: .env files hold")
    assert sent["c2"].startswith("config.txt: API_KEY=[redacted] and the rest")
    assert "sk-live-123" not in json.dumps(model.last_call.input)  # type: ignore[union-attr]
    assert "[Hook: Redactor | PostToolUse] a secret was redacted" in sent["c2"]


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
    model = ScriptedModel(
        [
            [function_call("file_write", {"path": "a.txt", "text": "hi"}, call_id="w1")],
            [assistant_message("ok")],
        ]
    )
    bus = HookBusAgents(registry)
    await bus.run(bus.wrap(Agent(name="main", model=model, tools=[tools.file_write])), "write")
    assert tools.ran == [("file_write", {"path": "notes/a.txt", "text": "hi"})]
    assert outputs(model)["w1"] == "wrote 2 characters to notes/a.txt"


async def test_the_lifecycle_reaches_hooks_as_hookbus_events() -> None:
    registry = HookRegistry()
    seen = Recorder("seen")
    registry.add(seen)
    tools = Tools()
    model = read_env_then_config()
    bus = HookBusAgents(registry)
    await bus.run(bus.wrap(Agent(name="main", model=model, tools=[tools.file_read])), "go",
                  session_id="s-9")  # fmt: skip
    await registry.drain()
    events = [e for e, _ in seen.calls]
    assert events[0] == HookEvent.ON_SESSION_START and events[-1] == HookEvent.ON_SESSION_STOP
    steps = [c for e, c in seen.calls if e == HookEvent.ON_STEP_COMPLETE]
    assert [(c.step, c.max_steps) for c in steps] == [(1, 10), (2, 10)]
    assert events.count(HookEvent.PRE_TOOL_USE) == 2
    assert events.count(HookEvent.POST_TOOL_USE) == 2
    stop = seen.calls[-1][1]
    assert (stop.session_id, stop.terminal, stop.total_steps) == ("s-9", TurnTerminal.COMPLETED, 2)
    pre = next(c for e, c in seen.calls if e == HookEvent.PRE_TOOL_USE)
    assert (pre.session_id, pre.step) == ("s-9", 1)


async def test_a_run_that_runs_out_of_turns_stops_with_max_steps() -> None:
    registry = HookRegistry()
    seen = Recorder("seen", events=(HookEvent.ON_SESSION_STOP,))
    registry.add(seen)
    tools = Tools()
    model = ScriptedModel(
        [[function_call("file_read", {"path": f"f{i}"}, call_id=f"c{i}")] for i in range(3)]
    )
    bus = HookBusAgents(registry)
    agent = bus.wrap(Agent(name="main", model=model, tools=[tools.file_read]))
    with pytest.raises(MaxTurnsExceeded):
        await bus.run(agent, "loop", max_turns=2)
    assert [c.terminal for _, c in seen.calls] == [TurnTerminal.MAX_STEPS]


async def test_a_handoff_is_a_subagent() -> None:
    registry = HookRegistry()
    seen = Recorder("seen", events=(HookEvent.ON_SUBAGENT_START, HookEvent.ON_SUBAGENT_STOP))
    registry.add(SecretGuard())
    registry.add(seen)
    tools = Tools()
    helper_model = ScriptedModel(
        [[function_call("file_read", {"path": ".env"}, call_id="h1")], [assistant_message("no")]]
    )
    helper = Agent(name="reader", model=helper_model, tools=[tools.file_read])
    main_model = ScriptedModel([[function_call("transfer_to_reader", {}, call_id="t1")]])
    bus = HookBusAgents(registry)
    agent = bus.wrap(Agent(name="main", model=main_model, handoffs=[helper]))

    result = await bus.run(agent, "hand it over", session_id="s-2")

    assert result.final_output == "no"
    assert tools.ran == []  # the handed-to agent's tools are hooked too
    assert outputs(helper_model)["h1"].startswith("Tool call blocked by a hook. SecretGuard")
    assert [(e, c.subagent_name, c.parent_session_id) for e, c in seen.calls] == [
        (HookEvent.ON_SUBAGENT_START, "reader", "s-2"),
        (HookEvent.ON_SUBAGENT_STOP, "reader", "s-2"),
    ]
    assert seen.calls[1][1].result_summary == "no"


async def test_permission_required_is_decided_by_permission_request_hooks() -> None:
    registry = HookRegistry()
    registry.add(Recorder("ask", PermissionRequired(permission="write", tool_name="file_write"),
                          events=(HookEvent.PRE_TOOL_USE,)))  # fmt: skip
    registry.add(Recorder("policy", Override(decision=PermissionDecision.ALLOW, reason="ok"),
                          events=(HookEvent.PERMISSION_REQUEST,)))  # fmt: skip
    tools = Tools()
    model = ScriptedModel(
        [[function_call("file_write", {"path": "a", "text": "x"}, call_id="w1")],
         [assistant_message("ok")]]
    )  # fmt: skip
    bus = HookBusAgents(registry)
    await bus.run(bus.wrap(Agent(name="main", model=model, tools=[tools.file_write])), "write")
    assert tools.ran == [("file_write", {"path": "a", "text": "x"})]


async def test_permission_required_with_nobody_to_ask_is_denied() -> None:
    registry = HookRegistry()
    registry.add(Recorder("ask", PermissionRequired(permission="write", tool_name="file_write"),
                          events=(HookEvent.PRE_TOOL_USE,)))  # fmt: skip
    denied = Recorder("denied", events=(HookEvent.PERMISSION_DENIED,))
    registry.add(denied)
    tools = Tools()
    model = ScriptedModel(
        [[function_call("file_write", {"path": "a", "text": "x"}, call_id="w1")],
         [assistant_message("ok")]]
    )  # fmt: skip
    bus = HookBusAgents(registry)
    await bus.run(bus.wrap(Agent(name="main", model=model, tools=[tools.file_write])), "write")
    await registry.drain()
    assert tools.ran == []
    assert outputs(model)["w1"] == "Permission denied: write (file_write) (nobody to ask)"
    assert [c.tool_name for _, c in denied.calls] == ["file_write"]


def deleter(*paths: str) -> tuple[Any, list[str], ScriptedModel]:
    """A ``delete`` tool that needs approval, the paths it deleted, and a model that asks it to
    delete ``paths`` (call ids d0, d1, …), then answers "done"."""
    ran: list[str] = []

    @function_tool(needs_approval=True)
    def delete(path: str) -> str:
        """Delete a file."""
        ran.append(path)
        return f"deleted {path}"

    calls = [function_call("delete", {"path": p}, call_id=f"d{i}") for i, p in enumerate(paths)]
    return delete, ran, ScriptedModel([calls, [assistant_message("done")]])


async def test_pending_approvals_are_decided_by_permission_request_hooks() -> None:
    class Policy(Recorder):
        async def on_permission_request(self, ctx: Any) -> Any:
            self.calls.append((HookEvent.PERMISSION_REQUEST, ctx))
            path = ctx.tool_args.get("path", "")
            if path.startswith("tmp/"):
                return Override(decision=PermissionDecision.ALLOW)
            if path.startswith("/etc"):
                return Override(decision=PermissionDecision.DENY, reason="system files")
            return None

    registry = HookRegistry()
    policy = Policy("policy", events=(HookEvent.PERMISSION_REQUEST,))
    registry.add(policy)
    delete, ran, model = deleter("tmp/x", "/etc/passwd", "home/notes")
    bus = HookBusAgents(registry)
    agent = bus.wrap(Agent(name="main", model=model, tools=[delete]))
    first = await bus.run(agent, "clean up", session_id="s-3")
    assert len(first.interruptions) == 3 and ran == []

    state, pending = await bus.decide_approvals(first)
    assert [json.loads(p.arguments or "{}")["path"] for p in pending] == ["home/notes"]
    state.reject(pending[0])  # the person says no
    second = await bus.run(agent, state, session_id="s-3")

    assert second.final_output == "done"
    assert ran == ["tmp/x"]
    sent = outputs(model)
    assert sent["d1"] == "Permission denied: policy: system files"
    assert [c.session_id for _, c in policy.calls] == ["s-3"] * 3


# -- distributed: the hooks are served by worker processes ----------------------------------


async def test_distributed_hooks_block_a_call_and_rewrite_an_output(
    bus_settings: BusSettings, procs: Processes
) -> None:
    procs.worker(bus_settings, "workers.builtins.demo_hooks:SecretGuard", "guard")
    procs.worker(bus_settings, "workers.builtins.demo_hooks:Redactor", "redactor")
    async with HookClient(bus_settings) as client:
        await wait_live(client, "SecretGuard", "Redactor")
        tools = Tools()
        model = read_env_then_config()
        bus = HookBusAgents(client)
        agent = bus.wrap(Agent(name="main", model=model, tools=[tools.file_read]))

        result = await bus.run(agent, "read both files", session_id="s-remote")

    assert result.final_output == "done"
    assert tools.ran == [("file_read", {"path": "config.txt"})]
    sent = outputs(model)
    assert sent["c1"] == (
        "Tool call blocked by a hook. SecretGuard: .env files hold secrets; "
        "file_read on them is not allowed"
    )
    assert sent["c2"].startswith("config.txt: API_KEY=[redacted] and the rest")


async def test_distributed_rewrite_of_input_and_output_by_scripted_workers(
    bus_settings: BusSettings, procs: Processes
) -> None:
    from tests.remote_hooks import HookConfig

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
        model = ScriptedModel(
            [[function_call("file_write", {"path": "a.txt", "text": "hi"}, call_id="w1")],
             [assistant_message("ok")]]
        )  # fmt: skip
        bus = HookBusAgents(client)
        await bus.run(bus.wrap(Agent(name="main", model=model, tools=[tools.file_write])), "w")
    assert tools.ran == [("file_write", {"path": "notes/a.txt", "text": "hi"})]
    assert outputs(model)["w1"] == "written (details withheld)"


async def test_an_agent_used_as_a_tool_is_one_hooked_call_and_its_own_tools_can_be_hooked() -> None:
    registry = HookRegistry()
    registry.add(SecretGuard())
    seen = Recorder("seen", events=(HookEvent.PRE_TOOL_USE,))
    registry.add(seen)
    tools = Tools()
    inner_model = ScriptedModel(
        [[function_call("file_read", {"path": ".env"}, call_id="i1")], [assistant_message("no")]]
    )
    bus = HookBusAgents(registry)
    reader = bus.wrap(Agent(name="reader", model=inner_model, tools=[tools.file_read]))
    outer_model = ScriptedModel(
        [[function_call("ask_reader", {"input": "read .env"}, call_id="o1")],
         [assistant_message("done")]]
    )  # fmt: skip
    agent = bus.wrap(
        Agent(name="main", model=outer_model, tools=[reader.as_tool("ask_reader", "Reads.")])
    )
    await bus.run(agent, "go", session_id="s-5")
    assert tools.ran == []
    assert outputs(inner_model)["i1"].startswith("Tool call blocked by a hook. SecretGuard")
    assert [(c.tool_name, c.session_id) for _, c in seen.calls] == [
        ("ask_reader", "s-5"),
        ("file_read", "s-5"),
    ]


async def test_a_failed_run_stops_with_error_and_your_run_hooks_are_still_called() -> None:
    from agents import RunHooks

    class Mine(RunHooks[Any]):
        def __init__(self) -> None:
            self.llm_ends = 0

        async def on_llm_end(self, context: Any, agent: Any, response: Any) -> None:
            self.llm_ends += 1

    registry = HookRegistry()
    seen = Recorder("seen", events=(HookEvent.ON_SESSION_STOP,))
    registry.add(seen)
    tools = Tools()
    model = ScriptedModel(
        [[function_call("file_read", {"path": "a"}, call_id="c1")], RuntimeError("model down")]
    )
    mine = Mine()
    bus = HookBusAgents(registry)
    with pytest.raises(RuntimeError, match="model down"):
        await bus.run(bus.wrap(Agent(name="main", model=model, tools=[tools.file_read])), "go",
                      hooks=mine)  # fmt: skip
    assert mine.llm_ends == 1
    assert [(c.terminal, c.total_steps) for _, c in seen.calls] == [(TurnTerminal.ERROR, 1)]


async def test_a_cancelled_session_stops_the_run_at_its_next_tool_call(
    bus_settings: BusSettings, procs: Processes
) -> None:
    procs.worker(bus_settings, "workers.builtins.cancellation:RedisCancellationHook", "cancel")
    async with HookClient(bus_settings) as client:
        await wait_live(client, "CancellationHook")
        await client.cancel("s-c")  # what `hookbus cancel s-c` does
        tools = Tools()
        model = read_env_then_config()
        bus = HookBusAgents(client)
        agent = bus.wrap(Agent(name="main", model=model, tools=[tools.file_read]))
        with pytest.raises(SessionCancelled, match="session s-c was cancelled"):
            await bus.run(agent, "read both files", session_id="s-c")
        # The run's OnSessionStop lifts nothing: the cancellation ends with its TTL (set by the
        # CancellationHook when it blocked the call), or an operator.
        assert await client.redis.exists(client.keys.cancelled("s-c"))
        assert await client.redis.ttl(client.keys.cancelled("s-c")) > 0
    assert tools.ran == []


async def test_arguments_that_are_not_a_json_object_are_still_inspected() -> None:
    from agents import FunctionTool

    registry = HookRegistry()
    only_rm = ToolMatchFilter.parse(["shell"], ["input:rm -rf"])
    registry.add(Recorder("no-rm", Block(reason="no rm -rf"), events=(HookEvent.PRE_TOOL_USE,),
                          match_filter=only_rm))  # fmt: skip
    ran: list[str] = []

    async def run_shell(ctx: Any, arguments: str) -> str:
        ran.append(arguments)
        return "ran"

    shell = FunctionTool(
        name="shell",
        description="Run a raw command line.",
        params_json_schema={"type": "object", "properties": {}, "additionalProperties": False},
        on_invoke_tool=run_shell,
    )
    model = ScriptedModel(
        [[function_call("shell", "rm -rf /srv", call_id="s1"),
          function_call("shell", '"ls"', call_id="s2")],
         [assistant_message("ok")]]
    )  # fmt: skip
    bus = HookBusAgents(registry)
    await bus.run(bus.wrap(Agent(name="main", model=model, tools=[shell])), "go")
    assert ran == ['"ls"']  # the original arguments, untouched, for the call let through
    assert outputs(model)["s1"] == "Tool call blocked by a hook. no-rm: no rm -rf"


def test_without_the_extra_the_import_says_which_to_install() -> None:
    import subprocess
    import sys

    code = (
        "import sys; sys.modules['agents'] = None\n"  # as if the package were not installed
        "import agent_adapter.integrations.openai_agents"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 1
    assert "pip install 'hookbus[openai-agents]'" in out.stderr.splitlines()[-1]


async def test_tools_are_hooked_in_a_streamed_run_started_without_bus_run() -> None:
    from agents import Runner

    tools = Tools()
    model = read_env_then_config()
    bus = HookBusAgents(guard_and_redactor(), session_id="s-stream")
    streamed = Runner.run_streamed(
        bus.wrap(Agent(name="main", model=model, tools=[tools.file_read])), "go"
    )
    async for _ in streamed.stream_events():
        pass
    assert streamed.final_output == "done"
    assert tools.ran == [("file_read", {"path": "config.txt"})]
    assert outputs(model)["c1"].startswith("Tool call blocked by a hook. SecretGuard")
    assert outputs(model)["c2"].startswith("config.txt: API_KEY=[redacted]")


def guard_and_redactor() -> HookRegistry:
    registry = HookRegistry()
    registry.add(SecretGuard())
    registry.add(Redactor())
    return registry


async def test_a_cancellation_stops_a_bare_runner_run_too() -> None:
    from agents import Runner
    from agents.exceptions import UserError

    registry = HookRegistry()
    registry.add(Recorder("CancellationHook", Block(reason="session s-1 was cancelled by the user"),
                          events=(HookEvent.PRE_TOOL_USE,)))  # fmt: skip
    tools = Tools()
    agent = HookBusAgents(registry).wrap(
        Agent(name="main", model=read_env_then_config(), tools=[tools.file_read])
    )
    with pytest.raises(UserError) as raised:
        await Runner.run(agent, "go")
    assert isinstance(raised.value.__cause__, SessionCancelled)
    assert tools.ran == []


# -- the SDK's own observability, and a session across a pause for approvals ---------------


class Spans:
    """A trace provider of the SDK's that keeps the spans it ends (nothing is exported)."""

    def __init__(self) -> None:
        from agents.tracing import TracingProcessor
        from agents.tracing.provider import DefaultTraceProvider

        ended: list[Any] = []

        class Keep(TracingProcessor):
            def on_trace_start(self, trace: Any) -> None: ...
            def on_trace_end(self, trace: Any) -> None: ...
            def on_span_start(self, span: Any) -> None: ...
            def on_span_end(self, span: Any) -> None:
                ended.append(span)

            def shutdown(self) -> None: ...
            def force_flush(self) -> None: ...

        self.ended = ended
        self.provider = DefaultTraceProvider()
        self.provider.set_processors([Keep()])
        self.provider.set_disabled(False)

    def of_type(self, kind: str) -> list[dict[str, Any]]:
        return [s.span_data.export() for s in self.ended if s.span_data.type == kind]


@pytest.fixture
def spans() -> Any:
    from agents.tracing import get_trace_provider, set_trace_provider

    kept, previous = Spans(), get_trace_provider()
    set_trace_provider(kept.provider)
    try:
        yield kept
    finally:
        set_trace_provider(previous)


async def test_a_block_is_a_tool_guardrail_rejection_in_the_sdks_results_and_trace(
    spans: Spans,
) -> None:
    from agents import RunHooks

    class Ends(RunHooks[Any]):
        def __init__(self) -> None:
            self.started: list[str] = []
            self.ended: list[str] = []

        async def on_tool_start(self, context: Any, agent: Any, tool: Any) -> None:
            self.started.append(context.tool_call_id)

        async def on_tool_end(self, context: Any, agent: Any, tool: Any, result: Any) -> None:
            self.ended.append(context.tool_call_id)

    tools = Tools()
    ends = Ends()
    bus = HookBusAgents(guard_and_redactor())
    agent = bus.wrap(Agent(name="main", model=read_env_then_config(), tools=[tools.file_read]))
    result = await bus.run(agent, "read both files", session_id="s-g", hooks=ends)

    assert tools.ran == [("file_read", {"path": "config.txt"})]
    got = [(r.guardrail.get_name(), r.output.behavior) for r in result.tool_input_guardrail_results]
    assert got == [
        ("HookBus", {"type": "reject_content", "message": (
            "Tool call blocked by a hook. SecretGuard: .env files hold secrets; "
            "file_read on them is not allowed")}),
        ("HookBus", {"type": "allow"}),
    ]  # fmt: skip
    assert result.tool_input_guardrail_results[0].output.output_info == {
        "session_id": "s-g",
        "rewritten": False,
    }
    assert spans.of_type("guardrail") == [
        {"type": "guardrail", "name": "HookBus", "triggered": True},
        {"type": "guardrail", "name": "HookBus", "triggered": False},
    ]
    assert ends.started == ends.ended == ["c2"]  # the blocked call never started


async def test_a_resumed_run_continues_the_session_it_paused_in() -> None:
    registry = HookRegistry()
    seen = Recorder("seen")
    registry.add(seen)
    delete, ran, model = deleter("tmp/x")
    bus = HookBusAgents(registry)
    agent = bus.wrap(Agent(name="main", model=model, tools=[delete]))

    first = await bus.run(agent, "clean up", session_id="s-r")
    assert len(first.interruptions) == 1 and ran == []
    state = first.to_state()  # the SDK's own way, not decide_approvals
    state.approve(state.get_interruptions()[0])
    second = await bus.run(agent, state)  # no session_id: the state carries it

    assert second.final_output == "done" and ran == ["tmp/x"]
    await registry.drain()
    assert {c.session_id for e, c in seen.calls if hasattr(c, "session_id")} == {"s-r"}
    starts = [c.is_resume for e, c in seen.calls if e == HookEvent.ON_SESSION_START]
    assert starts == [False, True]
    stops = [c.terminal for e, c in seen.calls if e == HookEvent.ON_SESSION_STOP]
    assert stops == [TurnTerminal.COMPLETED, TurnTerminal.COMPLETED]  # the pause, the end
    assert [e for e, _ in seen.calls].count(HookEvent.PRE_TOOL_USE) == 1  # the resumed call's


async def test_a_state_that_carries_no_session_needs_one() -> None:
    from agents import RunState

    from bus import ConfigError

    delete, ran, model = deleter("tmp/x")
    bus = HookBusAgents(HookRegistry())
    agent = bus.wrap(Agent(name="main", model=model, tools=[delete]))
    first = await bus.run(agent, "clean up", session_id="s-r")
    restored = await RunState.from_string(agent, first.to_state().to_string())
    restored.approve(restored.get_interruptions()[0])
    with pytest.raises(ConfigError, match="the state carries no HookBus session"):
        await bus.run(agent, restored)
    assert ran == []
    second = await bus.run(agent, restored, session_id="s-r")
    assert second.final_output == "done" and ran == ["tmp/x"]


async def test_an_adapter_made_with_a_session_resumes_a_restored_state_in_it() -> None:
    from agents import RunState

    registry = HookRegistry()
    seen = Recorder("seen", events=(HookEvent.ON_SESSION_START, HookEvent.PRE_TOOL_USE))
    registry.add(seen)
    delete, ran, model = deleter("tmp/x")
    bus = HookBusAgents(registry, session_id="s-fixed")
    agent = bus.wrap(Agent(name="main", model=model, tools=[delete]))
    first = await bus.run(agent, "clean up")
    restored = await RunState.from_string(agent, first.to_state().to_string())
    restored.approve(restored.get_interruptions()[0])
    await bus.run(agent, restored)
    assert ran == ["tmp/x"]
    assert {c.session_id for _, c in seen.calls} == {"s-fixed"}


async def test_a_cancel_while_paused_refuses_the_resumed_runs_calls(
    bus_settings: BusSettings, procs: Processes
) -> None:
    procs.worker(bus_settings, "workers.builtins.cancellation:RedisCancellationHook", "cancel")
    delete, ran, model = deleter("tmp/x")
    async with HookClient(bus_settings) as client:
        await wait_live(client, "CancellationHook")
        bus = HookBusAgents(client)
        agent = bus.wrap(Agent(name="main", model=model, tools=[delete]))
        first = await bus.run(agent, "clean up", session_id="s-p")
        state, pending = await bus.decide_approvals(first)
        state.approve(pending[0])  # the person says yes, but meanwhile:
        await client.cancel("s-p")  # what `hookbus cancel s-p` does
        with pytest.raises(SessionCancelled, match="session s-p was cancelled"):
            await bus.run(agent, state)
    assert ran == []


async def test_the_approver_gets_the_tool_its_arguments_as_hooks_left_them_and_the_reason() -> None:
    registry = HookRegistry()
    registry.add(Recorder("ask", PermissionRequired(permission="write", tool_name="file_write"),
                          events=(HookEvent.PRE_TOOL_USE,)))  # fmt: skip
    registry.add(Recorder("notes", MutateInput(updated_args={"path": "notes/a", "text": "x"}),
                          events=(HookEvent.PRE_TOOL_USE,)))  # fmt: skip
    asked: list[tuple[str, dict[str, Any], str]] = []

    async def approver(tool_name: str, args: Any, reason: str) -> bool | None:
        asked.append((tool_name, dict(args), reason))
        return args["path"].startswith("notes/")

    tools = Tools()
    model = ScriptedModel(
        [[function_call("file_write", {"path": "a", "text": "x"}, call_id="w1")],
         [assistant_message("ok")]]
    )  # fmt: skip
    bus = HookBusAgents(registry, approver=approver)
    await bus.run(bus.wrap(Agent(name="main", model=model, tools=[tools.file_write])), "write")
    assert asked == [("file_write", {"path": "notes/a", "text": "x"}, "write (file_write)")]
    assert tools.ran == [("file_write", {"path": "notes/a", "text": "x"})]


async def test_a_call_whose_guardrail_did_not_run_is_checked_by_its_invoker() -> None:
    from agents.tool_context import ToolContext

    tools = Tools()
    hooked = HookBusAgents(guard_and_redactor(), session_id="s-i").wrap_tool(tools.file_read)
    arguments = '{"path": ".env"}'
    ctx = ToolContext(None, tool_name="file_read", tool_call_id="x", tool_arguments=arguments)
    said = await hooked.on_invoke_tool(ctx, arguments)  # not through the SDK's loop
    assert said.startswith("Tool call blocked by a hook. SecretGuard")
    assert tools.ran == []
