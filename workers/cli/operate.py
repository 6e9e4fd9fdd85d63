"""The commands that look at and steer a running bus: ``hooks``, ``lag``, ``events tail``,
``dlq``, ``metrics``, ``replay``, ``cancel``, ``breakglass``, ``audit``, ``tenants`` and
``repair``. The Redis side of each is in workers/ops/ (one module per concern, the rendering
in workers/ops/render.py); these are thin wrappers that print."""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import os
import signal
import socket
import sys
from typing import TYPE_CHECKING

from bus.errors import ConfigError, InvalidInputError
from bus.settings import BusSettings
from workers.cli.common import (
    UsageError,
    add_redis_options,
    announce_redis,
    duration,
    retry_secs,
    settings_of,
    with_redis,
)
from workers.cli.dead_letters import (
    _dlq_list,
    _dlq_purge,
    _dlq_replay,
    _dlq_show,
    _partitions,
    _replay_dead_letters,
)

if TYPE_CHECKING:
    from redis.asyncio import Redis

    from bus.transport.keys import Keys


def _replay(args: argparse.Namespace) -> int:
    from bus.transport.keys import Keys
    from bus.transport.redis_io import connect
    from workers.ops.replay import check_replayable, replay_range

    if args.dlq:
        return _replay_dead_letters(args, args.hook)
    settings = settings_of(args)
    announce_redis(args, settings)

    async def replay() -> int:
        redis = connect(settings)
        try:
            keys = Keys.of(settings)
            await check_replayable(redis, keys, args.hook)
            return await replay_range(redis, keys, args.hook, args.start, args.end)
        finally:
            await redis.aclose()

    count = asyncio.run(replay())
    print(f"re-fed {count} events to {args.hook}")
    return 0


def _cancel(args: argparse.Namespace) -> int:
    from bus.transport.redis_io import cancel_session

    if not args.session_id:  # it would name no session ({p}:cancelled:), or none of a tenant's
        why = "the session id is empty; name the session to cancel"
        raise InvalidInputError(f"hookbus cancel: {why}")

    async def cancel(redis: Redis, keys: Keys, settings: BusSettings) -> None:
        await cancel_session(redis, keys, args.session_id, settings.session_ttl_secs, "operator")

    with_redis(args, cancel)
    print(f"session {args.session_id} cancelled: its next tool call will be blocked")
    return 0


def _hooks_list(args: argparse.Namespace) -> int:
    from workers.ops.hooks import bus_partitions, list_hooks, partitions_note
    from workers.ops.render import make_console, render_hooks

    async def work(redis: Redis, keys: Keys, settings: BusSettings) -> None:
        rows = await list_hooks(redis, keys, settings.liveness_secs)
        partitions = await bus_partitions(redis, keys)
        console = make_console()
        console.print(render_hooks(rows, keys, settings.liveness_secs, partitions))
        console.print(partitions_note(keys, partitions))

    with_redis(args, work, reads_only=True)
    return 0


def _hooks_mode(args: argparse.Namespace) -> int:
    """Switch a hook between enforce, warn and dryrun without redeploying it."""
    from bus.protocol import ControlMessage, encode

    async def work(redis: Redis, keys: Keys, settings: BusSettings) -> None:
        from bus.protocol import retired_hook

        if retired_hook(await redis.get(keys.manifest(args.name))) is not None:
            raise ConfigError(f"hook {args.name!r} was removed (see hookbus hooks list)")
        if not await redis.sismember(keys.hooks, args.name):
            raise ConfigError(f"no hook named {args.name!r} is registered (see hookbus hooks list)")
        await redis.hset(keys.modes, args.name, args.mode)
        # Coordinators refresh their directory at once on this announcement.
        await redis.publish(keys.control, encode(ControlMessage(type="manifest", name=args.name)))
        print(f"hook {args.name} is now in {args.mode} mode")

    with_redis(args, work)
    return 0


def _hooks_remove(args: argparse.Namespace) -> int:
    from workers.ops.hooks import remove_hook

    async def work(redis: Redis, keys: Keys, settings: BusSettings) -> int:
        done = await remove_hook(redis, keys, args.name, args.by, settings.liveness_secs, args.wait)
        print(
            f"hook {args.name} removed: coordinators no longer select it, and its replicas "
            f"stop at their next heartbeat (undo: hookbus hooks restore {args.name})"
        )
        if done.live:
            print(
                f"hookbus: {done.live} replica{'' if done.live == 1 else 's'} of {args.name} "
                f"still live after {args.wait:g}s: stop them (and their deployment); "
                + ("its events group was kept" if done.kind != "sync" else ""),
                file=sys.stderr,
            )
            return 1
        if done.group_destroyed:
            print("its consumer group on the events stream is destroyed: retention moves on")
        return 0

    return with_redis(args, work)


def _hooks_restore(args: argparse.Namespace) -> int:
    from workers.ops.hooks import restore_hook

    async def work(redis: Redis, keys: Keys, settings: BusSettings) -> None:
        await restore_hook(redis, keys, args.name)
        print(f"hook {args.name} restored: start its replicas to serve it again")

    with_redis(args, work)
    return 0


def _breakglass(args: argparse.Namespace) -> int:
    """Switch the audited bypass of every enforcing hook on or off, or show it."""
    from bus.errors import ProtocolError
    from workers.ops.breakglass import breakglass_off, breakglass_on, breakglass_status

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

    with_redis(args, work)
    return 0


def _lag(args: argparse.Namespace) -> int:
    from workers.ops.dead_letters import cut_dead_letters
    from workers.ops.hooks import bus_partitions, partitions_note
    from workers.ops.lag import consumer_lag
    from workers.ops.render import make_console, render_dlq_cuts, render_lag

    async def work(redis: Redis, keys: Keys, settings: BusSettings) -> None:
        rows = await consumer_lag(
            redis, keys, settings.events_maxlen, settings.requests_maxlen,
            audit_maxlen=settings.audit_maxlen,
        )  # fmt: skip
        console = make_console()
        console.print(render_lag(rows))
        console.print(partitions_note(keys, await bus_partitions(redis, keys)))
        for line in render_dlq_cuts(await cut_dead_letters(redis, keys)):
            console.print(line)

    with_redis(args, work, reads_only=True)
    return 0


def _events_tail(args: argparse.Namespace) -> int:
    import contextlib

    from bus.events import HookEvent
    from workers.ops.events import event_matches, events_end, follow_events
    from workers.ops.render import make_console, render_event

    events = {HookEvent.parse(e).value for e in args.event or ()}
    sessions = set(args.session or ())
    if args.count is not None and args.count <= 0:
        raise UsageError("--count must be a positive number of events")
    out, err = make_console(), make_console(stderr=True)

    async def work(redis: Redis, keys: Keys, settings: BusSettings) -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        start = await events_end(redis, keys, retry_secs())
        err.print(f"following {len(start)} events partition(s) (Ctrl-C to stop)", markup=False)
        shown = 0
        following = follow_events(redis, keys, start, stop, retry_secs=retry_secs())
        async with contextlib.aclosing(following) as stream:
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

    with_redis(args, work)
    return 0


def _audit_list(args: argparse.Namespace) -> int:
    from workers.ops.records import list_audit
    from workers.ops.render import make_console, render_audit

    if args.limit <= 0:
        raise UsageError("--limit must be a positive number of entries")

    async def work(redis: Redis, keys: Keys, settings: BusSettings) -> None:
        records, broken = await list_audit(redis, keys, args.limit)
        make_console().print(render_audit(records, broken, keys))

    with_redis(args, work, reads_only=True)
    return 0


def _tenants(args: argparse.Namespace) -> int:
    """Which tenants (untrusted agents: each with its own Redis user, or gateway tokens) the
    coordinator service and the gateway answer."""
    from workers.ops.tenants import add_tenant, list_tenants, remove_tenant

    if args.action != "list" and not args.name:
        raise UsageError(f"tenants {args.action} needs the tenant's NAME")

    async def work(redis: Redis, keys: Keys, settings: BusSettings) -> None:
        if args.action == "list":
            names = await list_tenants(redis, keys)
            print("\n".join(names) if names else f"no tenants in {keys.tenants}")
        elif args.action == "add":
            added = await add_tenant(redis, keys, args.name, args.by)
            print(
                f"tenant {args.name} "
                + ("added" if added else "was already served")
                + f": the coordinator service answers {keys.tenant_decisions(args.name)} "
                f"(its Redis user: tenant-{args.name}, from hookbus acl --tenants), and the "
                "gateway its tokens, within 2 s"
            )
        else:
            removed = await remove_tenant(redis, keys, args.name, args.by)
            print(
                f"tenant {args.name} removed: within 2 s its requests are no longer answered "
                "(the gateway answers its tokens 401)"
                if removed
                else f"tenant {args.name} was not served"
            )

    with_redis(args, work)
    return 0


def _repair(args: argparse.Namespace) -> int:
    """Repair a stream poisoned with ids beyond Redis's clock (docs/security.md)."""
    from workers.ops.repair import repair_stream

    async def work(redis: Redis, keys: Keys, settings: BusSettings) -> None:
        stream = keys.tenant_decisions(args.tenant) if args.tenant else args.stream
        if not stream:
            raise UsageError("name the STREAM to repair, or --tenant NAME")
        slack = int(args.slack * 1000)
        done = await repair_stream(redis, keys, stream, args.by, slack_ms=slack)
        if not done.poisoned:
            print(f"{stream} is not poisoned: its last id {done.last_id} is within Redis's clock")
            return
        print(
            f"repaired {stream}: last id {done.last_id} set back to {done.new_last_id}; "
            f"{len(done.removed)} entries beyond Redis's clock dead-lettered and deleted"
        )
        for group, was in done.groups_reset:
            print(f"  group {group} moved back from {was} to {done.new_last_id}")
        print(f"  recorded in {keys.audit}; the entries taken out: hookbus dlq list")

    with_redis(args, work)
    return 0


def _metrics(args: argparse.Namespace) -> int:
    from workers.ops.records import collect_metrics
    from workers.ops.render import make_console, render_metrics

    async def work(redis: Redis, keys: Keys, settings: BusSettings) -> None:
        make_console().print(render_metrics(await collect_metrics(redis, keys)))

    with_redis(args, work, reads_only=True)
    return 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    replay = add_redis_options(sub.add_parser("replay", help="re-feed events to one async hook"))
    replay.add_argument("hook", help="the async hook's name")
    replay.add_argument("--from", dest="start", default="-", help="first event (id or time)")
    replay.add_argument("--to", dest="end", default="+", help="last event (id or time)")
    replay.add_argument(
        "--dlq", action="store_true", help="re-feed the hook's own dead letters (shown first)"
    )
    replay.add_argument("--yes", action="store_true", help="with --dlq: do not ask")
    replay.set_defaults(func=_replay)

    cancel = add_redis_options(sub.add_parser("cancel", help="cancel a session wherever it runs"))
    cancel.add_argument("session_id")
    cancel.set_defaults(func=_cancel)

    hooks = sub.add_parser("hooks", help="the hooks registered on the bus")
    hooks_sub = hooks.add_subparsers(dest="action", required=True, metavar="ACTION")
    hooks_list = add_redis_options(
        hooks_sub.add_parser("list", help="every hook: kind, events, filters, live replicas")
    )
    hooks_list.set_defaults(func=_hooks_list)
    hooks_mode = add_redis_options(
        hooks_sub.add_parser("mode", help="enforce, warn or dryrun a hook, without redeploying")
    )
    hooks_mode.add_argument("name", help="the hook's name")
    hooks_mode.add_argument("mode", choices=["enforce", "warn", "dryrun"])
    hooks_mode.set_defaults(func=_hooks_mode)
    who = f"{os.environ.get('USER', 'operator')}@{socket.gethostname()}"
    hooks_remove = add_redis_options(
        hooks_sub.add_parser(
            "remove",
            help="retire a hook, safe while its replicas run: coordinators stop selecting it; "
            "its sync replicas stay up idle (ready, answering nothing; async ones exit 0), "
            "until `hooks restore`",
        )
    )
    hooks_remove.add_argument("name", help="the hook's name")
    hooks_remove.add_argument("--by", default=who, help=f"who removes it ({who})")
    hooks_remove.add_argument(
        "--wait", type=duration, default=10.0, metavar="DURATION",
        help="how long to wait for its replicas to stop (10s)",
    )  # fmt: skip
    hooks_remove.set_defaults(func=_hooks_remove)
    hooks_restore = add_redis_options(
        hooks_sub.add_parser("restore", help="undo hooks remove: its replicas may register again")
    )
    hooks_restore.add_argument("name", help="the hook's name")
    hooks_restore.set_defaults(func=_hooks_restore)

    glass = sub.add_parser(
        "breakglass",
        help="an audited, time-limited bypass: every enforcing hook only warns (on, off, status)",
    )
    glass_sub = glass.add_subparsers(dest="switch", required=True, metavar="ACTION")
    glass_on = add_redis_options(
        glass_sub.add_parser("on", help="switch the bypass on, with a reason")
    )
    glass_on.add_argument("--reason", required=True, help="why (goes to the audit trail)")
    glass_on.add_argument(
        "--for", dest="seconds", type=duration, default=900.0, metavar="DURATION",
        help="how long until it ends by itself: 900, 15m, 2h (15m; at most 24h)",
    )  # fmt: skip
    glass_on.add_argument("--by", default=who, help=f"who switches it ({who})")
    glass_off = add_redis_options(glass_sub.add_parser("off", help="enforce every hook again"))
    glass_off.add_argument("--by", default=who, help=f"who switches it ({who})")
    add_redis_options(glass_sub.add_parser("status", help="is it on, until when, why"))
    glass.set_defaults(func=_breakglass)

    lag = add_redis_options(
        sub.add_parser("lag", help="per consumer group: lag, pending, oldest pending, consumers")
    )
    lag.set_defaults(func=_lag)

    parts = add_redis_options(
        sub.add_parser(
            "partitions",
            help="the bus's partition count ({p}:config); with N --force, set it (every "
            "process of the bus stopped)",
        )
    )
    parts.add_argument("count", nargs="?", type=int, metavar="N", help="the new count")
    parts.add_argument("--force", action="store_true", help="set it although it is written")
    parts.set_defaults(func=_partitions)

    events = sub.add_parser("events", help="the lifecycle events stream")
    events_sub = events.add_subparsers(dest="action", required=True, metavar="ACTION")
    tail = add_redis_options(events_sub.add_parser("tail", help="print new events as they arrive"))
    tail.add_argument("--session", action="append", metavar="S", help="only this session")
    tail.add_argument("--event", action="append", metavar="E", help="only this event name")
    tail.add_argument("--count", type=int, metavar="N", help="exit after N matching events")
    tail.set_defaults(func=_events_tail)

    audit = sub.add_parser("audit", help="the audit trail: answers held back, break-glass")
    audit_sub = audit.add_subparsers(dest="action", required=True, metavar="ACTION")
    audit_list = add_redis_options(
        audit_sub.add_parser(
            "list", help="the newest records: warn/dryrun/break-glass answers, break-glass switches"
        )
    )
    audit_list.add_argument("--limit", type=int, default=50, metavar="N", help="at most N (50)")
    audit_list.set_defaults(func=_audit_list)

    dlq = sub.add_parser(
        "dlq", help="the dead letters of every unit (hooks, tenants, coordinators)"
    )
    dlq_sub = dlq.add_subparsers(dest="action", required=True, metavar="ACTION")
    dlq_list = add_redis_options(dlq_sub.add_parser("list", help="the newest dead letters"))
    dlq_list.add_argument("--hook", metavar="H", help="only the dead letters of this hook")
    dlq_list.add_argument("--limit", type=int, default=50, metavar="N", help="at most N (50)")
    dlq_list.set_defaults(func=_dlq_list)
    dlq_show = add_redis_options(dlq_sub.add_parser("show", help="every field of one dead letter"))
    dlq_show.add_argument("id", metavar="ID", help="its stream id (from dlq list)")
    dlq_show.set_defaults(func=_dlq_show)
    dlq_replay = add_redis_options(
        dlq_sub.add_parser("replay", help="re-feed an async hook's dead letters to it")
    )
    dlq_replay.add_argument("hook", metavar="HOOK", help="the async hook's name")
    dlq_replay.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    dlq_replay.set_defaults(func=_dlq_replay)
    dlq_purge = add_redis_options(dlq_sub.add_parser("purge", help="delete dead letters"))
    dlq_purge.add_argument("--hook", metavar="H", help="only the dead letters of this hook")
    dlq_purge.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    dlq_purge.set_defaults(func=_dlq_purge)

    tenants = add_redis_options(
        sub.add_parser(
            "tenants",
            help="the untrusted tenants the coordinator service and the gateway answer (add, "
            "remove, list)",
        )
    )
    tenants.add_argument("action", choices=["add", "remove", "list"])
    tenants.add_argument("name", nargs="?", help="the tenant (letters, digits, '_', '-')")
    tenants.add_argument("--by", default=who, help=f"who (goes to the audit trail; {who})")
    tenants.set_defaults(func=_tenants)

    repair = add_redis_options(
        sub.add_parser(
            "repair",
            help="repair a stream poisoned with ids beyond Redis's clock (a maximal id)",
            description=(
                "Entries whose ids are beyond Redis's clock (+ --slack) are dead-lettered and "
                "deleted, the stream's last id and every group beyond it are set back, so that "
                "XADD works again; consumer groups and every other entry stay. Recorded in the "
                "audit trail."
            ),
        )
    )
    repair.add_argument("stream", nargs="?", help="the stream's key")
    repair.add_argument("--tenant", help="the decisions stream of this tenant")
    repair.add_argument(
        "--slack", type=duration, default=60.0, metavar="DURATION",
        help="ids up to this far beyond Redis's clock are kept (60s)",
    )  # fmt: skip
    repair.add_argument("--by", default=who, help=f"who (goes to the audit trail; {who})")
    repair.set_defaults(func=_repair)

    metrics = add_redis_options(
        sub.add_parser("metrics", help="figures collected by metrics hooks")
    )
    metrics.set_defaults(func=_metrics)
