"""HookBus around an OpenAI Agents SDK agent (``pip install 'hookbus[openai-agents]'``).

::

    bus = HookBusAgents(hooks)                  # HookRegistry (embedded) or HookClient
    agent = bus.wrap(agent)                     # its function tools, and its handoffs', hooked
    result = await bus.run(agent, "question", session_id="s-1")

``wrap`` returns a copy of the agent (``Agent.clone``) whose every ``FunctionTool`` is a copy
with a HookBus invoker in front of the SDK's own (``on_invoke_tool``, the SDK's documented way
in: it gets the call's arguments as JSON and returns its output). Why not the SDK's tool
guardrails: they can reject a call or replace its output, but not rewrite its arguments, which
PreToolUse ``MutateInput`` needs. So the tool runs after the SDK's approvals, guardrails and
``on_tool_start``, and PreToolUse runs just before its body:

* PreToolUse ``Block``: the body does not run; the model gets the refusal as the tool's output.
* PreToolUse ``MutateInput``: the body runs with the rewritten arguments.
* PostToolUse ``MutateOutput``: the model gets the rewritten output. Output that is not text
  (``ToolOutputImage``, a dict, …) is shown to hooks as ``str(output)``, and passed on unchanged
  unless a hook rewrote it.
* A tool whose exception the SDK turns into a message (its ``failure_error_function``, the
  default) reaches PostToolUse as that message; a tool whose exceptions propagate
  (``failure_error_function=None``) gets PostToolUseFailure, and the exception goes on.

``run`` is ``Runner.run`` framed by the session events, with a ``RunHooks`` that maps the SDK's
lifecycle onto HookBus's (``HookBusRunHooks``; a ``hooks=`` you pass is still called):

==============================  ===============================================================
SDK                             HookBus
==============================  ===============================================================
``Runner.run`` starts           OnSessionStart (``is_resume`` when the input is a ``RunState``)
``on_llm_end``                  OnStepComplete (``step`` counts model calls, ``max_steps`` is
                                ``max_turns``)
``on_handoff``                  OnSubagentStart (``subagent_name`` is the agent handed to)
``on_agent_end`` of an agent    OnSubagentStop (``result_summary``: its final output as text)
handed to
``Runner.run`` ends             OnSessionStop: ``Completed`` (also when it stops for
                                approvals), ``MaxSteps`` (``MaxTurnsExceeded``), ``Cancelled``
                                (``hookbus cancel``, or the task was cancelled), ``Error`` (the
                                exception goes on)
tools with ``needs_approval``   ``decide_approvals(result)``: PermissionRequest hooks approve or
                                reject each pending call; the rest are left to a person
==============================  ===============================================================

``hookbus cancel SESSION`` stops the session's run at its next tool call: the call does not
run, OnSessionStop says ``Cancelled`` and ``run`` raises ``SessionCancelled``. Tools the
SDK runs itself (hosted tools: web search, file search, code interpreter; MCP servers' tools)
have no ``FunctionTool`` here and are not hooked.
"""

from __future__ import annotations

import asyncio
import copy
import json
import time
import uuid
import weakref
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

try:
    from agents import Agent, FunctionTool, RunHooks, Runner, RunResult
    from agents.exceptions import MaxTurnsExceeded
    from agents.items import ModelResponse, ToolApprovalItem
    from agents.run_context import RunContextWrapper
    from agents.run_state import RunState
    from agents.tool_context import ToolContext
except ModuleNotFoundError as exc:  # say which extra brings it, not only which module is missing
    raise ModuleNotFoundError(
        f"{exc}: HookBus's OpenAI Agents SDK adapter needs pip install 'hookbus[openai-agents]'",
        name=exc.name,
    ) from exc

from agent_adapter.executor import Approver
from agent_adapter.integrations.gate import ToolGate, elapsed_ms
from bus import (
    EventRunner,
    PermissionDecision,
    SessionCancelled,
    SessionStartContext,
    SessionStopContext,
    StepCompleteContext,
    SubagentStartContext,
    SubagentStopContext,
    TurnTerminal,
)

DEFAULT_MAX_TURNS = 10  # the SDK's own default for Runner.run
NON_OBJECT_INPUT = "input"  # where arguments that are not a JSON object are shown to hooks


@dataclass
class _Run:
    """The run in progress in this task (tool invocations run in tasks that inherit it)."""

    session_id: str
    steps: int = 0
    handed_to: set[str] = field(default_factory=set)


_current: ContextVar[_Run | None] = ContextVar("hookbus_openai_agents_run", default=None)


def _as_args(arguments: str) -> dict[str, Any]:
    """The call's arguments as hooks see them: the JSON object the model sent; anything else
    (not an object, not JSON) under ``"input"``, so that hooks inspect every call."""
    try:
        value = json.loads(arguments) if arguments.strip() else {}
    except ValueError:
        return {NON_OBJECT_INPUT: arguments}
    return value if isinstance(value, dict) else {NON_OBJECT_INPUT: value}


def _cancellation(exc: BaseException) -> SessionCancelled | None:
    """The ``SessionCancelled`` that ``exc`` is, or was raised from."""
    seen: set[int] = set()
    cause: BaseException | None = exc
    while cause is not None and id(cause) not in seen:
        if isinstance(cause, SessionCancelled):
            return cause
        seen.add(id(cause))
        cause = cause.__cause__
    return None


class HookedInvoker:
    """A ``FunctionTool.on_invoke_tool`` that runs the original one through HookBus."""

    def __init__(self, bus: HookBusAgents, tool_name: str, original: Any) -> None:
        self.bus = bus
        self.tool_name = tool_name
        self.original = original

    async def __call__(self, ctx: ToolContext[Any], arguments: str) -> Any:
        run = _current.get()
        session = run.session_id if run is not None else self.bus.session_id
        step = run.steps if run is not None else 0
        args = _as_args(arguments)
        verdict = await self.bus.gate.before(session, self.tool_name, args, step=step)
        if verdict.cancelled:
            raise SessionCancelled(f"session {session} was cancelled: {verdict.refusal}")
        if verdict.refusal is not None:
            return "\n\n".join([verdict.refusal, *verdict.reminders])
        if verdict.rewritten:
            arguments = json.dumps(verdict.args, ensure_ascii=False)
        t0 = time.perf_counter()
        try:
            output = await self.original(ctx, arguments)
        except Exception as exc:
            await self.bus.gate.after(
                session,
                self.tool_name,
                verdict.args,
                str(exc) or type(exc).__name__,
                is_error=True,
                elapsed_ms=elapsed_ms(t0),
                step=step,
            )
            raise
        text = output if isinstance(output, str) else str(output)
        final = await self.bus.gate.after(
            session,
            self.tool_name,
            verdict.args,
            text,
            elapsed_ms=elapsed_ms(t0),
            step=step,
            reminders=verdict.reminders,
        )
        return output if final == text else final


class HookBusRunHooks(RunHooks[Any]):
    """The SDK's run lifecycle as HookBus events (made by ``HookBusAgents.run``)."""

    def __init__(
        self, bus: HookBusAgents, run: _Run, max_turns: int, inner: RunHooks[Any] | None
    ) -> None:
        self.bus = bus
        self.run = run
        self.max_turns = max_turns
        self.inner = inner

    async def on_llm_start(
        self,
        context: RunContextWrapper[Any],
        agent: Agent[Any],
        system_prompt: str | None,
        input_items: list[Any],
    ) -> None:
        if self.inner is not None:
            await self.inner.on_llm_start(context, agent, system_prompt, input_items)

    async def on_llm_end(
        self, context: RunContextWrapper[Any], agent: Agent[Any], response: ModelResponse
    ) -> None:
        self.run.steps += 1
        await self.bus.hooks.run_on_step_complete(
            StepCompleteContext(
                session_id=self.run.session_id, step=self.run.steps, max_steps=self.max_turns
            )
        )
        if self.inner is not None:
            await self.inner.on_llm_end(context, agent, response)

    async def on_agent_start(self, context: Any, agent: Agent[Any]) -> None:
        if self.inner is not None:
            await self.inner.on_agent_start(context, agent)

    async def on_agent_end(self, context: Any, agent: Agent[Any], output: Any) -> None:
        if agent.name in self.run.handed_to:
            await self.bus.hooks.run_on_subagent_stop(
                SubagentStopContext(
                    parent_session_id=self.run.session_id,
                    subagent_name=agent.name,
                    result_summary=str(output),
                    steps=self.run.steps,
                )
            )
        if self.inner is not None:
            await self.inner.on_agent_end(context, agent, output)

    async def on_handoff(
        self, context: RunContextWrapper[Any], from_agent: Agent[Any], to_agent: Agent[Any]
    ) -> None:
        self.run.handed_to.add(to_agent.name)
        await self.bus.hooks.run_on_subagent_start(
            SubagentStartContext(parent_session_id=self.run.session_id, subagent_name=to_agent.name)
        )
        if self.inner is not None:
            await self.inner.on_handoff(context, from_agent, to_agent)

    async def on_tool_start(self, context: Any, agent: Agent[Any], tool: Any) -> None:
        if self.inner is not None:
            await self.inner.on_tool_start(context, agent, tool)

    async def on_tool_end(self, context: Any, agent: Agent[Any], tool: Any, result: Any) -> None:
        if self.inner is not None:
            await self.inner.on_tool_end(context, agent, tool, result)


class HookBusAgents:
    """HookBus for OpenAI Agents SDK agents.

    Args:
        hooks: ``HookRegistry`` (embedded) or ``HookClient`` (distributed).
        session_id: the session of tool calls made outside ``run`` (``Runner.run`` called
            directly); a fresh id by default.
        approver: asks a person when a PreToolUse hook answers ``PermissionRequired`` and no
            PermissionRequest hook decides; without one those calls are denied.
    """

    def __init__(
        self,
        hooks: EventRunner,
        *,
        session_id: str | None = None,
        approver: Approver | None = None,
    ) -> None:
        self.hooks = hooks
        self.gate = ToolGate(hooks, approver=approver)
        self.session_id = session_id or f"openai-agents-{uuid.uuid4().hex[:12]}"
        self._sessions: dict[int, str] = {}  # the session of each live RunResult of run()

    def wrap_tool(self, tool: FunctionTool) -> FunctionTool:
        """A copy of ``tool`` whose calls go through HookBus (a hooked tool is returned as is)."""
        if isinstance(tool.on_invoke_tool, HookedInvoker):
            return tool
        hooked = copy.copy(tool)  # the SDK's __copy__ rebinds its invoker to the copy
        hooked.on_invoke_tool = HookedInvoker(self, tool.name, hooked.on_invoke_tool)
        return hooked

    def wrap(self, agent: Agent[Any], _seen: dict[int, Agent[Any]] | None = None) -> Agent[Any]:
        """A copy of ``agent`` whose function tools, and those of the agents it hands off to,
        go through HookBus. The original agent is left as it was."""
        seen = {} if _seen is None else _seen
        if id(agent) in seen:
            return seen[id(agent)]
        clone = agent.clone()
        seen[id(agent)] = clone
        clone.tools = [self.wrap_tool(t) if isinstance(t, FunctionTool) else t for t in agent.tools]
        clone.handoffs = [self.wrap(h, seen) if isinstance(h, Agent) else h for h in agent.handoffs]
        return clone

    async def run(
        self,
        agent: Agent[Any],
        input: Any,
        *,
        session_id: str | None = None,
        max_turns: int = DEFAULT_MAX_TURNS,
        hooks: RunHooks[Any] | None = None,
        **kwargs: Any,
    ) -> RunResult:
        """``Runner.run(agent, input, …)`` with OnSessionStart before it, OnSessionStop after it
        (whatever happens), and steps and handoffs in between. ``session_id`` defaults to that of
        an SDK ``session=`` passed in ``kwargs``, else this adapter's."""
        sdk_session = kwargs.get("session")
        session = session_id or getattr(sdk_session, "session_id", None) or self.session_id
        run = _Run(session)
        token = _current.set(run)
        try:
            await self.hooks.run_on_session_start(
                SessionStartContext(session_id=session, is_resume=isinstance(input, RunState))
            )
            terminal = TurnTerminal.ERROR
            try:
                result = await Runner.run(
                    agent,
                    input,
                    max_turns=max_turns,
                    hooks=HookBusRunHooks(self, run, max_turns, hooks),
                    **kwargs,
                )
                terminal = TurnTerminal.COMPLETED
                self._sessions[id(result)] = session  # for decide_approvals(result)
                weakref.finalize(result, self._sessions.pop, id(result), None)
                return result
            except MaxTurnsExceeded:
                terminal = TurnTerminal.MAX_STEPS
                raise
            except asyncio.CancelledError:
                terminal = TurnTerminal.CANCELLED
                raise
            except Exception as exc:
                if (cancelled := _cancellation(exc)) is None:
                    raise
                terminal = TurnTerminal.CANCELLED
                raise cancelled from None  # the SDK wraps it in a UserError: unwrapped here
            finally:
                await self.hooks.run_on_session_stop(
                    SessionStopContext(session_id=session, terminal=terminal, total_steps=run.steps)
                )
        finally:
            _current.reset(token)

    async def decide_approvals(
        self, result: RunResult, *, session_id: str | None = None
    ) -> tuple[RunState[Any], list[ToolApprovalItem]]:
        """PermissionRequest hooks on each call the run stopped to have approved
        (``result.interruptions``): ``Override(Allow)`` approves it, ``Override(Deny)`` rejects
        it (the model is told the hook's reason). Returns the state to resume with
        (``bus.run(agent, state)``) and the calls still waiting for a person. The session is
        that of the ``run`` that returned ``result``, unless ``session_id`` says otherwise."""
        state = result.to_state()
        session = session_id or self._sessions.get(id(result), self.session_id)
        pending: list[ToolApprovalItem] = []
        for item in result.interruptions:
            args = _as_args(item.arguments or "")
            permission = await self.gate.permission(
                session, item.name or "", args, reason="the tool needs approval", ask=False
            )
            if permission.decision == PermissionDecision.ALLOW:
                state.approve(item)
            elif permission.decision == PermissionDecision.DENY:
                state.reject(item, rejection_message=f"Permission denied: {permission.reason}")
            else:
                pending.append(item)
        return state, pending
