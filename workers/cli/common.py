"""What every ``hookbus`` command shares: settings from the options, one Redis client per
command (and one line on stderr naming that Redis), serving until a signal, one-line errors,
and the Redis URL without its password."""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import re
import signal
import sys
import urllib.parse
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, TypeVar

from bus.errors import HookBusError
from bus.settings import BusSettings, redacted

if TYPE_CHECKING:
    from redis.asyncio import Redis

    from bus.transport.keys import Keys
    from workers.services.probes import Health

T = TypeVar("T")


def settings_of(args: argparse.Namespace) -> BusSettings:
    """The bus settings: the environment, overridden by ``--redis`` and ``--prefix``."""
    settings = BusSettings.from_env(redis_url=getattr(args, "redis", None))
    if getattr(args, "prefix", None):
        import msgspec

        settings = msgspec.structs.replace(settings, prefix=args.prefix)
    return settings


def serve(
    main: Callable[[asyncio.Event], Awaitable[None]],
    role: str,
    health: Health | None = None,
    health_port: int = 0,
) -> int:
    """Run a service until SIGTERM or Ctrl-C, then let it shut down cleanly; with a
    ``health_port``, answer ``/livez`` and ``/readyz`` from ``health`` there meanwhile."""
    from bus.telemetry import tracing as telemetry

    telemetry.configure(role)
    freeze_start_up_heap()

    async def runner() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        probes = None
        if health is not None and health_port:
            from workers.services.probes import start_probes

            try:
                probes = await start_probes(health, health_port)
            except OSError as exc:
                raise UsageError(f"HOOKBUS_HEALTH_PORT={health_port}: {exc.strerror}") from exc
        try:
            await main(stop)
        finally:
            if probes is not None:
                probes.close()

    try:
        asyncio.run(runner())
    finally:
        telemetry.shutdown()  # flush the last spans
    return 0


def freeze_start_up_heap() -> None:
    """Move what start-up made (modules, the hook, settings: it lives as long as the process)
    out of the garbage collector's reach. Why: a full collection walks every object it tracks;
    a service answering many agents keeps enough requests in flight that some survive into the
    oldest generation, and then a full collection over the whole heap stalls every request for
    tens of milliseconds (measured in a process of 32 clients: 33 ms; after ``gc.freeze()``,
    under 2 ms: docs/performance.md, "Garbage collection")."""
    gc.collect()
    gc.freeze()


#: How long an operator command keeps retrying while Redis cannot be reached (a failover's
#: promotion, a seed node down, a restart) before it gives up with one line
#: (``HOOKBUS_RETRY_SECS``).
DEFAULT_RETRY_SECS = 15.0


def retry_secs() -> float:
    value = os.environ.get("HOOKBUS_RETRY_SECS", "")
    try:
        return max(0.0, float(value)) if value else DEFAULT_RETRY_SECS
    except ValueError:
        raise UsageError(f"HOOKBUS_RETRY_SECS={value!r} is not a number of seconds") from None


def with_redis(
    args: argparse.Namespace,
    work: Callable[[Redis, Keys, BusSettings], Awaitable[T]],
    *,
    reads_only: bool = False,
) -> T:
    """Run ``work`` with a client on the bus's Redis, closed afterwards. While Redis cannot be
    reached (a failover, a seed node down, a restart) the client retries its first command
    for up to ``HOOKBUS_RETRY_SECS`` (15 s); ``reads_only`` work, which may run twice, is
    retried as a whole too. Giving up is one line (workers/cli/__init__.py)."""
    from bus.transport.keys import Keys
    from bus.transport.redis_io import close, connect, until_reachable

    settings = settings_of(args)
    announce_redis(args, settings)

    async def run() -> T:
        deadline = asyncio.get_running_loop().time() + retry_secs()

        async def attempt(check: bool) -> T:
            redis = connect(settings)
            try:
                if check:
                    await until_reachable(redis.ping, deadline)
                return await work(redis, Keys.of(settings), settings)
            finally:
                await close(redis)

        if reads_only:
            return await until_reachable(lambda: attempt(False), deadline)
        return await attempt(True)

    return asyncio.run(run())


def add_redis_options(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    p.add_argument("--redis", metavar="URL", help="Redis URL (default: $HOOKBUS_REDIS_URL)")
    p.add_argument("--prefix", help="key prefix (default: $HOOKBUS_PREFIX or hookbus)")
    return p


def text(value: object) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def plural(n: int) -> str:
    return "" if n == 1 else "s"


def duration(value: str) -> float:
    """Seconds from ``90``, ``90s``, ``15m`` or ``2h``."""
    match = re.fullmatch(r"(\d+(?:\.\d+)?)([smh]?)", value.strip())
    if match is None:
        raise argparse.ArgumentTypeError(f"{value!r} is not a duration like 900, 900s, 15m or 2h")
    return float(match[1]) * {"": 1, "s": 1, "m": 60, "h": 3600}[match[2]]


class UsageError(HookBusError):
    """A bad option value (reported as one line, like every HookBusError)."""


def describe_redis(url: str) -> str:
    """Where ``url`` leads, for people: host and port (or socket), db, user; never a password.
    ``Redis at 127.0.0.1:6379 db 0, user default``; ``Redis at h:6380 (TLS) db 2, user
    operator with a password``; ``the Redis Cluster seeded by h:7000, user default``."""
    parts = urllib.parse.urlsplit(url)
    query = urllib.parse.parse_qs(parts.query)
    user = urllib.parse.unquote(parts.username or "") or query.get("username", [""])[0]
    secret = parts.password is not None or "password" in query
    who = f"user {user or 'default'}" + (" with a password" if secret else "")
    if parts.scheme == "unix":
        db = query.get("db", ["0"])[0]
        return f"Redis at the socket {parts.path} db {db}, {who}"
    try:
        port = parts.port or 6379
    except ValueError:
        port = 6379
    where = f"{parts.hostname or 'localhost'}:{port}"
    if parts.scheme.startswith("rediss"):
        where += " (TLS)"
    if parts.scheme.endswith("+cluster"):
        from bus.settings import cluster_seeds

        seeds = ", ".join(f"[{h}]:{p}" if ":" in h else f"{h}:{p}" for h, p in cluster_seeds(url))
        tls = " (TLS)" if parts.scheme.startswith("rediss") else ""
        return f"the Redis Cluster seeded by {seeds}{tls}, {who}"
    db = parts.path.strip("/") or query.get("db", ["0"])[0]
    return f"Redis at {where} db {db}, {who}"


def redis_source(args: argparse.Namespace) -> str:
    """Which setting chose the Redis URL a command uses."""
    if getattr(args, "redis", None):
        return "--redis"
    variable = "HOOKBUS_REDIS_URL"
    for name in (variable, f"{variable}_FILE"):  # the URL, or a file holding it
        if os.environ.get(name):
            return name
    return "the default: neither --redis nor HOOKBUS_REDIS_URL is set"


_announced: set[str] = set()


def announce_redis(args: argparse.Namespace, settings: BusSettings) -> None:
    """Say on stderr, once per process, which Redis the command talks to (stdout stays the
    command's own): a command pointed at another Redis than meant reads "no hooks" there."""
    line = f"hookbus: talking to {describe_redis(settings.redis_url)} ({redis_source(args)})"
    if line not in _announced:
        _announced.add(line)
        print(line, file=sys.stderr, flush=True)


def redis_url(args: argparse.Namespace) -> str:
    """The Redis URL a command uses, without its password ("?" if it is malformed)."""
    try:
        return redacted(settings_of(args).redis_url)
    except HookBusError:
        return "?"


def hook_config(args: argparse.Namespace) -> dict[str, object]:
    """The hook's constructor arguments from ``--config FILE`` and ``--set NAME=VALUE``."""
    from workers.services.loading import parse_config

    return parse_config(getattr(args, "set_values", None) or (), getattr(args, "config", None))
