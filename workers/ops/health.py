"""Whether a hook or a coordinator is up, as ``hookbus check``, ``worker … --check`` and
``hookbus up`` ask: a live replica (on this host, with ``--here``), and its clocks.

A replica whose clock is off by more than the bound (``bus.transport.clock.MAX_SKEW_MS``,
docs/protocol.md 1.5) still corrects its deadlines by the offset it measures, but its host is not
keeping time; the check fails, with a line that says so, instead of calling it healthy. Two things
are compared with Redis's clock (``TIME``): this host's own clock (the probe runs where the worker
runs: same host, same clock), and the offsets the live replicas publish with their heartbeats
(``{p}:hook:{name}:clocks``; with ``--here``, those on this host only).
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from redis.exceptions import ResponseError

from bus.settings import BusSettings
from bus.transport.clock import (
    MAX_SKEW_MS,
    START_SAMPLES,
    describe,
    is_skewed,
    local_ms,
    offset_from,
)
from bus.transport.keys import Keys
from workers.ops.common import _text
from workers.ops.hooks import replica_summary

if TYPE_CHECKING:
    from redis.asyncio import Redis

Status = tuple[bool, str]
BOUND = f"the {MAX_SKEW_MS / 1000:g} s bound (docs/protocol.md 1.5)"


def _plural(n: int) -> str:
    return "" if n == 1 else "s"


async def clock_checked(
    status: Callable[[Any, Keys, BusSettings, str, str | None], Awaitable[Status]],
    redis: Any,
    keys: Keys,
    settings: BusSettings,
    hook: str,
    host: str | None = None,
) -> Status:
    """``status(redis, keys, settings, hook, host)`` (the replica check), failed first if this
    host's clock, or a live replica's (on ``host`` only, if given), is further than the bound
    from Redis's."""
    try:
        offset, _ = await offset_from(redis, START_SAMPLES)
    except ResponseError as exc:
        return False, (
            f"cannot compare this host's clock with Redis's (TIME refused: {exc}); allow +time "
            "for this Redis user (deploy/redis/users.acl)"
        )
    if is_skewed(offset):
        return False, (
            f"this host's clock is {describe(offset)} Redis's, beyond {BOUND}: hook {hook}'s "
            "deadlines are corrected, but keep this host's clock in sync (NTP)"
        )
    ok, line = await status(redis, keys, settings, hook, host)
    if not ok:
        return ok, line
    skewed = await skewed_replicas(redis, keys, settings, hook, offset, host)
    if skewed:
        listed = ", ".join(f"{replica} {describe(o)} Redis's" for replica, o in skewed[:5])
        return False, (
            f"hook {hook}: {len(skewed)} live "
            f"{'replica reports' if len(skewed) == 1 else 'replicas report'} a clock beyond "
            f"{BOUND}: {listed}"
        )
    return ok, line


async def skewed_replicas(
    redis: Any,
    keys: Keys,
    settings: BusSettings,
    hook: str,
    offset_ms: int,
    host: str | None = None,
) -> list[tuple[str, int]]:
    """Live replicas of ``hook`` (on ``host`` only, if given) whose published clock offset is
    beyond the bound, with that offset. ``offset_ms`` is this host's own, to judge liveness on
    Redis's clock."""

    window = int(settings.liveness_secs * 1000)
    now = local_ms() - offset_ms  # Redis's clock; a heartbeat dated ahead is not live either
    live: Any = await redis.zrange(keys.replicas(hook), now - window, now + window, byscore=True)
    clocks: Any = await redis.hgetall(keys.clocks(hook))
    skewed = []
    for member in live:
        name = member.decode("utf-8", "replace") if isinstance(member, bytes) else str(member)
        if host is not None and not on_host(name, host):
            continue
        try:
            offset = int(clocks[member])
        except (KeyError, ValueError):
            continue
        if is_skewed(offset):
            skewed.append((name, offset))
    return skewed


def on_host(member: str, host: str) -> bool:
    """Whether a replica or coordinator id (``HOST-PID-RANDOM``, workers/services/worker.py and
    bus/transport/coordinator.py) names a process on ``host``."""
    if not member.startswith(host + "-"):
        return False
    return re.fullmatch(r"\d+-[0-9a-f]+", member[len(host) + 1 :]) is not None


async def hook_status(
    redis: Redis, keys: Keys, settings: BusSettings, hook: str, host: str | None = None
) -> tuple[bool, str]:
    """Whether ``hook`` has a live replica (on ``host`` only, if given), and a line saying so."""
    from bus.protocol import now_ms
    from bus.transport.clock import redis_ms

    # Only this hook's own keys: a hook service's Redis user reaches no other hook's
    # (workers/ops/acl.py), and needs none to tell whether it is up.
    async with redis.pipeline(transaction=False) as pipe:
        pipe.sismember(keys.hooks, hook)
        pipe.get(keys.manifest(hook))
        registered, manifest = await pipe.execute()
    if not registered or not manifest:
        return False, f"hook {hook} is not registered in {keys.hooks}"
    live_ms = settings.liveness_secs * 1000
    if host is None:
        now = await redis_ms(redis)
        live, total, last, _ = await replica_summary(redis, keys, hook, settings.liveness_secs, now)
    else:
        beats: Any = await redis.zrange(keys.replicas(hook), 0, -1, withscores=True)
        now = now_ms()
        ages = [now - float(s) for m, s in beats if on_host(_text(m), host)]
        live, total = sum(1 for a in ages if a <= live_ms), len(ages)
        last = max(0.0, min(ages) / 1000) if ages else None
    where = f" on {host}" if host is not None else ""
    if live:
        return True, f"hook {hook}: {live} live replica{_plural(live)}{where} (of {total})"
    if last is None:
        return False, f"hook {hook} has no replica{where} in {keys.replicas(hook)}"
    return False, (
        f"hook {hook} has no live replica{where}: last heartbeat {last:.1f}s ago "
        f"(live means within {settings.liveness_secs:g}s)"
    )


async def coordinator_status(
    redis: Redis, keys: Keys, settings: BusSettings, host: str | None = None
) -> tuple[bool, str]:
    """Whether a coordinator service replica (on ``host`` only, if given) is live: its heartbeat
    in ``{p}:coordinators`` is within ``liveness_secs``; and a line saying so."""
    from bus.protocol import now_ms

    beats: Any = await redis.zrange(keys.coordinators, 0, -1, withscores=True)
    now, live_ms = now_ms(), settings.liveness_secs * 1000
    ages = [now - float(s) for m, s in beats if host is None or on_host(_text(m), host)]
    live = sum(1 for a in ages if a <= live_ms)
    where = f" on {host}" if host is not None else ""
    if live:
        return True, f"coordinator: {live} live replica{_plural(live)}{where} (of {len(ages)})"
    if not ages:
        return False, f"no coordinator{where} has a heartbeat in {keys.coordinators}"
    return False, (
        f"no live coordinator{where}: last heartbeat {max(0.0, min(ages)) / 1000:.1f}s ago "
        f"(live means within {settings.liveness_secs:g}s)"
    )
