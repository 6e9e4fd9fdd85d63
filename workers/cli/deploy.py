"""Deploy tooling: ``hookbus acl`` prints a deployment's Redis ACL users (workers/ops/acl.py)."""

from __future__ import annotations

import argparse
import shlex
import sys

from workers.cli.common import UsageError


def _acl(args: argparse.Namespace) -> int:
    from workers.ops.acl import P, hook_user_of, render, split_list

    hooks = [hook_user_of(h, args.app_dir) for h in split_list(args.hooks)]
    tenants = split_list(args.tenants)
    if not hooks:
        raise UsageError("--hooks: name at least one hook service (MODULE:CLASS or NAME)")
    command = ["hookbus", "acl", "--hooks", args.hooks]
    if tenants:
        command += ["--tenants", args.tenants]
    if args.prefix != P:
        command += ["--prefix", args.prefix]
    text = render(hooks, tenants, args.prefix, shlex.join(command))
    if args.output and args.output != "-":
        with open(args.output, "w", encoding="utf-8") as out:
            out.write(text)
    else:
        sys.stdout.write(text)
    return 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    acl = sub.add_parser(
        "acl",
        help="print the Redis ACL users: the shared roles, one per hook, one per tenant",
        description=(
            "Print a Redis ACL file: the roles coordinator, agent and operator, a user "
            "hook-NAME per hook service (only its own keys) and a user tenant-NAME per "
            "untrusted tenant (only its own decisions stream and inboxes). No passwords: "
            "deploy/redis/start.sh adds them. See docs/security.md."
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
    acl.add_argument("-o", "--output", metavar="FILE", help="write it there, not to stdout")
    acl.set_defaults(func=_acl)
