"""Small configurable hooks shared by the tests (and, later, run in worker processes)."""

from __future__ import annotations

import asyncio
from typing import Any

from bus import AgentHook, AsyncAgentHook, HookEvent


class Recorder(AgentHook):
    """Answers a fixed action for every event and records what it saw."""

    def __init__(
        self,
        name: str,
        action: Any = None,
        *,
        events: tuple[HookEvent, ...] = (),
        delay: float = 0.0,
        raises: bool = False,
        **attrs: Any,
    ) -> None:
        self.name = name  # type: ignore[misc]
        self.subscribed_events = events  # type: ignore[misc]
        self.action = action
        self.delay = delay
        self.raises = raises
        self.calls: list[tuple[HookEvent, Any]] = []
        for key, value in attrs.items():
            setattr(self, key, value)

    async def _answer(self, event: HookEvent, ctx: Any) -> Any:
        self.calls.append((event, ctx))
        if self.delay:
            await asyncio.sleep(self.delay)
        if self.raises:
            raise RuntimeError(f"{self.name} exploded")
        return self.action

    async def on_session_start(self, ctx: Any) -> None:
        await self._answer(HookEvent.ON_SESSION_START, ctx)

    async def pre_tool_use(self, ctx: Any) -> Any:
        return await self._answer(HookEvent.PRE_TOOL_USE, ctx)

    async def post_tool_use(self, ctx: Any) -> Any:
        return await self._answer(HookEvent.POST_TOOL_USE, ctx)

    async def on_post_tool_use_failure(self, ctx: Any) -> Any:
        return await self._answer(HookEvent.POST_TOOL_USE_FAILURE, ctx)

    async def on_step_complete(self, ctx: Any) -> None:
        await self._answer(HookEvent.ON_STEP_COMPLETE, ctx)

    async def on_session_stop(self, ctx: Any) -> None:
        await self._answer(HookEvent.ON_SESSION_STOP, ctx)

    async def on_subagent_start(self, ctx: Any) -> None:
        await self._answer(HookEvent.ON_SUBAGENT_START, ctx)

    async def on_subagent_stop(self, ctx: Any) -> None:
        await self._answer(HookEvent.ON_SUBAGENT_STOP, ctx)

    async def on_pre_compact(self, ctx: Any) -> None:
        await self._answer(HookEvent.ON_PRE_COMPACT, ctx)

    async def on_post_compact(self, ctx: Any) -> None:
        await self._answer(HookEvent.ON_POST_COMPACT, ctx)

    async def on_permission_request(self, ctx: Any) -> Any:
        return await self._answer(HookEvent.PERMISSION_REQUEST, ctx)

    async def on_permission_denied(self, ctx: Any) -> None:
        await self._answer(HookEvent.PERMISSION_DENIED, ctx)


class AsyncRecorder(AsyncAgentHook):
    """Records every async call it receives."""

    def __init__(self, name: str, *, events: tuple[HookEvent, ...] = (), delay: float = 0.0):
        self.name = name  # type: ignore[misc]
        self.subscribed_events = events  # type: ignore[misc]
        self.delay = delay
        self.seen: list[Any] = []
        self.done = asyncio.Event()

    async def _record(self, ctx: Any) -> None:
        if self.delay:
            await asyncio.sleep(self.delay)
        self.seen.append(ctx)
        self.done.set()

    async def on_post_tool_use_async(self, ctx: Any) -> None:
        await self._record(ctx)

    async def on_post_tool_use_failure_async(self, ctx: Any) -> None:
        await self._record(ctx)

    async def on_session_stop_async(self, ctx: Any) -> None:
        await self._record(ctx)

    async def on_step_complete_async(self, ctx: Any) -> None:
        await self._record(ctx)
