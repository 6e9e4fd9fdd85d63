"""What an operator asks of a running bus: hooks, consumer lag, live events, dead letters, metrics.

The async functions take a redis-py asyncio client (bytes in and out, as
``bus.transport.redis_io.connect`` makes it) and the Keys, and return plain data; the ``render_*``
helpers turn that data into ``rich`` renderables. ``hookbus hooks list``, ``lag``, ``events tail``,
``dlq …`` and ``metrics`` (workers/cli/) are thin wrappers around the two.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime as dt
import json
import os
import re
from collections.abc import AsyncGenerator, Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import msgspec
from redis.asyncio import Redis
from redis.exceptions import ResponseError, WatchError
from rich.console import Console, Group, RenderableType
from rich.table import Table
from rich.text import Text

from bus import limits
from bus.breakglass import BreakGlass, switch
from bus.errors import HookBusError, InvalidInputError, ProtocolError
from bus.hooks import MODES
from bus.protocol import (
    DATA_FIELD,
    PROTOCOL_VERSION,
    AuditRecord,
    ControlMessage,
    EventMessage,
    HookManifest,
    RetiredHook,
    decode,
    encode,
    new_id,
    now_ms,
    retired_hook,
)
from bus.transport.clock import redis_ms
from bus.transport.coordinator import AUDIT_MAXLEN
from bus.transport.directory import read_manifests
from bus.transport.keys import MAX_SHARDS, WORKERS_GROUP, Keys, check_name, check_tenant
from bus.transport.redis_io import dead_letter_entry
from bus.transport.retention import hard_cap

_DATA = DATA_FIELD.encode()
_STREAM_ID = re.compile(r"^\d+(-\d+)?$")
CHUNK = 500
#: From this many entries on, ``dlq replay`` and ``dlq purge`` show a progress bar.
MANY = 500


def _text(value: Any) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    return "" if value is None else str(value)


def _id_ms(entry_id: str) -> int:
    return int(entry_id.partition("-")[0])


def _secs(ms: float) -> float:
    return max(0.0, ms / 1000)


# -- hooks ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class HookRow:
    """One hook of ``{p}:hooks`` with its replicas. ``problem`` is set for an unusable manifest."""

    name: str
    kind: str = "?"
    scope: str = ""
    events: tuple[str, ...] = ()  # empty: every event
    tool_names: tuple[str, ...] = ()
    tool_content: tuple[str, ...] = ()
    failure_policy: str = ""
    priority: int | None = None
    timeout: float | None = None
    live: int = 0  # replicas whose heartbeat is within liveness_secs
    replicas: int = 0  # replicas in the zset, live or not
    last_heartbeat_secs: float | None = None  # seconds since the freshest heartbeat
    problem: str = ""
    mode: str = ""  # the mode coordinators apply: the operator's override, else the manifest's
    mode_set_by_operator: bool = False  # `hookbus hooks mode` set it ({p}:modes)
    stopped_secs: float | None = None  # seconds since a replica last stopped cleanly

    @property
    def stopped(self) -> bool:
        """No live replica, and the last thing a replica did was stop cleanly."""
        if self.live or self.stopped_secs is None:
            return False
        return self.last_heartbeat_secs is None or self.stopped_secs <= self.last_heartbeat_secs


async def list_hooks(
    redis: Redis, keys: Keys, liveness_secs: float, now: int | None = None, *, modes: bool = True
) -> list[HookRow]:
    """Every hook in ``{p}:hooks``, by name; a malformed manifest is a row with ``problem``.
    ``modes=False``: do not read ``{p}:modes`` (a worker's health check may not), so every
    row shows its manifest's mode."""
    now = await redis_ms(redis) if now is None else now  # heartbeats are on Redis's clock
    manifests = await read_manifests(redis, keys)
    overrides: Any = await redis.hgetall(keys.modes) if modes else {}
    mode_of = {_text(k): _text(v) for k, v in overrides.items()}
    rows: list[HookRow] = []
    for raw_name, value in sorted(manifests.items()):
        name = _text(raw_name)
        live, total, last, stopped = await replica_summary(redis, keys, name, liveness_secs, now)
        tomb = retired_hook(value)
        if tomb is not None:
            by = f" by {tomb.by}" if tomb.by else ""
            problem = (
                f"removed{by} {_ago(_secs(now - tomb.at))} ago; coordinators ignore it "
                f"(hookbus hooks restore {name} to serve it again)"
            )
            row = HookRow(name, kind="removed", live=live, replicas=total, problem=problem)
            rows.append(dataclasses.replace(row, last_heartbeat_secs=last, stopped_secs=stopped))
            continue
        try:
            manifest = decode(value, HookManifest)
            if manifest.name != name:
                raise InvalidInputError(f"it names hook {manifest.name!r}")
            if manifest.protocol_version != PROTOCOL_VERSION:
                raise InvalidInputError(f"protocol version {manifest.protocol_version}")
            manifest.spec()  # checks the patterns
        except HookBusError as exc:
            problem = "malformed manifest: " + str(exc).removeprefix("malformed HookManifest: ")
            rows.append(
                HookRow(
                    name,
                    live=live,
                    replicas=total,
                    last_heartbeat_secs=last,
                    problem=problem,
                    stopped_secs=stopped,
                )
            )
            continue
        # As coordinators decide it (bus/transport/directory.py): an override that is no mode is
        # ignored.
        override = mode_of.get(name)
        by_operator = override in MODES
        rows.append(
            HookRow(
                name=name,
                kind=manifest.kind,
                scope=manifest.scope,
                events=tuple(e.value for e in manifest.events),
                tool_names=tuple(manifest.tool_names),
                tool_content=tuple(manifest.tool_content),
                failure_policy=manifest.failure_policy,
                priority=manifest.priority,
                timeout=manifest.timeout,
                live=live,
                replicas=total,
                last_heartbeat_secs=last,
                mode=override if by_operator and override else manifest.mode,
                mode_set_by_operator=by_operator,
                stopped_secs=stopped,
            )
        )
    return rows


async def replica_summary(
    redis: Redis, keys: Keys, name: str, liveness_secs: float, now: int
) -> tuple[int, int, float | None, float | None]:
    """Live replicas, replicas, seconds since the last heartbeat and since the last clean stop."""
    try:
        check_name("hook name", name)
    except HookBusError:
        return 0, 0, None, None
    beats: Any = await redis.zrange(keys.replicas(name), 0, -1, withscores=True)
    stopped = None
    scores = []
    for member, score in beats:
        if _text(member) == Keys.STOPPED_MEMBER:
            stopped = _secs(now + float(score))  # scored -(epoch ms of the stop)
        else:
            scores.append(float(score))
    if not scores:
        return 0, 0, None, stopped
    live = sum(1 for s in scores if now - s <= liveness_secs * 1000)
    return live, len(scores), _secs(now - max(scores)), stopped


@dataclass(frozen=True)
class Removal:
    """What ``hookbus hooks remove`` did."""

    kind: str  # "sync", "async", or "?" for a manifest that did not decode
    live: int  # replicas still live when it stopped waiting
    group_destroyed: bool  # an async hook's group on {p}:events is gone (retention moves on)


async def remove_hook(
    redis: Redis, keys: Keys, name: str, by: str, liveness_secs: float, wait_secs: float
) -> Removal:
    """Retire a hook for good, safely while its replicas run.

    Its manifest is replaced (one ``SET``) by a ``RetiredHook`` tombstone, which every
    coordinator ignores and which a replica's heartbeat (``SET … NX``) cannot overwrite; each
    replica sees it at its next heartbeat and stops, and a replica that starts refuses to serve
    the hook. Its mode override goes too. Once no replica is live (at most ``wait_secs``), an
    async hook's consumer group on every events partition is destroyed, so that retention no
    longer keeps events for it.
    """
    check_name("hook name", name)
    raw: Any = await redis.get(keys.manifest(name))
    if raw is None:
        raise InvalidInputError(f"no hook named {name!r} is registered (see hookbus hooks list)")
    if retired_hook(raw) is not None:
        raise InvalidInputError(f"hook {name!r} is removed already (see hookbus hooks list)")
    try:
        kind: str = decode(raw, HookManifest).kind
    except ProtocolError:
        kind = "?"  # a malformed manifest can be removed all the same
    tomb = RetiredHook(retired=name, at=now_ms(), by=by)
    await redis.set(keys.manifest(name), encode(tomb))
    await redis.hdel(keys.modes, name)
    await redis.publish(keys.control, encode(ControlMessage(type="manifest", name=name)))
    deadline = asyncio.get_running_loop().time() + wait_secs
    while True:
        live, _, _, _ = await replica_summary(redis, keys, name, liveness_secs, now_ms())
        if not live or asyncio.get_running_loop().time() > deadline:
            break
        await asyncio.sleep(0.1)
    destroyed = False
    if kind != "sync" and not live:
        for partition in keys.event_partitions:
            try:
                destroyed = bool(await redis.xgroup_destroy(partition, name)) or destroyed
            except ResponseError as exc:  # no such partition stream
                if "no such key" not in str(exc).lower():
                    raise
    return Removal(kind, live, destroyed)


async def restore_hook(redis: Redis, keys: Keys, name: str) -> None:
    """Undo ``remove_hook``: delete the tombstone, so that the hook's replicas may register."""
    check_name("hook name", name)
    raw: Any = await redis.get(keys.manifest(name))
    if retired_hook(raw) is None:
        raise InvalidInputError(f"hook {name!r} was not removed: nothing to restore")
    await redis.delete(keys.manifest(name))


# -- lag --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GroupLag:
    """One consumer group on one stream."""

    stream: str
    group: str
    lag: int | None  # entries not yet delivered to the group (None: Redis cannot tell)
    pending: int  # delivered, not acknowledged
    oldest_pending_secs: float | None  # age of the oldest pending entry, from its id
    consumers: int
    idle_secs: float | None  # how long the least idle consumer has been idle
    cap: int | None  # the stream's hard cap (entries beyond it are dropped), if any
    #: Entries the hard cap cut before the group handled them: counted (``{p}:hook:{name}:lost``),
    #: or cut and not yet counted (a gap before its next entry, or entries pending when cut).
    #: Not part of ``lag`` and ``pending``: those no longer exist.
    lost: int = 0

    @property
    def backlog(self) -> int:
        return (self.lag or 0) + self.pending

    @property
    def at_risk(self) -> bool:
        """Past half the hard cap: the group may lose entries it has not handled yet."""
        return self.cap is not None and self.backlog > self.cap // 2


async def consumer_lag(
    redis: Redis,
    keys: Keys,
    events_maxlen: int,
    requests_maxlen: int,
    now: int | None = None,
    audit_maxlen: int | None = None,
) -> list[GroupLag]:
    """Every group on each events partition, on the audit trail and on each sync hook's
    request streams. Async hooks' replay streams are listed too, but only while they hold a
    backlog or lost entries.
    """
    now = await redis_ms(redis) if now is None else now  # stream ids are on Redis's clock
    out: list[GroupLag] = []
    for partition in keys.event_partitions:
        out += await _stream_lag(redis, keys, partition, hard_cap(events_maxlen), now)
    audit_cap = AUDIT_MAXLEN if audit_maxlen is None else hard_cap(audit_maxlen)
    out.extend(await _stream_lag(redis, keys, keys.audit, audit_cap, now))
    manifests = await read_manifests(redis, keys)
    for raw_name, value in sorted(manifests.items()):
        name = _text(raw_name)
        try:
            check_name("hook name", name)
            kind = decode(value, HookManifest).kind
        except HookBusError:
            continue
        if kind == "sync":
            shards = min(max(1, decode(value, HookManifest).shards), MAX_SHARDS)
            for shard in range(shards):
                stream = keys.requests(name, shard, shards)
                rows = await _stream_lag(redis, keys, stream, requests_maxlen, now)
                out.extend(r for r in rows if r.group == WORKERS_GROUP)
        else:
            rows = await _stream_lag(redis, keys, keys.replay(name), None, now)
            out.extend(r for r in rows if r.backlog or r.lost)
    return out


def _stream_id(value: Any) -> tuple[int, int]:
    ms, _, seq = _text(value).partition("-")
    return int(ms), int(seq or 0)


async def _stream_lag(
    redis: Redis, keys: Keys, stream: str, cap: int | None, now: int
) -> list[GroupLag]:
    """The groups of one stream. What the hard cap cut is "lost", never lag or pending: the
    count a hook service recorded (bus/transport/retention.py), plus what it has not seen yet — the
    gap between a group's last delivered entry and the stream's first (Redis counts entries added
    and read), and pending entries older than the first."""
    try:
        groups: Any = await redis.xinfo_groups(stream)
        info: Any = await redis.xinfo_stream(stream)
    except ResponseError:  # no such stream
        return []
    length, added = int(info["length"]), int(info.get("entries-added") or 0)
    first = _stream_id(info["recorded-first-entry-id"]) if length else None
    last = _stream_id(info["last-generated-id"])
    out: list[GroupLag] = []
    for g in groups:
        name = _text(g["name"])
        pending = int(g["pending"])
        oldest: float | None = None
        cut_pending = 0
        if pending:
            summary: Any = await redis.xpending(stream, name)
            if summary.get("min"):
                oldest = _secs(now - _id_ms(_text(summary["min"])))
            if first is None:
                cut_pending = pending
            elif _stream_id(summary["min"]) < first:
                below = f"({first[0]}-{first[1]}"
                cut: Any = await redis.xpending_range(stream, name, "-", below, pending)
                cut_pending = len(cut)
        lag = None if g.get("lag") is None else int(g["lag"])
        gap = 0
        if lag is not None and g.get("entries-read") is not None:
            delivered = _stream_id(g["last-delivered-id"])
            if first is None or delivered < first:
                gap = max(0, added - int(g["entries-read"]) - length)
            elif delivered == last:
                gap = lag
        counted = 0
        if stream != keys.requests(name):  # a hook service's group: its recorded count
            with contextlib.suppress(HookBusError):
                counted = int(
                    await redis.hget(keys.lost(check_name("hook name", name)), stream) or 0
                )
        consumers: Any = await redis.xinfo_consumers(stream, name)
        idle = [int(c["idle"]) for c in consumers]
        out.append(
            GroupLag(
                stream=stream,
                group=name,
                lag=None if lag is None else lag - gap,
                pending=pending - cut_pending,
                oldest_pending_secs=oldest,
                consumers=len(consumers),
                idle_secs=_secs(min(idle)) if idle else None,
                cap=cap,
                lost=counted + gap + cut_pending,
            )
        )
    return out


# -- events tail ------------------------------------------------------------------------------


@dataclass(frozen=True)
class TailedEvent:
    """One entry of ``{p}:events`` as ``hookbus events tail`` shows it."""

    entry_id: str
    ts: int  # epoch ms
    event: str
    session_id: str
    tool: str
    context: dict[str, Any] = field(default_factory=dict)
    problem: str = ""  # set for an entry that is not a valid event message


def _tailed(entry_id: str, fields: Mapping[bytes, bytes] | None) -> TailedEvent:
    data = (fields or {}).get(_DATA)
    try:
        if data is None:
            raise InvalidInputError(f"entry has no {DATA_FIELD!r} field")
        message = decode(data, EventMessage)
        context = msgspec.json.decode(bytes(message.context))
        if not isinstance(context, dict):
            raise InvalidInputError("its context is not an object")
    except (HookBusError, msgspec.DecodeError) as exc:
        return TailedEvent(entry_id, _id_ms(entry_id), "?", "", "", problem=str(exc))
    return TailedEvent(
        entry_id=entry_id,
        ts=message.ts,
        event=message.event.value,
        session_id=message.session_id,
        tool=str(context.get("tool_name") or context.get("subagent_name") or ""),
        context=context,
    )


async def events_end(redis: Redis, keys: Keys) -> dict[str, str]:
    """The id of the newest event of each partition (``0-0`` if empty): tail from there."""
    ends: dict[str, str] = {}
    for partition in keys.event_partitions:
        last: Any = await redis.xrevrange(partition, count=1)
        ends[partition] = _text(last[0][0]) if last else "0-0"
    return ends


async def follow_events(
    redis: Redis, keys: Keys, after: dict[str, str], stop: asyncio.Event, *, block_ms: int = 500
) -> AsyncGenerator[TailedEvent, None]:
    """Events added after the ids ``after`` (per partition), as they arrive, until ``stop``.
    One partition blocks per read (each may be on another cluster node); the others are
    polled between, so no partition waits longer than ``block_ms``."""
    cursors = dict(after)
    partitions = list(keys.event_partitions)
    turn = 0
    while not stop.is_set():
        found = False
        for partition in partitions:
            response: Any = await redis.xread({partition: cursors[partition]}, count=CHUNK)
            for _, entries in response or ():
                for raw_id, fields in entries:
                    found = True
                    cursors[partition] = _text(raw_id)
                    yield _tailed(cursors[partition], fields)
        if not found:
            partition = partitions[turn % len(partitions)]
            turn += 1
            wait = max(20, block_ms // len(partitions))
            await redis.xread({partition: cursors[partition]}, count=1, block=wait)


def event_matches(
    event: TailedEvent, sessions: Collection[str] = (), events: Collection[str] = ()
) -> bool:
    """Whether the event passes the ``--session`` and ``--event`` filters (empty: any)."""
    if sessions and event.session_id not in sessions:
        return False
    return not events or event.event in events


# -- dead letters -----------------------------------------------------------------------------


@dataclass(frozen=True)
class DeadLetter:
    """One entry of ``{p}:dlq``: source, reason, data, ts (+ hook, entry_id, deliveries)."""

    id: str
    fields: dict[str, str]

    @property
    def ts(self) -> int:
        ts = self.fields.get("ts", "")
        return int(ts) if ts.isdigit() else _id_ms(self.id)

    @property
    def hook(self) -> str:
        return self.fields.get("hook", "")

    @property
    def source(self) -> str:
        return self.fields.get("source", "")

    @property
    def reason(self) -> str:
        return self.fields.get("reason", "")

    @property
    def deliveries(self) -> str:
        return self.fields.get("deliveries", "")

    @property
    def data(self) -> str:
        return self.fields.get("data", "")


def _letter(raw_id: Any, fields: Mapping[Any, Any] | None) -> DeadLetter:
    return DeadLetter(_text(raw_id), {_text(k): _text(v) for k, v in (fields or {}).items()})


def _is_of(fields: Mapping[Any, Any] | None, hook: str | None) -> bool:
    return hook is None or _text((fields or {}).get(b"hook", b"")) == hook


def check_stream_id(entry_id: str) -> str:
    if not _STREAM_ID.match(entry_id):
        raise InvalidInputError(f"{entry_id!r} is not a stream id (like 1700000000000-0)")
    return entry_id


async def list_dead_letters(
    redis: Redis, keys: Keys, hook: str | None = None, limit: int = 50
) -> tuple[list[DeadLetter], bool]:
    """The ``limit`` newest dead letters (of ``hook``, if given), oldest first; and whether
    there are more."""
    found: list[DeadLetter] = []
    cursor = "+"
    while len(found) <= limit:
        rows: Any = await redis.xrevrange(keys.dlq, max=cursor, min="-", count=CHUNK)
        if not rows:
            break
        found.extend(_letter(i, f) for i, f in rows if _is_of(f, hook))
        cursor = "(" + _text(rows[-1][0])
    return list(reversed(found[:limit])), len(found) > limit


async def get_dead_letter(redis: Redis, keys: Keys, entry_id: str) -> DeadLetter | None:
    rows: Any = await redis.xrange(keys.dlq, min=entry_id, max=entry_id, count=1)
    return _letter(*rows[0]) if rows else None


async def count_dead_letters(
    redis: Redis, keys: Keys, hook: str | None = None
) -> tuple[int, str | None]:
    """How many dead letters (of ``hook``, if given), and the id of the newest of them."""
    if hook is None:
        last: Any = await redis.xrevrange(keys.dlq, count=1)
        return int(await redis.xlen(keys.dlq)), _text(last[0][0]) if last else None
    total, newest, cursor = 0, None, "-"
    while True:
        rows: Any = await redis.xrange(keys.dlq, min=cursor, max="+", count=CHUNK)
        if not rows:
            return total, newest
        mine = [_text(i) for i, f in rows if _is_of(f, hook)]
        if mine:
            total, newest = total + len(mine), mine[-1]
        cursor = "(" + _text(rows[-1][0])


async def purge_dead_letters(
    redis: Redis,
    keys: Keys,
    hook: str | None = None,
    upto: str = "+",
    progress: Callable[[int], None] | None = None,
) -> int:
    """Delete the dead letters (of ``hook``, if given) up to the id ``upto``; how many."""
    total, cursor = 0, "-"
    while True:
        rows: Any = await redis.xrange(keys.dlq, min=cursor, max=upto, count=CHUNK)
        if not rows:
            return total
        mine = [i for i, f in rows if _is_of(f, hook)]
        if mine:
            total += int(await redis.xdel(keys.dlq, *mine))
            if progress:
                progress(len(mine))
        cursor = "(" + _text(rows[-1][0])


# -- tenants ----------------------------------------------------------------------------------


async def list_tenants(redis: Redis, keys: Keys) -> list[str]:
    """The tenants the coordinator service answers (``{p}:tenants``), by name."""
    return sorted(_text(m) for m in await redis.smembers(keys.tenants))


async def _record(
    redis: Redis, keys: Keys, kind: Literal["tenant", "repair"], mode: str, detail: str, by: str
) -> None:
    """An operator's change, in the audit trail."""
    record = AuditRecord(id=new_id(), ts=now_ms(), kind=kind, mode=mode, detail=detail, by=by)
    await redis.xadd(
        keys.audit, {DATA_FIELD: encode(record)}, maxlen=AUDIT_MAXLEN, approximate=True
    )


async def add_tenant(redis: Redis, keys: Keys, tenant: str, by: str) -> bool:
    """Have the coordinator service answer ``tenant``'s decisions stream (within
    ``TENANTS_REFRESH_SECS``); recorded in the audit trail. False if it already was."""
    check_tenant(tenant)
    added = bool(await redis.sadd(keys.tenants, tenant))
    if added:
        await _record(redis, keys, "tenant", "add", tenant, by)
    return added


async def remove_tenant(redis: Redis, keys: Keys, tenant: str, by: str) -> bool:
    """Stop answering ``tenant`` (its requests then go unanswered; its Redis user still exists
    until the ACL file is generated without it); recorded. False if it was not served."""
    check_tenant(tenant)
    removed = bool(await redis.srem(keys.tenants, tenant))
    if removed:
        await _record(redis, keys, "tenant", "remove", tenant, by)
    return removed


# -- repair -----------------------------------------------------------------------------------

#: An entry id this far beyond Redis's clock is poisoned (a stream id is Redis's clock in ms
#: when it took the entry, unless the writer chose it).
REPAIR_SLACK_MS = 60_000
_MAX_ID = (2**64 - 1, 2**64 - 1)


def _id(entry_id: str) -> tuple[int, int]:
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


def _id_text(entry_id: tuple[int, int]) -> str:
    return f"{entry_id[0]}-{entry_id[1]}"


def repairable(keys: Keys, stream: str) -> bool:
    """Whether ``stream`` is one of the bus's streams (the only ones ``repair`` touches)."""
    p = re.escape(keys.prefix)
    fixed = {*keys.event_partitions, *keys.decision_partitions, keys.dlq, keys.audit}
    patterns = (
        rf"{p}:t:\{{[A-Za-z0-9_\-]{{1,64}}\}}:decisions",
        rf"{p}:hook:\{{[A-Za-z0-9_.\-]{{1,128}}(#\d+)?\}}:(requests|replay)",
    )
    return stream in fixed or any(re.fullmatch(x, stream) for x in patterns)


@dataclass(frozen=True)
class Repair:
    """What ``repair_stream`` found and did to one stream."""

    stream: str
    last_id: str  # the stream's last generated id before
    limit_id: str  # ids beyond this were poisoned (Redis's clock + the slack)
    new_last_id: str = ""  # after ("" if the stream was not poisoned)
    removed: tuple[str, ...] = ()  # ids of the entries taken out (each dead-lettered first)
    groups_reset: tuple[tuple[str, str], ...] = ()  # (group, its last-delivered id before)

    @property
    def poisoned(self) -> bool:
        return bool(self.new_last_id)


async def repair_stream(
    redis: Redis,
    keys: Keys,
    stream: str,
    by: str,
    *,
    slack_ms: int = REPAIR_SLACK_MS,
    now_ms_: int | None = None,
) -> Repair:
    """Repair a stream poisoned with ids beyond Redis's clock (a writer that chose its ids: a
    maximal id makes every later ``XADD *`` fail; a future one puts every later entry there).

    Every entry with an id beyond Redis's clock + ``slack_ms`` is copied to ``{p}:dlq`` (reason
    "repair: …", its id and fields), then, in one MULTI/EXEC under WATCH (retried if the stream
    changes meanwhile): deleted (XDEL) and acknowledged in every group; the stream's last id set
    back (XSETID) to the newest id at or below the limit (entry, group position or deleted id);
    and every group whose position was beyond it moved back there (XGROUP SETID). Consumer
    groups and every other entry stay; later ``XADD *`` get ids on Redis's clock again. The
    repair is recorded in the audit trail. Nothing is done to a stream that is not poisoned.
    """
    if not repairable(keys, stream):
        raise InvalidInputError(
            f"{stream!r} is not one of the bus's streams (events, decisions, a tenant's "
            "decisions, a hook's requests or replay, the dead letters, the audit trail)"
        )
    now = await redis_ms(redis) if now_ms_ is None else now_ms_
    limit = (now + slack_ms, 2**64 - 1)
    lettered: set[str] = set()
    later: list[tuple[str, dict[str, str]]] = []  # the dead-letter stream's own, after the fix
    for _ in range(20):
        async with redis.pipeline(transaction=True) as pipe:
            await pipe.watch(stream)
            try:
                info: Any = await pipe.xinfo_stream(stream)
            except ResponseError as exc:
                raise InvalidInputError(f"no stream {stream}: {exc}") from exc
            last = _text(info["last-generated-id"])
            if _id(last) <= limit:
                await pipe.unwatch()
                return Repair(stream, last, _id_text(limit))
            future: list[tuple[str, dict[str, str]]] = []
            cursor = f"({_id_text(limit)}"
            while True:
                rows: Any = await pipe.xrange(stream, min=cursor, max="+", count=CHUNK)
                future += [(_text(i), {_text(k): _text(v) for k, v in f.items()}) for i, f in rows]
                if len(rows) < CHUNK or _id(future[-1][0]) == _MAX_ID:  # no id after the max
                    break
                cursor = "(" + future[-1][0]
            groups: Any = await pipe.xinfo_groups(stream)
            top: Any = await pipe.xrevrange(stream, max=_id_text(limit), min="-", count=1)
            known = [(0, 0)] + ([_id(_text(top[0][0]))] if top else [])
            deleted = _id(_text(info.get("max-deleted-entry-id") or "0-0"))
            known += [deleted] if deleted <= limit else []
            positions = {_text(g["name"]): _text(g["last-delivered-id"]) for g in groups}
            known += [_id(d) for d in positions.values() if _id(d) <= limit]
            new_last = max(known)
            beyond = [(g, d) for g, d in positions.items() if _id(d) > new_last]
            fresh = [(i, f) for i, f in future if i not in lettered]
            if stream == keys.dlq:
                later += fresh
            else:
                await _dead_letter_all(redis, keys, stream, fresh, now)
            lettered.update(i for i, _ in fresh)
            ids = [i for i, _ in future]
            pipe.multi()
            for start in range(0, len(ids), CHUNK):
                pipe.xdel(stream, *ids[start : start + CHUNK])
                for group in positions:
                    pipe.xack(stream, group, *ids[start : start + CHUNK])
            max_deleted = deleted if deleted <= new_last else new_last
            pipe.execute_command(
                "XSETID", stream, _id_text(new_last), "MAXDELETEDID", _id_text(max_deleted)
            )
            for group, _ in beyond:
                pipe.execute_command("XGROUP", "SETID", stream, group, _id_text(new_last))
            try:
                await pipe.execute()
            except WatchError:
                continue
        break
    else:
        raise HookBusError(f"{stream} kept changing: repair it again")
    await _dead_letter_all(redis, keys, stream, later, now)
    repair = Repair(stream, last, _id_text(limit), _id_text(new_last), tuple(ids), tuple(beyond))
    moved = ", ".join(f"group {g} from {d}" for g, d in beyond) or "no group"
    detail = (
        f"{stream}: last id {last} was beyond Redis's clock ({now} ms); {len(ids)} entries "
        f"dead-lettered and deleted, last id set back to {repair.new_last_id}, {moved} moved "
        "back there"
    )
    await _record(redis, keys, "repair", "stream", detail, by)
    return repair


async def _dead_letter_all(
    redis: Redis, keys: Keys, stream: str, entries: list[tuple[str, dict[str, str]]], now: int
) -> None:
    """Copy ``entries`` to the dead letters, in order (not through the WATCHing pipeline: the
    dead letters are another key, on another slot in a cluster)."""
    for start in range(0, len(entries), CHUNK):
        async with redis.pipeline(transaction=False) as pipe:
            for entry_id, fields in entries[start : start + CHUNK]:
                letter = _repair_letter(stream, entry_id, fields, now)
                pipe.xadd(keys.dlq, letter, maxlen=100_000, approximate=True)
            await pipe.execute()


def _repair_letter(stream: str, entry_id: str, fields: dict[str, str], now: int) -> dict[Any, Any]:
    data = fields.get(DATA_FIELD) if list(fields) == [DATA_FIELD] else json.dumps(fields)
    why = f"repair: its id {entry_id} was beyond Redis's clock ({now} ms)"
    return dead_letter_entry(stream, why, data or "", entry_id=entry_id)


# -- metrics ----------------------------------------------------------------------------------


# -- break-glass --------------------------------------------------------------------------------


async def _record_breakglass(
    redis: Redis, keys: Keys, glass: BreakGlass, mode: str, by: str
) -> None:
    """The audit record of a switch."""
    record = AuditRecord(
        id=new_id(),
        ts=now_ms(),
        kind="breakglass",
        mode=mode,
        detail=glass.reason,
        by=by,
        until_ms=glass.until_ms,
    )
    await redis.xadd(
        keys.audit, {DATA_FIELD: encode(record)}, maxlen=AUDIT_MAXLEN, approximate=True
    )


async def _announce_breakglass(redis: Redis, keys: Keys) -> None:
    """Make every coordinator re-read the switch now (they also do every refresh)."""
    await redis.publish(keys.control, encode(ControlMessage(type="breakglass")))


async def breakglass_on(
    redis: Redis, keys: Keys, reason: str, seconds: float, by: str
) -> BreakGlass:
    """Switch the bypass on for ``seconds`` (``{p}:breakglass`` with a TTL), recorded."""
    glass = switch(reason, seconds, by, await redis_ms(redis))  # coordinators use Redis's
    await _record_breakglass(redis, keys, glass, "on", by)  # recorded before it takes effect
    await redis.set(keys.breakglass, encode(glass), px=glass.until_ms - glass.since_ms)
    await _announce_breakglass(redis, keys)
    return glass


async def breakglass_off(redis: Redis, keys: Keys, by: str) -> BreakGlass | None:
    """Switch the bypass off (recorded); the bypass that was on, or None."""
    data = await redis.get(keys.breakglass)
    await redis.delete(keys.breakglass)
    await _announce_breakglass(redis, keys)
    if data is None:
        return None
    try:
        glass = decode(data, BreakGlass)
    except ProtocolError as exc:  # ignored by coordinators; cleared and recorded all the same
        now = now_ms()
        why = f"cleared a switch that held something else ({exc})"
        glass = BreakGlass(reason=why, by=by, since_ms=now, until_ms=now)
    await _record_breakglass(redis, keys, glass, "off", by)
    return glass


async def breakglass_status(redis: Redis, keys: Keys) -> BreakGlass | None:
    """The bypass that is on, or None; ProtocolError if the switch holds something else."""
    data = await redis.get(keys.breakglass)
    return None if data is None else decode(data, BreakGlass)


async def list_audit(redis: Redis, keys: Keys, limit: int) -> tuple[list[AuditRecord], int]:
    """The newest ``limit`` audit-trail records, oldest first, and how many entries did not
    decode (shown as a count: the audit log hook dead-letters them)."""
    raw: Any = await redis.xrevrange(keys.audit, count=limit)
    records: list[AuditRecord] = []
    broken = 0
    for _, fields in reversed(raw):
        try:
            records.append(decode((fields or {}).get(_DATA, b""), AuditRecord))
        except HookBusError:
            broken += 1
    return records, broken


async def collect_metrics(redis: Redis, keys: Keys) -> dict[str, dict[str, str]]:
    """Hook name → the figures in its ``{p}:hook:{NAME}:metrics`` hash, for every registered
    hook (no SCAN: on a cluster that would see one node only)."""
    names = sorted(_text(m) for m in await redis.smembers(keys.hooks))
    out: dict[str, dict[str, str]] = {}
    for name in names:
        try:
            figures: Any = await redis.hgetall(keys.metrics(name))
        except ResponseError:  # not a hash (WRONGTYPE): no figures of a metrics hook
            continue
        if figures:
            out[name] = {_text(k): _text(v) for k, v in figures.items()}
    return out


# -- rendering --------------------------------------------------------------------------------


def make_console(stderr: bool = False) -> Console:
    """A console; written to a pipe or file, tables are not squeezed into 80 columns."""
    console = Console(stderr=stderr)
    if not console.is_terminal and not os.environ.get("COLUMNS"):
        console = Console(stderr=stderr, width=200)
    return console


def _clock(ms: int, with_date: bool = True) -> str:
    moment = dt.datetime.fromtimestamp(ms / 1000).astimezone()
    text = moment.strftime("%Y-%m-%d %H:%M:%S.%f" if with_date else "%H:%M:%S.%f")
    return text[:-3]


def _ago(secs: float | None) -> str:
    if secs is None:
        return "-"
    return f"{secs:.1f}s" if secs < 100 else f"{secs:.0f}s"


def _short(text: str, width: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


def _table(title: str, *columns: str) -> Table:
    table = Table(title=title, title_justify="left", highlight=False)
    for column in columns:
        justify = "right" if column in _NUMERIC else "left"
        table.add_column(column, justify=justify, overflow="fold")  # type: ignore[arg-type]
    return table


_NUMERIC = {"priority", "timeout", "live", "last beat", "lag", "pending", "lost"}
_NUMERIC |= {"oldest pending"}
_NUMERIC |= {"consumers", "idle", "deliveries", "value"}


def _row(table: Table, *cells: object, style: str = "") -> None:
    table.add_row(*(Text(str(c)) for c in cells), style=style or None)


def render_hooks(rows: list[HookRow], keys: Keys, liveness_secs: float) -> RenderableType:
    if not rows:
        return Text(f"no hooks registered in {keys.hooks}")
    title = f"hooks in {keys.hooks} (live: heartbeat within {liveness_secs:g}s)"
    table = _table(
        title, "hook", "kind", "mode", "events", "match", "policy", "priority", "timeout",
        "live", "last beat",
    )  # fmt: skip
    if any(r.problem for r in rows):
        table.add_column("problem", overflow="fold")
    for r in rows:
        if r.stopped:
            last = f"stopped {_ago(r.stopped_secs)} ago"
        else:
            last = _ago(r.last_heartbeat_secs) if r.replicas else "never"
        live = f"{r.live} of {r.replicas}" if r.replicas != r.live else str(r.live)
        if r.problem:
            cells = (r.name, r.kind, "-", "-", "-", "-", "-", "-", live, last, r.problem)
            _row(table, *cells, style="red")
            continue
        match = [f"tool {p}" for p in r.tool_names] + [f"content {p}" for p in r.tool_content]
        cells: list[object] = [
            r.name,
            r.kind if r.scope != "session" else f"{r.kind} (session)",
            f"{r.mode} (operator)" if r.mode_set_by_operator else r.mode,
            ", ".join(r.events) or "all",
            "; ".join(match) or "any",
            r.failure_policy,
            r.priority,
            "default" if r.timeout is None else f"{r.timeout:g}s",
            live,
            last,
        ]
        if len(table.columns) > 10:
            cells.append("")
        _row(table, *cells, style="" if r.live else "yellow")
    return table


def render_lag(rows: list[GroupLag]) -> RenderableType:
    if not rows:
        return Text("no consumer groups yet (no async hook has joined the events stream)")
    table = _table(
        "consumer groups",
        "stream", "group", "lag", "pending", "lost", "oldest pending", "consumers", "idle",
        "note",
    )  # fmt: skip
    for r in rows:
        notes = []
        if r.lost:
            notes.append(f"LOST {r.lost}: cut by the stream cap before handled (see dlq list)")
        if r.at_risk:
            notes.append(f"AT RISK: backlog {r.backlog} past half the stream cap of {r.cap}")
        elif r.consumers == 0 and r.backlog:
            notes.append("no consumer")
        _row(
            table,
            r.stream,
            r.group,
            "?" if r.lag is None else r.lag,
            r.pending,
            r.lost,
            _ago(r.oldest_pending_secs),
            r.consumers,
            _ago(r.idle_secs),
            "; ".join(notes),
            style="red" if r.at_risk or r.lost else "",
        )
    return table


def render_event(event: TailedEvent, width: int = 100) -> Text:
    """One line: time, event, session, tool, short context."""
    when = _clock(event.ts, with_date=False)
    if event.problem:
        return Text(f"{when}  malformed entry {event.entry_id}: {event.problem}", style="red")
    rest = {k: v for k, v in event.context.items() if k not in ("session_id", "tool_name")}
    context = json.dumps(rest, ensure_ascii=False, separators=(",", ":")) if rest else ""
    line = Text(f"{when}  ")
    line.append(f"{event.event:<18}", style="bold")
    line.append(f"  {event.session_id or '-'}  {event.tool or '-'}  {_short(context, width)}")
    return line


def render_dead_letters(
    letters: list[DeadLetter], more: bool, keys: Keys, hook: str | None
) -> RenderableType:
    whose = f" of {hook}" if hook else ""
    if not letters:
        return Text(f"no dead letters{whose} in {keys.dlq}")
    table = _table(f"dead letters{whose} in {keys.dlq}", "id", "time", "hook/source")
    table.add_column("deliveries", justify="right")
    table.add_column("reason", overflow="ellipsis", no_wrap=True, max_width=80)
    for d in letters:
        _row(table, d.id, _clock(d.ts), d.hook or d.source, d.deliveries or "-", d.reason)
    if not more:
        return table
    note = Text(f"showing the {len(letters)} newest; raise --limit to see more")
    return Group(table, note)


def render_audit(records: list[AuditRecord], broken: int, keys: Keys) -> RenderableType:
    if not records and not broken:
        return Text(f"nothing in the audit trail {keys.audit}")
    table = _table(f"audit trail {keys.audit}", "time", "what", "hook / by", "event", "session")
    table.add_column("tool")
    table.add_column("detail", overflow="ellipsis", no_wrap=True, max_width=80)
    for r in records:
        if r.kind == "breakglass":
            what = f"break-glass {r.mode}"
            detail = r.detail + (f" (until {_clock(r.until_ms)})" if r.mode == "on" else "")
            _row(table, _clock(r.ts), what, r.by, "", "", "", detail, style="bold red")
            continue
        if r.kind in ("tenant", "repair"):
            what = "repair" if r.kind == "repair" else f"tenant {r.mode}"
            _row(table, _clock(r.ts), what, r.by, "", "", "", r.detail, style="bold")
            continue
        detail = r.detail + (f" [break-glass: {r.breakglass}]" if r.breakglass else "")
        event = r.event.value if r.event is not None else ""
        _row(table, _clock(r.ts), r.mode, r.hook, event, r.session_id, r.tool_name, detail)
    if not broken:
        return table
    return Group(table, Text(f"{broken} entries could not be read (not AuditRecords)"))


def render_dead_letter(letter: DeadLetter) -> RenderableType:
    table = Table(show_header=False, box=None, highlight=False)
    table.add_column(style="bold")
    table.add_column(overflow="fold")
    table.add_row("id", Text(letter.id))
    table.add_row("time", Text(_clock(letter.ts)))
    for name, value in letter.fields.items():
        if name != "data":
            table.add_row(name, Text(value))
    try:  # a dead letter is often what no decoder could take: bounded before it is parsed
        limits.check(letter.data.encode("utf-8", "surrogatepass"), "data")
        pretty = json.dumps(json.loads(letter.data), indent=2, ensure_ascii=False)
    except (ValueError, RecursionError):
        return Group(table, Text("data:", style="bold"), Text(letter.data))
    return Group(table, Text("data (JSON):", style="bold"), Text(pretty))


def render_metrics(metrics: dict[str, dict[str, str]]) -> RenderableType:
    if not metrics:
        return Text("no metrics collected yet")
    table = _table("metrics", "hook", "figure", "value")
    for hook, figures in metrics.items():
        for name, value in sorted(figures.items()):
            _row(table, hook, name, _number(value))
    return table


def _number(value: str) -> str:
    try:
        number = float(value)
    except ValueError:
        return value
    if number.is_integer() and "." not in value:
        return str(int(number))
    return f"{number:.3f}".rstrip("0").rstrip(".")
