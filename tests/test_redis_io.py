"""bus.transport.redis_io's own pipelined exchange and stream replies, on a real Redis and a real
cluster: what redis-py's Pipeline and parsers gave before, without their cost per call."""

from __future__ import annotations

import asyncio
from typing import Any, cast

import pytest
from redis.asyncio import Redis, RedisCluster
from redis.exceptions import RedisError, ResponseError

from bus.settings import BusSettings
from bus.transport.redis_io import (
    Acks,
    close,
    connect,
    consume,
    ensure_group,
    held_connection,
    master_of,
    pipelined,
)
from tests.harness import wait_for


async def test_an_error_reply_in_a_pipeline_leaves_the_others_in_their_places(
    bus_settings: BusSettings,
) -> None:
    redis = connect(bus_settings)
    key = f"{bus_settings.prefix}:io"
    try:
        await redis.set(f"{key}:str", "x")
        replies = await pipelined(
            redis,
            [
                ("RPUSH", f"{key}:list", "a", "b"),
                ("RPUSH", f"{key}:str", "c"),  # WRONGTYPE
                ("PEXPIRE", f"{key}:list", 60_000),
                ("LRANGE", f"{key}:list", 0, -1),
            ],
        )
        assert replies[0] == 2 and isinstance(replies[1], ResponseError)
        assert replies[2] is True  # redis-py's own parse of PEXPIRE, as its Pipeline gave
        assert replies[3] == [b"a", b"b"]
    finally:
        await redis.aclose()


async def test_a_pipeline_cut_short_never_hands_its_unread_replies_to_the_next_call(
    bus_settings: BusSettings,
) -> None:
    """Cancelled while Redis still owes replies (a blocking pop first): the connection is
    closed, so the next exchange reads its own replies, not the ones left over."""
    redis = connect(bus_settings)
    redis.connection_pool.max_connections = 1  # the next call gets the same pooled connection
    try:
        call = asyncio.create_task(
            pipelined(redis, [("BLPOP", f"{bus_settings.prefix}:never", 2), ("ECHO", "stale")])
        )
        watcher = connect(bus_settings)
        try:  # sent, and Redis is holding its reply: a client blocked in BLPOP

            async def blocked() -> bool:
                clients: Any = await watcher.client_list()
                return any(c.get("cmd") == "blpop" for c in clients)

            await wait_for(blocked, timeout=5, what="the BLPOP to be blocked in Redis")
        finally:
            await watcher.aclose()
        call.cancel()
        await asyncio.gather(call, return_exceptions=True)
        assert await pipelined(redis, [("ECHO", "fresh"), ("PING",)]) == [b"fresh", True]
        assert await redis.echo("again") == b"again"
    finally:
        await redis.aclose()


async def test_stream_replies_match_redis_pys_shape_on_a_node_and_on_a_cluster(
    bus_settings: BusSettings, cluster_settings: BusSettings
) -> None:
    for settings in (bus_settings, cluster_settings):
        redis: Redis = connect(settings)
        s = f"{settings.prefix}:{{s}}"
        try:
            a = await redis.xadd(s, {"data": b"1", "more": b"2"})
            b = await redis.xadd(s, {"data": b"3"})
            await redis.xgroup_create(s, "g", id="0")
            read: Any = await redis.xreadgroup("g", "c", {s: ">"}, count=10)
            assert read == [
                [s.encode(), [(a, {b"data": b"1", b"more": b"2"}), (b, {b"data": b"3"})]]
            ]
            await redis.xdel(s, a)
            pending: Any = await redis.xreadgroup("g", "c", {s: "0"}, count=10)
            assert pending == [[s.encode(), [(a, {}), (b, {b"data": b"3"})]]]  # deleted: no fields
            replies = await pipelined(
                redis,
                [
                    ("XREADGROUP", "GROUP", "g", "c", "COUNT", 10, "STREAMS", s, "0"),
                    ("XACK", s, "g", a, b),
                ],
            )
            assert replies == [pending, 2]
            assert await redis.xread({s: "$"}, block=10) == []
        finally:
            await close(redis)


async def test_a_held_connection_cut_by_redis_reconnects_on_its_next_exchange(
    bus_settings: BusSettings,
) -> None:
    """The inbox reader keeps one connection (held_connection): when Redis drops it, that
    exchange fails as unreachable, and the next one through it reconnects."""
    redis = connect(bus_settings)
    conn = await held_connection(redis)
    try:
        [me] = await pipelined(redis, [("CLIENT", "ID")], conn)
        killer = connect(bus_settings)
        try:
            assert await killer.execute_command("CLIENT", "KILL", "ID", me) == 1
        finally:
            await killer.aclose()
        with pytest.raises((RedisError, OSError)):
            await pipelined(redis, [("PING",)], conn)
        assert await pipelined(redis, [("ECHO", "back")], conn) == [b"back"]
    finally:
        await redis.connection_pool.release(conn)
        await redis.aclose()


async def test_a_group_reader_outlives_redis_cutting_its_connection_and_gives_it_back(
    bus_settings: BusSettings,
) -> None:
    """consume() reads through a connection it keeps: when Redis drops it, the reader goes on
    with new entries (reconnected); once stopped, the connection is back in the pool."""
    redis, admin = connect(bus_settings), connect(bus_settings)
    stream = f"{bus_settings.prefix}:reader"
    await ensure_group(redis, stream, "g", start="0")
    got: list[bytes] = []
    stop = asyncio.Event()

    async def handle(entries: list[Any]) -> None:
        got.extend(fields[b"n"] for _, fields in entries)

    async def recreate() -> None:
        await ensure_group(redis, stream, "g", start="0")

    async def reader() -> Any:  # the connection blocked in the group's read
        return [c["id"] for c in await admin.client_list() if c["cmd"] == "xreadgroup"]

    task = asyncio.create_task(
        consume(redis, stream, "g", "c", count=8, stop=stop, handle=handle, recreate=recreate)
    )
    try:
        await admin.xadd(stream, {"n": "1"})
        await wait_for(lambda: got == [b"1"], what="the first entry")
        [first] = await wait_for(reader, what="the reader blocked in XREADGROUP")
        assert await admin.execute_command("CLIENT", "KILL", "ID", first) == 1
        await admin.xadd(stream, {"n": "2"})
        await wait_for(lambda: got == [b"1", b"2"], what="an entry after the cut")
        [second] = await wait_for(reader, what="the reader reconnected")
        assert second != first
    finally:
        stop.set()
        await asyncio.wait_for(task, 5)
        in_use = list(redis.connection_pool._get_in_use_connections())  # type: ignore[attr-defined]
        await admin.aclose()
        await redis.aclose()
    assert in_use == []


async def test_a_reader_acknowledges_with_its_next_read_and_when_it_stops(
    bus_settings: BusSettings,
) -> None:
    """consume(acks=…): what the handler finished is acknowledged in the next read's write
    (a hook worker's XACK, on the stream's node), and what is left when the loop stops is
    acknowledged as it stops, not left pending for a takeover to answer again."""
    redis, admin = connect(bus_settings), connect(bus_settings)
    stream = f"{bus_settings.prefix}:acked"
    await ensure_group(redis, stream, "g", start="0")
    acks = Acks()
    seen: list[bytes] = []
    stop = asyncio.Event()

    async def handle(entries: list[Any]) -> None:
        for entry_id, fields in entries:
            seen.append(fields[b"n"])
            acks.append(entry_id)
            if fields[b"n"] == b"last":
                stop.set()  # no read follows this one

    async def recreate() -> None:
        await ensure_group(redis, stream, "g", start="0")

    async def pending() -> int:
        return int((await admin.xpending(stream, "g"))["pending"])

    task = asyncio.create_task(
        consume(
            redis, stream, "g", "c", count=8, stop=stop, handle=handle, recreate=recreate, acks=acks
        )
    )
    try:
        await admin.xadd(stream, {"n": "1"})
        await admin.xadd(stream, {"n": "2"})
        await wait_for(lambda: len(seen) == 2, what="both entries")

        async def acknowledged() -> bool:
            return await pending() == 0

        await wait_for(acknowledged, what="the two acknowledged by the next read")
        assert acks == []  # taken by the read
        await admin.xadd(stream, {"n": "last"})
        await asyncio.wait_for(task, 5)
        assert seen == [b"1", b"2", b"last"]
        assert await pending() == 0
    finally:
        stop.set()
        await asyncio.wait_for(task, 5)
        await admin.aclose()
        await redis.aclose()


async def test_the_master_of_a_key_is_the_one_redis_py_routes_it_to(
    cluster_settings: BusSettings,
) -> None:
    """master_of remembers each key's slot; the master comes from the slot map of the moment,
    as redis-py's get_node_from_key has it (hash tags, str and bytes alike)."""
    redis = cast(RedisCluster, connect(cluster_settings))
    try:
        await redis.initialize()
        p = cluster_settings.prefix
        keys = [f"{p}:events:{{{i}}}" for i in range(40)] + [f"{p}:inbox:{i}" for i in range(40)]
        keys += [k.encode() for k in keys] + [f"{p}:hook:{{Guard}}:requests", "plain"]
        seen = set()
        for key in keys * 2:  # the second time from the remembered slots
            expected = redis.get_node_from_key(key)
            assert master_of(redis, key) is expected
            seen.add(expected.name)
        assert len(seen) == len(redis.get_primaries())  # the keys spread over every master
    finally:
        await close(redis)
