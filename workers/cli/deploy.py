"""Deploy tooling: ``hookbus acl`` writes a deployment's Redis ACL users (workers/ops/acl.py)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from workers.cli.common import UsageError


def _acl(args: argparse.Namespace) -> int:
    from workers.ops.acl import Options, explain, hook_user_of, read_passwords, render, split_list
    from workers.ops.acl import users as all_users

    hooks = [hook_user_of(h, args.app_dir) for h in split_list(args.hooks)]
    tenants = split_list(args.tenants)
    if not hooks:
        raise UsageError("--hooks: name at least one hook service (MODULE:CLASS or NAME)")
    if args.explain:
        sys.stdout.write(explain(hooks, tenants, args.prefix))
        return 0
    version = _version(args.redis_version)
    names = [user for user, _, _ in all_users(hooks, tenants, args.prefix)]
    passwords = read_passwords(args.password_dir, names) if args.password_dir else None
    options = Options(setinfo=version >= (7, 2), cluster=args.cluster, passwords=passwords)
    text = render(hooks, tenants, args.prefix, options)
    if args.apply:
        if passwords is None:
            raise UsageError(
                "--apply needs --password-dir: a user without a password is locked out"
            )
        return _apply(args, text)
    if args.output and args.output != "-":
        with open(args.output, "w", encoding="utf-8") as out:
            out.write(text)
    else:
        sys.stdout.write(text)
    return 0


def _version(text: str) -> tuple[int, int]:
    major, _, minor = text.partition(".")
    if not (major.isdigit() and minor.split(".")[0].isdigit()):
        raise UsageError(f"--redis-version {text!r}: write it as MAJOR.MINOR, e.g. 7.2")
    if (int(major), int(minor.split(".")[0])) < (7, 0):
        raise UsageError("--redis-version: HookBus's users need Redis >= 7.0 (ACL selectors)")
    return int(major), int(minor.split(".")[0])


def _apply(args: argparse.Namespace, text: str) -> int:
    """Each line of ``text`` as ``ACL SETUSER user reset rules…`` on the running Redis
    (HOOKBUS_REDIS_URL, as the admin user): a user's connections stay open and authenticated;
    new ones need one of its passwords now. ``ACL LOAD`` would close every connection of every
    user it loads (Redis 7.0), which drops what they were waiting for."""
    from workers.cli.common import redis_url, with_redis

    commands = []
    for line in text.splitlines():
        _, user, rules = line.split(" ", 2)
        commands.append([user, "reset", *_rule_args(rules)])

    async def work(redis: Any, *_: Any) -> int:
        from redis.asyncio import RedisCluster

        # ACL rules are per node: on a cluster, set them on every node (replicas too).
        where = {"target_nodes": RedisCluster.ALL_NODES} if isinstance(redis, RedisCluster) else {}
        for command in commands:
            await redis.execute_command("ACL", "SETUSER", *command, **where)
        return len(commands)

    count = with_redis(args, work)
    print(f"ok: {count} Redis users set with ACL SETUSER on {redis_url(args)}")
    return 0


def _rule_args(rules: str) -> list[str]:
    """A user line's rules as ACL SETUSER's arguments: a ``(…)`` selector is one argument."""
    out, depth, current = [], 0, ""
    for word in rules.split(" "):
        current = f"{current} {word}" if current else word
        depth += word.count("(") - word.count(")")
        if depth == 0:
            out.append(current)
            current = ""
    return out


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    acl = sub.add_parser(
        "acl",
        help="write the Redis ACL users: the shared roles, one per hook, one per tenant",
        description=(
            "Write a Redis ACL file that redis-server loads as it is (--aclfile, ACL LOAD): the "
            "roles coordinator, agent, operator, scaler and admin, a user hook-NAME per hook "
            "service (only its own keys) and a user tenant-NAME per untrusted tenant (only its "
            "own decisions stream and inboxes). Passwords from --password-dir, as SHA-256 "
            "hashes; without it none (deploy/redis/start.sh adds them). See docs/security.md."
        ),
    )
    acl.add_argument(
        "--hooks", required=True, metavar="H,H",
        help="the hook services: MODULE:CLASS (read from the class), NAME (a sync hook) or "
        "NAME=async",
    )  # fmt: skip
    acl.add_argument("--tenants", default="", metavar="T,T", help="the untrusted tenants")
    acl.add_argument("--prefix", default="hookbus", help="the key prefix (hookbus)")
    acl.add_argument(
        "--app-dir", default=".", metavar="DIR",
        help="import MODULE from this directory first (default: the current directory), as "
        "`hookbus worker` does",
    )  # fmt: skip
    acl.add_argument(
        "--password-dir", metavar="DIR",
        help="each user's password from the file DIR/USER (one per line: during a rotation, "
        "the old and the new), written as its SHA-256 hash",
    )  # fmt: skip
    acl.add_argument(
        "--redis-version", default="7.0", metavar="X.Y",
        help="the oldest Redis server the file is for (7.0); 7.2 or later adds +client|setinfo",
    )  # fmt: skip
    acl.add_argument(
        "--cluster", action="store_true",
        help="for a Redis Cluster: add COMMAND, CLUSTER SLOTS/SHARDS/NODES and ASKING, which "
        "cluster clients send",
    )  # fmt: skip
    acl.add_argument(
        "--explain", action="store_true",
        help="print what each user is for, as comments (not a file Redis loads)",
    )  # fmt: skip
    acl.add_argument(
        "--apply", action="store_true",
        help="set the users on the running Redis of HOOKBUS_REDIS_URL (as admin) with ACL "
        "SETUSER, keeping every connection: how to rotate a password without a restart",
    )  # fmt: skip
    acl.add_argument("--redis", metavar="URL", help="--apply: Redis URL ($HOOKBUS_REDIS_URL)")
    acl.add_argument("-o", "--output", metavar="FILE", help="write it there, not to stdout")
    acl.set_defaults(func=_acl)
