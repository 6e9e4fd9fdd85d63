"""Health checks for containers: ``hookbus check``, ``worker MODULE:CLASS --check`` and
``coordinator --check``. One line and an exit code: 0 healthy, 1 not, 2 bad usage."""

from __future__ import annotations

import argparse
import asyncio
import re
import socket
import sys
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from bus.errors import ConfigError
from bus.settings import BusSettings
from workers.cli.common import (
    add_redis_options,
    hook_config,
    plural,
    redacted,
    settings_of,
    text,
)

if TYPE_CHECKING:
    from redis.asyncio import Redis

    from bus.transport.keys import Keys

#: A check that gets no answer within this many seconds fails (probes allow a few more).
CHECK_TIMEOUT_SECS = 3.0
Probe = Callable[["Redis", "Keys", BusSettings], Awaitable[tuple[bool, str]]]


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
    from workers.ops.operator import replica_summary

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
        ages = [now - float(s) for m, s in beats if on_host(text(m), host)]
        live, total = sum(1 for a in ages if a <= live_ms), len(ages)
        last = max(0.0, min(ages) / 1000) if ages else None
    where = f" on {host}" if host is not None else ""
    if live:
        return True, f"hook {hook}: {live} live replica{plural(live)}{where} (of {total})"
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
    ages = [now - float(s) for m, s in beats if host is None or on_host(text(m), host)]
    live = sum(1 for a in ages if a <= live_ms)
    where = f" on {host}" if host is not None else ""
    if live:
        return True, f"coordinator: {live} live replica{plural(live)}{where} (of {len(ages)})"
    if not ages:
        return False, f"no coordinator{where} has a heartbeat in {keys.coordinators}"
    return False, (
        f"no live coordinator{where}: last heartbeat {max(0.0, min(ages)) / 1000:.1f}s ago "
        f"(live means within {settings.liveness_secs:g}s)"
    )


async def ping(redis: Redis, keys: Keys, settings: BusSettings) -> tuple[bool, str]:
    await redis.ping()
    return True, f"Redis at {redacted(settings.redis_url)} answers"


def run_check(args: argparse.Namespace, probe: Probe) -> int:
    """One line and an exit code: 0 healthy, 1 not (or Redis did not answer), 2 bad usage."""
    from bus.transport.keys import Keys
    from bus.transport.redis_io import connect

    settings = settings_of(args)
    url = redacted(settings.redis_url)

    async def run() -> tuple[bool, str]:
        redis = connect(settings)
        try:
            return await asyncio.wait_for(
                probe(redis, Keys.of(settings), settings), CHECK_TIMEOUT_SECS
            )
        finally:
            await redis.aclose()

    try:
        ok, message = asyncio.run(run())
    except TimeoutError:
        ok, message = False, f"no answer from Redis at {url} within {CHECK_TIMEOUT_SECS:g}s"
    except (RedisConnectionError, RedisTimeoutError, OSError) as exc:
        ok, message = False, f"cannot reach Redis at {url}: {exc}"
    except RedisError as exc:
        ok, message = False, f"Redis at {url} refused the check: {exc}"
    if ok:
        print(f"ok: {message}")
        return 0
    print(f"hookbus: {message}", file=sys.stderr)
    return 1


def worker_check(args: argparse.Namespace) -> int:
    from bus.hooks import spec_of
    from workers.services.loading import load_hook

    try:
        name = spec_of(load_hook(args.hook, app_dir=args.app_dir, config=hook_config(args))).name
    except ConfigError as exc:  # a check says it in one line (the hint's lines joined)
        raise ConfigError(" ".join(line.strip() for line in str(exc).splitlines())) from exc
    host = socket.gethostname() if args.here else None

    async def probe(redis: Redis, keys: Keys, settings: BusSettings) -> tuple[bool, str]:
        from workers.ops.health import clock_checked  # and the clocks: workers/ops/health.py

        return await clock_checked(hook_status, redis, keys, settings, name, host)

    return run_check(args, probe)


def coordinator_check(args: argparse.Namespace) -> int:
    host = socket.gethostname() if args.here else None

    async def probe(redis: Redis, keys: Keys, settings: BusSettings) -> tuple[bool, str]:
        return await coordinator_status(redis, keys, settings, host)

    return run_check(args, probe)


def _check(args: argparse.Namespace) -> int:
    return run_check(args, ping)


def add_check_options(p: argparse.ArgumentParser, healthy: str, here: bool = True) -> None:
    p.add_argument(
        "--check",
        action="store_true",
        help=f"health check, do not serve: exit 0 if {healthy}, else 1, with one line",
    )
    if here:
        p.add_argument(
            "--here",
            action="store_true",
            help="with --check: count only replicas whose id names this host (this container "
            "or pod)",
        )


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    check = add_redis_options(
        sub.add_parser("check", help="health check: exit 0 if Redis answers (PING), else 1")
    )
    check.set_defaults(func=_check)
