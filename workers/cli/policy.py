"""``hookbus policy check FILE`` and ``hookbus policy test FILE PAYLOAD.json``: a rules file
(workers/builtins/policy.py) linted, and asked about one event, without Redis."""

from __future__ import annotations

import argparse
import sys
from typing import Any


def _check(args: argparse.Namespace) -> int:
    from workers.builtins.policy import check_file, load_rules

    problems = check_file(args.file)
    for problem in problems:
        print(f"{args.file}: {problem}")
    if problems:
        return 1
    rules = load_rules(args.file)
    print(f"{args.file}: ok, {len(rules.rules)} rules")
    return 0


def read_payload(path: str) -> tuple[str, Any]:
    """The event and context in ``path``: HookBus's ``{"event": …, "context": {…}}`` (a
    decision request's), or Claude Code's hook input (``hook_event_name``, ``tool_input``…).
    Raises ConfigError saying why it is neither."""
    import msgspec

    from bus.errors import ConfigError, HookBusError
    from bus.events import HookEvent
    from bus.protocol import decode_context

    try:
        with open(path, "rb") as f:
            body = f.read()
        data = msgspec.json.decode(body)
    except OSError as exc:
        raise ConfigError(f"{path}: {exc.strerror or exc}") from None
    except msgspec.DecodeError as exc:
        raise ConfigError(f"{path}: not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: must hold a JSON object")
    try:
        if "hook_event_name" in data:
            from workers.integrations.claude_code import to_hookbus

            call = to_hookbus(body)
            if call is None:
                raise ConfigError(f"{path}: {data['hook_event_name']} has no HookBus event")
            return call.event.value, call.ctx
        if "event" not in data or not isinstance(data.get("context"), dict):
            raise ConfigError(
                f'{path}: give {{"event": "PreToolUse", "context": {{…}}}} (HookBus) or a '
                "Claude Code hook input (hook_event_name, tool_name, tool_input…)"
            )
        event = HookEvent.parse(data["event"])
        return event.value, decode_context(event, msgspec.json.encode(data["context"]))
    except ConfigError:
        raise
    except HookBusError as exc:
        raise ConfigError(f"{path}: {exc}") from None


def _test(args: argparse.Namespace) -> int:
    import msgspec

    from workers.builtins.policy import PolicyError, decide, load_rules

    try:
        rules = load_rules(args.file)
    except PolicyError as exc:
        for problem in exc.problems:
            print(f"{args.file}: {problem}", file=sys.stderr)
        return 2
    event, ctx = read_payload(args.payload)
    answer, verdicts = decide(rules, event, ctx)
    width = max((len(r.name) for r, _ in verdicts), default=4)
    print(f"{event} {getattr(ctx, 'tool_name', '')}".rstrip())
    for rule, why in verdicts:
        said = "matches" if why is None else f"no: {why}"
        print(f"  {rule.name:<{width}}  {rule.decision:<7}  {said}")
    print(f"answer: {msgspec.json.encode(answer).decode()}")
    return 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    policy = sub.add_parser("policy", help="rules files of the Policy hook: lint, try")
    actions = policy.add_subparsers(dest="policy_command", required=True, metavar="ACTION")
    check = actions.add_parser(
        "check",
        help="lint a rules file: unknown keys, bad patterns, unreachable rules, patterns that "
        "can never match (exit 1, one line per problem)",
    )
    check.add_argument("file", metavar="FILE", help="the rules file (TOML)")
    check.set_defaults(func=_check)
    test = actions.add_parser(
        "test", help="what each rule decides for one event payload, and the answer (no Redis)"
    )
    test.add_argument("file", metavar="FILE", help="the rules file (TOML)")
    test.add_argument(
        "payload",
        metavar="PAYLOAD.json",
        help='{"event": "PreToolUse", "context": {...}}, or a Claude Code hook input',
    )
    test.set_defaults(func=_test)
