"""What HookBus adds to an OpenAI Agents SDK or LangChain agent: one run, with and without it.

A run is one agent invocation on the framework's own scripted model: the model asks for one
tool call (``file_read``), then answers. Each series runs the same agent: **bare** (no HookBus),
then through the adapter with **0 hooks** (``HookRegistry()``: the adapter's own cost), the two
demo hooks **in-process** (``SecretGuard`` and ``Redactor``, which let this call through), and
the same two as **worker processes** (``HookClient`` over a private redis-server). For the SDK,
**tools only** wraps the tools but runs ``Runner.run`` itself (no session and step events); for
LangChain, **no-op middleware** has the same four hooks as ``HookBusMiddleware`` doing nothing:
what LangGraph itself charges for the nodes a middleware adds.

With HookBus a run dispatches PreToolUse and PostToolUse, plus OnSessionStart, two
OnStepComplete and OnSessionStop (the SDK's **tools only**: the first two). Series alternate in
``rounds`` batches; the figure is each series' median run time and its overhead over **bare**
(the difference of the medians) and over the floor (``FLOOR``). Writes
bench/results/frameworks.json.
"""

from __future__ import annotations

import asyncio
import signal
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from bench.common import (
    ROOT,
    Children,
    Plan,
    header,
    hookbus_env,
    percentiles,
    progress,
    terminated,
    write_results,
)

RESULTS = ROOT / "bench" / "results" / "frameworks.json"
FULL = Plan(warmup=20, rounds=10, batch=40)
QUICK = Plan(warmup=2, rounds=2, batch=5)
FRAMEWORKS = ("openai-agents", "langgraph")
SERIES = {
    "openai-agents": ("bare", "tools only, 0 hooks", "0 hooks", "2 hooks in-process",
                      "2 hook workers"),
    "langgraph": ("bare", "no-op middleware", "0 hooks", "2 hooks in-process", "2 hook workers"),
}  # fmt: skip
#: What HookBus's own cost is measured against: for LangChain, the framework's cost of a
#: middleware with the same hooks.
FLOOR = {"openai-agents": "bare", "langgraph": "no-op middleware"}
HOOKS = ("SecretGuard", "Redactor")

Run = Callable[[], Awaitable[Any]]


def _registry(hooks: int) -> Any:
    from bus import HookRegistry
    from workers.builtins.demo_hooks import Redactor, SecretGuard

    registry = HookRegistry()
    if hooks:
        registry.add(SecretGuard())
        registry.add(Redactor())
    return registry


def _openai_runs(runs: int, client: Any) -> dict[str, Run]:
    from agents import Agent, Runner, function_tool, set_tracing_disabled
    from agents.testing import ScriptedModel, assistant_message, function_call

    from agent_adapter.integrations.openai_agents import HookBusAgents

    set_tracing_disabled(True)

    @function_tool
    def file_read(path: str) -> str:
        """Read a file."""
        return f"the text of {path}"

    def agent() -> Any:
        steps = [[function_call("file_read", {"path": "a.txt"}, call_id="c1")],
                 [assistant_message("done")]] * runs  # fmt: skip
        return Agent(name="main", model=ScriptedModel(steps), tools=[file_read])

    bare = agent()
    tools_only = HookBusAgents(_registry(0)).wrap(agent())
    made: dict[str, Run] = {
        "bare": lambda: Runner.run(bare, "go"),
        "tools only, 0 hooks": lambda: Runner.run(tools_only, "go"),
    }
    for series, hooks in (("0 hooks", _registry(0)), ("2 hooks in-process", _registry(2)),
                          ("2 hook workers", client)):  # fmt: skip
        bus = HookBusAgents(hooks)
        wrapped = bus.wrap(agent())
        made[series] = lambda bus=bus, wrapped=wrapped: bus.run(wrapped, "go")
    return made


def _langgraph_runs(runs: int, client: Any) -> dict[str, Run]:
    from langchain.agents import create_agent
    from langchain.agents.middleware import AgentMiddleware
    from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
    from langchain_core.messages import AIMessage
    from langchain_core.tools import tool

    from agent_adapter.integrations.langchain import HookBusMiddleware

    class Scripted(GenericFakeChatModel):
        def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
            return self

    @tool
    def file_read(path: str) -> str:
        """Read a file."""
        return f"the text of {path}"

    def model() -> Any:
        call = {"name": "file_read", "args": {"path": "a.txt"}, "id": "c1"}
        turns = [AIMessage("", tool_calls=[call]), AIMessage("done")] * runs
        return Scripted(messages=iter(turns))

    class Noop(AgentMiddleware):  # type: ignore[type-arg]
        """The same hooks as HookBusMiddleware, doing nothing: LangGraph's cost of the nodes."""

        async def abefore_agent(self, state: Any, runtime: Any) -> None:
            return None

        async def aafter_model(self, state: Any, runtime: Any) -> None:
            return None

        async def aafter_agent(self, state: Any, runtime: Any) -> None:
            return None

        async def awrap_tool_call(self, request: Any, handler: Any) -> Any:
            return await handler(request)

    question = {"messages": [{"role": "user", "content": "go"}]}
    bare = create_agent(model(), [file_read])
    noop = create_agent(model(), [file_read], middleware=[Noop()])
    made: dict[str, Run] = {
        "bare": lambda: bare.ainvoke(question),
        "no-op middleware": lambda: noop.ainvoke(question),
    }
    for series, hooks in (("0 hooks", _registry(0)), ("2 hooks in-process", _registry(2)),
                          ("2 hook workers", client)):  # fmt: skip
        agent = create_agent(model(), [file_read], middleware=[HookBusMiddleware(hooks)])
        made[series] = lambda agent=agent: agent.ainvoke(question)
    return made


async def _measure(framework: str, plan: Plan, settings: Any) -> dict[str, list[int]]:
    from agent_adapter.client import HookClient

    async with HookClient(settings) as client:
        deadline = time.monotonic() + 60
        while not all(client.directory.live(h) for h in HOOKS):
            if time.monotonic() > deadline:
                raise RuntimeError(f"hook workers {HOOKS} not live after 60 s")
            await asyncio.sleep(0.05)
        make = _openai_runs if framework == "openai-agents" else _langgraph_runs
        runs = make(plan.warmup + plan.samples, client)
        samples: dict[str, list[int]] = {s: [] for s in runs}
        for run in runs.values():
            for _ in range(plan.warmup):
                await run()
        for _ in range(plan.rounds):
            for series, run in runs.items():
                for _ in range(plan.batch):
                    t0 = time.perf_counter_ns()
                    await run()
                    samples[series].append(time.perf_counter_ns() - t0)
    return samples


def main(argv: list[str] | None = None) -> int:
    from bus.settings import BusSettings
    from workers.local.redis_server import RedisServer

    argv = list(sys.argv[1:] if argv is None else argv)
    quick = "--quick" in argv
    plan = QUICK if quick else FULL
    signal.signal(signal.SIGTERM, terminated)
    report: dict[str, Any] = {**header("frameworks", quick), "plan": plan.__dict__, "results": []}
    print(f"frameworks: one agent run (1 tool call, 2 model calls), {plan.samples} per series")
    with tempfile.TemporaryDirectory() as logs, RedisServer() as redis:
        children = Children(Path(logs))
        prefix = f"bench-fw-{uuid.uuid4().hex[:8]}"
        env = hookbus_env(redis.url, prefix)
        settings = BusSettings(redis_url=redis.url, prefix=prefix)
        try:
            for hook in HOOKS:
                children.start(
                    hook, "workers.cli", ["worker", f"workers.builtins.demo_hooks:{hook}"], env
                )
            for framework in FRAMEWORKS:
                progress(f"{framework} ...")
                samples = asyncio.run(_measure(framework, plan, settings))
                children.check()
                bare_p50 = percentiles(samples["bare"])[0]
                floor = FLOOR[framework]
                floor_p50 = percentiles(samples[floor])[0]
                for series, times in samples.items():
                    p50, p99 = percentiles(times)
                    row = {
                        "framework": framework,
                        "series": series,
                        "samples": len(times),
                        "p50_us": p50,
                        "p99_us": p99,
                        "overhead_p50_us": p50 - bare_p50,
                        "ratio_p50": p50 / bare_p50,
                        "floor": floor,
                        "overhead_over_floor_p50_us": p50 - floor_p50,
                    }
                    report["results"].append(row)
                    extra = f"+{p50 - bare_p50:>6.0f} µs over bare ({p50 / bare_p50:.2f}x)"
                    print(f"  {framework:<14} {series:<20} p50 {p50:>8.0f} µs  {extra}")
        finally:
            children.stop()
    write_results(RESULTS, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
