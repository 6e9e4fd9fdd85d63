"""The reference ReAct runtime: every integration point of the specification, in one loop.

``AgentRuntime.run_turn(question)`` fires OnSessionStart, then per step asks the (scripted) LLM,
runs its tool calls through the executor, injects hook contexts as deduplicated
``<system-reminder>`` messages, fires OnStepComplete and compacts the context when the estimated
tokens pass the limit (OnPreCompact / OnPostCompact). A ``run_subagent`` tool runs a subagent
whose own loop fires Pre/PostToolUse, framed by OnSubagentStart / OnSubagentStop. Whatever
happens — a final answer, ``max_steps``, a cancellation, an error — OnSessionStop runs last.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Mapping
from typing import Any

import msgspec

from agent_adapter.executor import Approver, Denial, ToolExecutor, ToolMessage
from agent_adapter.llm import ChatMessage, ScriptedLLM
from agent_adapter.permissions import PermissionChecker, ToolKind
from agent_adapter.tools import Tool, Toolbox, ToolFailed
from bus import (
    BlockingError,
    ContextDeduplicator,
    EventRunner,
    PostCompactContext,
    PreCompactContext,
    SessionStartContext,
    SessionStopContext,
    StepCompleteContext,
    SubagentStartContext,
    SubagentStopContext,
    TurnTerminal,
    render_system_reminder,
)
from bus.actions import ShadowedAnswer
from bus.telemetry import tracing as telemetry
from bus.telemetry.tracing import instrument
from workers.builtins.embedded import MetricsData

log = logging.getLogger("hookbus.runtime")


class TurnResult(msgspec.Struct, kw_only=True):
    """What one turn produced."""

    session_id: str
    answer: str
    terminal: TurnTerminal
    steps: int
    messages: list[ChatMessage]  # the conversation as it ended (after any compaction)
    tool_messages: list[ToolMessage]  # every tool result of the turn, in order
    reminders: list[str]
    denials: list[Denial]
    blocking_errors: list[BlockingError]
    warnings: list[str]
    shadowed: list[ShadowedAnswer] = msgspec.field(default_factory=list)  # warn/dryrun answers


def estimate_tokens(messages: list[ChatMessage]) -> int:
    """A rough token count: four characters per token, plus a little per message."""
    return sum(len(m.content) // 4 + 4 for m in messages)


class AgentRuntime:
    """A ReAct agent driven by a scripted LLM, with hooks at every lifecycle point.

    Args:
        hooks: the hook runner: ``HookRegistry`` (embedded) or the distributed client.
        llm: the scripted LLM of the main agent.
        toolbox: the tools it may call.
        subagents: scripted LLMs of the subagents ``run_subagent`` may start, by name.
        cancelled: the shared set of cancelled session ids (the CancellationHook's).
        metrics: the metrics object the MetricsHook fills; ``get_metrics`` reads it.
    """

    def __init__(
        self,
        hooks: EventRunner,
        llm: ScriptedLLM,
        toolbox: Toolbox,
        *,
        session_id: str | None = None,
        checker: PermissionChecker | None = None,
        session_checker: PermissionChecker | None = None,
        approver: Approver | None = None,
        subagents: Mapping[str, ScriptedLLM] | None = None,
        cancelled: set[str] | None = None,
        metrics: MetricsData | None = None,
        max_steps: int = 8,
        token_limit: int = 2000,
        keep_recent: int = 4,
        turn_index: int = 0,
        system_prompt: str = "You are a careful agent. Use the tools you are given.",
    ) -> None:
        self.hooks = instrument(hooks)  # spans and metrics when OTEL_* asks for them
        self.llm = llm
        self.session_id = session_id or f"session-{uuid.uuid4().hex[:8]}"
        self.executor = ToolExecutor(
            hooks, toolbox, checker=checker, session_checker=session_checker, approver=approver
        )
        self.subagents = dict(subagents or {})
        self.cancelled = cancelled if cancelled is not None else set()
        self.metrics = metrics if metrics is not None else MetricsData()
        self.max_steps = max_steps
        self.token_limit = token_limit
        self.keep_recent = keep_recent
        self.turn_index = turn_index
        self.system_prompt = system_prompt
        if self.subagents:
            toolbox.add(
                Tool(
                    "run_subagent",
                    "Delegate a task to a named subagent",
                    ToolKind.READ,
                    {"name": str, "prompt": str},
                    self._run_subagent,
                )
            )

    def get_metrics(self) -> dict[str, Any]:
        """The metrics the MetricsHook collected for this runtime."""
        return self.metrics.snapshot()

    async def run_turn(self, question: str) -> TurnResult:
        """Run one turn to its end; never raises for what the LLM or a tool does."""
        result = TurnResult(
            session_id=self.session_id,
            answer="",
            terminal=TurnTerminal.ERROR,
            steps=0,
            messages=[ChatMessage("system", self.system_prompt), ChatMessage("user", question)],
            tool_messages=[],
            reminders=[],
            denials=[],
            blocking_errors=[],
            warnings=[],
        )
        with telemetry.span(
            "turn", {"session.id": self.session_id, "turn.index": self.turn_index}
        ) as span:
            await self._turn(result)
            span.set_attribute("turn.terminal", result.terminal.value)
        return result

    async def _turn(self, result: TurnResult) -> None:
        await self.hooks.run_on_session_start(
            SessionStartContext(
                session_id=self.session_id,
                turn_index=self.turn_index,
                is_resume=self.turn_index > 0,
            )
        )
        try:
            await self._loop(result)
        except Exception as exc:  # the agent must always reach OnSessionStop
            log.exception("turn of %s failed", self.session_id)
            result.terminal = TurnTerminal.ERROR
            result.answer = f"The turn stopped on an internal error: {exc}"
        finally:
            await self.hooks.run_on_session_stop(
                SessionStopContext(
                    session_id=self.session_id, terminal=result.terminal, total_steps=result.steps
                )
            )

    async def _loop(self, turn: TurnResult) -> None:
        messages = turn.messages
        for step in range(1, self.max_steps + 1):
            if self.session_id in self.cancelled:
                turn.terminal = TurnTerminal.CANCELLED
                turn.answer = "The session was cancelled."
                return
            turn.steps = step
            with telemetry.span(f"step {step}", {"step": step}):
                if await self._step(turn, step):
                    return
        turn.terminal = TurnTerminal.MAX_STEPS
        turn.answer = f"Stopped after {self.max_steps} steps without a final answer."
        messages.append(
            ChatMessage("user", f"<system-reminder>\n{turn.answer}\n</system-reminder>")
        )

    async def _step(self, turn: TurnResult, step: int) -> bool:
        """One ReAct step; True when the turn is over."""
        messages = turn.messages
        reply = await self.llm.complete(messages)
        if not reply.tool_calls:
            messages.append(ChatMessage("assistant", reply.text))
            turn.terminal, turn.answer = TurnTerminal.COMPLETED, reply.text
            return True
        calls = ", ".join(c.name for c in reply.tool_calls)
        messages.append(ChatMessage("assistant", reply.text or f"(calls {calls})"))
        executed = await self.executor.execute_parallel(
            self.session_id, reply.tool_calls, step=step
        )
        for m in executed.messages:
            messages.append(ChatMessage("tool", m.content, m.tool_name))
        turn.tool_messages.extend(executed.messages)
        dedup = ContextDeduplicator()
        for ctx in executed.hook_contexts:
            if not dedup.is_duplicate(ctx):
                reminder = render_system_reminder(ctx)
                messages.append(ChatMessage("user", reminder))
                turn.reminders.append(reminder)
        for b in executed.blocking_errors:
            log.warning("tool call blocked by %s: %s", b.hook_name, b.reason)
            if b.hook_name == "CancellationHook":  # however the hook learnt of it
                self.cancelled.add(self.session_id)
        for w in executed.warnings:
            log.warning("hook warning: %s", w)
        for permission, tool in executed.post_permission_requests:
            log.info("post-hoc permission request for %s: %s", tool, permission)
        turn.denials.extend(executed.denials)
        turn.blocking_errors.extend(executed.blocking_errors)
        turn.warnings.extend(executed.warnings)
        turn.shadowed.extend(executed.shadowed)
        for answer in executed.shadowed:
            log.info("%s (%s) %s", answer.hook_name, answer.mode, answer.detail)
        tokens = estimate_tokens(messages)
        await self.hooks.run_on_step_complete(
            StepCompleteContext(
                session_id=self.session_id,
                step=step,
                max_steps=self.max_steps,
                messages_count=len(messages),
                estimated_tokens=tokens,
                token_limit=self.token_limit,
            )
        )
        if tokens > self.token_limit:
            await self._compact(messages, tokens)
        return False

    async def _compact(self, messages: list[ChatMessage], tokens: int) -> None:
        await self.hooks.run_on_pre_compact(
            PreCompactContext(
                session_id=self.session_id, message_count=len(messages), estimated_tokens=tokens
            )
        )
        method = compress_with_fallback(messages, self.keep_recent, self.token_limit)
        await self.hooks.run_on_post_compact(
            PostCompactContext(
                session_id=self.session_id,
                new_message_count=len(messages),
                compression_method=method,
            )
        )

    async def _run_subagent(self, args: dict[str, Any]) -> str:
        name, prompt = args["name"], args["prompt"]
        llm = self.subagents.get(name)
        if llm is None:
            raise ToolFailed(f"no subagent named {name!r}; known: {', '.join(self.subagents)}")
        await self.hooks.run_on_subagent_start(
            SubagentStartContext(
                parent_session_id=self.session_id, subagent_name=name, prompt=prompt
            )
        )
        messages = [ChatMessage("user", prompt)]
        summary, steps, is_error = f"{name} reached its step limit", 0, True
        for steps in range(1, self.max_steps + 1):
            reply = await llm.complete(messages)
            if not reply.tool_calls:
                summary, is_error = reply.text, False
                break
            executed = await self.executor.execute_parallel(
                self.session_id, reply.tool_calls, step=steps, agent_name=name, is_subagent=True
            )
            messages.extend(ChatMessage("tool", m.content, m.tool_name) for m in executed.messages)
        await self.hooks.run_on_subagent_stop(
            SubagentStopContext(
                parent_session_id=self.session_id,
                subagent_name=name,
                result_summary=summary,
                steps=steps,
                is_error=is_error,
            )
        )
        if is_error:
            raise ToolFailed(summary)
        return summary


def compress_with_fallback(messages: list[ChatMessage], keep_recent: int, token_limit: int) -> str:
    """Shrink ``messages`` in place; returns the method used ("summary" or "truncate").

    Keeps the system prompt, the question and the most recent messages, and replaces the middle
    with a one-line-per-message summary. If that does not fit (or there is no middle), long
    messages are cut until the conversation fits the limit.
    """
    head, tail = messages[:2], messages[2:][-keep_recent:]
    middle = messages[2 : len(messages) - len(tail)]
    if middle:
        lines = [f"- {m.role}{'/' + m.name if m.name else ''}: {m.content[:60]}" for m in middle]
        summary = f"<summary of {len(middle)} earlier messages>\n" + "\n".join(lines)
        messages[:] = [*head, ChatMessage("user", summary), *tail]
        if estimate_tokens(messages) <= token_limit:
            return "summary"
        messages[2] = ChatMessage("user", f"<{len(middle)} earlier messages dropped>")
    budget = max(80, token_limit * 4 // max(1, len(messages)))
    for m in messages[1:]:
        if len(m.content) > budget:
            m.content = m.content[:budget] + " …[cut by compaction]"
    return "truncate"
