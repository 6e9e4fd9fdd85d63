"""Health checks for containers: ``hookbus check``, ``worker MODULE:CLASS --check`` and
``coordinator --check``. One line and an exit code: 0 healthy, 1 not, 2 bad usage."""

from __future__ import annotations

import argparse
import asyncio
import socket
import sys
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisClusterException, RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from bus.errors import ConfigError
from bus.settings import BusSettings, redacted
from workers.cli.common import (
    add_redis_options,
    hook_config,
    settings_of,
)
from workers.ops.health import clock_checked, coordinator_status, hook_status

if TYPE_CHECKING:
    from redis.asyncio import Redis

    from bus.transport.keys import Keys

#: A check that gets no answer within this many seconds fails (probes allow a few more).
CHECK_TIMEOUT_SECS = 3.0
Probe = Callable[["Redis", "Keys", BusSettings], Awaitable[tuple[bool, str]]]


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
    except (RedisConnectionError, RedisTimeoutError, RedisClusterException, OSError) as exc:
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
