"""A hook service runs each hook call in a task of its own from its first step on
(bus/dispatch.py, own_task): what a hook ties to its current task — ``asyncio.timeout`` around
its own slow call, anyio's cancel scopes (httpx) — is tied to the call, never to the service's
read loop. Before, the first step ran in the read loop's task: a hook's own timeout, when it
fired, cancelled the loop (the replica stopped serving, the lane stopped reading), and leaving
an anyio cancel scope failed ("in a different task than it was entered in")."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import anyio
from redis.asyncio import Redis

from bus import AgentHook, AsyncAgentHook, Block, HookEvent, PostToolUseContext, PreToolUseContext
from bus.protocol import DATA_FIELD, EventMessage, HookRequest, encode, new_id, now_ms, raw
from bus.settings import BusSettings
from bus.transport.keys import Keys
from tests.harness import wait_for


async def guarded_sub_call(kind: str) -> str:
    """A hook's own guard on a slow call of its own: it gives up, and says so."""
    try:
        if kind == "asyncio":
            async with asyncio.timeout(0.05):
                await asyncio.sleep(5)
        else:
            with anyio.fail_after(0.05):
                await anyio.sleep(5)
    except TimeoutError:
        return f"{kind} guard fired"
    return "no guard fired"


class Guarded(AgentHook):
    name = "Guarded"

    async def pre_tool_use(self, ctx: PreToolUseContext) -> Block:
        return Block(reason=await guarded_sub_call(ctx.tool_args["kind"]))


async def ask(redis: Redis, bus_settings: BusSettings, stream: str, kind: str) -> Any:
    inbox = Keys(bus_settings.prefix).inbox(f"probe-{new_id()[:6]}")
    context = PreToolUseContext(session_id="s", tool_name="t", tool_args={"kind": kind})
    request = HookRequest(
        id=new_id(), ts=now_ms(), hook="Guarded", event=HookEvent.PRE_TOOL_USE,
        session_id="s", context=raw(context), deadline=now_ms() + 30_000, reply_to=inbox,
    )  # fmt: skip
    await redis.xadd(stream, {DATA_FIELD: encode(request)})
    got = await redis.blpop([inbox], timeout=10)
    assert got is not None, f"no answer to the {kind} request"
    return json.loads(got[1])


async def test_a_hooks_own_timeouts_fire_on_its_call_and_the_replica_serves_on(
    bus_settings: BusSettings,
) -> None:
    from workers.services.worker import HookWorker

    worker = HookWorker(Guarded(), bus_settings)
    redis = Redis.from_url(bus_settings.redis_url)
    stop = asyncio.Event()
    run = asyncio.create_task(worker.run(stop))
    try:

        async def serving() -> bool:
            return bool(await redis.exists(worker.stream)) and bool(
                await redis.xinfo_groups(worker.stream)
            )

        await wait_for(serving, what="the worker reading its requests")
        for kind in ("asyncio", "anyio", "asyncio"):
            reply = await ask(redis, bus_settings, worker.stream, kind)
            assert reply["status"] == "ok", reply
            assert reply["action"]["reason"] == f"{kind} guard fired"
        assert not run.done()  # still serving
    finally:
        stop.set()
        await asyncio.wait_for(run, 30)
        await redis.aclose()


class GuardedObserver(AsyncAgentHook):
    name = "GuardedObserver"
    subscribed_events = (HookEvent.POST_TOOL_USE,)

    def __init__(self) -> None:
        self.said: list[str] = []

    async def on_post_tool_use_async(self, ctx: PostToolUseContext) -> None:
        self.said.append(await guarded_sub_call(ctx.output_content))


async def test_an_async_hooks_own_timeouts_fire_on_its_call_and_its_lane_reads_on(
    bus_settings: BusSettings,
) -> None:
    from workers.services.async_worker import AsyncHookWorker

    hook = GuardedObserver()
    worker = AsyncHookWorker(hook, bus_settings, start="0")
    keys = Keys(bus_settings.prefix)
    redis = Redis.from_url(bus_settings.redis_url)
    stop = asyncio.Event()
    run = asyncio.create_task(worker.run(stop))
    try:
        for i, kind in enumerate(("asyncio", "anyio", "asyncio")):
            ctx = PostToolUseContext(session_id="s", tool_name="t", output_content=kind)
            message = EventMessage(id=new_id(), ts=now_ms(), event=HookEvent.POST_TOOL_USE,
                                   session_id="s", context=raw(ctx))  # fmt: skip
            await redis.xadd(keys.event_partitions[0], {DATA_FIELD: encode(message)})
            await wait_for(lambda n=i + 1: len(hook.said) == n, what=f"the {kind} event handled")
        assert hook.said == ["asyncio guard fired", "anyio guard fired", "asyncio guard fired"]
        assert worker.stats["failed"] == 0
        assert not run.done()
    finally:
        stop.set()
        await asyncio.wait_for(run, 30)
        await redis.aclose()


class GuardedEverywhere(AgentHook):
    """Guards a slow call of its own on every event it takes, embedded as well."""

    subscribed_events = (HookEvent.PRE_TOOL_USE, HookEvent.ON_SESSION_STOP)

    def __init__(self, name: str, kind: str) -> None:
        self.name, self.kind = name, kind
        self.said: list[str] = []

    async def pre_tool_use(self, ctx: PreToolUseContext) -> Block:
        return Block(reason=await guarded_sub_call(self.kind))

    async def on_session_stop(self, ctx: Any) -> None:
        self.said.append(await guarded_sub_call(self.kind))


async def test_embedded_hooks_own_timeouts_fire_on_their_calls_side_by_side_and_in_turn() -> None:
    """In-process, the first hook that suspends is finished by the caller's task (its first
    step ran there) and the hooks after it by a task of their own: every hook's own timeout
    and cancel scope belongs to the task that runs it, side by side (PreToolUse) and one at a
    time (OnSessionStop). Before, the dispatch itself was cancelled, or the scope failed."""
    from bus import HookRegistry, HookSettings, SessionStopContext

    hooks = [GuardedEverywhere(f"g{i}", kind) for i, kind in enumerate(("asyncio", "anyio") * 2)]
    registry = HookRegistry(HookSettings(hook_timeout_secs=5))
    for hook in hooks:
        registry.add(hook)
    ctx = PreToolUseContext(session_id="s", tool_name="t", tool_args={})
    result = await asyncio.wait_for(registry.run_pre_tool_use(ctx), 10)
    assert [(b.hook_name, b.reason) for b in result.blocking_errors] == [
        (h.name, f"{h.kind} guard fired") for h in hooks
    ]
    assert result.skipped == ()
    await asyncio.wait_for(registry.run_on_session_stop(SessionStopContext(session_id="s")), 10)
    assert [h.said for h in hooks] == [[f"{h.kind} guard fired"] for h in hooks]
