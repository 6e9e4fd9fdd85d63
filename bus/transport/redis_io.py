"""Small typed helpers over redis-py shared by the coordinator and the worker services.

Why one module: every Redis round trip HookBus makes goes through these helpers (connections and
their authentication, cluster routing, pipelines, batched XADD, group reads and claims, dead
letters); they share the connection classes and the rules for errors, and a reviewer of
HookBus's Redis traffic reads them in one place.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import logging
import math
import re
import socket
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from typing import Any, TypeVar, cast

import hiredis
from redis.asyncio import Redis, RedisCluster
from redis.asyncio import connection as redis_connection
from redis.asyncio.cluster import ClusterNode
from redis.cluster import PRIMARY
from redis.crc import key_slot
from redis.exceptions import (
    AskError,
    AuthenticationError,
    ClusterDownError,
    DataError,
    NoPermissionError,
    RedisClusterException,
    RedisError,
    ResponseError,
    SlotNotCoveredError,
    TryAgainError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from bus.errors import ConfigError, HookRetired, RedisAuthError
from bus.protocol import DATA_FIELD, RetiredHook, now_ms, retired_hook
from bus.ratelog import RateLimitedLog
from bus.settings import BusSettings, cluster_seeds
from bus.telemetry import tracing as telemetry
from bus.transport.backoff import Backoff
from bus.transport.directory import read_manifest
from bus.transport.keys import DLQ_DATA_BYTES, DLQ_MAXLEN, Keys

log = logging.getLogger("hookbus.redis")
T = TypeVar("T")
_failures = RateLimitedLog(log)

Entry = tuple[bytes, dict[bytes, bytes]]

#: Errors that mean "Redis is not reachable right now": retry later, never crash.
UNREACHABLE = (RedisError, OSError)

#: The reason of a dead letter for a pending entry a stream's cap cut before it was acknowledged.
TRIMMED = "trimmed before it was handled"


SOCKET_TIMEOUT = 10.0
#: :func:`consume`'s retries while Redis is unreachable: the first delay at most 0.1 s, doubling
#: to at most 2 s, each between half its ceiling and its ceiling (bus/transport/backoff.py).
CONSUME_RETRY_FIRST_SECS, CONSUME_RETRY_CAP_SECS = 0.1, 2.0


def permanent(exc: BaseException, conn: Any = None) -> RedisAuthError | None:
    """The one place that tells a permanent Redis error (retrying cannot help: the process must
    be reconfigured) from a passing one. Today that is a refused login: a missing or wrong
    password, an unknown or disabled user. ``conn``, when given, names the server and user."""
    refused = isinstance(exc, AuthenticationError) or (
        isinstance(exc, ResponseError) and str(exc).startswith(("NOAUTH", "WRONGPASS"))
    )
    if not refused:
        return None
    where = "Redis"
    if conn is not None:
        path = getattr(conn, "path", None)
        where += f" at {path}" if path else f" at {conn.host}:{conn.port}"
        user = getattr(conn, "username", None)
        if user:
            who = f"user {user!r} with that password"
        elif getattr(conn, "password", None):
            who = "the password given"
        else:
            who = "a connection without a password"
    else:
        who = "the credentials"
    return RedisAuthError(
        f"authentication failed: {where} refused {who} ({exc}). Put the right user and "
        "password in the Redis URL: HOOKBUS_REDIS_URL or --redis, "
        "redis://USER:PASSWORD@HOST:PORT/0"
    )


async def _handshake(conn: Any, check: Callable[[], Awaitable[None]]) -> None:
    """redis-py's connection handshake (AUTH/HELLO, then SELECT …), with a refused login
    turned into a RedisAuthError: a connection then stops every retry loop at once."""
    try:
        await check()
    except RedisError as exc:
        error = permanent(exc, conn)
        if error is None:
            raise
        await conn.disconnect()
        raise error from exc


class _Watch:
    """The sends and reads of one event loop's connections, and one timer that sweeps them.

    Why not redis-py's timeouts: with a socket timeout set, redis-py schedules and cancels a
    timer for every send and for every reply it reads (a 3-command pipeline: 4 timers), and a
    1-hook dispatch reads 5-6 replies on each side. Profiled on the benchmark of concurrent
    agents, those timers were about a tenth of the agent's and the hook's CPU per dispatch.
    Here a send or read costs two dict operations; a timer runs every ``TICK`` seconds while
    any is under way and aborts the connection of one waiting past its timeout. The waiter then
    gets redis-py's ``TimeoutError``, as before (at most ``TICK`` later).
    """

    TICK = 0.25

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.waiting: dict[Any, float] = {}
        self.timer: asyncio.TimerHandle | None = None

    def sweep(self) -> None:
        self.timer = None
        now = self.loop.time()
        for conn, deadline in list(self.waiting.items()):
            if deadline <= now:
                del self.waiting[conn]
                conn.timed_out = True
                transport = getattr(getattr(conn, "_writer", None), "transport", None)
                if transport is not None:
                    transport.abort()  # the read or send under way fails at once
        if self.waiting:
            self.timer = self.loop.call_later(self.TICK, self.sweep)


_watches: dict[asyncio.AbstractEventLoop, _Watch] = {}


def _watch() -> _Watch:
    loop = asyncio.get_running_loop()
    watch = _watches.get(loop)
    if watch is None or watch.loop.is_closed():
        for old in [k for k in _watches if k.is_closed()]:
            del _watches[old]
        watch = _watches[loop] = _Watch(loop)
    return watch


class _Watched(redis_connection.AbstractConnection):
    """redis-py's connection, its sends and reads bounded by :class:`_Watch` instead of a
    timer each; and a refused login turned into a RedisAuthError (a connection then stops
    every retry loop at once)."""

    timed_out = False

    async def _watched(self, step: Awaitable[Any], timeout: float | None) -> Any:
        if timeout is None:
            return await step
        self.timed_out = False
        watch = _watch()
        watch.waiting[self] = watch.loop.time() + timeout
        if watch.timer is None:
            watch.timer = watch.loop.call_later(watch.TICK, watch.sweep)
        try:
            return await step
        except (RedisError, OSError) as exc:
            if self.timed_out:
                self.timed_out = False
                await self.disconnect(nowait=True)
                raise RedisTimeoutError(
                    f"Timeout waiting on the socket after {timeout:g}s"
                ) from exc
            raise
        finally:
            watch.waiting.pop(self, None)

    async def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        timeout, self.socket_timeout = self.socket_timeout, None
        try:
            await self._watched(super().send_packed_command(command, check_health), timeout)
        finally:
            self.socket_timeout = timeout

    async def read_response(
        self,
        disable_decoding: bool = False,
        timeout: float | None = None,
        *,
        disconnect_on_error: bool = True,
        push_request: bool | None = False,
    ) -> Any:
        read = super().read_response
        if timeout is not None:  # a read's own timeout (pub/sub): redis-py's way
            return await read(
                disable_decoding, timeout,
                disconnect_on_error=disconnect_on_error, push_request=push_request,
            )  # fmt: skip
        step = read(
            disable_decoding, math.inf,
            disconnect_on_error=disconnect_on_error, push_request=push_request,
        )  # fmt: skip
        return await self._watched(step, self.socket_timeout)

    async def on_connect_check_health(self, check_health: bool = True) -> None:
        parent = super().on_connect_check_health
        await _handshake(self, lambda: parent(check_health=check_health))

    def pack_command(self, *args: Any) -> list[bytes]:
        """A command in Redis's protocol, packed by hiredis (C) as redis-py's own synchronous
        connection does; its asyncio connection packs in Python: 3.6 µs an XADD here against
        0.5, 31 µs an XACK of 100 ids against 7."""
        if isinstance(args[0], str):
            args = (*args[0].encode().split(), *args[1:])
        elif b" " in args[0]:
            args = (*args[0].split(), *args[1:])
        try:
            return [hiredis.pack_command(args)]
        except TypeError as exc:  # None, a bool, a list…: refused, as redis-py's encoder does
            raise DataError(f"invalid Redis argument in {args[0]!r}: {exc}") from exc


class _Connection(_Watched, redis_connection.Connection):
    pass


class _AuthSSLConnection(_Watched, redis_connection.SSLConnection):
    pass


class _AuthUnixConnection(_Watched, redis_connection.UnixDomainSocketConnection):
    pass


#: URL schemes that name a Redis Cluster: ``redis+cluster://host:port`` (any one node; the
#: client discovers the others; several seeds separated by commas, ``h1:7000,h2:7001``, of
#: which any live one is enough: bus.settings.cluster_seeds) and ``rediss+cluster://`` with TLS.
CLUSTER_SCHEMES = {"redis+cluster": "redis", "rediss+cluster": "rediss"}


class ClusterClient(RedisCluster):
    """redis-py's asyncio cluster client, routing XREADGROUP, XREAD and BLMPOP by their key.

    Why around redis-py here: for every command flagged ``movablekeys`` — these three among
    them — redis-py asks a node for the command's keys (``COMMAND GETKEYS``) before sending it:
    one more round trip per call, every one to the same node (redis-py issue #2229; PR #2836,
    open, would use the key positions instead). Those are the reads of every hook replica and
    the inbox reads of every coordinator. HookBus names one key in each (protocol.md §9), at a
    place the command's syntax fixes; anything else goes the library's way.
    """

    async def _determine_slot(self, command: str, *args: Any) -> int:
        key = routing_key(command, args)
        if key is None:
            return await super()._determine_slot(command, *args)
        return self.keyslot(key)

    async def _refresh_topology(self, *args: Any, **kwargs: Any) -> None:
        """redis-py's refresh of the slot map, with the command table (fetched once) taken
        from the first node of the new map that answers. redis-py asks only its default node,
        the first master the map lists; while that master was down (not yet failed over, or
        with no replica) no new client could start, whatever master its keys were on. The node
        that answered becomes the default one (keyless commands: ``TIME``)."""
        try:
            await super()._refresh_topology(*args, **kwargs)
        except (RedisError, OSError):
            manager = self.nodes_manager
            if self.commands_parser.commands or manager.default_node is None:
                raise  # the map itself could not be read: redis-py says why
            failed = manager.default_node
            others = [*manager.get_nodes_by_server_type(PRIMARY), *manager.nodes_cache.values()]
            for node in dict.fromkeys(n for n in others if n is not failed):
                try:
                    await self.commands_parser.initialize(node)
                except (RedisError, OSError):
                    continue
                manager.default_node = node
                return
            raise


def routing_key(command: Any, args: Sequence[Any]) -> Any:
    """The one key of an ``XREADGROUP``/``XREAD`` of one stream or a ``BLMPOP`` of one list
    (``args`` after the command's name), or None."""
    name = command.decode() if isinstance(command, bytes) else str(command)
    name = name.upper()
    if name in ("XREADGROUP", "XREAD"):
        start = 3 if name == "XREADGROUP" else 0  # past GROUP <group> <consumer>
        for i in range(start, len(args)):
            token = args[i].decode() if isinstance(args[i], bytes) else str(args[i])
            if token.upper() == "STREAMS":
                rest = args[i + 1 :]
                return rest[0] if len(rest) == 2 else None
        return None
    if name == "BLMPOP" and len(args) >= 3 and str(args[1]) == "1":
        return args[2]
    return None


async def held_connection(redis: Redis) -> Any:
    """A connection of ``redis``'s pool for one long-lived task to keep and pass to
    :func:`pipelined` (taking one from the pool and giving it back costs a few per cent of an
    agent's CPU per dispatch); for a cluster client, a :class:`HeldNodes` that keeps one per
    node as the task meets them. Give it back with :func:`release_held`."""
    if isinstance(redis, RedisCluster):
        return HeldNodes()
    return await redis.connection_pool.get_connection()  # type: ignore[no-untyped-call]


class HeldNodes(dict[tuple[str, int], tuple[Any, Any]]):
    """A task's own connection to each cluster node it sends to: address → (pool, connection)."""


async def release_held(redis: Redis, conn: Any) -> None:
    """Give back what :func:`held_connection` returned."""
    if isinstance(conn, HeldNodes):
        for pool, held in conn.values():
            await pool.release(held)
        conn.clear()
    else:
        await redis.connection_pool.release(conn)


class Lane:
    """One master's share of a process's writes (on one node: all of them): what waits to be
    sent, the lock that lets one send at a time go out (each stream's entries stay in order),
    and the connection the sends keep (:func:`held_connection`)."""

    __slots__ = ("conn", "lock", "pending")

    def __init__(self) -> None:
        self.pending: list[Any] = []
        self.lock = asyncio.Lock()
        self.conn: Any = None


class Lanes:
    """A process's writes, one :class:`Lane` per cluster master.

    Why: with one batch on the wire at a time for every master, one slow master held up the
    writes to all of them: a durable write to a master without a replica waits out its
    ``WAIT`` timeout (1 s by default), a write to a dead one its connection attempt, and
    every session of the process waited behind it (issue 32: 16 decisions/s instead of ~750
    for 26 s). Each master's lane sends on its own, so a master's trouble costs the writes to
    its own keys only. A stream whose slot has no master in the client's map (mid-failover)
    goes to a lane of its own. On one node there is one lane.

    A stream stays in the lane it was given while any of its entries there is unsent or
    in flight (``outstanding``): a failover that moves its slot while an older entry waits in
    the old master's lane would otherwise let a newer one, in the new master's lane, overtake
    it. Each send routes its commands by the slot map of the moment (``xadd_batch``)."""

    def __init__(self, redis: Redis) -> None:
        self.cluster = cast(RedisCluster, redis) if isinstance(redis, RedisCluster) else None
        self.lanes: dict[Any, Lane] = {}
        self.outstanding: dict[Any, tuple[Lane, int]] = {}

    def lane(self, stream: Any) -> Lane:
        """The lane of ``stream``: the one it has entries outstanding in, else that of the
        master which serves it, as the client's slot map says."""
        held = self.outstanding.get(stream)
        if held is not None:
            return held[0]
        address: Any = None
        if self.cluster is not None:
            try:
                node = master_of(self.cluster, stream)
                address = (node.host, int(node.port))
            except RedisClusterException:  # mid-failover: no master serves the slot yet
                address = "unmapped"
        lane = self.lanes.get(address)
        if lane is None:
            lane = self.lanes[address] = Lane()
        return lane

    def add(self, items: Sequence[T], stream: Callable[[T], Any]) -> list[Lane]:
        """Put ``items`` in the lanes of their streams, in their order; the lanes they went to."""
        if self.cluster is None:
            lane = self.lane(None)
            lane.pending += items
            return [lane] if items else []
        touched: dict[Lane, None] = {}
        for item in items:
            key = stream(item)
            lane = self.lane(key)
            held = self.outstanding.get(key)
            self.outstanding[key] = (lane, 1 if held is None else held[1] + 1)
            lane.pending.append(item)
            touched[lane] = None
        return list(touched)

    def done(self, items: Sequence[T], stream: Callable[[T], Any]) -> None:
        """``items`` left their lane (sent, failed or dropped): their streams may follow the
        slot map again once none of theirs is outstanding."""
        if self.cluster is None:
            return
        for item in items:
            key = stream(item)
            held = self.outstanding.get(key)
            if held is None:
                continue
            if held[1] <= 1:
                del self.outstanding[key]
            else:
                self.outstanding[key] = (held[0], held[1] - 1)

    async def release(self, redis: Redis) -> None:
        """Give back every lane's kept connection."""
        for lane in self.lanes.values():
            if lane.conn is not None:
                conn, lane.conn = lane.conn, None
                await release_held(redis, conn)


async def pipelined(redis: Redis, commands: Sequence[Sequence[Any]], conn: Any = None) -> list[Any]:
    """The replies of ``commands``, sent in one write on one connection (a pipeline, never a
    transaction), each parsed as redis-py parses it, or the ResponseError Redis answered for it.
    Raises what the connection raises (RedisError, OSError); a connection cut short mid-way is
    closed, never reused with replies still unread.

    Why around redis-py's Pipeline: beyond its commands, each execution of it costs about 40 µs
    of CPU (a retry wrapper, observability hooks, a task to release the connection; measured
    2026-12-03 with a two-command pipeline: about 200 µs against 120 µs), and HookBus runs one
    per dispatch (the agent's request and event), per batch of requests (a sync hook's replies)
    and per batch of events (an async hook's read). On a cluster, one write per node
    (:func:`_cluster_pipelined`). ``conn``: what the caller holds (:func:`held_connection`),
    used instead of the pool's connections."""
    if isinstance(redis, RedisCluster):
        return await _cluster_pipelined(cast(RedisCluster, redis), commands, conn)
    pool = redis.connection_pool
    held = conn is not None
    if not held:
        conn = await pool.get_connection()  # type: ignore[no-untyped-call]
    try:
        await conn.send_packed_command(conn.pack_commands(commands))
        return await _replies(conn, commands, redis.response_callbacks)
    except BaseException:
        await conn.disconnect(nowait=True)  # a held one reconnects on its next send
        raise
    finally:
        if not held:
            await pool.release(conn)


def stream_reply(response: Any, **options: Any) -> list[list[Any]]:
    """XREAD's and XREADGROUP's reply as redis-py gives it, ``[[stream, [(id, fields), …]]]``,
    for either protocol's wire shape, built with one dict display per entry. Why around
    redis-py's own parser: it builds each entry's dict through two generic helpers, about 0.3 µs
    an entry against 0.1 here; every event an async hook or a sync worker reads goes through it
    (a deleted entry, read from a group's pending list, is ``(id, {})``, as redis-py has it)."""
    if not response:
        return []
    streams = response.items() if isinstance(response, dict) else response
    return [
        [stream, [(i, {f[0]: f[1]} if f and len(f) == 2 else _pairs(f)) for i, f in entries]]
        for stream, entries in streams
    ]


def _pairs(flat: list[bytes] | None) -> dict[bytes, bytes]:
    it = iter(flat or ())
    return dict(zip(it, it, strict=True))


def retryable(exc: BaseException) -> bool:
    """A Redis that cannot be reached now and may be soon: a connection refused or cut, a
    timeout, a cluster without a master for a slot (a failover) or without a seed that answers;
    never a refusal (NOPERM, a wrong password) or an error in the command."""
    seen: BaseException | None = exc
    while seen is not None:  # a cluster client wraps what its nodes answered
        if isinstance(seen, NoPermissionError | AuthenticationError):
            return False
        seen = seen.__cause__ or seen.__context__
    return isinstance(
        exc,
        RedisConnectionError | RedisTimeoutError | ClusterDownError | TryAgainError
        | RedisClusterException | OSError,
    )  # fmt: skip


async def until_reachable(step: Callable[[], Awaitable[T]], deadline: float) -> T:
    """``step()``, again while it fails because Redis cannot be reached (:func:`retryable`),
    until ``deadline`` (the event loop's clock); then what it raised."""
    loop = asyncio.get_running_loop()
    while True:
        try:
            return await step()
        except Exception as exc:
            if not retryable(exc) or loop.time() >= deadline:
                raise
        await asyncio.sleep(min(0.5, max(0.0, deadline - loop.time())))  # a retry's pace


def _seed_nodes(seeds: list[tuple[str, int]], scheme: str) -> list[tuple[str, int]]:
    """Every seed, and (without TLS, whose certificates name hosts) each address its name
    resolves to; a name that does not resolve now stays, to be tried when connecting."""
    nodes = list(seeds)
    if scheme.startswith("rediss"):
        return nodes
    for host, port in seeds:
        try:
            found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except OSError:
            continue
        nodes.extend((str(info[4][0]), port) for info in found)
    return list(dict.fromkeys(nodes))


async def _library_pipeline(cluster: RedisCluster, commands: Sequence[Sequence[Any]]) -> list[Any]:
    async with cluster.pipeline(transaction=False) as pipe:
        for command in commands:
            pipe.execute_command(*command)
        return list(await pipe.execute(raise_on_error=False))


@functools.lru_cache(maxsize=4096)
def _slot(key: str | bytes) -> int:
    return key_slot(key.encode() if isinstance(key, str) else key)


def master_of(cluster: RedisCluster, key: Any) -> ClusterNode:
    """The master that serves ``key`` in ``cluster``'s slot map (``get_node_from_key``), its slot
    remembered: HookBus sends to a few keys, over and over (its partitions, its inbox, its
    hooks' streams), and working the slot out each time (redis-py: encode, CRC16 in Python)
    was 2.7 µs a command, five times a decision on a cluster. Raises RedisClusterException
    when no master serves it (mid-failover)."""
    served = cluster.nodes_manager.slots_cache.get(_slot(key))
    if not served:
        raise SlotNotCoveredError(f"slot of {key!r} is not covered by the cluster")
    return served[0]


def _key_of(command: Sequence[Any]) -> Any:
    """The key a command of :func:`pipelined` is routed by, or None if it names none we know."""
    name = command[0]
    if name in ("XREADGROUP", "XREAD"):
        # HookBus spells its reads itself: the one stream follows STREAMS (found without the
        # case folding of routing_key, for each read of every hook replica).
        at = command.index("STREAMS") if "STREAMS" in command else -1
        if at > 0 and len(command) == at + 3:
            return command[at + 1]
        return routing_key(name, command[1:])
    if name == "BLMPOP":
        return routing_key(name, command[1:])
    if name in ("EVALSHA", "EVAL"):
        return command[3] if len(command) > 3 and str(command[2]) != "0" else None
    if name == "WAIT" or len(command) < 2:
        return None
    return command[1]


async def _cluster_pipelined(
    cluster: RedisCluster, commands: Sequence[Sequence[Any]], held: HeldNodes | None = None
) -> list[Any]:
    """:func:`pipelined` on a cluster: each node's commands sent in one write through a plain
    client of that node, the nodes' replies read after every write went out.

    Why not redis-py's cluster pipeline: per execution it resolves each command's policies and
    slot, wraps the nodes' sends in tasks, retries and parses through several layers; measured
    (``bench.fixed_costs``, 2026-12-04) it made an agent's CPU per decision 1.9x, and a hook
    worker's 1.9x, what they are on one node, where :func:`pipelined` writes to the socket
    itself. HookBus knows the key (so the slot) of every command it sends on the hot path, and
    the cluster client's slot map says which node serves it. A command the map placed wrong is
    redirected by its node (MOVED, ASK: it did not run): the map is refreshed and those commands
    go through redis-py's pipeline, which follows redirections. A command whose key we do not
    know goes that way too. A connection lost mid-way refreshes the map (a failover moved the
    slots) and raises, as on one node."""
    by_node: dict[tuple[str, int], list[int]] = {}
    for index, command in enumerate(commands):
        key = _key_of(command)
        try:
            node = None if key is None else master_of(cluster, key)
        except RedisClusterException:  # mid-failover: no master serves the slot yet
            node = None
        if node is None:
            return await _library_pipeline(cluster, commands)
        by_node.setdefault((node.host, int(node.port)), []).append(index)
    replies: list[Any] = [None] * len(commands)
    taken: list[tuple[Any, Any]] = []  # (pool, connection) of each node
    callbacks = cluster.response_callbacks
    try:
        for address, indices in by_node.items():
            kept = None if held is None else held.get(address)
            if kept is None:
                pool = _node_client(cluster, address).connection_pool
                kept = (pool, await pool.get_connection())  # type: ignore[no-untyped-call]
                if held is not None:
                    held[address] = kept
            taken.append(kept)
            conn = kept[1]
            await conn.send_packed_command(conn.pack_commands([commands[i] for i in indices]))
        for (_, conn), indices in zip(taken, by_node.values(), strict=True):
            got = await _replies(conn, [commands[i] for i in indices], callbacks)
            for i, reply in zip(indices, got, strict=True):
                replies[i] = reply
    except BaseException as exc:
        for _, conn in taken:
            await conn.disconnect(nowait=True)  # a held one reconnects on its next send
        if isinstance(exc, RedisError | OSError):  # not a cancellation: a node may be gone
            await _refresh_slots(cluster)
        raise
    finally:
        if held is None:
            for pool, conn in taken:
                await pool.release(conn)
    moved = [i for i, r in enumerate(replies) if isinstance(r, AskError)]  # MOVED is one too
    if moved:
        await _refresh_slots(cluster)
        again = await _library_pipeline(cluster, [commands[i] for i in moved])
        for i, reply in zip(moved, again, strict=True):
            replies[i] = reply
    return replies


async def _replies(
    conn: Any, commands: Sequence[Sequence[Any]], callbacks: Mapping[Any, Any]
) -> list[Any]:
    """The replies to ``commands`` sent on ``conn``, each parsed as redis-py parses it, or the
    ResponseError Redis answered for it."""
    replies: list[Any] = []
    for command in commands:
        try:
            reply = await conn.read_response()
        except ResponseError as exc:  # the reply was read: the next one follows
            replies.append(exc)
            continue
        callback = callbacks.get(command[0])
        replies.append(callback(reply) if callback else reply)
    return replies


def connect(settings: BusSettings) -> Redis:
    """A redis-py asyncio client for HookBus: bytes in and out, reconnecting on demand.

    A ``redis+cluster://`` URL gives redis-py's cluster client (:class:`ClusterClient`). It has
    the same command methods (every HookBus command names one key, and pipelines are never
    transactions: protocol.md §9), so the roles use it through the same ``Redis`` type.
    """
    scheme, _, rest = settings.redis_url.partition("://")
    if scheme in CLUSTER_SCHEMES:
        # The URL's first seed is redis-py's; the others, and every address a seed's name
        # resolves to (a headless Service's DNS name, say), are more startup nodes: the client
        # learns the cluster from the first that answers.
        seeds = cluster_seeds(settings.redis_url)
        userinfo = rest.rsplit("@", 1)[0] + "@" if "@" in rest else ""
        tail = rest.rsplit("@", 1)[-1]
        tail = tail[len(re.split(r"[/?#]", tail, maxsplit=1)[0]) :]
        host, port = seeds[0]
        shown = f"[{host}]" if ":" in host else host
        cluster = ClusterClient.from_url(
            f"{CLUSTER_SCHEMES[scheme]}://{userinfo}{shown}:{port}{tail}",
            startup_nodes=[ClusterNode(h, p) for h, p in _seed_nodes(seeds, scheme)],
            socket_connect_timeout=2,
            socket_timeout=SOCKET_TIMEOUT,
            health_check_interval=0,
        )
        for command in ("XREAD", "XREADGROUP"):
            cluster.set_response_callback(command, stream_reply)
        return cast(Redis, cluster)
    client = Redis.from_url(
        settings.redis_url,
        socket_connect_timeout=2,
        socket_timeout=SOCKET_TIMEOUT,
        health_check_interval=0,
        retry_on_timeout=False,
    )
    for command in ("XREAD", "XREADGROUP"):
        client.set_response_callback(command, stream_reply)
    return _watch_connections(client)


def _watch_connections(client: Redis) -> Redis:
    """``client`` with :class:`_Watched` connections (hiredis packing, one timer per loop)."""
    pool = client.connection_pool
    pool.connection_class = {
        redis_connection.Connection: _Connection,
        redis_connection.SSLConnection: _AuthSSLConnection,
        redis_connection.UnixDomainSocketConnection: _AuthUnixConnection,
    }.get(pool.connection_class, pool.connection_class)
    return client


class NotReplicated(RedisError):
    """A durable write reached its master but not enough replicas within the wait."""


#: (stream, payload, maxlen) of one XADD in a batch.
Xadd = tuple[str, bytes, int]


async def xadd_batch(
    redis: Redis,
    batch: Sequence[Xadd],
    *,
    replicas: int = 0,
    wait_ms: int = 1000,
    conn: Any = None,
) -> list[Any]:
    """XADD every item (one round trip per node); each result is an entry id or the exception.

    ``replicas`` > 0 is the durable mode: after the XADDs, ``WAIT replicas wait_ms`` on the
    same connection, and an item whose master did not hear back from that many replicas gets
    :class:`NotReplicated` instead of its id (the write may still survive; it is not promised).
    ``conn``: what the caller holds (:func:`held_connection`).
    """
    if replicas <= 0:
        return await _pipelined(redis, batch, None, conn)
    if not isinstance(redis, RedisCluster):
        return await _pipelined(redis, batch, (replicas, wait_ms), conn)
    # WAIT names no key: redis-py's cluster pipeline sends it to a random node, whose answer
    # says nothing about ours. So each master's share goes through a plain client of that node.
    cluster = cast(RedisCluster, redis)
    shares: dict[tuple[str, int], list[int]] = {}
    results: list[Any] = [None] * len(batch)
    for index, (stream, _, _) in enumerate(batch):
        try:
            node = master_of(cluster, stream)
        except RedisClusterException as exc:  # mid-failover: no master serves the slot yet
            results[index] = RedisError(f"no master for {stream}: {exc}")
            continue
        shares.setdefault((node.host, node.port), []).append(index)

    async def share(address: tuple[str, int], indices: list[int]) -> None:
        got = await _pipelined(
            _node_client(cluster, address), [batch[i] for i in indices], (replicas, wait_ms)
        )
        for i, result in zip(indices, got, strict=True):
            results[i] = result

    await asyncio.gather(*(share(a, i) for a, i in shares.items()))
    # A master short of replicas answered (NotReplicated): its slots are where they were.
    if any(isinstance(r, Exception) and not isinstance(r, NotReplicated) for r in results):
        await _refresh_slots(cluster)
    return results


#: The least time between two slot-map refreshes of one client (:func:`_refresh_slots`).
REFRESH_SLOTS_SECS = 0.25
_REFRESHED = "_hookbus_slots_refreshed"


async def _refresh_slots(cluster: RedisCluster) -> None:
    """Learn the cluster's new slot map (a failover moved slots) before the next batch. The
    nodes redis-py drops from its map are disconnected here: it would leave their connections
    to the garbage collector (unclosed sockets to a dead master).

    At most one every ``REFRESH_SLOTS_SECS`` per client, and none while one runs: a master
    that stays down (no replica to promote) fails every batch of its own lane, and a refresh
    for each (a connection to every seed, ``CLUSTER SLOTS``) took the CPU that the lanes of
    the healthy masters need (their decisions/s halved in test_chaos_outage)."""
    loop = asyncio.get_running_loop()
    if loop.time() < cluster.__dict__.get(_REFRESHED, -math.inf) + REFRESH_SLOTS_SECS:
        return
    cluster.__dict__[_REFRESHED] = loop.time()
    manager = cluster.nodes_manager
    before = list(manager.nodes_cache.values())
    try:
        await manager.initialize()
    except (RedisError, RedisClusterException, OSError) as exc:
        log.warning("could not refresh the cluster's slot map (%s); retrying", exc)
        return
    finally:
        cluster.__dict__[_REFRESHED] = loop.time()
    kept = {id(node) for node in manager.nodes_cache.values()}
    for node in before:
        if id(node) not in kept:
            with contextlib.suppress(RedisError, OSError):
                await node.disconnect()


async def _pipelined(
    redis: Redis, batch: Sequence[Xadd], wait: tuple[int, int] | None, conn: Any = None
) -> list[Any]:
    commands: list[tuple[Any, ...]] = [
        ("XADD", stream, "MAXLEN", "~", maxlen, "*", DATA_FIELD, payload)
        for stream, payload, maxlen in batch
    ]
    if wait is not None:
        commands.append(("WAIT", *wait))
    try:
        results = await pipelined(redis, commands, conn)
    except (RedisError, OSError) as exc:
        return [exc] * len(batch)
    if wait is not None:
        acked = results.pop()
        if not isinstance(acked, int) or acked < wait[0]:
            missing = NotReplicated(
                f"{acked} of {wait[0]} replicas acknowledged within {wait[1]} ms"
            )
            results = [r if isinstance(r, Exception) else missing for r in results]
    return results


_NODE_KWARGS = {
    "username", "password", "credential_provider", "socket_timeout", "socket_connect_timeout",
}  # fmt: skip


async def close(redis: Redis) -> None:
    """Close a client of :func:`connect`, with the plain clients of single cluster nodes that
    the durable mode opened beside it (:func:`_node_client`)."""
    nodes: dict[tuple[str, int], Redis] = redis.__dict__.pop(_NODES, {})
    for client in nodes.values():
        await client.aclose()
    await redis.aclose()


_NODES = "_hookbus_nodes"


def _node_client(cluster: RedisCluster, address: tuple[str, int]) -> Redis:
    """A plain client of one cluster node, with the cluster client's credentials and TLS
    (kept on the cluster client, so that both go together)."""
    clients: dict[tuple[str, int], Redis] = cluster.__dict__.setdefault(_NODES, {})
    client = clients.get(address)
    if client is None:
        given = cluster.connection_kwargs
        kwargs = {k: v for k, v in given.items() if k in _NODE_KWARGS or k.startswith("ssl_")}
        if given.get("connection_class") is redis_connection.SSLConnection:
            kwargs["ssl"] = True
        # Watched connections, as one node's client has: the hot path on a cluster goes
        # through these (_cluster_pipelined).
        client = clients[address] = _watch_connections(
            Redis(host=address[0], port=address[1], **kwargs)
        )
    return client


def group_lost(exc: ResponseError) -> bool:
    """NOGROUP, or a blocked read woken because its stream was deleted: recreate the group."""
    text = str(exc)
    return "NOGROUP" in text or "no longer exists" in text


async def ensure_group(redis: Redis, stream: str, group: str, start: str = "$") -> None:
    """Create ``group`` on ``stream`` (and the stream) unless it exists."""
    try:
        await redis.xgroup_create(stream, group, id=start, mkstream=True)
    except ResponseError as exc:
        if "BUSYGROUP" not in str(exc):
            raise


async def read_group(
    redis: Redis,
    group: str,
    consumer: str,
    stream: str,
    *,
    count: int,
    block_ms: int | None,
    conn: Any = None,
    acks: Sequence[bytes] = (),
) -> list[Entry]:
    """New entries for ``consumer`` (XREADGROUP … >), or [] after ``block_ms`` (None: at once).
    ``conn``: a connection the caller holds (:func:`held_connection`), read through
    :func:`pipelined`; then ``acks``, entries of ``stream`` to acknowledge, go in the same
    write, ahead of the read (Redis refusing the XACK is logged: they stay pending)."""
    response: Any
    if conn is None:
        response = await redis.xreadgroup(
            group, consumer, {stream: ">"}, count=count, block=block_ms
        )
    else:
        block = () if block_ms is None else ("BLOCK", block_ms)
        command = ("XREADGROUP", "GROUP", group, consumer, "COUNT", count, *block)
        read = (*command, "STREAMS", stream, ">")
        if acks:
            acked, response = await pipelined(redis, [("XACK", stream, group, *acks), read], conn)
            if isinstance(acked, Exception):
                _failures.warning("could not acknowledge %d entries: %s", len(acks), acked)
        else:
            [response] = await pipelined(redis, [read], conn)
        if isinstance(response, Exception):
            raise response
    entries: list[Entry] = []
    for _, batch in response or ():
        entries.extend(cast(list[Entry], batch))
    return entries


class Acks(list[bytes]):
    """Entries a consumer has finished, for its reader (:func:`consume`) to acknowledge with its
    next read. Once the reader has stopped (``taken`` False) nothing will: acknowledge them
    yourself."""

    taken = True

    def hand(self, entry_ids: Sequence[bytes]) -> bool:
        """Give ``entry_ids`` to the reader; False if it has stopped (acknowledge them
        yourself)."""
        if self.taken:
            self.extend(entry_ids)
        return self.taken


async def consume(
    redis: Redis,
    stream: str,
    group: str,
    consumer: str,
    *,
    count: int,
    stop: asyncio.Event,
    handle: Callable[[list[Entry]], Awaitable[None]],
    recreate: Callable[[], Awaitable[None]],
    acks: Acks | None = None,
) -> None:
    """Read a consumer group until ``stop``: new entries go to ``handle``; a lost group is
    recreated; while Redis is unreachable the loop backs off and retries (it never dies).
    The reader keeps a connection of its own (:func:`held_connection`): a read is on the path
    of every request, and a trip through the pool costs 15-30 µs of CPU.

    ``acks``: entries the caller has finished, to acknowledge. Each read takes them into its
    own write (the XACK goes to the stream's node, as the read does: on a cluster, a hook
    worker's reply and its XACK went to two masters in two writes); a read that fails keeps
    them for the next; what is left when the loop stops is acknowledged then."""
    backoff = Backoff(CONSUME_RETRY_FIRST_SECS, CONSUME_RETRY_CAP_SECS)
    conn: Any = None
    carried: list[bytes] = []
    try:
        while not stop.is_set():
            try:
                if conn is None:
                    conn = await held_connection(redis)
                if acks:
                    carried += acks
                    acks.clear()
                entries = await read_group(
                    redis, group, consumer, stream, count=count, block_ms=200, conn=conn,
                    acks=carried,
                )  # fmt: skip
                carried.clear()
                backoff.reset()
            except ResponseError as exc:
                if group_lost(exc):
                    log.warning("%s or its group %s vanished; recreating it", stream, group)
                    try:
                        await recreate()
                    except UNREACHABLE as lost:  # tried again at the next read
                        log.warning("could not recreate %s (%s); retrying", group, lost)
                        await asyncio.sleep(backoff.next())
                else:
                    log.error("Redis refused a read of %s (%s); retrying", stream, exc)
                    await asyncio.sleep(backoff.next())
                continue
            except UNREACHABLE as exc:
                delay = backoff.next()
                log.warning("Redis unreachable (%s); retrying in %.1fs", exc, delay)
                await asyncio.sleep(delay)
                continue
            try:
                await handle(entries)
            except UNREACHABLE as exc:  # lost while handling: what was not acknowledged stays
                log.warning("Redis unreachable while handling %s (%s); retrying", stream, exc)
                await asyncio.sleep(backoff.next())
            except Exception:  # no message stops the loop; what was not acknowledged is claimed
                _failures.error("handling a batch of %s failed", stream, exc_info=True)
    finally:
        if acks is not None:
            acks.taken = False  # from now on, their owner acknowledges them
            carried += acks
            acks.clear()
        if conn is not None:
            await release_held(redis, conn)
        if carried:  # finished, not yet acknowledged: before the consumer hands over
            try:
                await redis.xack(stream, group, *carried)
            except (RedisError, OSError) as exc:  # they stay pending: answered again if claimed
                _failures.warning("could not acknowledge %d entries: %s", len(carried), exc)


async def keep_and_claim(
    redis: Redis,
    stream: str,
    group: str,
    consumer: str,
    in_flight: Collection[bytes],
    idle_ms: int,
    count: int = 16,
    *,
    dlq: str | None = None,
    hook: str = "",
) -> list[Entry]:
    """Keep ``consumer``'s in-flight entries its own (XCLAIM resets their idle time) and take
    over entries another consumer has left idle for ``idle_ms`` (XAUTOCLAIM): a replica that
    died or froze mid-entry loses it to a live one. Returns the entries taken over.

    Pending entries the stream's cap cut are dropped from the group by XAUTOCLAIM, which names
    them: with ``dlq``, each becomes a dead letter there ("trimmed before it was handled")."""
    # Entries in flight when this pass began are ours even if they finish meanwhile: one
    # acknowledged just after XAUTOCLAIM read it as pending must not be taken over again.
    ours = set(in_flight)
    if ours:
        await redis.xclaim(stream, group, consumer, 0, list(ours), justid=True)
    result = await redis.xautoclaim(stream, group, consumer, idle_ms, start_id="0-0", count=count)
    deleted = [i for i in (result[2] if len(result) > 2 else ()) if i not in ours]
    if dlq and deleted:
        reason = f"{TRIMMED}: cut by the cap of {stream} while pending"
        extra = {"groups": group, "lost": "1"} | ({"hook": hook} if hook else {})
        async with redis.pipeline(transaction=False) as pipe:
            for entry_id in deleted:
                letter = dead_letter_entry(stream, reason, b"", entry_id=entry_id.decode(), **extra)
                xadd_dead_letter(pipe, dlq, letter)
            await pipe.execute()
        log.error(
            "%d pending entries of %s (group %s) were %s; first %s",
            len(deleted), stream, group, TRIMMED, deleted[0].decode(),
        )  # fmt: skip
    return [
        (entry_id, fields)
        for entry_id, fields in result[1]
        if entry_id not in ours and entry_id not in in_flight
    ]


class Settled:
    """The last ``size`` entry ids this consumer acknowledged. An entry can reach a consumer
    twice at once — its XREADGROUP reply still being read while a takeover pass (XAUTOCLAIM)
    finds it idle — and must then be handled once: dead-lettered once, answered once."""

    def __init__(self, size: int = 4096) -> None:
        self.size = size
        self._ids: OrderedDict[bytes, None] = OrderedDict()

    def add(self, entry_id: bytes) -> None:
        self._ids[entry_id] = None
        if len(self._ids) > self.size:
            self._ids.popitem(last=False)

    def __contains__(self, entry_id: object) -> bool:
        return entry_id in self._ids


async def cancel_session(redis: Redis, keys: Keys, session_id: str, ttl_secs: int, by: str) -> None:
    """Mark a session cancelled (``{p}:cancelled:{sid}``, a set of who cancelled it) for
    ``ttl_secs``. Only adds: lifting one takes a DEL, which only the operator may run."""
    async with redis.pipeline(transaction=False) as pipe:
        pipe.sadd(keys.cancelled(session_id), by)
        pipe.expire(keys.cancelled(session_id), ttl_secs, nx=True)  # a new one: its TTL
        pipe.expire(keys.cancelled(session_id), ttl_secs, gt=True)  # never shortens one
        await pipe.execute()


def refuse_retired(tomb: RetiredHook) -> HookRetired:
    import datetime as dt

    when = dt.datetime.fromtimestamp(tomb.at / 1000, dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    by = f" by {tomb.by}" if tomb.by else ""
    return HookRetired(
        f"hook {tomb.retired} was removed{by} at {when} (hookbus hooks remove): not serving it. "
        f"To serve it again: hookbus hooks restore {tomb.retired}"
    )


async def current_manifest(redis: Redis, keys: Keys, hook: str) -> bytes | None:
    """The hook's manifest before a replica registers; raises HookRetired if an operator
    removed the hook (a tombstone, ``RetiredHook``, in place of its manifest)."""
    value = await read_manifest(redis, keys, hook)
    tomb = retired_hook(value)
    if tomb is not None:
        raise refuse_retired(tomb)
    return value


async def retire_replica(redis: Redis, keys: Keys, hook: str, replica: str) -> None:
    """A replica's clean shutdown: its heartbeat goes, and the hook's ``stopped`` member
    records when (``hookbus hooks list`` then says "stopped", not "never")."""
    async with redis.pipeline(transaction=False) as pipe:
        pipe.zrem(keys.replicas(hook), replica)
        pipe.zadd(keys.replicas(hook), {Keys.STOPPED_MEMBER: -now_ms()})
        pipe.hdel(keys.clocks(hook), replica)
        pipe.hdel(keys.problems(hook), replica)
        await pipe.execute()


def hook_problem(hook: object) -> str:
    """What a hook says is wrong with it now, in one line ("" when nothing): its optional
    ``problem()`` method, which its service asks at each heartbeat (the policy hook: the rules
    file it refused). A ``problem()`` that raises is itself the problem."""
    ask = getattr(hook, "problem", None)
    if not callable(ask):
        return ""
    try:
        said = ask()
    except Exception as exc:
        said = f"problem() failed: {type(exc).__name__}: {exc}"
    return " ".join(str(said or "").split())[:2000]


def publish_problem(pipe: Any, keys: Keys, hook: str, replica: str, problem: str, had: str) -> None:
    """With a heartbeat: the replica's ``problem`` (``hook_problem``) under ``keys.problems``,
    set at each beat while there is one (a restarted Redis gets it again), deleted once it is
    gone (``had``: what the last beat published)."""
    if problem:
        pipe.hset(keys.problems(hook), replica, problem)
    elif had:
        pipe.hdel(keys.problems(hook), replica)


async def hand_over(
    redis: Redis, stream: str, group: str, consumer: str, claim_idle_ms: int
) -> int:
    """At a clean shutdown: hand the entries still pending with ``consumer`` over to the live
    replicas, and delete the consumer only once it holds none.

    ``XGROUP DELCONSUMER`` would discard them (neither answered nor taken over); left alone they
    would wait ``claim_idle_ms`` from their delivery. Claiming them with ``IDLE claim_idle_ms``
    makes them look abandoned at once: a live replica's next ``XAUTOCLAIM`` takes them.
    Returns how many were handed over.
    """
    rows: Any = await redis.xpending_range(
        stream, group, min="-", max="+", count=10_000, consumername=consumer
    )
    ids = [row["message_id"] for row in rows]
    if ids:
        await redis.xclaim(stream, group, consumer, 0, ids, idle=claim_idle_ms, justid=True)
    else:
        with contextlib.suppress(ResponseError):  # the group is gone: nothing to hand over
            await redis.xgroup_delconsumer(stream, group, consumer)
    return len(ids)


def bounded_data(data: Any) -> dict[str, str | bytes]:
    """A message as a dead letter keeps it: at most its first ``DLQ_DATA_BYTES`` (``data``),
    with its whole ``size`` and SHA-256 (``sha256``); ``cut`` = 1 if the prefix is not all of
    it (such a letter is never replayed)."""
    if isinstance(data, bytes):
        whole = data
    else:
        whole = (data if isinstance(data, str) else repr(data)).encode("utf-8", "surrogatepass")
    if not whole:
        return {"data": b""}
    fields: dict[str, str | bytes] = {
        "data": whole[:DLQ_DATA_BYTES],
        "size": str(len(whole)),
        "sha256": hashlib.sha256(whole).hexdigest(),
    }
    if len(whole) > DLQ_DATA_BYTES:
        fields["cut"] = "1"
    return fields


def dead_letter_entry(source: str, reason: str, data: Any, **extra: str) -> dict[Any, Any]:
    """The fields of one dead letter: where it came from, why, the message (a bounded prefix,
    its size and digest: :func:`bounded_data`), when (+ extra, each at most 300 bytes; the reason
    at most 2000).
    So one letter takes at most ~7.4 KB, whatever it records."""
    return {
        "source": _at_most(source, 300),
        "reason": _at_most(reason, 2000),
        **bounded_data(data),
        "ts": str(now_ms()),
        **{k: _at_most(str(v), 300) for k, v in extra.items()},
    }


def _at_most(text: str, size: int) -> str:
    """``text``, cut to at most ``size`` bytes of UTF-8 (never inside a character)."""
    raw = text.encode("utf-8", "surrogatepass")
    return text if len(raw) <= size else raw[:size].decode("utf-8", "ignore")


def xadd_dead_letter(pipe: Any, dlq: str, letter: dict[Any, Any]) -> Any:
    """XADD one letter to a unit's dead-letter stream, capped (``DLQ_MAXLEN``)."""
    return pipe.xadd(dlq, letter, maxlen=DLQ_MAXLEN, approximate=True)


async def dead_letter(
    redis: Redis, dlq: str, source: str, reason: str, data: Any, **extra: str
) -> None:
    """Keep a message nobody could use, with why, in the dead-letter stream ``dlq`` of the
    unit it concerns (``Keys.dlq``, ``Keys.hook_dlq``, ``Keys.tenant_dlq``; bounded)."""
    entry = dead_letter_entry(source, reason, data, **extra)
    try:
        await xadd_dead_letter(redis, dlq, entry)
    except UNREACHABLE as exc:
        _failures.error("could not dead-letter a message from %s (%s): %s", source, reason, exc)


def partitions_mismatch(keys: Keys, theirs: int) -> str:
    """One line naming both counts, and how to fix it."""
    return (
        f"this process has HOOKBUS_PARTITIONS={keys.partitions} but the bus (prefix "
        f"{keys.prefix}) has {theirs} partitions ({keys.config} partitions): start it with "
        f"HOOKBUS_PARTITIONS={theirs}; on another count its events would go where no hook "
        f"reads them. To change the bus's count, stop every process of the bus and run "
        f"hookbus partitions {keys.partitions} --force"
    )


async def check_partitions(redis: Redis, keys: Keys) -> None:
    """The partition count is the bus's shared configuration (``{p}:config`` ``partitions``):
    written once, by the first process (HSETNX), read by every process at start and on
    refresh. Raises ConfigError (one line naming both counts) if the bus has another count
    than this process. A user that may not write it (NOPERM) only reads."""
    with contextlib.suppress(NoPermissionError):
        await redis.hsetnx(keys.config, "partitions", str(keys.partitions))
    value = await redis.hget(keys.config, "partitions")
    if value is None:
        return
    try:
        theirs = int(value)
    except ValueError:
        raise ConfigError(
            f"{keys.config} partitions is {value!r}, not a number: an operator must set it "
            f"(hookbus partitions N --force)"
        ) from None
    if theirs != keys.partitions:
        raise ConfigError(partitions_mismatch(keys, theirs))


async def partitions_changed(redis: Redis, keys: Keys) -> bool:
    """A hook service's check on refresh: True (after an ERROR line naming both counts) if the
    bus's partition count is no longer this process's: it stops rather than read streams no
    agent writes (a supervisor restarting it with the old count is refused at start)."""
    try:
        await check_partitions(redis, keys)
    except ConfigError as exc:
        log.error("stopping: %s", exc)
        return True
    return False


class CutWatch:
    """Reports what the cap of a dead-letter stream cut: Redis's entries-added − length − the
    letters the operator deleted (``{p}:dlq:purged``). Each service watches the units it
    writes (a hook its own, the coordinator service the tenants' and ``{p}:dlq``) every
    ``every_secs`` and logs an ERROR line when the count grew (and once at start if any)."""

    def __init__(self, every_secs: float = 10.0) -> None:
        self.every_secs = every_secs
        self.cut: dict[str, int] = {}
        self._next = 0.0

    async def check(self, redis: Redis, keys: Keys, streams: Sequence[str]) -> None:
        import time

        if not streams or time.monotonic() < self._next:
            return
        self._next = time.monotonic() + self.every_secs
        purged: Any = await redis.hmget(keys.dlq_purged, list(streams))
        for stream, deleted in zip(streams, purged, strict=True):
            try:
                info: Any = await redis.xinfo_stream(stream)
            except ResponseError:  # no such stream yet
                continue
            cut = int(info.get("entries-added") or 0) - int(info["length"]) - int(deleted or 0)
            before = self.cut.get(stream, 0)
            self.cut[stream] = cut
            if cut > before:
                log.error(
                    "%d dead letters of %s cut by its cap (MAXLEN ~%d), %d in all: see "
                    "hookbus dlq list", cut - before, stream, DLQ_MAXLEN, cut,
                )  # fmt: skip
                # counted with the other losses: hookbus.entries.lost{hook.name="dead letters"}
                telemetry.count_lost("dead letters", stream, cut - before)
