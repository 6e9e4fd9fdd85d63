"""``HookRegistry``: embedded mode, hooks as Python objects in the agent's process.

Keeps the specification's precomputed event index (global hooks per event, already in hook
order), session hooks per session, and async hooks per event. Dispatch goes through the shared
``EventRunner``: selection and aggregation are the pure core's.
"""

from __future__ import annotations

import asyncio
import bisect
import itertools
import logging
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import msgspec

from bus import breakglass
from bus.actions import NotifyResult
from bus.aggregation import Outcome
from bus.breakglass import BreakGlass, switch
from bus.dispatch import (
    Endpoint,
    LocalCall,
    check_outside_hooks,
    enter_hook,
    local_call,
    run_targets,
    start_local,
)
from bus.errors import ConfigError
from bus.events import (
    TOOL_EVENTS,
    HookContext,
    HookEvent,
    SessionStopContext,
    session_of,
    tool_of,
)
from bus.hooks import (
    ASYNC_METHODS,
    MODES,
    SYNC_METHODS,
    AgentHook,
    AsyncAgentHook,
    DeliveredEvent,
    HookSpec,
    current_event,
    spec_of,
)
from bus.runner import EventRunner
from bus.selection import select
from bus.settings import HookSettings

log = logging.getLogger("hookbus.registry")
_NONE: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True)
class LocalTarget:
    """A hook object in this process, ready to be dispatched."""

    spec: HookSpec
    order: tuple[int, int]
    hook: Any
    methods: dict[HookEvent, Callable[[Any], Any]] = field(repr=False)
    endpoint: Endpoint = field(repr=False)


def local_target(
    spec: HookSpec, order: tuple[int, int], hook: Any, table: dict[HookEvent, str]
) -> LocalTarget:
    """A hook object in this process as a dispatch target (its methods bound once)."""
    methods = {event: getattr(hook, method) for event, method in table.items()}
    return LocalTarget(
        spec, order, hook, methods, lambda event, ctx, _deadline: methods[event](ctx)
    )


class HookRegistry(EventRunner):
    """In-process hook registry (embedded mode).

    Args:
        settings: dispatch settings; read from the environment once, here, when omitted.
    """

    def __init__(self, settings: HookSettings | None = None) -> None:
        super().__init__(settings)
        self._seq = itertools.count()
        # Each list is replaced, never changed in place: a dispatch in flight keeps the list
        # it started with (it dispatches the index itself when nothing needs selecting).
        self._event_index: dict[HookEvent, list[LocalTarget]] = {e: [] for e in HookEvent}
        #: Per event, when every global hook lets every tool call through and enforces its
        #: answers (so with no session hooks, selection and the shadowed-answer scan have nothing
        #: to do): the hooks and each one's ``LocalCall``, in order; else None. One look-up on
        #: the hot path.
        self._plain: dict[HookEvent, tuple[list[LocalTarget], list[LocalCall]] | None] = {
            e: ([], []) for e in HookEvent
        }
        self._session_hooks: dict[str, list[LocalTarget]] = {}
        self._async_index: dict[HookEvent, list[LocalTarget]] = {e: [] for e in HookEvent}
        if type(self).fire_async is HookRegistry.fire_async:  # a subclass's own is always called
            self.fires = self._async_index  # an event's async hooks: none, nothing to fire
        self._names: set[str] = set()
        self.async_failures = 0
        self.breakglass: BreakGlass | None = None

    # -- registration ------------------------------------------------------------------------

    def _target(self, hook: Any, table: dict[HookEvent, str]) -> LocalTarget:
        spec = spec_of(hook)
        return local_target(spec, (spec.priority, next(self._seq)), hook, table)

    def _claim_name(self, name: str) -> None:
        if name in self._names:
            raise ConfigError(f"a hook named {name!r} is already registered")
        self._names.add(name)

    def add(self, hook: AgentHook) -> HookSpec:
        """Register a global synchronous hook."""
        check_outside_hooks("add()")
        if not isinstance(hook, AgentHook):
            hint = " (use add_async)" if isinstance(hook, AsyncAgentHook) else ""
            raise ConfigError(f"add() takes an AgentHook, got {type(hook).__name__}{hint}")
        target = self._target(hook, SYNC_METHODS)
        self._claim_name(target.spec.name)
        for event in HookEvent:
            if target.spec.subscribes(event):
                targets = list(self._event_index[event])
                bisect.insort(targets, target, key=lambda t: t.order)
                self._index(event, targets)
        return target.spec

    def _index(self, event: HookEvent, targets: list[LocalTarget]) -> None:
        self._event_index[event] = targets
        plain = all(
            t.spec.mode == "enforce"
            and (event not in TOOL_EVENTS or t.spec.match_filter.is_match_all())
            for t in targets
        )
        calls = [local_call(t.spec, t.methods[event]) for t in targets]
        self._plain[event] = (targets, calls) if plain else None

    def add_async(self, hook: AsyncAgentHook) -> HookSpec:
        """Register a fire-and-forget hook."""
        check_outside_hooks("add_async()")
        if not isinstance(hook, AsyncAgentHook):
            raise ConfigError(f"add_async() takes an AsyncAgentHook, got {type(hook).__name__}")
        target = self._target(hook, ASYNC_METHODS)
        self._claim_name(target.spec.name)
        for event in HookEvent:
            if target.spec.subscribes(event):
                self._async_index[event].append(target)
        return target.spec

    def add_session_hook(self, session_id: str, hook: AgentHook) -> HookSpec:
        """Register a hook that answers only for ``session_id`` (no match filter)."""
        check_outside_hooks("add_session_hook()")
        if not isinstance(hook, AgentHook):
            raise ConfigError(f"add_session_hook() takes an AgentHook, got {type(hook).__name__}")
        target = self._target(hook, SYNC_METHODS)
        hooks = self._session_hooks.setdefault(session_id, [])
        if any(t.spec.name == target.spec.name for t in hooks):
            raise ConfigError(f"session {session_id} already has a hook named {target.spec.name!r}")
        hooks.append(target)
        return target.spec

    def remove_session_hook(self, session_id: str, name: str) -> bool:
        """Remove one session hook by name; True if it was there."""
        check_outside_hooks("remove_session_hook()")
        hooks = self._session_hooks.get(session_id, [])
        kept = [t for t in hooks if t.spec.name != name]
        if len(kept) == len(hooks):
            return False
        if kept:
            self._session_hooks[session_id] = kept
        else:
            del self._session_hooks[session_id]
        return True

    def clear_session_hooks(self, session_id: str) -> None:
        """Remove every hook of ``session_id``."""
        check_outside_hooks("clear_session_hooks()")
        self._session_hooks.pop(session_id, None)

    def set_mode(self, name: str, mode: str) -> None:
        """Switch a global hook between ``enforce``, ``warn`` and ``dryrun`` while running."""
        check_outside_hooks("set_mode()")
        if mode not in MODES:
            raise ConfigError(f"mode must be one of {', '.join(MODES)}, not {mode!r}")
        found = False
        for event, targets in list(self._event_index.items()):
            if not any(t.spec.name == name for t in targets):
                continue
            changed = list(targets)
            for i, t in enumerate(changed):
                if t.spec.name == name:
                    spec = msgspec.structs.replace(t.spec, mode=mode)
                    changed[i] = LocalTarget(spec, t.order, t.hook, t.methods, t.endpoint)
            self._index(event, changed)
            found = True
        if not found:
            raise ConfigError(f"no global hook named {name!r}")

    def break_glass(self, reason: str, seconds: float, by: str = "agent") -> BreakGlass:
        """Switch the audited bypass on for ``seconds`` (see ``bus.breakglass``): every
        ``enforce`` hook is applied as ``warn`` until it ends or ``end_break_glass()``."""
        check_outside_hooks("break_glass()")
        self.breakglass = switch(reason, seconds, by, time.time_ns() // 1_000_000)
        log.warning("break-glass is ON for %gs (by %s): %s", seconds, by, reason)
        return self.breakglass

    def end_break_glass(self) -> None:
        """Enforce every hook again."""
        check_outside_hooks("end_break_glass()")
        if self.breakglass is not None:
            log.warning("break-glass is off: hooks are enforced again")
        self.breakglass = None

    def specs(self, event: HookEvent | None = None) -> list[HookSpec]:
        """The global sync hooks (for one event, or all), in hook order."""
        if event is not None:
            return [t.spec for t in self._event_index[event]]
        seen = {t.spec.name: t for ts in self._event_index.values() for t in ts}
        return [t.spec for t in sorted(seen.values(), key=lambda t: t.order)]

    def session_hook_names(self, session_id: str) -> list[str]:
        return [t.spec.name for t in self._session_hooks.get(session_id, [])]

    # -- dispatch ------------------------------------------------------------------------------

    def start_gather(
        self, event: HookEvent, ctx: HookContext, sequential: bool = False
    ) -> list[Outcome] | Awaitable[list[Outcome]]:
        plain = self._plain[event]
        if (
            plain is not None
            and self.breakglass is None
            and not (self._session_hooks and session_of(ctx) in self._session_hooks)
        ):
            # The usual case, kept cheap (this is the hot path): select() would return the
            # index as it is, and no hook's answer can be held back.
            # No observer reads the outcomes' times here (observers, and tracing, take the
            # runner's other paths): timed=False (passed by position: a keyword costs more).
            return start_local(event, ctx, plain[0], self.settings.hook_timeout_secs, sequential,
                               plain[1], False)  # fmt: skip
        return self.gather(event, ctx, sequential=sequential)

    async def gather(
        self, event: HookEvent, ctx: HookContext, *, sequential: bool = False
    ) -> list[Outcome]:
        session = self._session_hooks.get(session_of(ctx), ()) if self._session_hooks else ()
        index = self._event_index[event]
        if self.breakglass is None and not session and self._plain[event] is not None:
            return await run_targets(event, ctx, index, self.settings.hook_timeout_secs,
                                     sequential=sequential, local=True)  # fmt: skip
        name, args = tool_of(ctx)
        targets = select(event, index, session, name, args)
        if self.breakglass is None:
            outcomes = await run_targets(
                event, ctx, targets, self.settings.hook_timeout_secs, sequential=sequential,
                local=True,
            )  # fmt: skip
            if outcomes:
                self._note_held_back(event, ctx, outcomes, "", _NONE)
            return outcomes
        now = time.time_ns() // 1_000_000
        applied, reason, softened = breakglass.apply(self.breakglass, targets, now)
        outcomes = await run_targets(
            event, ctx, applied, self.settings.hook_timeout_secs, sequential=sequential
        )
        self._note_held_back(event, ctx, outcomes, reason, softened)
        return outcomes

    def fire_async(self, event: HookEvent, ctx: HookContext) -> None:
        targets = self._async_index[event]
        if not targets:
            return
        name, args = tool_of(ctx)
        for target in select(event, targets, (), name, args):
            self.spawn(self._call_async(target, event, ctx))

    async def _call_async(self, target: LocalTarget, event: HookEvent, ctx: HookContext) -> None:
        timeout = target.spec.timeout or self.settings.async_timeout_secs
        delivered = DeliveredEvent(os.urandom(16).hex(), event, time.time_ns() // 1_000_000, ctx)
        current_event.set(delivered)  # this task's own context
        enter_hook()
        try:
            if target.hook.handles_batches:
                await asyncio.wait_for(target.hook.on_batch([delivered]), timeout)
            else:
                await asyncio.wait_for(target.methods[event](ctx), timeout)
        except Exception as exc:  # an async hook never fails the agent
            self.async_failures += 1
            why = f"no answer within {timeout:g}s" if isinstance(exc, TimeoutError) else repr(exc)
            log.warning("async hook %s failed on %s: %s", target.spec.name, event.value, why)

    async def run_on_session_stop(self, ctx: SessionStopContext) -> NotifyResult:
        """Run OnSessionStop hooks in order, then forget the session's hooks."""
        try:
            return await super().run_on_session_stop(ctx)
        finally:
            self.clear_session_hooks(ctx.session_id)
