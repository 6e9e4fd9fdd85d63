"""How large a reply a coordinator reads (``HookRequest.reply_max``, docs/protocol.md 3.2), with
real hook processes and a real Redis: a worker whose hook answers more than its request allows
fails the hook loudly instead of sending what would be dropped; a bigger context allows a bigger
rewrite; a reply pushed over its request's bound is dropped unread and counted, and one that
names a pending request but cannot be read fails that request at once."""

from __future__ import annotations

import asyncio
from typing import Any

from redis.asyncio import Redis

from agent_adapter.client import HookClient
from bus import Block, HookEvent, HookSettings, MutateInput, PreToolUseContext
from bus.protocol import DATA_FIELD, HookReply, HookRequest, decode, encode, new_id, now_ms
from bus.settings import BusSettings
from bus.transport.coordinator import REPLY_FLOOR, reply_bound
from bus.transport.keys import Keys
from tests.harness import Processes, wait_for, wait_live
from tests.remote_hooks import HookConfig

PRE = HookEvent.PRE_TOOL_USE


def test_the_bound_is_small_for_answers_without_content_and_grows_with_a_tool_events_context() -> (
    None
):
    assert reply_bound(HookEvent.ON_SESSION_START, 900_000) == REPLY_FLOOR == 16_384
    assert reply_bound(PRE, 100) == 32_768
    assert reply_bound(HookEvent.POST_TOOL_USE, 60_000) == 262_144
    assert reply_bound(HookEvent.PERMISSION_REQUEST, 1_000_000) == 1_048_576


async def test_a_rewrite_over_the_reply_bound_fails_its_hook_loudly_and_one_within_it_is_applied(
    bus_settings: BusSettings, procs: Processes
) -> None:
    """A MutateInput of 100 kB for a call of a few bytes would be over the 32 KiB its
    coordinator reads: the worker sends an error reply naming reply_max instead, and the hook
    fails under its policy (fail: Blocked) at once, not after its timeout. The same rewrite of
    a call of 60 kB (bound 256 KiB) is applied."""
    rewrite = MutateInput(updated_args={"pad": "x" * 100_000})
    cfg = HookConfig(name="Rewriter", answers={PRE.value: rewrite}, failure_policy="fail")
    procs.scripted(bus_settings, cfg)
    client = await HookClient(bus_settings, HookSettings(hook_timeout_secs=20)).start()
    try:
        await wait_live(client, "Rewriter")
        small = PreToolUseContext(session_id="s1", tool_name="edit", tool_args={"x": 1})
        result = await asyncio.wait_for(client.run_pre_tool_use(small), 10)
        assert isinstance(result.action, Block), result
        (skipped,) = result.skipped
        assert skipped.hook_name == "Rewriter" and skipped.kind == "error", result
        assert "over the 32768 bytes its coordinator reads" in skipped.detail, result
        assert "reply_max" in skipped.detail, result
        big = PreToolUseContext(session_id="s1", tool_name="edit", tool_args={"x": "y" * 60_000})
        result = await client.run_pre_tool_use(big)
        assert result.action == rewrite, result
        assert client.stats["oversized_replies"] == 0
    finally:
        await client.close()
    log = "\n".join(p.read_text() for p in procs.logdir.glob("Rewriter-*.log"))
    assert "reply_max" in log  # the worker says so too, where the hook ran


async def test_a_reply_over_its_requests_bound_is_dropped_unread_and_a_malformed_one_fails_it(
    bus_settings: BusSettings, procs: Processes
) -> None:
    """While a slow hook's request is pending, a reply naming it (from the hook's own
    credential: only it is shown the request's id) that is larger than the request allows is
    dropped unread (``oversized_replies``); the hook's own answer still decides. A reply naming
    it that is within the bound but cannot be read fails the request at once (the hook asked
    answered what cannot be read), instead of leaving it to its timeout."""
    cfg = HookConfig(name="Slow", answers={PRE.value: Block(reason="slow no")}, delay=3.0)
    procs.scripted(bus_settings, cfg)
    keys = Keys(bus_settings.prefix)
    client = await HookClient(bus_settings, HookSettings(hook_timeout_secs=20)).start()
    hook = Redis.from_url(bus_settings.redis_url)
    try:
        await wait_live(client, "Slow")

        async def asked() -> HookRequest:
            entries: Any = []

            async def sent() -> bool:
                entries[:] = await hook.xrevrange(keys.requests("Slow"), count=1)
                return bool(entries)

            await wait_for(sent, what="the request to Slow")
            return decode(entries[0][1][DATA_FIELD.encode()], HookRequest)

        ctx = PreToolUseContext(session_id="s1", tool_name="rm")
        first = asyncio.create_task(client.run_pre_tool_use(ctx))
        request = await asked()
        assert request.reply_max == 32_768
        big = HookReply(
            id=new_id(), ts=now_ms(), request_id=request.id, hook="Slow",
            action=Block(reason="z" * 40_000),
        )  # fmt: skip
        await hook.rpush(request.reply_to, encode(big))
        await wait_for(lambda: client.stats["oversized_replies"] == 1, what="dropped")
        assert (await first).action == Block(reason="slow no")  # the hook's own answer

        await hook.delete(keys.requests("Slow"))
        second = asyncio.create_task(client.run_pre_tool_use(ctx))
        request = await asked()
        head = f'{{"v":2,"id":"x","ts":1,"request_id":"{request.id}","hook":"Slow",'
        junk = head.encode() + b'"action":' + b"[" * 20_000
        await hook.rpush(request.reply_to, junk)
        result = await asyncio.wait_for(second, 2.5)  # before Slow's own answer (3 s)
        (skipped,) = result.skipped
        assert "its reply could not be read" in skipped.detail, result
        assert client.stats["malformed_replies"] == 1
    finally:
        await hook.aclose()
        await client.close()
