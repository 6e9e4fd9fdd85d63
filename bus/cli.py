"""The ``hookbus`` command line: run the demo, serve hooks, coordinate, cancel sessions, and
look at a running bus (``hooks list``, ``lag``, ``events tail``, ``dlq …``, ``metrics``); health
checks for containers (``check``, ``worker … --check``, ``coordinator --check``) and the whole
stack as local processes (``up``)."""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import logging
import os
import re
import signal
import socket
import sys
import urllib.parse
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from bus.errors import ConfigError, HookBusError
from bus.settings import BusSettings, HookSettings

if TYPE_CHECKING:
    from redis.asyncio import Redis

    from bus.keys import Keys

T = TypeVar("T")


def _settings(args: argparse.Namespace) -> BusSettings:
    settings = BusSettings.from_env(redis_url=getattr(args, "redis", None))
    if getattr(args, "prefix", None):
        import msgspec

        settings = msgspec.structs.replace(settings, prefix=args.prefix)
    return settings


def _serve(main: Callable[[asyncio.Event], Awaitable[None]], role: str) -> int:
    """Run a service until SIGTERM or Ctrl-C, then let it shut down cleanly."""
    from bus import telemetry

    telemetry.configure(role)

    async def runner() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await main(stop)

    try:
        asyncio.run(runner())
    finally:
        telemetry.shutdown()  # flush the last spans
    return 0


def _demo(args: argparse.Namespace) -> int:
    from agent_adapter.demo import main as demo_main

    return demo_main(sys.stdout, redis_url=args.redis, embedded=args.embedded, attach=args.attach)


def _worker(args: argparse.Namespace) -> int:
    if args.check:
        return _worker_check(args)
    from bus.hooks import AsyncAgentHook
    from workers.async_worker import AsyncHookWorker
    from workers.replay import parse_position
    from workers.worker import HookWorker, load_hook

    hook = load_hook(args.hook)
    if isinstance(hook, AsyncAgentHook):
        service: HookWorker | AsyncHookWorker = AsyncHookWorker(
            hook,
            _settings(args),
            HookSettings.from_env(),
            start=parse_position(args.start),
            batch_size=args.batch,
            max_deliveries=args.max_deliveries,
        )
    else:
        service = HookWorker(hook, _settings(args), scope=args.scope)
    return _serve(service.run, "worker")


def _replay(args: argparse.Namespace) -> int:
    from bus.keys import Keys
    from bus.redis_io import connect
    from workers.replay import replay_dead_letters, replay_range

    settings = _settings(args)

    async def replay() -> int:
        redis = connect(settings)
        try:
            keys = Keys(settings.prefix)
            if args.dlq:
                return await replay_dead_letters(redis, keys, args.hook)
            return await replay_range(redis, keys, args.hook, args.start, args.end)
        finally:
            await redis.aclose()

    count = asyncio.run(replay())
    source = "dead letters" if args.dlq else "events"
    print(f"re-fed {count} {source} to {args.hook}")
    return 0


def _coordinator(args: argparse.Namespace) -> int:
    if args.check:
        return _coordinator_check(args)
    from workers.coordinator_service import CoordinatorService

    return _serve(CoordinatorService(_settings(args)).run, "coordinator")


def _cancel(args: argparse.Namespace) -> int:
    from agent_adapter.client import HookClient

    async def cancel() -> None:
        client = HookClient(_settings(args))
        try:
            await client.cancel(args.session_id)
        finally:
            await client.redis.aclose()

    asyncio.run(cancel())
    print(f"session {args.session_id} cancelled: its next tool call will be blocked")
    return 0


# -- health checks (container probes) ----------------------------------------------------------

#: A check that gets no answer within this many seconds fails (probes allow a few more).
CHECK_TIMEOUT_SECS = 3.0
Probe = Callable[["Redis", "Keys", BusSettings], Awaitable[tuple[bool, str]]]


def on_host(member: str, host: str) -> bool:
    """Whether a replica or coordinator id (``HOST-PID-RANDOM``, workers/worker.py and
    bus/coordinator.py) names a process on ``host``."""
    if not member.startswith(host + "-"):
        return False
    return re.fullmatch(r"\d+-[0-9a-f]+", member[len(host) + 1 :]) is not None


async def hook_status(
    redis: Redis, keys: Keys, settings: BusSettings, hook: str, host: str | None = None
) -> tuple[bool, str]:
    """Whether ``hook`` has a live replica (on ``host`` only, if given), and a line saying so."""
    from bus.protocol import now_ms
    from workers.operator import list_hooks

    rows = [r for r in await list_hooks(redis, keys, settings.liveness_secs) if r.name == hook]
    if not rows:
        return False, f"hook {hook} is not registered in {keys.hooks}"
    live_ms = settings.liveness_secs * 1000
    if host is None:
        live, total, last = rows[0].live, rows[0].replicas, rows[0].last_heartbeat_secs
    else:
        beats: Any = await redis.zrange(keys.replicas(hook), 0, -1, withscores=True)
        now = now_ms()
        ages = [now - float(s) for m, s in beats if on_host(_text(m), host)]
        live, total = sum(1 for a in ages if a <= live_ms), len(ages)
        last = max(0.0, min(ages) / 1000) if ages else None
    where = f" on {host}" if host is not None else ""
    if live:
        return True, f"hook {hook}: {live} live replica{_s(live)}{where} (of {total})"
    if last is None:
        return False, f"hook {hook} has no replica{where} in {keys.replicas(hook)}"
    return False, (
        f"hook {hook} has no live replica{where}: last heartbeat {last:.1f}s ago "
        f"(live means within {settings.liveness_secs:g}s)"
    )


async def coordinator_status(redis: Redis, keys: Keys, settings: BusSettings) -> tuple[bool, str]:
    """Whether the coordinator service is up, as far as Redis can tell: Redis answers and the
    group ``coordinators`` on ``{p}:decisions`` exists (each replica creates it at start).

    Not which replica reads: Redis before 7.2 neither lists a consumer that has not been handed
    an entry yet nor refreshes its idle time on an empty blocking read, so consumer activity
    says nothing about an idle coordinator.
    """
    from redis.exceptions import ResponseError

    from bus.keys import COORDINATORS_GROUP

    try:
        groups: Any = await redis.xinfo_groups(keys.decisions)
    except ResponseError as exc:
        if "no such key" not in str(exc):
            raise
        groups = []
    mine = [g for g in groups if _text(g["name"]) == COORDINATORS_GROUP]
    if not mine:
        return False, (
            f"no coordinator has started: {keys.decisions} has no group {COORDINATORS_GROUP}"
        )
    group = mine[0]
    lag = "?" if group.get("lag") is None else str(group["lag"])
    return True, (
        f"coordinator group {COORDINATORS_GROUP} on {keys.decisions} exists "
        f"({group['consumers']} consumers, {group['pending']} pending, lag {lag})"
    )


async def _ping(redis: Redis, keys: Keys, settings: BusSettings) -> tuple[bool, str]:
    await redis.ping()
    return True, f"Redis at {_redacted(settings.redis_url)} answers"


def _text(value: object) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _s(n: int) -> str:
    return "" if n == 1 else "s"


def _run_check(args: argparse.Namespace, probe: Probe) -> int:
    """One line and an exit code: 0 healthy, 1 not (or Redis did not answer), 2 bad usage."""
    from bus.keys import Keys
    from bus.redis_io import connect

    settings = _settings(args)
    url = _redacted(settings.redis_url)

    async def run() -> tuple[bool, str]:
        redis = connect(settings)
        try:
            return await asyncio.wait_for(
                probe(redis, Keys(settings.prefix), settings), CHECK_TIMEOUT_SECS
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


def _host(args: argparse.Namespace) -> str | None:
    return socket.gethostname() if args.here else None


def _worker_check(args: argparse.Namespace) -> int:
    from bus.hooks import spec_of
    from workers.worker import load_hook

    name = spec_of(load_hook(args.hook)).name
    host = _host(args)

    async def probe(redis: Redis, keys: Keys, settings: BusSettings) -> tuple[bool, str]:
        return await hook_status(redis, keys, settings, name, host)

    return _run_check(args, probe)


def _coordinator_check(args: argparse.Namespace) -> int:
    return _run_check(args, coordinator_status)


def _check(args: argparse.Namespace) -> int:
    return _run_check(args, _ping)


def _up(args: argparse.Namespace) -> int:
    from workers.launcher import up

    url = args.redis or os.environ.get("HOOKBUS_REDIS_URL") or None
    if url is not None:
        _settings(args)  # a malformed URL is said at once, in one line
    if args.stop_timeout <= 0:
        raise _usage("--stop-timeout must be a positive number of seconds")
    return up(
        redis_url=url,
        prefix=args.prefix,
        demo=args.demo,
        once=args.once,
        log_dir=args.logs,
        stop_timeout=args.stop_timeout,
    )


# -- looking at a running bus ------------------------------------------------------------------


def _with_redis(
    args: argparse.Namespace, work: Callable[[Redis, Keys, BusSettings], Awaitable[T]]
) -> T:
    """Run ``work`` with a client on the bus's Redis, closed afterwards."""
    from bus.keys import Keys
    from bus.redis_io import connect

    settings = _settings(args)

    async def run() -> T:
        redis = connect(settings)
        try:
            return await work(redis, Keys(settings.prefix), settings)
        finally:
            await redis.aclose()

    return asyncio.run(run())


def _hooks_list(args: argparse.Namespace) -> int:
    from workers.operator import list_hooks, make_console, render_hooks

    async def work(redis: Redis, keys: Keys, settings: BusSettings) -> None:
        rows = await list_hooks(redis, keys, settings.liveness_secs)
        make_console().print(render_hooks(rows, keys, settings.liveness_secs))

    _with_redis(args, work)
    return 0


def _hooks_mode(args: argparse.Namespace) -> int:
    """Switch a hook between enforce, warn and dryrun without redeploying it."""
    from bus.protocol import ControlMessage, encode

    async def work(redis: Redis, keys: Keys, settings: BusSettings) -> None:
        if not await redis.hexists(keys.hooks, args.name):
            raise ConfigError(f"no hook named {args.name!r} is registered (see hookbus hooks list)")
        await redis.hset(keys.modes, args.name, args.mode)
        # Coordinators refresh their directory at once on this announcement.
        await redis.publish(keys.control, encode(ControlMessage(type="manifest", name=args.name)))
        print(f"hook {args.name} is now in {args.mode} mode")

    _with_redis(args, work)
    return 0


def _duration(text: str) -> float:
    """Seconds from ``90``, ``90s``, ``15m`` or ``2h``."""
    match = re.fullmatch(r"(\d+(?:\.\d+)?)([smh]?)", text.strip())
    if match is None:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration like 900, 900s, 15m or 2h")
    return float(match[1]) * {"": 1, "s": 1, "m": 60, "h": 3600}[match[2]]


def _breakglass(args: argparse.Namespace) -> int:
    """Switch the audited bypass of every enforcing hook on or off, or show it."""
    from bus.errors import ProtocolError
    from workers.operator import breakglass_off, breakglass_on, breakglass_status

    def until(ms: int) -> str:
        return dt.datetime.fromtimestamp(ms / 1000, dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")

    async def work(redis: Redis, keys: Keys, settings: BusSettings) -> None:
        if args.switch == "on":
            on = await breakglass_on(redis, keys, args.reason, args.seconds, args.by)
            print(
                f"break-glass is ON until {until(on.until_ms)}: every enforcing hook is "
                "applied as a warning (recorded in the audit trail); P0-P2 permission denials "
                "still hold, and so do cancellations. End it with: hookbus breakglass off"
            )
        elif args.switch == "off":
            was = await breakglass_off(redis, keys, args.by)
            print("break-glass is off: hooks are enforced" + (" again" if was else ""))
        else:
            try:
                glass = await breakglass_status(redis, keys)
            except ProtocolError as exc:
                print(f"break-glass is off: {keys.breakglass} holds something else ({exc}); "
                      "coordinators ignore it, `hookbus breakglass off` clears it")  # fmt: skip
                return
            if glass is None:
                print("break-glass is off")
            else:
                print(f"break-glass is ON until {until(glass.until_ms)}, by {glass.by}: "
                      f"{glass.reason}")  # fmt: skip

    _with_redis(args, work)
    return 0


def _lag(args: argparse.Namespace) -> int:
    from workers.operator import consumer_lag, make_console, render_lag

    async def work(redis: Redis, keys: Keys, settings: BusSettings) -> None:
        rows = await consumer_lag(redis, keys, settings.events_maxlen, settings.requests_maxlen)
        make_console().print(render_lag(rows))

    _with_redis(args, work)
    return 0


def _events_tail(args: argparse.Namespace) -> int:
    import contextlib

    from bus.events import HookEvent
    from workers.operator import (
        event_matches,
        events_end,
        follow_events,
        make_console,
        render_event,
    )

    events = {HookEvent.parse(e).value for e in args.event or ()}
    sessions = set(args.session or ())
    if args.count is not None and args.count <= 0:
        raise _usage("--count must be a positive number of events")
    out, err = make_console(), make_console(stderr=True)

    async def work(redis: Redis, keys: Keys, settings: BusSettings) -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        start = await events_end(redis, keys)
        err.print(f"following {keys.events} after {start} (Ctrl-C to stop)", markup=False)
        shown = 0
        async with contextlib.aclosing(follow_events(redis, keys, start, stop)) as stream:
            async for event in stream:
                if event.problem:  # not an event at all: said on stderr, never counted
                    err.print(render_event(event), soft_wrap=True)
                    continue
                if not event_matches(event, sessions, events):
                    continue
                out.print(render_event(event), soft_wrap=True)
                shown += 1
                if args.count is not None and shown >= args.count:
                    return

    _with_redis(args, work)
    return 0


def _dlq_list(args: argparse.Namespace) -> int:
    from bus.keys import check_name
    from workers.operator import list_dead_letters, make_console, render_dead_letters

    hook = check_name("hook name", args.hook) if args.hook else None
    if args.limit <= 0:
        raise _usage("--limit must be a positive number of entries")

    async def work(redis: Redis, keys: Keys, settings: BusSettings) -> None:
        letters, more = await list_dead_letters(redis, keys, hook, args.limit)
        make_console().print(render_dead_letters(letters, more, keys, hook))

    _with_redis(args, work)
    return 0


def _audit_list(args: argparse.Namespace) -> int:
    from workers.operator import list_audit, make_console, render_audit

    if args.limit <= 0:
        raise _usage("--limit must be a positive number of entries")

    async def work(redis: Redis, keys: Keys, settings: BusSettings) -> None:
        records, broken = await list_audit(redis, keys, args.limit)
        make_console().print(render_audit(records, broken, keys))

    _with_redis(args, work)
    return 0


def _dlq_show(args: argparse.Namespace) -> int:
    from workers.operator import check_stream_id, get_dead_letter, make_console, render_dead_letter

    entry_id = check_stream_id(args.id)

    async def work(redis: Redis, keys: Keys, settings: BusSettings) -> int:
        letter = await get_dead_letter(redis, keys, entry_id)
        if letter is None:
            print(f"hookbus: no dead letter {entry_id} in {keys.dlq}", file=sys.stderr)
            return 1
        make_console().print(render_dead_letter(letter))
        return 0

    return _with_redis(args, work)


def _with_progress(
    total: int, what: str, run: Callable[[Callable[[int], None] | None], int]
) -> int:
    """``run(progress)``, with a progress bar on stderr when there are many entries."""
    from rich.progress import Progress

    from workers.operator import MANY, make_console

    if total < MANY:
        return run(None)
    with Progress(console=make_console(stderr=True), transient=True) as bar:
        task = bar.add_task(what, total=total)
        return run(lambda n: bar.advance(task, n))


def _dlq_replay(args: argparse.Namespace) -> int:
    from bus.keys import check_name
    from workers.operator import count_dead_letters, list_hooks
    from workers.replay import replay_dead_letters

    hook = check_name("hook name", args.hook)

    async def count(redis: Redis, keys: Keys, settings: BusSettings) -> tuple[int, int, str]:
        total, _ = await count_dead_letters(redis, keys, hook)
        rows = [r for r in await list_hooks(redis, keys, settings.liveness_secs) if r.name == hook]
        return total, rows[0].live if rows else 0, keys.replay(hook)

    total, live, replay_stream = _with_redis(args, count)
    if total == 0:
        print(f"no dead letters of {hook}: nothing re-fed")
        return 0

    def run(progress: Callable[[int], None] | None) -> int:
        async def work(redis: Redis, keys: Keys, settings: BusSettings) -> int:
            return await replay_dead_letters(redis, keys, hook, progress)

        return _with_redis(args, work)

    done = _with_progress(total, f"re-feeding {hook}", run)
    print(f"re-fed {_entries(done)} to {hook}")
    if not live:
        print(f"note: {hook} has no live replica; they wait in {replay_stream} until one starts")
    return 0


def _dlq_purge(args: argparse.Namespace) -> int:
    from bus.keys import check_name
    from workers.operator import count_dead_letters, purge_dead_letters

    hook = check_name("hook name", args.hook) if args.hook else None
    whose = f" of {hook}" if hook else ""

    async def count(redis: Redis, keys: Keys, settings: BusSettings) -> tuple[int, str | None]:
        return await count_dead_letters(redis, keys, hook)

    total, newest = _with_redis(args, count)
    if total == 0 or newest is None:
        print(f"no dead letters{whose}: nothing to delete")
        return 0
    if not args.yes:
        if not sys.stdin.isatty():
            print(
                f"hookbus: not deleting {_entries(total)}{whose} without confirmation; "
                "stdin is not a terminal, so pass --yes",
                file=sys.stderr,
            )
            return 2
        from rich.prompt import Confirm

        try:
            sure = Confirm.ask(f"delete {_entries(total)}{whose}?", default=False)
        except EOFError:
            sure = False
        if not sure:
            print("nothing deleted")
            return 0

    def run(progress: Callable[[int], None] | None) -> int:
        async def work(redis: Redis, keys: Keys, settings: BusSettings) -> int:
            return await purge_dead_letters(redis, keys, hook, newest, progress)

        return _with_redis(args, work)

    done = _with_progress(total, "deleting", run)
    print(f"deleted {_entries(done)}{whose}")
    return 0


def _metrics(args: argparse.Namespace) -> int:
    from workers.operator import collect_metrics, make_console, render_metrics

    async def work(redis: Redis, keys: Keys, settings: BusSettings) -> None:
        make_console().print(render_metrics(await collect_metrics(redis, keys)))

    _with_redis(args, work)
    return 0


def _entries(n: int) -> str:
    return f"{n} dead letter" + ("" if n == 1 else "s")


class _UsageError(HookBusError):
    """A bad option value (reported as one line, like every HookBusError)."""


def _usage(message: str) -> _UsageError:
    return _UsageError(message)


def _redacted(url: str) -> str:
    """The URL without its password."""
    parts = urllib.parse.urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.rsplit("@", 1)[1]
    user = f"{parts.username}:***@" if parts.username else ":***@"
    return urllib.parse.urlunsplit(parts._replace(netloc=user + netloc))


def _redis_url(args: argparse.Namespace) -> str:
    try:
        return _redacted(_settings(args).redis_url)
    except HookBusError:
        return "?"


def _schema(args: argparse.Namespace) -> int:
    from pathlib import Path

    from bus.schema import drift, export

    directory = Path(args.out)
    if args.check:
        problems = drift(directory)
        for p in problems:
            print(f"{directory}/{p}", file=sys.stderr)
        if problems:
            print(
                "schema drift: run `hookbus schema export` and commit the result", file=sys.stderr
            )
            return 1
        print(f"{directory} matches the code")
        return 0
    written = export(directory)
    print(f"wrote {len(written)} files to {directory}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hookbus", description="Lifecycle hooks for AI agents, embedded or over Redis."
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log at debug level")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def with_redis(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
        p.add_argument("--redis", metavar="URL", help="Redis URL (default: $HOOKBUS_REDIS_URL)")
        p.add_argument("--prefix", help="key prefix (default: $HOOKBUS_PREFIX or hookbus)")
        return p

    def check_args(p: argparse.ArgumentParser, healthy: str, here: bool = True) -> None:
        p.add_argument(
            "--check",
            action="store_true",
            help=f"health check, do not serve: exit 0 if {healthy}, else 1, with one line",
        )
        if here:
            p.add_argument(
                "--here",
                action="store_true",
                help="with --check: count only replicas on this host (this container or pod)",
            )

    demo = with_redis(sub.add_parser("demo", help="run one scripted agent session"))
    demo.add_argument("--embedded", action="store_true", help="hooks in this process, no Redis")
    demo.add_argument(
        "--attach", action="store_true", help="use the hook services already running (compose)"
    )
    demo.set_defaults(func=_demo)

    worker = with_redis(sub.add_parser("worker", help="serve one hook over Redis"))
    worker.add_argument("hook", metavar="MODULE:CLASS", help="e.g. workers.demo_hooks:SecretGuard")
    worker.add_argument(
        "--scope",
        choices=["global", "session"],
        default="global",
        help="session: only for sessions that attach this hook by name",
    )
    worker.add_argument(
        "--from",
        dest="start",
        default="$",
        metavar="POSITION",
        help="async hooks: where a new group starts: $ (new events, default), 0 (all retained "
        "history), a stream id, epoch ms or an ISO time",
    )
    worker.add_argument("--batch", type=int, default=100, help="async hooks: entries per read")
    worker.add_argument(
        "--max-deliveries",
        type=int,
        default=5,
        help="async hooks: deliveries before an entry goes to the dead-letter stream",
    )
    check_args(worker, "the hook has a live replica (heartbeat within HOOKBUS_LIVENESS_SECS)")
    worker.set_defaults(func=_worker)

    replay = with_redis(sub.add_parser("replay", help="re-feed events to one async hook"))
    replay.add_argument("hook", help="the async hook's name")
    replay.add_argument("--from", dest="start", default="-", help="first event (id or time)")
    replay.add_argument("--to", dest="end", default="+", help="last event (id or time)")
    replay.add_argument("--dlq", action="store_true", help="re-feed the hook's dead letters")
    replay.set_defaults(func=_replay)

    coordinator = with_redis(
        sub.add_parser("coordinator", help="answer decision requests from agents in any language")
    )
    check_args(
        coordinator,
        "Redis answers and the coordinators group on PREFIX:decisions exists (every replica "
        "creates it at start; Redis cannot tell an idle replica from a dead one)",
        here=False,
    )
    coordinator.set_defaults(func=_coordinator)

    from workers import gateway as gateway_command  # its options and run(); Starlette on demand

    gateway = with_redis(
        sub.add_parser("gateway", help="decisions over HTTP (bearer token per tenant)")
    )
    gateway_command.add_arguments(gateway)
    gateway.set_defaults(func=gateway_command.run)

    check = with_redis(
        sub.add_parser("check", help="health check: exit 0 if Redis answers (PING), else 1")
    )
    check.set_defaults(func=_check)

    up = with_redis(
        sub.add_parser(
            "up",
            help="run the docker-compose stack as local processes (no Docker): Redis (a private "
            "redis-server unless HOOKBUS_REDIS_URL or --redis is set), coordinator, hooks",
        )
    )
    up.add_argument(
        "--demo", action="store_true", help="once ready, run the demo agent (hookbus demo --attach)"
    )
    up.add_argument(
        "--once",
        action="store_true",
        help="stop everything once ready (after the demo, with --demo) and exit with its code",
    )
    up.add_argument(
        "--logs", metavar="DIR", help="one log file per process here (default: a new temp dir)"
    )
    up.add_argument(
        "--stop-timeout",
        type=float,
        default=10.0,
        metavar="SECS",
        help="on Ctrl-C or SIGTERM, processes still running after SECS are killed (10)",
    )
    up.set_defaults(func=_up)

    schema = sub.add_parser("schema", help="JSON Schema and AsyncAPI of the wire protocol")
    schema_sub = schema.add_subparsers(dest="schema_command", required=True, metavar="ACTION")
    export_cmd = schema_sub.add_parser("export", help="write docs/schema/ from the code")
    export_cmd.add_argument("--out", default="docs/schema", help="directory (docs/schema)")
    export_cmd.add_argument("--check", action="store_true", help="only compare; exit 1 on drift")
    export_cmd.set_defaults(func=_schema)

    cancel = with_redis(sub.add_parser("cancel", help="cancel a session wherever it runs"))
    cancel.add_argument("session_id")
    cancel.set_defaults(func=_cancel)

    hooks = sub.add_parser("hooks", help="the hooks registered on the bus")
    hooks_sub = hooks.add_subparsers(dest="action", required=True, metavar="ACTION")
    hooks_list = with_redis(
        hooks_sub.add_parser("list", help="every hook: kind, events, filters, live replicas")
    )
    hooks_list.set_defaults(func=_hooks_list)
    hooks_mode = with_redis(
        hooks_sub.add_parser("mode", help="enforce, warn or dryrun a hook, without redeploying")
    )
    hooks_mode.add_argument("name", help="the hook's name")
    hooks_mode.add_argument("mode", choices=["enforce", "warn", "dryrun"])
    hooks_mode.set_defaults(func=_hooks_mode)

    glass = sub.add_parser(
        "breakglass",
        help="an audited, time-limited bypass: every enforcing hook only warns (on, off, status)",
    )
    glass_sub = glass.add_subparsers(dest="switch", required=True, metavar="ACTION")
    who = f"{os.environ.get('USER', 'operator')}@{socket.gethostname()}"
    glass_on = with_redis(glass_sub.add_parser("on", help="switch the bypass on, with a reason"))
    glass_on.add_argument("--reason", required=True, help="why (goes to the audit trail)")
    glass_on.add_argument(
        "--for", dest="seconds", type=_duration, default=900.0, metavar="DURATION",
        help="how long until it ends by itself: 900, 15m, 2h (15m; at most 24h)",
    )  # fmt: skip
    glass_on.add_argument("--by", default=who, help=f"who switches it ({who})")
    glass_off = with_redis(glass_sub.add_parser("off", help="enforce every hook again"))
    glass_off.add_argument("--by", default=who, help=f"who switches it ({who})")
    with_redis(glass_sub.add_parser("status", help="is it on, until when, why"))
    glass.set_defaults(func=_breakglass)

    lag = with_redis(
        sub.add_parser("lag", help="per consumer group: lag, pending, oldest pending, consumers")
    )
    lag.set_defaults(func=_lag)

    events = sub.add_parser("events", help="the lifecycle events stream")
    events_sub = events.add_subparsers(dest="action", required=True, metavar="ACTION")
    tail = with_redis(events_sub.add_parser("tail", help="print new events as they arrive"))
    tail.add_argument("--session", action="append", metavar="S", help="only this session")
    tail.add_argument("--event", action="append", metavar="E", help="only this event name")
    tail.add_argument("--count", type=int, metavar="N", help="exit after N matching events")
    tail.set_defaults(func=_events_tail)

    audit = sub.add_parser("audit", help="the audit trail: answers held back, break-glass")
    audit_sub = audit.add_subparsers(dest="action", required=True, metavar="ACTION")
    audit_list = with_redis(
        audit_sub.add_parser(
            "list", help="the newest records: warn/dryrun/break-glass answers, break-glass switches"
        )
    )
    audit_list.add_argument("--limit", type=int, default=50, metavar="N", help="at most N (50)")
    audit_list.set_defaults(func=_audit_list)

    dlq = sub.add_parser("dlq", help="the dead-letter stream")
    dlq_sub = dlq.add_subparsers(dest="action", required=True, metavar="ACTION")
    dlq_list = with_redis(dlq_sub.add_parser("list", help="the newest dead letters"))
    dlq_list.add_argument("--hook", metavar="H", help="only the dead letters of this hook")
    dlq_list.add_argument("--limit", type=int, default=50, metavar="N", help="at most N (50)")
    dlq_list.set_defaults(func=_dlq_list)
    dlq_show = with_redis(dlq_sub.add_parser("show", help="every field of one dead letter"))
    dlq_show.add_argument("id", metavar="ID", help="its stream id (from dlq list)")
    dlq_show.set_defaults(func=_dlq_show)
    dlq_replay = with_redis(
        dlq_sub.add_parser("replay", help="re-feed an async hook's dead letters to it")
    )
    dlq_replay.add_argument("hook", metavar="HOOK", help="the async hook's name")
    dlq_replay.set_defaults(func=_dlq_replay)
    dlq_purge = with_redis(dlq_sub.add_parser("purge", help="delete dead letters"))
    dlq_purge.add_argument("--hook", metavar="H", help="only the dead letters of this hook")
    dlq_purge.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    dlq_purge.set_defaults(func=_dlq_purge)

    metrics = with_redis(sub.add_parser("metrics", help="figures collected by metrics hooks"))
    metrics.set_defaults(func=_metrics)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        code: int = args.func(args)
    except HookBusError as exc:
        print(f"hookbus: {exc}", file=sys.stderr)
        return 2
    except (RedisConnectionError, RedisTimeoutError) as exc:
        print(f"hookbus: cannot reach Redis at {_redis_url(args)}: {exc}", file=sys.stderr)
        return 2
    except RedisError as exc:
        print(f"hookbus: Redis answered with an error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return code


if __name__ == "__main__":
    sys.exit(main())
