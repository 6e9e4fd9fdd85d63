"""The commands that run the bus: ``demo``, ``worker``, ``coordinator``, ``gateway`` and ``up``."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys

from bus.settings import HookSettings
from bus.transport.keys import MAX_SHARDS
from workers.cli.check import add_check_options, coordinator_check, worker_check
from workers.cli.common import UsageError, add_redis_options, hook_config, serve, settings_of


def _demo(args: argparse.Namespace) -> int:
    from agent_adapter.demo import main as demo_main

    return demo_main(sys.stdout, redis_url=args.redis, embedded=args.embedded, attach=args.attach)


def _worker(args: argparse.Namespace) -> int:
    if args.check:
        return worker_check(args)
    from bus.hooks import AsyncAgentHook
    from workers.ops.replay import parse_position
    from workers.services.async_worker import AsyncHookWorker
    from workers.services.loading import load_hook
    from workers.services.worker import HookWorker

    hook = load_hook(args.hook, app_dir=args.app_dir, config=hook_config(args))
    if isinstance(hook, AsyncAgentHook):
        service: HookWorker | AsyncHookWorker = AsyncHookWorker(
            hook,
            settings_of(args),
            HookSettings.from_env(),
            start=parse_position(args.start),
            batch_size=args.batch,
            max_deliveries=args.max_deliveries,
        )
        return serve(service.run, "worker", service.health, service.settings.health_port)
    settings = settings_of(args)
    if not 1 <= args.shards <= MAX_SHARDS:
        raise UsageError(f"--shards must be 1-{MAX_SHARDS}")
    lanes = [
        HookWorker(hook, settings, scope=args.scope, shard=k, shards=args.shards, owns_hook=k == 0)
        for k in range(args.shards)
    ]

    async def run_lanes(stop: asyncio.Event) -> None:
        await asyncio.gather(*(lane.run(stop) for lane in lanes))

    # The probes follow the first lane: every lane shares the process and its Redis.
    return serve(run_lanes, "worker", lanes[0].health, settings.health_port)


def _coordinator(args: argparse.Namespace) -> int:
    if args.check:
        return coordinator_check(args)
    from workers.services.coordinator_service import CoordinatorService

    service = CoordinatorService(settings_of(args))
    return serve(service.run, "coordinator", service.health, service.settings.health_port)


def _up(args: argparse.Namespace) -> int:
    from workers.local.launcher import up

    url = args.redis or os.environ.get("HOOKBUS_REDIS_URL") or None
    if url is not None:
        settings_of(args)  # a malformed URL is said at once, in one line
    if args.stop_timeout <= 0:
        raise UsageError("--stop-timeout must be a positive number of seconds")
    return up(
        redis_url=url,
        prefix=args.prefix,
        demo=args.demo,
        once=args.once,
        log_dir=args.logs,
        stop_timeout=args.stop_timeout,
    )


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    demo = add_redis_options(sub.add_parser("demo", help="run one scripted agent session"))
    demo.add_argument("--embedded", action="store_true", help="hooks in this process, no Redis")
    demo.add_argument(
        "--attach", action="store_true", help="use the hook services already running (compose)"
    )
    demo.set_defaults(func=_demo)

    worker = add_redis_options(sub.add_parser("worker", help="serve one hook over Redis"))
    worker.add_argument(
        "hook", metavar="MODULE:CLASS", help="e.g. workers.builtins.demo_hooks:SecretGuard"
    )
    worker.add_argument(
        "--shards",
        type=int,
        default=1,
        metavar="N",
        help="a sync hook's requests spread over N streams (a hot hook on a Redis Cluster); "
        "every replica serves all N, and every replica must be given the same N",
    )
    worker.add_argument(
        "--app-dir",
        default=".",
        metavar="DIR",
        help="import MODULE from this directory first (default: the current directory)",
    )
    worker.add_argument(
        "--set",
        dest="set_values",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a keyword argument for the hook class's constructor (repeatable); VALUE is read as "
        'JSON when it is JSON (3, true, ["a"], {"k": 1}), else as a string',
    )
    worker.add_argument(
        "--config",
        metavar="FILE",
        help="a JSON object of keyword arguments for the hook class's constructor (--set wins)",
    )
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
    add_check_options(
        worker, "the hook has a live replica (heartbeat within HOOKBUS_LIVENESS_SECS)"
    )
    worker.set_defaults(func=_worker)

    coordinator = add_redis_options(
        sub.add_parser("coordinator", help="answer decision requests from agents in any language")
    )
    add_check_options(
        coordinator,
        "a coordinator replica is live (heartbeat in PREFIX:coordinators within "
        "HOOKBUS_LIVENESS_SECS)",
    )
    coordinator.set_defaults(func=_coordinator)

    # its options and run(); Starlette on demand
    from workers.cli import gateway as gateway_command

    gateway = add_redis_options(
        sub.add_parser("gateway", help="decisions over HTTP (bearer token per tenant)")
    )
    gateway_command.add_arguments(gateway)
    gateway.set_defaults(func=gateway_command.run)

    up = add_redis_options(
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
