"""What ``hookbus worker … --check`` adds to "the hook has a live replica": the clocks.

A replica whose clock is off by more than the bound (``bus.transport.clock.MAX_SKEW_MS``,
docs/protocol.md 1.5) still corrects its deadlines by the offset it measures, but its host is not
keeping time; the check fails, with a line that says so, instead of calling it healthy. Two things
are compared with Redis's clock (``TIME``): this host's own clock (the probe runs where the worker
runs: same host, same clock), and the offsets the live replicas publish with their heartbeats
(``{p}:hook:{name}:clocks``; with ``--here``, those on this host only).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

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

Status = tuple[bool, str]
BOUND = f"the {MAX_SKEW_MS / 1000:g} s bound (docs/protocol.md 1.5)"


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
    from workers.cli.check import on_host  # imported lazily: workers.cli imports this module

    live_since = local_ms() - offset_ms - int(settings.liveness_secs * 1000)
    live: Any = await redis.zrange(keys.replicas(hook), live_since, "+inf", byscore=True)
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
