"""The ``hookbus`` command line: run the demo, serve hooks, coordinate, cancel sessions, and
look at a running bus (``hooks list``, ``lag``, ``events tail``, ``dlq …``, ``metrics``); health
checks for containers (``check``, ``worker … --check``, ``coordinator --check``) and the whole
stack as local processes (``up``).

One module per command group: ``serve`` (demo, worker, coordinator, up), ``operate`` (hooks,
lag, events, dlq, metrics, replay, cancel, breakglass, audit), ``check`` (health checks),
``schema``, ``deploy`` (acl); ``common`` holds what they share. The command line belongs to the
services' side: ``bus`` (the core) never imports it.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisClusterException, RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from bus.errors import HookBusError
from bus.logfmt import LineFormatter
from workers.cli import check, deploy, operate, schema, serve
from workers.cli.common import redis_url

__all__ = ["build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hookbus", description="Lifecycle hooks for AI agents, embedded or over Redis."
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log at debug level")
    parser.add_argument("--version", action="version", version=f"hookbus {_version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    serve.register(sub)
    check.register(sub)
    schema.register(sub)
    operate.register(sub)
    deploy.register(sub)
    _verbose_everywhere(sub)
    return parser


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("hookbus")
    except PackageNotFoundError:  # run from a checkout that was never installed
        return "unknown (not installed)"


def _verbose_everywhere(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``-v`` after the command too (``hookbus worker X -v``), not only before it. SUPPRESS:
    a command's own default must not overwrite a ``-v`` given before the command."""
    for parser in set(sub.choices.values()):
        parser.add_argument(
            "-v", "--verbose", action="store_true", default=argparse.SUPPRESS,
            help="log at debug level",
        )  # fmt: skip
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                _verbose_everywhere(action)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from bus.settings import unknown_variables

    if unknown := unknown_variables():  # one line at start-up: a typo otherwise means a default
        print(
            f"hookbus: warning: unknown environment variable{'s' if len(unknown) > 1 else ''} "
            f"{', '.join(unknown)}: ignored (docs/protocol.md, section 2, lists those read)",
            file=sys.stderr,
        )
    handler = logging.StreamHandler()  # every line one line, whatever it quotes: bus/logfmt.py
    handler.setFormatter(LineFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO, handlers=[handler])
    try:
        code: int = args.func(args)
    except HookBusError as exc:
        print(f"hookbus: {exc}", file=sys.stderr)
        return 2
    except (RedisConnectionError, RedisTimeoutError, RedisClusterException) as exc:
        print(f"hookbus: cannot reach Redis at {redis_url(args)}: {exc}", file=sys.stderr)
        return 2
    except RedisError as exc:
        print(f"hookbus: Redis answered with an error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return code
