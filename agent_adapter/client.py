"""``HookClient``: what a Python agent embeds to use hook services over Redis.

It has the same ``run_*`` API as ``HookRegistry``, so the reference runtime switches mode by
configuration only. Every lifecycle event is published to ``{p}:events``; synchronous decisions
come from the hook services through the coordinator that runs inside the client.
"""

from __future__ import annotations

from bus import NotifyResult, SessionStopContext, StepCompleteContext
from bus.dispatch import check_outside_hooks
from bus.errors import InvalidInputError
from bus.protocol import ControlMessage, encode
from bus.settings import BusSettings, HookSettings
from bus.transport.coordinator import Coordinator
from bus.transport.keys import check_name, session_digest


class HookClient(Coordinator):
    """A coordinator in the agent's process, plus session hooks and cancellation.

    Use as ``async with HookClient(BusSettings.from_env()) as hooks: ...``. Started while
    Redis is down, it fails closed until it has read the hook directory (tool calls blocked,
    permissions denied, tool output withheld; ``hooks.directory.known`` says when it has), then
    the hooks decide; ``HOOKBUS_FAIL_OPEN_UNTIL_DIRECTORY=1`` opts out (docs/reliability.md).
    """

    def __init__(
        self,
        settings: BusSettings | None = None,
        hook_settings: HookSettings | None = None,
        *,
        source: str = "",
    ) -> None:
        super().__init__(settings or BusSettings.from_env(), hook_settings, source=source)

    async def add_session_hook(self, session_id: str, hook_name: str) -> None:
        """Attach the hook service ``hook_name`` to one session (expires with the session)."""
        check_outside_hooks("add_session_hook()")
        check_name("hook name", hook_name)
        key = self.keys.session_hooks(session_id)
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.sadd(key, hook_name)
            pipe.expire(key, self.bus.session_ttl_secs)
            pipe.publish(self.keys.control, encode(_session_note(session_id)))
            await pipe.execute()
        self.session_changed(
            session_id, self._session_hooks.get(session_id, frozenset()) | {hook_name}
        )

    async def remove_session_hook(self, session_id: str, hook_name: str) -> bool:
        check_outside_hooks("remove_session_hook()")
        removed = await self.redis.srem(self.keys.session_hooks(session_id), hook_name)
        await self._announce_session(
            session_id, self._session_hooks.get(session_id, frozenset()) - {hook_name}
        )
        return bool(removed)

    async def clear_session_hooks(self, session_id: str) -> None:
        check_outside_hooks("clear_session_hooks()")
        await self.redis.delete(self.keys.session_hooks(session_id))
        await self._announce_session(session_id, frozenset())

    def _known(self, session_id: str) -> frozenset[str]:
        return self._session_hooks.get(session_id, frozenset())

    async def _announce_session(self, session_id: str, known: frozenset[str]) -> None:
        self.session_changed(session_id, known)
        await self.redis.publish(self.keys.control, encode(_session_note(session_id)))

    async def run_on_step_complete(self, ctx: StepCompleteContext) -> NotifyResult:
        result = await super().run_on_step_complete(ctx)
        if self._session_hooks.get(ctx.session_id):  # keep a live session's hooks from expiring
            self.spawn(
                self.redis.expire(
                    self.keys.session_hooks(ctx.session_id), self.bus.session_ttl_secs
                )
            )
        return result

    async def run_on_session_stop(self, ctx: SessionStopContext) -> NotifyResult:
        """Run OnSessionStop hooks in order, then detach the session's hooks."""
        try:
            return await super().run_on_session_stop(ctx)
        finally:
            if self._session_hooks.get(ctx.session_id):
                await self.clear_session_hooks(ctx.session_id)
            self.forget_session(ctx.session_id)

    async def cancel(self, session_id: str) -> None:
        """Cancel a session wherever its agent runs (its next tool call is blocked). An agent
        may only add to ``{p}:cancelled:{sid}`` (SADD): it cannot lift a cancellation, nor
        shorten one; the CancellationHook starts its TTL."""
        if not session_id:  # it would name no session ({p}:cancelled:): refused, as everywhere
            raise InvalidInputError("cancel: the session id is empty; name the session to cancel")
        await self.redis.sadd(self.keys.cancelled(session_id), "agent")


def _session_note(session_id: str) -> ControlMessage:
    """The control channel's note that a session's hooks changed: the session named by its
    digest, never its id (every trusted process subscribes to the channel)."""
    return ControlMessage(type="session", session_id=session_digest(session_id))
