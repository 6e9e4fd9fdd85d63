"""The coordinator's live view of registered hook services: manifests and live replicas.

Refreshed every ``refresh_secs`` from ``{p}:hooks`` (the names), each hook's manifest and replica
set, and at once
when a ``{p}:control`` announcement arrives. A hook whose manifest is malformed is left out,
logged and counted — it never breaks the view of the others. Liveness is judged on Redis's
clock (bus/transport/clock.py); a hook whose live replicas all report a clock offset beyond the
bound is listed in ``skewed``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import cast

import msgspec
from redis.asyncio import Redis

from bus.dispatch import Endpoint
from bus.errors import InvalidInputError
from bus.events import HookEvent
from bus.hooks import MODES, HookSpec
from bus.protocol import BreakGlass, HookManifest, decode, retired_hook
from bus.transport.clock import RedisClock, describe, is_skewed
from bus.transport.keys import MAX_SHARDS, Keys

log = logging.getLogger("hookbus.directory")


@dataclass(frozen=True, slots=True)
class RemoteTarget:
    """A hook service as a dispatch target."""

    spec: HookSpec
    order: tuple[int, int]
    endpoint: Endpoint = field(repr=False)
    manifest: HookManifest
    replicas: int


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


async def write_manifest(
    redis: Redis, keys: Keys, name: str, manifest: bytes, *, only_if_absent: bool = False
) -> bool:
    """Register a hook: its manifest under ``{p}:hook:{NAME}:manifest`` and its name in
    ``{p}:hooks``. ``only_if_absent``: keep a manifest already there (a heartbeat's re-announce
    never overwrites what a replica of a newer release wrote). True if the manifest was written."""
    async with redis.pipeline(transaction=False) as pipe:
        pipe.set(keys.manifest(name), manifest, nx=only_if_absent)
        pipe.sadd(keys.hooks, name)
        written, _ = await pipe.execute()
    return bool(written)


async def read_manifest(redis: Redis, keys: Keys, name: str) -> bytes | None:
    """One hook's manifest, or None if it is not registered."""
    return cast(bytes | None, await redis.get(keys.manifest(name)))


async def read_manifests(redis: Redis, keys: Keys) -> dict[str, bytes]:
    """Every registered hook's manifest by name (names without a manifest are left out)."""
    names = sorted(_text(m) for m in await redis.smembers(keys.hooks))
    async with redis.pipeline(transaction=False) as pipe:
        for name in names:
            pipe.get(keys.manifest(name))
        found = await pipe.execute()
    return {name: data for name, data in zip(names, found, strict=True) if data is not None}


def _all_skewed(live: list[bytes], clocks: dict[bytes, bytes]) -> int | None:
    """If every live replica reported an offset beyond the bound: the one nearest to 0.
    A replica that reported none (a client in another language) is not counted as skewed."""
    offsets = []
    for member in live:
        try:
            offsets.append(int(clocks[member]))
        except (KeyError, ValueError):
            return None
    if not offsets or not all(is_skewed(o) for o in offsets):
        return None
    return min(offsets, key=abs)


class HookDirectory:
    """Manifests and replica counts of every registered hook, indexed by event."""

    def __init__(
        self,
        redis: Redis,
        keys: Keys,
        liveness_secs: float,
        endpoint_for: Callable[[str], Endpoint],
        clock: RedisClock | None = None,
    ) -> None:
        self._redis = redis
        self.clock = clock or RedisClock()
        self._keys = keys
        self._liveness_ms = int(liveness_secs * 1000)
        self._endpoint_for = endpoint_for
        self.by_name: dict[str, RemoteTarget] = {}
        self.by_event: dict[HookEvent, list[RemoteTarget]] = {e: [] for e in HookEvent}
        self.async_hooks: dict[str, HookManifest] = {}
        self.malformed = 0
        self.breakglass: BreakGlass | None = None
        #: Hooks whose live replicas all report a clock beyond the bound → the offset (ms) of
        #: the one nearest to Redis's.
        self.skewed: dict[str, int] = {}
        #: True once the directory has been read from Redis: before, no hook is known, not
        #: even that there is none (bus/unread.py decides then).
        self.known = False

    def _read_breakglass(self, data: bytes | None) -> BreakGlass | None:
        if data is None:
            if self.breakglass is not None:
                log.warning("break-glass is off: hooks are enforced again")
            return None
        try:
            glass = decode(data, BreakGlass)
        except InvalidInputError as exc:  # a broken switch must not switch enforcement off
            log.error("ignoring a malformed %s: %s", self._keys.breakglass, exc)
            return None
        if self.breakglass != glass:
            log.warning(
                "break-glass is ON until %d (by %s): %s", glass.until_ms, glass.by, glass.reason
            )
        return glass

    async def refresh(self) -> None:
        """Re-read every manifest and count live replicas (two round trips)."""
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.smembers(self._keys.hooks)
            pipe.hgetall(self._keys.modes)
            pipe.get(self._keys.breakglass)
            members, overrides, glass = await pipe.execute()
        self.breakglass = self._read_breakglass(glass)
        modes = {_text(k): _text(v) for k, v in overrides.items()}
        names = sorted(_text(m) for m in members)
        now = self.clock.now_ms()
        # A heartbeat dated more than the liveness window ahead (a skewed clock, a member written
        # by hand) is not live either: it would count a replica no one runs.
        live_since, live_until = now - self._liveness_ms, now + self._liveness_ms
        async with self._redis.pipeline(transaction=False) as pipe:
            for name in names:
                pipe.get(self._keys.manifest(name))
                pipe.zrange(self._keys.replicas(name), live_since, live_until, byscore=True)
                pipe.hgetall(self._keys.clocks(name))
            replies = await pipe.execute()
        raw = {
            name: (data, live, clocks)
            for name, data, live, clocks in zip(
                names, replies[::3], replies[1::3], replies[2::3], strict=True
            )
            if data is not None
        }
        manifests: list[HookManifest] = []
        counts, skewed = [], {}
        for name, (data, live, clocks) in raw.items():
            if retired_hook(data) is not None:  # removed by an operator: not a hook any more
                continue
            try:
                manifest = decode(data, HookManifest)
                if manifest.name != name:
                    raise InvalidInputError(f"manifest of {name!r} names {manifest.name!r}")
                manifest.spec()  # validates its patterns
                mode = modes.get(manifest.name)
                if mode in MODES and mode != manifest.mode:
                    manifest = msgspec.structs.replace(manifest, mode=mode)
            except InvalidInputError as exc:
                self.malformed += 1
                log.warning("ignoring malformed manifest for hook %r: %s", name, exc)
                continue
            manifests.append(manifest)
            counts.append(len(live))
            offset = _all_skewed(live, clocks)
            if offset is not None:
                skewed[manifest.name] = offset
        self._note_skew(skewed)
        self._rebuild(manifests, counts)
        self.known = True

    def _note_skew(self, skewed: dict[str, int]) -> None:
        for name, offset in skewed.items():
            if name not in self.skewed:
                log.error(
                    "hook %s is skewed: every live replica's clock is beyond the bound, the "
                    "nearest %s Redis's; its failures are reported as skewed",
                    name,
                    describe(offset),
                )
        for name in self.skewed.keys() - skewed.keys():
            log.warning("hook %s is no longer skewed", name)
        self.skewed = skewed

    def _rebuild(self, manifests: list[HookManifest], counts: list[int]) -> None:
        by_name: dict[str, RemoteTarget] = {}
        async_hooks: dict[str, HookManifest] = {}
        for m, count in zip(manifests, counts, strict=True):
            if m.kind == "async":
                async_hooks[m.name] = m
                continue
            spec = m.spec()
            order = (spec.priority, m.registered_at)
            by_name[m.name] = RemoteTarget(spec, order, self._endpoint_for(m.name), m, int(count))
        by_event: dict[HookEvent, list[RemoteTarget]] = {e: [] for e in HookEvent}
        for target in sorted(by_name.values(), key=lambda t: (t.order, t.spec.name)):
            if target.manifest.scope != "global":
                continue
            for event in HookEvent:
                if target.spec.subscribes(event):
                    by_event[event].append(target)
        self.by_name, self.by_event, self.async_hooks = by_name, by_event, async_hooks

    def requests(self, name: str, session_id: str) -> str:
        """The request stream a session's requests to hook ``name`` go to: one of the hook's
        manifest's ``shards`` (:meth:`Keys.shard`), so that a session's requests stay in order
        in one."""
        target = self.by_name.get(name)
        shards = min(max(1, target.manifest.shards), MAX_SHARDS) if target is not None else 1
        return self._keys.requests(name, self._keys.shard(name, session_id, shards), shards)

    def live(self, name: str) -> bool:
        target = self.by_name.get(name)
        return target is not None and target.replicas > 0
