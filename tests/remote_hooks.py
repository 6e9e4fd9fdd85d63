"""A hook whose behaviour is data, so the same hook runs in-process or in a worker process.

In a worker it reads its configuration from ``HOOKBUS_TEST_HOOK`` (JSON of ``HookConfig``):
``hookbus worker tests.remote_hooks:Scripted``.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

import msgspec

from bus import AsyncAgentHook, HookAction, HookEvent, Metadata, MutateInput, ToolMatchFilter
from bus.hooks import ASYNC_METHODS, current_event
from tests.hooks_for_tests import Recorder


class HookConfig(msgspec.Struct, kw_only=True):
    name: str
    events: list[HookEvent] = msgspec.field(default_factory=list)
    answers: dict[str, HookAction] = msgspec.field(default_factory=dict)  # event name → action
    delay: float = 0.0
    raises: bool = False
    timeout: float | None = None
    failure_policy: str = "ignore"
    priority: int = 0
    names: list[str] = msgspec.field(default_factory=list)
    content: list[str] = msgspec.field(default_factory=list)
    record: str = ""  # a file each call appends "<event> <pid>" to
    enforcement: str = "enforce"


class Scripted(Recorder):
    """Answers per event from its HookConfig."""

    def __init__(self, config: HookConfig | None = None) -> None:
        if config is None:
            config = msgspec.json.decode(os.environ["HOOKBUS_TEST_HOOK"], type=HookConfig)
        super().__init__(
            config.name,
            events=tuple(config.events),
            delay=config.delay,
            raises=config.raises,
            timeout=config.timeout,
            failure_policy=config.failure_policy,
            priority=config.priority,
            match_filter=ToolMatchFilter.parse(config.names, config.content),
            enforcement=config.enforcement,
        )
        self.config = config

    async def _answer(self, event: HookEvent, ctx: Any) -> Any:
        if self.config.record:
            with open(self.config.record, "a") as f:
                f.write(f"{event.value} {os.getpid()}\n")
        self.calls.append((event, ctx))
        if self.delay:
            await asyncio.sleep(self.delay)
        if self.raises:
            raise RuntimeError(f"{self.name} exploded")
        return self.config.answers.get(event.value)


class AsyncConfig(msgspec.Struct, kw_only=True):
    name: str
    fail_session: str = ""  # events of this session raise ...
    fixed_flag: str = ""  # ... until this file exists
    record: str = ""  # a file each handled event id is appended to
    events: list[HookEvent] = msgspec.field(default_factory=list)
    delay_secs: float = 0  # each event takes this long (asyncio.sleep) before it is recorded
    timeout: float | None = None  # the hook's timeout (default: the async timeout)


class ScriptedAsync(AsyncAgentHook):
    """An async hook that records event ids and fails on one session until 'fixed'."""

    def __init__(self, config: AsyncConfig | None = None) -> None:
        if config is None:
            config = msgspec.json.decode(os.environ["HOOKBUS_TEST_ASYNC"], type=AsyncConfig)
        self.config = config
        self.name = config.name  # type: ignore[misc]
        self.subscribed_events = tuple(config.events)  # type: ignore[misc]
        self.timeout = config.timeout  # type: ignore[misc]

    async def _handle(self, ctx: Any) -> None:
        event = current_event.get()
        assert event is not None
        session = getattr(ctx, "session_id", "") or getattr(ctx, "parent_session_id", "")
        fixed = self.config.fixed_flag and os.path.exists(self.config.fixed_flag)
        if self.config.fail_session and session == self.config.fail_session and not fixed:
            raise RuntimeError(f"cannot handle session {session}")
        if self.config.delay_secs:
            await asyncio.sleep(self.config.delay_secs)
        if self.config.record:
            with open(self.config.record, "a") as f:
                f.write(f"{event.id}\n")


for _event, _method in ASYNC_METHODS.items():

    async def _forward(self: ScriptedAsync, ctx: Any) -> None:
        await self._handle(ctx)

    setattr(ScriptedAsync, _method, _forward)


class FromRedis(Recorder):
    """Answers whatever the test stored for it in ``{prefix}:test:answers`` (one process can
    then serve many generated cases). Its name comes from ``HOOKBUS_TEST_NAME``."""

    def __init__(self) -> None:
        from bus.settings import BusSettings
        from bus.transport.redis_io import connect

        settings = BusSettings.from_env()
        super().__init__(os.environ["HOOKBUS_TEST_NAME"])
        self.key = f"{settings.prefix}:test:answers"
        self.redis = connect(settings)

    async def _answer(self, event: HookEvent, ctx: Any) -> Any:
        raw = await self.redis.hget(self.key, f"{self.name}:{event.value}")
        return msgspec.json.decode(raw, type=HookAction) if raw else None


def nested(depth: int) -> Any:
    """``[[…[]…]]``, ``depth`` arrays deep (built without recursion)."""
    value: list[Any] = []
    for _ in range(depth - 1):
        value = [value]
    return value


class DeepAnswers(Recorder):
    """Answers with a value nested ``HOOKBUS_TEST_DEPTH`` levels deep in Metadata for
    PostToolUse, one level less in MutateInput's ``updated_args["deep"]`` for PreToolUse: either
    reply then nests that depth + 2 levels. Its name comes from ``HOOKBUS_TEST_NAME``."""

    def __init__(self) -> None:
        super().__init__(os.environ["HOOKBUS_TEST_NAME"])
        self.depth = int(os.environ["HOOKBUS_TEST_DEPTH"])

    async def _answer(self, event: HookEvent, ctx: Any) -> Any:
        if event == HookEvent.PRE_TOOL_USE:
            return MutateInput(updated_args={"deep": nested(self.depth - 1)})
        if event == HookEvent.POST_TOOL_USE:
            return Metadata(key="deep", value=nested(self.depth))
        return None
