"""HookBus around an OpenAI Agents SDK agent (``pip install 'hookbus[openai-agents]'``).

::

    bus = HookBusAgents(hooks)                  # HookRegistry (embedded) or HookClient
    agent = bus.wrap(agent)                     # its function tools, and its handoffs', hooked
    result = await bus.run(agent, "question", session_id="s-1")

``wrap`` returns a copy of the agent (``Agent.clone``) whose every ``FunctionTool`` is a copy
with a HookBus tool input guardrail (``tool_input_guardrails``, after the tool's own) and a
HookBus invoker in front of the SDK's own (``on_invoke_tool``):

* the guardrail runs PreToolUse (the SDK runs tool input guardrails after its approvals, before
  ``on_tool_start`` and the tool's body). ``Block``: it answers ``reject_content`` with the
  refusal, which the model gets as the tool's output; the call is in the run's
  ``tool_input_guardrail_results`` and a guardrail span (``HookBus``, ``triggered``), and has no
  ``on_tool_start`` / ``on_tool_end``, as for any guardrail's rejection. Otherwise it answers
  ``allow``.
* the invoker runs the tool with the arguments PreToolUse left (``MutateInput``: a guardrail can
  reject a call but not rewrite its arguments, so the rewrite is applied here), then PostToolUse.
  A call whose guardrail did not run (a tool invoked outside the SDK's loop) gets its PreToolUse
  here: no call runs unchecked.
* PostToolUse ``MutateOutput``: the model gets the rewritten output. Output that is not text
  (``ToolOutputImage``, a dict, …) is shown to hooks as ``str(output)``, and passed on unchanged
  unless a hook rewrote it.
* A tool whose exception the SDK turns into a message (its ``failure_error_function``, the
  default) reaches PostToolUse as that message; a tool whose exceptions propagate
  (``failure_error_function=None``) gets PostToolUseFailure, and the exception goes on.

``run`` is ``Runner.run`` framed by the session events, with a ``RunHooks`` that maps the SDK's
lifecycle onto HookBus's (``HookBusRunHooks``; a ``hooks=`` you pass is still called). Every
SDK event and its HookBus counterpart, or none, is in docs/integrations.md's table
(tests/test_integrations_doc.py checks it against this module).

A run that stops for approvals (``needs_approval``) keeps its session when it is resumed: ``run``
marks the session on the result's run context, which ``result.to_state()`` copies, so
``bus.run(agent, state)`` continues the session it paused in (OnSessionStart ``is_resume``); a
cancel of that session refuses the resumed half's calls too. A state that carries no mark (one
restored with ``RunState.from_string``) needs ``session_id=``, unless the adapter was made with
one, or the run has an SDK ``session=``: otherwise ``run`` refuses it with a ``ConfigError``
rather than split the session.

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
    from agents.tool_guardrails import (
        ToolGuardrailFunctionOutput,
        ToolInputGuardrail,
        ToolInputGuardrailData,
    )
    from agents.tracing import guardrail_span
except ModuleNotFoundError as exc:  # say which extra brings it, not only which module is missing
    raise ModuleNotFoundError(
        f"{exc}: HookBus's OpenAI Agents SDK adapter needs pip install 'hookbus[openai-agents]'",
        name=exc.name,
    ) from exc

from agent_adapter.executor import Approver
from agent_adapter.integrations.gate import ToolGate, Verdict, elapsed_ms
from bus import (
    ConfigError,
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
GUARDRAIL_NAME = "HookBus"  # the tool input guardrail's name in results and spans
#: The attribute of a run's ``RunContextWrapper`` that holds its HookBus session: the SDK's
#: ``to_state()`` copies the wrapper (``copy.copy``), so a paused run's state carries it.
SESSION_MARK = "_hookbus_session_id"


@dataclass
class _Run:
    """The run in progress in this task (tool invocations run in tasks that inherit it)."""

    session_id: str
    steps: int = 0
    handed_to: set[str] = field(default_factory=set)


_current: ContextVar[_Run | None] = ContextVar("hookbus_openai_agents_run", default=None)


@dataclass(frozen=True, slots=True)
class _Checked:
    """A call's PreToolUse, from the guardrail to the invoker of the same call."""

    session: str
    step: int
    verdict: Verdict


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
        checked = self.bus._checked.pop(ctx, None)
        if checked is None:  # the guardrail did not run for this call: PreToolUse here
            checked = await self.bus._pre_tool_use(self.tool_name, arguments)
        session, step, verdict = checked.session, checked.step, checked.verdict
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


class HookBusGuardrail:
    """A ``ToolInputGuardrail``'s function: PreToolUse, in the SDK's own tool guardrail step."""

    def __init__(self, bus: HookBusAgents, tool_name: str) -> None:
        self.bus = bus
        self.tool_name = tool_name

    async def __call__(self, data: ToolInputGuardrailData) -> ToolGuardrailFunctionOutput:
        ctx = data.context
        with guardrail_span(GUARDRAIL_NAME) as span:
            try:
                checked = await self.bus._pre_tool_use(self.tool_name, ctx.tool_arguments)
            except SessionCancelled:
                span.span_data.triggered = True
                raise
            verdict = checked.verdict
            span.span_data.triggered = verdict.refusal is not None
        info = {"session_id": checked.session, "rewritten": verdict.rewritten}
        if verdict.refusal is not None:
            message = "\n\n".join([verdict.refusal, *verdict.reminders])
            return ToolGuardrailFunctionOutput.reject_content(message, output_info=info)
        self.bus._checked[ctx] = checked  # for the invoker of this call
        return ToolGuardrailFunctionOutput.allow(output_info=info)


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
            PermissionRequest hook decides: ``async def approver(tool_name: str, args:
            Mapping[str, Any], reason: str) -> bool | None`` (``agent_adapter.executor.Approver``)
            gets the call's arguments as the hooks left them and the hook's reason; ``True``
            runs the call, ``False`` denies it, ``None`` (or no answer within 30 s) denies it as
            unanswered. Without one those calls are denied.
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
        self._named = session_id is not None
        # each call's PreToolUse, from its guardrail to its invoker (gone with the call)
        self._checked: weakref.WeakKeyDictionary[ToolContext[Any], _Checked] = (
            weakref.WeakKeyDictionary()
        )

    async def _pre_tool_use(self, tool_name: str, arguments: str) -> _Checked:
        """PreToolUse on a call in the run of this task; ``SessionCancelled`` if the session was
        cancelled."""
        run = _current.get()
        session = run.session_id if run is not None else self.session_id
        step = run.steps if run is not None else 0
        verdict = await self.gate.before(session, tool_name, _as_args(arguments), step=step)
        if verdict.cancelled:
            raise SessionCancelled(f"session {session} was cancelled: {verdict.refusal}")
        return _Checked(session, step, verdict)

    def _session_of(self, input: Any, session_id: str | None, sdk_session: Any) -> str:
        """The run's session: ``session_id``, else the one a paused run's state carries, else
        the SDK session's, else the adapter's (for a state: only one it was made with)."""
        paused = getattr(getattr(input, "_context", None), SESSION_MARK, None)
        session = session_id or paused or getattr(sdk_session, "session_id", None)
        if session:
            return str(session)
        if isinstance(input, RunState) and not self._named:
            raise ConfigError(
                "bus.run(agent, state): the state carries no HookBus session (restored from "
                "a string?); pass session_id=, the session the run paused in"
            )
        return self.session_id

    def wrap_tool(self, tool: FunctionTool) -> FunctionTool:
        """A copy of ``tool`` whose calls go through HookBus (a hooked tool is returned as is)."""
        if isinstance(tool.on_invoke_tool, HookedInvoker):
            return tool
        hooked = copy.copy(tool)  # the SDK's __copy__ rebinds its invoker to the copy
        hooked.on_invoke_tool = HookedInvoker(self, tool.name, hooked.on_invoke_tool)
        guardrail: ToolInputGuardrail[Any] = ToolInputGuardrail(
            HookBusGuardrail(self, tool.name), name=GUARDRAIL_NAME
        )
        hooked.tool_input_guardrails = [*(tool.tool_input_guardrails or []), guardrail]
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
        (whatever happens), and steps and handoffs in between. ``session_id`` defaults to the
        session a paused run's ``RunState`` carries, else that of an SDK ``session=`` passed in
        ``kwargs``, else this adapter's."""
        session = self._session_of(input, session_id, kwargs.get("session"))
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
                setattr(result.context_wrapper, SESSION_MARK, session)  # to_state() copies it
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
        paused = getattr(result.context_wrapper, SESSION_MARK, None)
        session = session_id or paused or self.session_id
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
