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
import os
import sys
from collections.abc import Sequence

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoPermissionError, RedisClusterException, RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from bus.errors import HookBusError
from bus.logfmt import formatter
from workers.cli import check, deploy, mcp, operate, policy, schema, serve
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
    policy.register(sub)
    mcp.register(sub)
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
    kind = os.environ.get("HOOKBUS_LOG_FORMAT", "text")
    try:
        handler.setFormatter(formatter(kind, "%(asctime)s %(levelname)s %(name)s: %(message)s"))
    except HookBusError as exc:
        print(f"hookbus: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO, handlers=[handler])
    try:
        code: int = args.func(args)
    except HookBusError as exc:
        print(f"hookbus: {exc}", file=sys.stderr)
        return 2
    except (RedisError, RedisClusterException) as exc:
        if (denied := _denied(exc)) is not None:  # a NOPERM, however the client wrapped it
            print(f"hookbus: {_denied_line(denied, redis_url(args))}", file=sys.stderr)
        elif isinstance(exc, RedisConnectionError | RedisTimeoutError | RedisClusterException):
            print(f"hookbus: cannot reach Redis at {redis_url(args)}: {exc}", file=sys.stderr)
        else:
            print(f"hookbus: Redis answered with an error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return code


def _denied(exc: BaseException) -> NoPermissionError | None:
    """The NOPERM behind ``exc``: itself, or what it was raised from (a cluster client that may
    not run CLUSTER SLOTS says "Cluster mode is not enabled on this node")."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, NoPermissionError):
            return current
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return None


def _denied_line(exc: NoPermissionError, url: str) -> str:
    """One line: which Redis user may not run which command (from the message, or the
    arguments of the redis-py call that sent it), and where to look."""
    import re
    import urllib.parse

    user = urllib.parse.urlsplit(url).username or "default"
    command = ""
    if quoted := re.search(r"run the '([^']+)' command", str(exc)):
        command = quoted.group(1)
    tb = exc.__traceback__
    while tb is not None:  # innermost last: the call that sent the command
        sent = tb.tb_frame.f_locals.get("args")
        if isinstance(sent, tuple) and sent and isinstance(sent[0], str | bytes) and not command:
            words = [w.decode() if isinstance(w, bytes) else str(w) for w in sent[:2]]
            command = " ".join(words) if words[0].upper() in _CONTAINERS else words[0]
        tb = tb.tb_next
    what = command.replace("|", " ").upper() or "a command"
    return (
        f"Redis user {user} may not run {what} ({exc}): its ACL rules lack it; generate them "
        "with `hookbus acl` (--cluster on a Redis Cluster) and see docs/security.md"
    )


#: Commands whose first argument is a subcommand (ACL rules name them as COMMAND|SUB).
_CONTAINERS = frozenset(
    {
        "CLUSTER",
        "XINFO",
        "XGROUP",
        "CLIENT",
        "CONFIG",
        "ACL",
        "SCRIPT",
        "COMMAND",
        "FUNCTION",
        "OBJECT",
        "MEMORY",
    }
)
