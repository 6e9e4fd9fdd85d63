"""``hookbus demo``: one scripted session that shows every lifecycle event and intervention.

The session blocks a call, rewrites an input, redacts an output, warns about a long output,
lets a hook override a permission, is denied a dangerous command, recovers from a failed call,
runs a subagent, compacts its context and is finally cancelled. The timeline shows each
dispatch: the event, the tool, every hook called with its answer, and the latency.
"""

from __future__ import annotations

import asyncio
import logging
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import msgspec

from agent_adapter.llm import ChatMessage, LLMReply, ScriptedLLM, answer, call, tools
from agent_adapter.permissions import PermissionChecker, PermissionRule
from agent_adapter.runtime import AgentRuntime, TurnResult
from agent_adapter.tools import sandbox_tools
from bus import EventRunner, HookContext, HookEvent, HookSettings, PermissionDecision
from bus.aggregation import Outcome
from workers.builtins import MetricsData, with_builtins
from workers.demo_hooks import DEMO_HOOKS, EventCounter

CONFIG = "\n".join(
    ["# service configuration", "API_KEY=sk-live-51Hx9d2", "region=eu-west-1"]
    + [f"feature_{i}=enabled  # rolled out in wave {i % 4}" for i in range(12)]
)
CORPUS = {
    "hooks": "Hooks plug cross-cutting concerns into the agent loop.",
    "streams": "Redis Streams keep events for consumer groups.",
    "tracing": "Every hook execution is a span in one trace.",
}
QUESTION = "Tidy up the project notes and check the configuration."


def session_plan(cancelled: set[str], session_id: str) -> list[Any]:
    """The main agent's script: one step per intervention the demo shows."""

    def cancel_then_read(_: Sequence[ChatMessage]) -> LLMReply:
        cancelled.add(session_id)  # the user presses "stop" while the model is thinking
        return tools(call("file_read", path="notes/todo.txt"))

    return [
        tools(call("file_read", path=".env"), call("file_write", path="todo.txt", content="- a")),
        tools(call("file_read", path="config.txt")),
        tools(call("run_shell", command="ls notes"), call("run_shell", command="rm -rf notes")),
        tools(call("file_read", path="missing.txt")),
        tools(call("file_write", path="notes/secrets.txt", content="x")),
        tools(call("run_subagent", name="researcher", prompt="What are hooks for?")),
        cancel_then_read,
        answer("never reached: the session is cancelled first"),
    ]


def researcher() -> ScriptedLLM:
    return ScriptedLLM(
        [tools(call("search_corpus", query="hooks")), answer("Hooks add concerns to the loop.")]
    )


@dataclass
class Timeline:
    """A DispatchObserver that prints one line per dispatch."""

    out: TextIO
    rows: list[tuple[str, str, str, float]] = field(default_factory=list)

    def __call__(
        self, event: HookEvent, ctx: HookContext, outcomes: Sequence[Outcome], seconds: float
    ) -> None:
        tool = getattr(ctx, "tool_name", "") or getattr(ctx, "subagent_name", "")
        answers = "; ".join(_describe(o) for o in outcomes) or "-"
        self.rows.append((event.value, tool, answers, seconds))
        print(f"{event.value:<19} {tool:<14} {seconds * 1e6:>8.0f} µs  {answers}", file=self.out)


def _describe(o: Outcome) -> str:
    if o.failure is not None:
        return f"{o.spec.name}: {o.failure}"
    a = o.action
    if a is None:
        return f"{o.spec.name}: ok"
    name = type(a).__name__
    detail = next(
        (
            getattr(a, f)
            for f in ("reason", "updated_content", "message", "context")
            if hasattr(a, f)
        ),
        None,
    )
    if name == "MutateInput":
        detail = a.updated_args
    if name == "Override":
        detail = f"{a.decision.value}: {a.reason}"
    text = f"{o.spec.name}: {name}" + (f"({detail})" if detail not in (None, "") else "")
    text = text.replace("\n", " ")
    return text if len(text) <= 70 else text[:67] + "..."


def build_runtime(
    hooks: EventRunner, workdir: Path, cancelled: set[str], metrics: MetricsData, session_id: str
) -> AgentRuntime:
    """The demo's agent: sandbox tools, a deny rule for secrets, the scripted plan."""
    sandbox = workdir / "sandbox"
    box = sandbox_tools(sandbox, CORPUS)
    (sandbox / "config.txt").write_text(CONFIG)
    checker = PermissionChecker(
        [PermissionRule.parse("file_write", PermissionDecision.DENY, content=["path:secrets"])]
    )
    return AgentRuntime(
        hooks,
        ScriptedLLM(session_plan(cancelled, session_id)),
        box,
        session_id=session_id,
        checker=checker,
        subagents={"researcher": researcher()},
        cancelled=cancelled,
        metrics=metrics,
        max_steps=10,
        token_limit=400,
    )


def embedded_registry(
    workdir: Path, cancelled: set[str], metrics: MetricsData
) -> tuple[Any, EventCounter]:
    settings = HookSettings.from_env()
    settings = msgspec.structs.replace(settings, truncate_chars=240)  # show the truncation
    registry = with_builtins(workdir / "audit.db", cancelled, metrics, settings)
    for hook_class in DEMO_HOOKS:
        registry.add(hook_class())
    counter = EventCounter()
    registry.add_async(counter)
    return registry, counter


async def run_embedded(workdir: Path, out: TextIO) -> tuple[TurnResult, list[dict[str, Any]]]:
    """Run the demo session in embedded mode; returns the turn and the audit rows."""
    cancelled: set[str] = set()
    metrics = MetricsData()
    registry, counter = embedded_registry(workdir, cancelled, metrics)
    timeline = Timeline(out)
    registry.observers.append(timeline)
    try:
        print(f"{'event':<19} {'tool':<14} {'latency':>11}  hooks and their answers", file=out)
        runtime = build_runtime(registry, workdir, cancelled, metrics, "demo-session")
        result = await runtime.run_turn(QUESTION)
        await registry.drain()
        await registry.audit_log.flush()
        rows = registry.audit_log.rows()
        report(result, rows, runtime.get_metrics(), counter.counts, out)
        return result, rows
    finally:
        registry.close()


def report(
    result: TurnResult,
    rows: list[dict[str, Any]],
    metrics: dict[str, Any],
    async_counts: dict[str, int],
    out: TextIO,
) -> None:
    print(f"\nturn ended: {result.terminal.value} after {result.steps} steps", file=out)
    print(f"answer: {result.answer}", file=out)
    print(f"\nsystem reminders the agent saw ({len(result.reminders)}):", file=out)
    for r in result.reminders:
        print("  " + r.replace("\n", " "), file=out)
    print("\ndenials:", file=out)
    for d in result.denials:
        print(f"  {d.tool_name}: P{d.level} {d.source.value} — {d.reason}", file=out)
    print(f"\naudit log ({len(rows)} rows):", file=out)
    print(f"  {'status':<13} {'tool':<14} preview", file=out)
    for row in rows:
        preview = (row["output_preview"] or "").replace("\n", " ")[:50]
        print(f"  {row['status']:<13} {row['tool_name'] or '-':<14} {preview}", file=out)
    print("\nmetrics:", file=out)
    for key, value in metrics.items():
        print(f"  {key}: {value}", file=out)
    print(f"\nasync hook EventCounter saw: {async_counts}", file=out)


def main(out: TextIO, *, redis_url: str | None = None, embedded: bool = True) -> int:
    # The timeline already shows blocks, warnings and denials; keep the log for real trouble.
    logging.basicConfig(level=logging.ERROR, format="%(levelname)s %(name)s: %(message)s")
    with tempfile.TemporaryDirectory(prefix="hookbus-demo-") as tmp:
        print("hookbus demo — embedded mode (hooks in this process)\n", file=out)
        asyncio.run(run_embedded(Path(tmp), out))
    return 0
