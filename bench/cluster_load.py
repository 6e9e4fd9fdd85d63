"""The load and the floor processes of ``bench.cluster``, started by it (never by hand)::

    python -m bench.cluster_load agent URL PREFIX SESSIONS CALLS HOOK
    python -m bench.cluster_load floor-agent URL PREFIX SESSIONS CALLS HOOK
    python -m bench.cluster_load floor-hook URL PREFIX HOOK
    python -m bench.cluster_load floor-consumer URL PREFIX GROUP

``HOOKBUS_PARTITIONS`` and ``BENCH_SHARDS`` (the hook's request shards) in the environment give
the key layout, which the floor shares with HookBus (bus/transport/keys.py): the same streams on the
same slots, so that both spread over a cluster alike. ``URL`` is ``redis://`` (one node) or
``redis+cluster://`` (redis-py's cluster client), for HookBus and floor alike.

agent
    HookBus: a ``HookClient`` (its settings from ``HOOKBUS_*``); ``SESSIONS`` sessions at once,
    each making ``CALLS`` sequential ``run_pre_tool_use`` calls, every answer checked.
floor-agent
    The same load on raw redis-py: per call, one pipeline of ``XADD`` of the request to the
    session's shard of the hook's requests and ``XADD`` of the event to the session's events
    partition (what HookBus sends), then the reply from one inbox per process, read by one
    ``BLMPOP`` loop that resolves a future per request.
floor-hook
    One task per request shard: ``XREADGROUP COUNT 32 BLOCK`` → one pipeline of an ``RPUSH`` of a
    reply per request + one ``XACK``.
floor-consumer
    One consumer of ``GROUP`` on every events partition: one task per partition, each
    ``XREADGROUP COUNT 100 BLOCK`` → ``msgspec.json.decode`` of each entry → ``XACK``.

An agent pushes its pid to ``{PREFIX}:bench:ready`` once warmed up, waits for a token on
``{PREFIX}:bench:go``, runs, and pushes what it measured (JSON) to ``{PREFIX}:bench:done``; the
others push to ``{PREFIX}:bench:ready`` once reading. Every process exits when its parent does.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from typing import Any

import msgspec
from redis.asyncio import Redis
from redis.exceptions import ResponseError

from bench.floor_worker import FloorReply, FloorRequest, hook_reply, hook_request
from bus.transport.keys import Keys
from bus.transport.redis_io import ClusterClient

GROUP = "workers"
BLOCK_MS = 200
GO_TIMEOUT = 300  # seconds an agent waits for the go token
CALL_TIMEOUT = 10.0

_request = msgspec.json.Decoder(FloorRequest).decode
_reply = msgspec.json.Decoder(FloorReply).decode


def floor_connect(url: str) -> Redis:
    """redis-py at its cheapest: no socket timeout; for ``+cluster`` URLs the cluster client,
    routing its reads by their key as HookBus's does (bus.transport.redis_io.ClusterClient: without
    it, redis-py asks a node for the key of every XREADGROUP and BLMPOP)."""
    scheme, _, rest = url.partition("://")
    if scheme.endswith("+cluster"):
        cluster = ClusterClient.from_url(f"{scheme.removesuffix('+cluster')}://{rest}")
        return cluster  # type: ignore[return-value]
    return Redis.from_url(url, socket_connect_timeout=2)


def layout() -> tuple[int, int]:
    return int(os.environ.get("HOOKBUS_PARTITIONS", "1")), int(os.environ.get("BENCH_SHARDS", "1"))


def sessions(count: int) -> list[str]:
    """The same session ids for HookBus and the floor (so the same shards and partitions):
    ``BENCH_AGENT`` numbers the agent process."""
    return [f"bench-a{os.environ.get('BENCH_AGENT', '0')}-s{i}" for i in range(count)]


async def ensure_group(redis: Redis, stream: str, group: str) -> None:
    try:
        await redis.xgroup_create(stream, group, id="0", mkstream=True)
    except ResponseError as exc:
        if "BUSYGROUP" not in str(exc):
            raise


async def until_parent_dies() -> None:
    parent = os.getppid()
    while os.getppid() == parent:
        await asyncio.sleep(0.5)


async def run_agent(
    redis: Redis, prefix: str, ids: list[str], calls: int, call: Any, warmup: int
) -> None:
    """Warm up, say ready, wait for go, make ``calls`` calls per session, report."""
    for _ in range(warmup):
        await asyncio.gather(*(call(s) for s in ids))
    await redis.rpush(f"{prefix}:bench:ready", os.getpid())
    if await redis.blpop([f"{prefix}:bench:go"], timeout=GO_TIMEOUT) is None:
        raise TimeoutError(f"no go within {GO_TIMEOUT}s")
    cpu0 = time.process_time()
    t0 = time.monotonic()

    async def one_session(session: str) -> None:
        for _ in range(calls):
            await call(session)

    await asyncio.gather(*(one_session(s) for s in ids))
    t1 = time.monotonic()
    report = {
        "pid": os.getpid(),
        "calls": calls * len(ids),
        "t0": t0,
        "t1": t1,
        "cpu": time.process_time() - cpu0,
    }
    await redis.rpush(f"{prefix}:bench:done", json.dumps(report))


# -- HookBus ------------------------------------------------------------------------------------


async def agent(url: str, prefix: str, n_sessions: int, calls: int, hook: str) -> None:
    from agent_adapter.client import HookClient
    from bus.actions import Continue
    from bus.events import PreToolUseContext
    from bus.settings import BusSettings, HookSettings

    settings = BusSettings.from_env()
    client = await HookClient(settings, HookSettings(hook_timeout_secs=CALL_TIMEOUT)).start()
    deadline = time.monotonic() + 60
    while not client.directory.live(hook):
        if time.monotonic() > deadline:
            raise TimeoutError(f"hook {hook} never became live")
        await asyncio.sleep(0.05)
    contexts = {
        s: PreToolUseContext(
            session_id=s, tool_name="file_read", tool_args={"path": "src/app/main.py", "limit": 200}
        )
        for s in sessions(n_sessions)
    }

    async def call(session: str) -> None:
        result = await client.run_pre_tool_use(contexts[session])
        if not isinstance(result.action, Continue) or result.skipped:
            raise RuntimeError(f"HookClient answered {result}")

    try:
        await run_agent(client.redis, prefix, list(contexts), calls, call, warmup=3)
        await until_parent_dies()  # connected until then: the benchmark counts connections
    finally:
        await client.close()


# -- the floor ----------------------------------------------------------------------------------


async def floor_agent(url: str, prefix: str, n_sessions: int, calls: int, hook: str) -> None:
    partitions, shards = layout()
    keys = Keys(prefix, partitions)
    redis = floor_connect(url)
    inbox = keys.inbox(f"floor-{os.getpid()}")
    waiting: dict[str, asyncio.Future[None]] = {}
    encode = msgspec.json.Encoder().encode
    ctx = msgspec.Raw(
        b'{"session_id":"","tool_name":"file_read","tool_args":'
        b'{"path":"src/app/main.py","limit":200},"step":0}'
    )

    async def read_inbox() -> None:
        while True:
            popped: Any = await redis.blmpop(1, 1, inbox, direction="LEFT", count=256)
            for data in popped[1] if popped else ():
                future = waiting.pop(_reply(data).request_id, None)
                if future is not None and not future.done():
                    future.set_result(None)

    async def call(session: str) -> None:
        request_id, payload = hook_request(hook, session, ctx, inbox)
        event = encode(
            {
                "v": 3,
                "id": request_id,
                "ts": 0,
                "traceparent": "",
                "tracestate": "",
                "event": "PreToolUse",
                "session_id": session,
                "context": ctx,
                "source": inbox,
            }
        )
        future = asyncio.get_running_loop().create_future()
        waiting[request_id] = future
        async with redis.pipeline(transaction=False) as pipe:
            pipe.xadd(
                keys.requests(hook, keys.shard(hook, session, shards), shards),  # as HookBus picks
                {"data": payload},
                maxlen=10_000,
                approximate=True,
            )
            pipe.xadd(keys.events(session), {"data": event}, maxlen=1_000_000, approximate=True)
            await pipe.execute()
        await asyncio.wait_for(future, CALL_TIMEOUT)

    reader = asyncio.create_task(read_inbox())
    await run_agent(redis, prefix, sessions(n_sessions), calls, call, warmup=3)
    reader.cancel()
    await until_parent_dies()


async def floor_hook(url: str, prefix: str, hook: str) -> None:
    partitions, shards = layout()
    keys = Keys(prefix, partitions)
    redis = floor_connect(url)
    replica = f"floor-{os.getpid()}"

    async def lane(stream: str) -> None:
        while True:
            response: Any = await redis.xreadgroup(
                GROUP, replica, {stream: ">"}, count=32, block=BLOCK_MS
            )
            for _, entries in response or ():
                async with redis.pipeline(transaction=False) as pipe:
                    for _, fields in entries:
                        request = _request(fields[b"data"])
                        pipe.rpush(request.reply_to, hook_reply(request.id, hook, replica))
                    pipe.xack(stream, GROUP, *(entry_id for entry_id, _ in entries))
                    await pipe.execute()

    streams = [keys.requests(hook, k, shards) for k in range(shards)]
    for stream in streams:
        await ensure_group(redis, stream, GROUP)
    lanes = [asyncio.create_task(lane(s)) for s in streams]
    await redis.rpush(f"{prefix}:bench:ready", os.getpid())
    await until_parent_dies()
    for task in lanes:
        task.cancel()


async def floor_consumer(url: str, prefix: str, group: str) -> None:
    partitions, _ = layout()
    keys = Keys(prefix, partitions)
    redis = floor_connect(url)
    consumer = f"floor-{os.getpid()}"
    decode = msgspec.json.decode

    async def lane(stream: str) -> None:
        while True:
            response: Any = await redis.xreadgroup(
                group, consumer, {stream: ">"}, count=100, block=BLOCK_MS
            )
            for _, entries in response or ():
                for _, fields in entries:
                    decode(fields[b"data"])
                await redis.xack(stream, group, *(entry_id for entry_id, _ in entries))

    for stream in keys.event_partitions:
        await ensure_group(redis, stream, group)
    lanes = [asyncio.create_task(lane(s)) for s in keys.event_partitions]
    await redis.rpush(f"{prefix}:bench:ready", os.getpid())
    await until_parent_dies()
    for task in lanes:
        task.cancel()


def main(argv: list[str]) -> int:
    kinds: dict[str, Any] = {
        "agent": agent,
        "floor-agent": floor_agent,
        "floor-hook": floor_hook,
        "floor-consumer": floor_consumer,
    }
    if not argv or argv[0] not in kinds:
        print(__doc__, file=sys.stderr)
        return 2
    kind, url, prefix, *rest = argv
    args: list[Any] = [int(a) if a.isdigit() else a for a in rest]
    asyncio.run(kinds[kind](url, prefix, *args))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
