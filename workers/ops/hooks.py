"""The registered hooks as an operator sees them (``hookbus hooks list``), and retiring and
restoring one (``hookbus hooks remove`` / ``restore``)."""

from __future__ import annotations

import asyncio
import dataclasses
from dataclasses import dataclass
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import ResponseError

from bus.errors import HookBusError, InvalidInputError, ProtocolError
from bus.hooks import MODES
from bus.logfmt import one_line
from bus.protocol import (
    PROTOCOL_VERSION,
    ControlMessage,
    HookManifest,
    RetiredHook,
    decode,
    encode,
    now_ms,
    retired_hook,
)
from bus.transport.clock import redis_ms
from bus.transport.directory import read_manifests
from bus.transport.keys import Keys, check_name
from workers.ops.common import _ago, _secs, _text


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
    live: int = 0  # replica processes whose heartbeat is within liveness_secs
    replicas: int = 0  # replica processes in the zset, live or not
    live_lanes: int = 0  # of the live processes' lanes (``--shards S``: S lanes a process)
    lanes: int = 0  # lanes in the zset, live or not (one member each)
    last_heartbeat_secs: float | None = None  # seconds since the freshest heartbeat
    problem: str = ""
    mode: str = ""  # the mode coordinators apply: the operator's override, else the manifest's
    mode_set_by_operator: bool = False  # `hookbus hooks mode` set it ({p}:modes)
    stopped_secs: float | None = None  # seconds since a replica last stopped cleanly
    shards: int = 1  # a sync hook's request streams (its manifest's ``shards``)
    #: What its live replicas say is wrong with the hook itself (its ``problem()``, published
    #: with their heartbeats: ``Keys.problems``), each different message once; "" when well.
    health: str = ""

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
        counts = await replica_counts(redis, keys, name, liveness_secs, now)
        live, total, last, stopped = counts.summary
        lanes = {"live_lanes": counts.live_lanes, "lanes": counts.lanes}
        tomb = retired_hook(value)
        if tomb is not None:
            by = f" by {tomb.by}" if tomb.by else ""
            problem = (
                f"removed{by} {_ago(_secs(now - tomb.at))} ago; coordinators ignore it "
                f"(hookbus hooks restore {name} to serve it again)"
            )
            row = HookRow(name, kind="removed", live=live, replicas=total, problem=problem, **lanes)
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
                    **lanes,
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
                **lanes,
                shards=max(1, manifest.shards),
                health=await live_problems(redis, keys, name, counts.live_members),
            )
        )
    return rows


async def bus_partitions(redis: Redis, keys: Keys) -> int | None:
    """The bus's partition count (``{p}:config`` ``partitions``), None if not written yet."""
    value: Any = await redis.hget(keys.config, "partitions")  # type: ignore[misc]
    return int(value) if value is not None and _text(value).isdigit() else None


def partitions_note(keys: Keys, bus: int | None) -> str:
    """One line: the bus's partition count, and a warning if this command's differs."""
    if bus is None:
        return f"partitions: {keys.partitions} (not yet in {keys.config}: no process started)"
    if bus != keys.partitions:
        return (
            f"WARNING: the bus has {bus} partitions ({keys.config}) but this command was given "
            f"HOOKBUS_PARTITIONS={keys.partitions}: set it to {bus} to see every partition"
        )
    return f"partitions: {bus} ({keys.config})"


@dataclass(frozen=True)
class ReplicaCounts:
    """A hook's replicas: processes, and their lanes (a sync worker started with ``--shards S``
    serves S request shards, one lane each, each with its own heartbeat member
    ``host-pid-xxxx#k``); times in seconds."""

    live: int = 0  # processes with a live lane
    processes: int = 0
    live_lanes: int = 0
    lanes: int = 0
    last_heartbeat_secs: float | None = None
    stopped_secs: float | None = None
    live_members: tuple[str, ...] = ()  # the heartbeat members of the live lanes

    @property
    def summary(self) -> tuple[int, int, float | None, float | None]:
        return self.live, self.processes, self.last_heartbeat_secs, self.stopped_secs


def process_of(member: str) -> str:
    """The process a heartbeat member belongs to: a lane's member ``host-pid-xxxx#k`` (a fresh
    ``xxxx`` per lane) is ``host-pid``; any other member is a process of its own."""
    if "#" not in member:
        return member
    return member.rsplit("#", 1)[0].rsplit("-", 1)[0]


async def replica_counts(
    redis: Redis, keys: Keys, name: str, liveness_secs: float, now: int
) -> ReplicaCounts:
    """A hook's replica processes and lanes, live and in all, and the last heartbeat and clean
    stop."""
    try:
        check_name("hook name", name)
    except HookBusError:
        return ReplicaCounts()
    beats: Any = await redis.zrange(keys.replicas(name), 0, -1, withscores=True)
    stopped = None
    scores: dict[str, float] = {}
    for raw, score in beats:
        member = _text(raw)
        if member == Keys.STOPPED_MEMBER:
            stopped = _secs(now + float(score))  # scored -(epoch ms of the stop)
        else:
            scores[member] = float(score)
    if not scores:
        return ReplicaCounts(stopped_secs=stopped)
    # Not in the future either (by more than the window): such a heartbeat is no live replica.
    live = [m for m, s in scores.items() if abs(now - s) <= liveness_secs * 1000]
    return ReplicaCounts(
        live=len({process_of(m) for m in live}),
        processes=len({process_of(m) for m in scores}),
        live_lanes=len(live),
        lanes=len(scores),
        last_heartbeat_secs=_secs(now - max(scores.values())),
        stopped_secs=stopped,
        live_members=tuple(sorted(live)),
    )


async def live_problems(redis: Redis, keys: Keys, name: str, members: tuple[str, ...]) -> str:
    """What the live replicas ``members`` of hook ``name`` say is wrong with it, each different
    message once ("" when none says anything)."""
    if not members:
        return ""
    said: Any = await redis.hgetall(keys.problems(name))  # the operator's ACL user has no HMGET
    # Written by the hook's own Redis user: shown escaped (no terminal escape sequence reaches
    # the operator's screen), each cut to PROBLEM_CHARS, at most PROBLEMS_SHOWN of them.
    texts = sorted({_shown(_text(v)) for k, v in said.items() if _text(k) in members})
    more = len(texts) - PROBLEMS_SHOWN
    return "; ".join(texts[:PROBLEMS_SHOWN]) + (f"; and {more} more" if more > 0 else "")


#: How much of one replica's problem ``hooks list`` shows, and how many different ones.
PROBLEM_CHARS = 500
PROBLEMS_SHOWN = 5


def _shown(text: str) -> str:
    text = one_line(text)
    return text if len(text) <= PROBLEM_CHARS else text[: PROBLEM_CHARS - 1] + "…"


async def replica_summary(
    redis: Redis, keys: Keys, name: str, liveness_secs: float, now: int
) -> tuple[int, int, float | None, float | None]:
    """Live replica processes, replica processes, seconds since the last heartbeat and since
    the last clean stop."""
    return (await replica_counts(redis, keys, name, liveness_secs, now)).summary


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
