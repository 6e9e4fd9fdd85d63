"""The ``hookbus`` command line: run the demo, serve hooks, coordinate, cancel sessions."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from collections.abc import Awaitable, Callable, Sequence

from bus.errors import HookBusError
from bus.settings import BusSettings


def _settings(args: argparse.Namespace) -> BusSettings:
    settings = BusSettings.from_env(redis_url=getattr(args, "redis", None))
    if getattr(args, "prefix", None):
        import msgspec

        settings = msgspec.structs.replace(settings, prefix=args.prefix)
    return settings


def _serve(main: Callable[[asyncio.Event], Awaitable[None]]) -> int:
    """Run a service until SIGTERM or Ctrl-C, then let it shut down cleanly."""

    async def runner() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await main(stop)

    asyncio.run(runner())
    return 0


def _demo(args: argparse.Namespace) -> int:
    from agent_adapter.demo import main as demo_main

    return demo_main(sys.stdout, redis_url=args.redis, embedded=args.embedded)


def _worker(args: argparse.Namespace) -> int:
    from bus.hooks import AsyncAgentHook
    from workers.async_worker import AsyncHookWorker
    from workers.replay import parse_position
    from workers.worker import HookWorker, load_hook

    hook = load_hook(args.hook)
    if isinstance(hook, AsyncAgentHook):
        service: HookWorker | AsyncHookWorker = AsyncHookWorker(
            hook,
            _settings(args),
            start=parse_position(args.start),
            batch_size=args.batch,
            max_deliveries=args.max_deliveries,
        )
    else:
        service = HookWorker(hook, _settings(args), scope=args.scope)
    return _serve(service.run)


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
    from workers.coordinator_service import CoordinatorService

    return _serve(CoordinatorService(_settings(args)).run)


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

    demo = with_redis(sub.add_parser("demo", help="run one scripted agent session"))
    demo.add_argument("--embedded", action="store_true", help="hooks in this process, no Redis")
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
    coordinator.set_defaults(func=_coordinator)

    cancel = with_redis(sub.add_parser("cancel", help="cancel a session wherever it runs"))
    cancel.add_argument("session_id")
    cancel.set_defaults(func=_cancel)
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
    except KeyboardInterrupt:
        return 130
    return code


if __name__ == "__main__":
    sys.exit(main())
