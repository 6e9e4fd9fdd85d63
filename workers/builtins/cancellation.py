"""The distributed CancellationHook: the cancelled-session set lives in Redis.

``hookbus cancel SESSION_ID`` (or an agent: ``HookClient.cancel``, or a tenant's cancel request
to the coordinator service) adds to ``{p}:cancelled:{sid}``; this hook, served by
``hookbus worker workers.builtins.cancellation:RedisCancellationHook``, blocks that session's next
tool call wherever its agent runs. Nothing an agent sends lifts a cancellation, OnSessionStop
included: it ends with its TTL (set here if the canceller could not set one), or when an
operator deletes it.
"""

from __future__ import annotations

from redis.asyncio import Redis

from bus import (
    CONTINUE,
    AgentHook,
    Block,
    HookEvent,
    PreToolUseAction,
    PreToolUseContext,
)
from bus.settings import BusSettings
from bus.transport.keys import Keys
from bus.transport.redis_io import connect


class RedisCancellationHook(AgentHook):
    """Blocks every tool call of a session cancelled through Redis."""

    name = "CancellationHook"
    subscribed_events = (HookEvent.PRE_TOOL_USE,)
    failure_policy = "fail"  # if we cannot tell whether it was cancelled, do not run the tool
    #: Its Redis user may read the cancellation keys and start their TTL (workers/ops/acl.py).
    acl_capabilities = ("read-cancellations",)

    def __init__(self, settings: BusSettings | None = None) -> None:
        self.settings = settings or BusSettings.from_env()
        self.keys = Keys.of(self.settings)
        self._redis: Redis | None = None

    @property
    def redis(self) -> Redis:
        if self._redis is None:
            self._redis = connect(self.settings)
        return self._redis

    async def pre_tool_use(self, ctx: PreToolUseContext) -> PreToolUseAction:
        key = self.keys.cancelled(ctx.session_id)
        if await self.redis.exists(key):
            # An agent may only add to the key (no EXPIRE for it): its TTL starts here.
            await self.redis.expire(key, self.settings.session_ttl_secs, nx=True)
            return Block(reason=f"session {ctx.session_id} was cancelled by the user")
        return CONTINUE
