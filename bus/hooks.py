"""The hook base classes and the static description (``HookSpec``) the dispatcher works from.

Subclass ``AgentHook`` and override only the methods you care about; every method has a
do-nothing default. Declarations are class (or instance) attributes::

    class NoEnvFiles(AgentHook):
        subscribed_events = (HookEvent.PRE_TOOL_USE,)
        match_filter = ToolMatchFilter.parse(["file_*"], ["path:.env"])
        timeout = 2.0
        failure_policy = "fail"

        async def pre_tool_use(self, ctx: PreToolUseContext) -> PreToolUseAction:
            return Block(reason="no .env files")

``priority`` orders hooks (lower first, ties by registration) for "last MutateInput wins" and
"first Override wins". ``failure_policy = "fail"`` turns a timeout, crash or unreachable hook
into Block (PreToolUse) or Deny (PermissionRequest); on other events a failure is only recorded.

A hook is checked when it loads (``spec_of``: ``HookRegistry.add*``, ``hookbus worker``): a
public method that looks like a hook method but is not one of its kind's (``pre_tooluse``,
``on_pre_tool_use``, ``post_tool_use`` on an async hook) and a subscribed event without its
method are refused with a "did you mean", since either would silently never run. So is a hook
method written as a plain ``def``: the dispatcher awaits what a hook method returns, and a
service's worker would fail every call to it, so it is refused where it loads, in every mode,
rather than run differently in each.
"""

from __future__ import annotations

import difflib
import inspect
import math
from collections.abc import Iterable, Sequence
from contextvars import ContextVar
from typing import Any, ClassVar, Literal, cast

import msgspec

from bus.actions import CONTINUE, PermissionRequestAction, PostToolUseAction, PreToolUseAction
from bus.errors import ConfigError
from bus.events import (
    HookEvent,
    PermissionDeniedContext,
    PermissionRequestContext,
    PostCompactContext,
    PostToolUseContext,
    PostToolUseFailureContext,
    PreCompactContext,
    PreToolUseContext,
    SessionStartContext,
    SessionStopContext,
    StepCompleteContext,
    SubagentStartContext,
    SubagentStopContext,
)
from bus.matcher import MATCH_ALL, ToolMatchFilter

FailurePolicy = Literal["ignore", "fail"]
#: How a hook's answers are applied: ``enforce`` (as given), ``warn`` (a Block or Deny becomes
#: a warning for the agent), ``dryrun`` (recorded as "would have …", never applied).
EnforcementMode = Literal["enforce", "warn", "dryrun"]
MODES: tuple[EnforcementMode, ...] = ("enforce", "warn", "dryrun")

#: The AgentHook method each event calls.
SYNC_METHODS: dict[HookEvent, str] = {
    HookEvent.ON_SESSION_START: "on_session_start",
    HookEvent.PRE_TOOL_USE: "pre_tool_use",
    HookEvent.POST_TOOL_USE: "post_tool_use",
    HookEvent.POST_TOOL_USE_FAILURE: "on_post_tool_use_failure",
    HookEvent.ON_STEP_COMPLETE: "on_step_complete",
    HookEvent.ON_SESSION_STOP: "on_session_stop",
    HookEvent.ON_SUBAGENT_START: "on_subagent_start",
    HookEvent.ON_SUBAGENT_STOP: "on_subagent_stop",
    HookEvent.ON_PRE_COMPACT: "on_pre_compact",
    HookEvent.ON_POST_COMPACT: "on_post_compact",
    HookEvent.PERMISSION_REQUEST: "on_permission_request",
    HookEvent.PERMISSION_DENIED: "on_permission_denied",
}

#: The AsyncAgentHook method each event calls (the spec's three, plus one per other event).
ASYNC_METHODS: dict[HookEvent, str] = {
    HookEvent.ON_SESSION_START: "on_session_start_async",
    HookEvent.PRE_TOOL_USE: "on_pre_tool_use_async",
    HookEvent.POST_TOOL_USE: "on_post_tool_use_async",
    HookEvent.POST_TOOL_USE_FAILURE: "on_post_tool_use_failure_async",
    HookEvent.ON_STEP_COMPLETE: "on_step_complete_async",
    HookEvent.ON_SESSION_STOP: "on_session_stop_async",
    HookEvent.ON_SUBAGENT_START: "on_subagent_start_async",
    HookEvent.ON_SUBAGENT_STOP: "on_subagent_stop_async",
    HookEvent.ON_PRE_COMPACT: "on_pre_compact_async",
    HookEvent.ON_POST_COMPACT: "on_post_compact_async",
    HookEvent.PERMISSION_REQUEST: "on_permission_request_async",
    HookEvent.PERMISSION_DENIED: "on_permission_denied_async",
}


class HookSpec(msgspec.Struct, frozen=True, kw_only=True):
    """Everything the dispatcher needs to know about a hook, without the hook itself.

    Built from a local hook object by ``spec_of``, or from a remote hook's manifest.
    """

    name: str
    events: frozenset[HookEvent] = frozenset()  # empty = every event
    timeout: float | None = None
    match_filter: ToolMatchFilter = MATCH_ALL
    priority: int = 0
    failure_policy: FailurePolicy = "ignore"
    mode: EnforcementMode = "enforce"

    def subscribes(self, event: HookEvent) -> bool:
        return not self.events or event in self.events


class _HookBase:
    name: ClassVar[str] = ""
    subscribed_events: ClassVar[Iterable[HookEvent | str]] = ()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "name" not in cls.__dict__:
            cls.name = cls.__name__


class AgentHook(_HookBase):
    """A synchronous hook: its answers shape what the agent does next."""

    name = "AgentHook"
    timeout: ClassVar[float | None] = None
    match_filter: ClassVar[ToolMatchFilter] = MATCH_ALL
    priority: ClassVar[int] = 0
    failure_policy: ClassVar[FailurePolicy] = "ignore"
    #: Roll a new policy out safely: "dryrun" records, "warn" warns, "enforce" applies.
    enforcement: ClassVar[EnforcementMode] = "enforce"

    async def on_session_start(self, ctx: SessionStartContext) -> None:
        return None

    async def pre_tool_use(self, ctx: PreToolUseContext) -> PreToolUseAction:
        return CONTINUE

    async def post_tool_use(self, ctx: PostToolUseContext) -> PostToolUseAction:
        return CONTINUE

    async def on_post_tool_use_failure(self, ctx: PostToolUseFailureContext) -> PostToolUseAction:
        return CONTINUE

    async def on_step_complete(self, ctx: StepCompleteContext) -> None:
        return None

    async def on_session_stop(self, ctx: SessionStopContext) -> None:
        return None

    async def on_subagent_start(self, ctx: SubagentStartContext) -> None:
        return None

    async def on_subagent_stop(self, ctx: SubagentStopContext) -> None:
        return None

    async def on_pre_compact(self, ctx: PreCompactContext) -> None:
        return None

    async def on_post_compact(self, ctx: PostCompactContext) -> None:
        return None

    async def on_permission_request(self, ctx: PermissionRequestContext) -> PermissionRequestAction:
        return CONTINUE

    async def on_permission_denied(self, ctx: PermissionDeniedContext) -> None:
        return None


class DeliveredEvent(msgspec.Struct, frozen=True):
    """One event as an async hook receives it: its id (stable across redeliveries), its
    timestamp (epoch ms) and its context."""

    id: str
    event: HookEvent
    ts: int
    context: Any


#: The event an async hook method is handling (its id makes writes idempotent).
current_event: ContextVar[DeliveredEvent | None] = ContextVar("current_event", default=None)


class AsyncAgentHook(_HookBase):
    """A fire-and-forget hook: it observes events and never delays the agent.

    The specification's three methods are ``on_post_tool_use_async``,
    ``on_post_tool_use_failure_async`` and ``on_session_stop_async``; the other events have
    ``on_<event>_async`` methods too (see ``ASYNC_METHODS``).
    """

    name = "AsyncAgentHook"
    timeout: ClassVar[float | None] = None  # default: the async timeout (5 s)
    #: Set to True and implement ``on_batch`` to receive events in batches (one transaction
    #: for many rows, say). A batch is acknowledged only after ``on_batch`` returns.
    handles_batches: ClassVar[bool] = False

    async def on_batch(self, batch: Sequence[DeliveredEvent]) -> None:
        """Handle several events at once (only called when ``handles_batches``)."""
        raise NotImplementedError

    #: Set to True and implement ``on_audit`` to receive the audit trail as well (hook services
    #: only): answers coordinators did not apply (``warn``, ``dryrun``, break-glass) and
    #: break-glass switches. Same delivery as events: at least once, retried, dead-lettered.
    follows_audit_trail: ClassVar[bool] = False

    async def on_audit(self, records: Sequence[Any]) -> None:
        """Handle audit records (only called when ``follows_audit_trail``): each is a
        ``bus.protocol.AuditRecord``. Typed ``Any`` here because the semantic core does not
        import the wire layer (tests/test_purity.py); an override may narrow it."""
        raise NotImplementedError

    async def on_session_start_async(self, ctx: SessionStartContext) -> None: ...
    async def on_pre_tool_use_async(self, ctx: PreToolUseContext) -> None: ...
    async def on_post_tool_use_async(self, ctx: PostToolUseContext) -> None: ...
    async def on_post_tool_use_failure_async(self, ctx: PostToolUseFailureContext) -> None: ...
    async def on_step_complete_async(self, ctx: StepCompleteContext) -> None: ...
    async def on_session_stop_async(self, ctx: SessionStopContext) -> None: ...
    async def on_subagent_start_async(self, ctx: SubagentStartContext) -> None: ...
    async def on_subagent_stop_async(self, ctx: SubagentStopContext) -> None: ...
    async def on_pre_compact_async(self, ctx: PreCompactContext) -> None: ...
    async def on_post_compact_async(self, ctx: PostCompactContext) -> None: ...
    async def on_permission_request_async(self, ctx: PermissionRequestContext) -> None: ...
    async def on_permission_denied_async(self, ctx: PermissionDeniedContext) -> None: ...


def _events(hook: object) -> frozenset[HookEvent]:
    declared = getattr(hook, "subscribed_events", ())
    if isinstance(declared, str):
        declared = (declared,)
    return frozenset(HookEvent.parse(e) for e in declared)


def _squashed(method: str) -> str:
    """A method name reduced to the event it seems to be about: ``on_pre_tool_use_async``,
    ``pre_tooluse`` and ``on_pre_tool_use`` all become ``pretooluse``."""
    return method.removeprefix("on_").removesuffix("_async").replace("_", "")


_EVENT_KEYS: dict[str, HookEvent] = {_squashed(m): e for e, m in SYNC_METHODS.items()}


def _meant(method: str) -> HookEvent | None:
    """The event a method name looks meant for, if any: among the events whose first word it
    shares (``on_session_end`` → OnSessionStop), if there are some."""
    first = method.removeprefix("on_").split("_")[0]
    same = [
        key
        for key, event in _EVENT_KEYS.items()
        if SYNC_METHODS[event].removeprefix("on_").startswith(first + "_")
    ]
    close = difflib.get_close_matches(_squashed(method), same or list(_EVENT_KEYS), n=1, cutoff=0.6)
    return _EVENT_KEYS[close[0]] if close else None


def _looks_like_a_hook_method(method: str) -> bool:
    """``on_*`` and ``*_async`` are the spec's naming; anything else only when it is close to
    an event's name (``pre_tooluse``), so that a helper like ``post_to_slack`` is left alone."""
    if method.startswith("on_") or method.endswith("_async"):
        return True
    return bool(difflib.get_close_matches(_squashed(method), list(_EVENT_KEYS), n=1, cutoff=0.85))


def _overrides(hook: object, base: type, method: str) -> bool:
    return method in vars(hook) or getattr(type(hook), method, None) is not getattr(base, method)


def check_methods(
    hook: AgentHook | AsyncAgentHook, name: str, events: frozenset[HookEvent]
) -> None:
    """Refuse what would silently never run: a public method that looks like a hook method
    but is none of this kind of hook's (``pre_tooluse``, ``on_pre_tool_use``, the sync name on
    an async hook), and a subscribed event the hook has no method for."""
    is_async = isinstance(hook, AsyncAgentHook)
    base: type = AsyncAgentHook if is_async else AgentHook
    table = ASYNC_METHODS if is_async else SYNC_METHODS
    kind = "an AsyncAgentHook" if is_async else "an AgentHook"
    known = {m for m in dir(base) if not m.startswith("_")}
    problems = []
    for method in sorted({*dir(type(hook)), *vars(hook)}):
        if method.startswith("_") or method in known or not callable(getattr(hook, method, None)):
            continue
        if not _looks_like_a_hook_method(method):
            continue
        event = _meant(method)
        hint = f"did you mean {table[event]!r}?" if event is not None else ""
        if not is_async and method in ("on_batch", "on_audit"):
            hint = "that is an AsyncAgentHook method"
        if not hint and (close := difflib.get_close_matches(method, table.values(), n=1)):
            hint = f"did you mean {close[0]!r}?"
        problems.append(
            f"{method}() is not a method {kind} is called with: "
            + (hint or "a helper? give it a leading underscore")
        )
    for method in [*table.values(), *(("on_batch", "on_audit") if is_async else ())]:
        if _overrides(hook, base, method) and (why := not_async(getattr(hook, method))):
            raise ConfigError(f"hook {name}: {method}() {why}")
    ask = getattr(hook, "problem", None)
    if inspect.iscoroutinefunction(ask) or inspect.isasyncgenfunction(ask):
        raise ConfigError(
            f"hook {name}: problem() is async; it is asked at each heartbeat and must be a plain "
            'def returning one line ("" when well)'
        )
    batches = is_async and getattr(hook, "handles_batches", False)
    if batches and not _overrides(hook, base, "on_batch"):
        problems.append("handles_batches is set but on_batch() is not implemented")
    audits = is_async and getattr(hook, "follows_audit_trail", False)
    if audits and not _overrides(hook, base, "on_audit"):
        problems.append("follows_audit_trail is set but on_audit() is not implemented")
    if not batches:
        for event in sorted(events, key=list(HookEvent).index):
            if not _overrides(hook, base, table[event]):
                problems.append(
                    f"it subscribes to {event.value} but does not implement {table[event]}()"
                )
    if problems:
        listed = "".join(f"\n  - {p}" for p in problems)
        raise ConfigError(
            f"hook {name} would silently never run some of its code:{listed}\n"
            f"  {kind}'s methods: {', '.join(table.values())} (docs/writing-hooks.md)"
        )


def not_async(method: object) -> str:
    """Why ``method`` cannot be a hook method (it is not a coroutine function), or ""."""
    if inspect.iscoroutinefunction(method):
        return ""
    if not callable(method):
        return f"is a {type(method).__name__}, not a method"
    if inspect.isasyncgenfunction(method):
        return "is an async generator (it has a yield); a hook method returns its answer"
    name = getattr(method, "__name__", "method")
    return (
        f"is a plain def; write `async def {name}(self, ctx)` (hook methods are awaited; for "
        "blocking work inside one, `await asyncio.to_thread(...)`)"
    )


def spec_of(hook: AgentHook | AsyncAgentHook) -> HookSpec:
    """Validate a hook's declarations and describe it; raise ConfigError if they are unusable."""
    if not isinstance(hook, AgentHook | AsyncAgentHook):
        raise ConfigError(f"{hook!r} is not an AgentHook or AsyncAgentHook instance")
    name = getattr(hook, "name", "")
    if not isinstance(name, str) or not name.strip():
        raise ConfigError(f"hook {hook!r} needs a non-empty name")
    events = _events(hook)
    check_methods(hook, name, events)
    timeout = getattr(hook, "timeout", None)
    if timeout is not None and (
        not isinstance(timeout, int | float) or not math.isfinite(timeout) or timeout <= 0
    ):
        raise ConfigError(f"hook {name}: timeout must be a positive number of seconds")
    policy = getattr(hook, "failure_policy", "ignore")
    if policy not in ("ignore", "fail"):
        raise ConfigError(f"hook {name}: failure_policy must be 'ignore' or 'fail', not {policy!r}")
    mode = getattr(hook, "enforcement", "enforce")
    if mode not in MODES:
        raise ConfigError(
            f"hook {name}: enforcement must be one of {', '.join(MODES)}, not {mode!r}"
        )
    match_filter = getattr(hook, "match_filter", MATCH_ALL)
    if not isinstance(match_filter, ToolMatchFilter):
        raise ConfigError(f"hook {name}: match_filter must be a ToolMatchFilter")
    priority = getattr(hook, "priority", 0)
    if not isinstance(priority, int):
        raise ConfigError(f"hook {name}: priority must be an integer")
    return HookSpec(
        name=name,
        events=events,
        timeout=float(timeout) if timeout is not None else None,
        match_filter=match_filter,
        priority=priority,
        failure_policy=cast(FailurePolicy, policy),
        mode=cast(EnforcementMode, mode),
    )
