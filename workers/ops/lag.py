"""How far each consumer group is behind, and what the hard cap cut (``hookbus lag``)."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import ResponseError

from bus.errors import HookBusError
from bus.protocol import HookManifest, decode
from bus.transport.clock import redis_ms
from bus.transport.coordinator import AUDIT_MAXLEN
from bus.transport.directory import read_manifests
from bus.transport.keys import MAX_SHARDS, WORKERS_GROUP, Keys, check_name
from bus.transport.retention import hard_cap
from workers.ops.common import _id_ms, _secs, _text


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
            # XPENDING answers after XINFO GROUPS: what it counts is the newer figure (entries
            # may have been acknowledged in between: then no min, and 0 pending).
            pending = int(summary.get("pending") or 0)
        if pending:
            oldest = _secs(now - _id_ms(_text(summary["min"])))
            if first is None:
                cut_pending = pending
            elif _stream_id(summary["min"]) < first:
                below = f"({first[0]}-{first[1]}"
                cut: Any = await redis.xpending_range(stream, name, "-", below, pending)
                cut_pending = len(cut)
        lag = None if g.get("lag") is None else int(g["lag"])
        gap = 0
        # As the hook services count it (bus/transport/retention.py): entries the group has yet
        # to read can be gone only while its last delivered entry is gone from the stream. A
        # failover or a restart from the AOF leaves a counter short (a replica keeps a group's
        # last-delivered-id, not its entries-read): no loss, and no more lag than is left.
        delivered = _stream_id(g["last-delivered-id"])
        if delivered == last:
            lag = 0
        elif lag is not None and g.get("entries-read") is not None:
            if first is None or delivered < first:
                gap = max(0, added - int(g["entries-read"]) - length)
            else:
                lag = min(lag, length)
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
