"""One hook per authoring mistake (tests/test_authoring_mistakes.py): each is run embedded
(``workers.testing``, ``HookRegistry``) and as a ``hookbus worker`` process asked by a
``HookClient``, and must get the same outcome in all of them."""

from __future__ import annotations

import time
from typing import Any

from bus import AgentHook, Block, HookEvent

#: How long Blocks holds the event loop, against its 0.5 s timeout.
BLOCK_SECS = 1.5


class _Guard(AgentHook):
    subscribed_events = (HookEvent.PRE_TOOL_USE,)
    failure_policy = "fail"
    timeout = 5.0


class PlainDef(_Guard):
    def pre_tool_use(self, ctx: Any) -> Any:  # type: ignore[override]
        return Block(reason="guarded")


class Misspelt(_Guard):
    async def pre_tooluse(self, ctx: Any) -> Any:
        return Block(reason="guarded")


class AsyncProblem(_Guard):
    async def pre_tool_use(self, ctx: Any) -> Any:
        return Block(reason="guarded")

    async def problem(self) -> str:  # asked at each heartbeat, never awaited
        return "the rules file is missing"


class WrongType(_Guard):
    async def pre_tool_use(self, ctx: Any) -> Any:
        return "block it"


class Raises(_Guard):
    async def pre_tool_use(self, ctx: Any) -> Any:
        raise RuntimeError("the rules file is missing")


class Blocks(_Guard):
    timeout = 0.5

    async def pre_tool_use(self, ctx: Any) -> Any:
        time.sleep(BLOCK_SECS)  # the mistake: a blocking call in an async def
        return Block(reason="guarded")


class BlocksLater(_Guard):
    """Blocks after its first await: it runs in a task, which its timer cannot pre-empt."""

    timeout = 0.5

    async def pre_tool_use(self, ctx: Any) -> Any:
        import asyncio

        await asyncio.sleep(0)
        time.sleep(BLOCK_SECS)
        return Block(reason="guarded")
