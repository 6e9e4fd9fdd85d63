"""A hook whose behaviour is data, so the same hook runs in-process or in a worker process.

In a worker it reads its configuration from ``HOOKBUS_TEST_HOOK`` (JSON of ``HookConfig``):
``hookbus worker tests.remote_hooks:Scripted``.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

import msgspec

from bus import HookAction, HookEvent, ToolMatchFilter
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
