"""The dead-letter commands (``hookbus dlq list|show|replay|purge``, ``hookbus replay --dlq``)
and ``hookbus partitions``: thin wrappers over workers/ops/dead_letters.py, workers/ops/replay.py
and workers/ops/hooks.py that print, ask for confirmation on a terminal (``--yes`` otherwise) and
show progress. Registered by workers/cli/operate.py."""

from __future__ import annotations

import argparse
import datetime as dt
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

from bus.settings import BusSettings
from workers.cli.common import UsageError, settings_of, with_redis

if TYPE_CHECKING:
    from redis.asyncio import Redis

    from bus.transport.keys import Keys


def _partitions(args: argparse.Namespace) -> int:
    """Show the bus's partition count, or (N --force, the operator only) set it."""
    from bus.transport.keys import MAX_PARTITIONS
    from workers.ops.hooks import bus_partitions

    if args.count is not None and not 1 <= args.count <= MAX_PARTITIONS:
        raise UsageError(f"the partition count must be 1-{MAX_PARTITIONS}")

    async def work(redis: Redis, keys: Keys, settings: BusSettings) -> int:
        current = await bus_partitions(redis, keys)
        if args.count is None:
            print(current if current is not None else f"not set in {keys.config}")
            return 0
        if current is not None and current != args.count and not args.force:
            print(f"hookbus: the bus has {current} partitions; pass --force to make it "
                  f"{args.count} (only with every process of the bus stopped)",
                  file=sys.stderr)  # fmt: skip
            return 2
        await redis.hset(keys.config, "partitions", str(args.count))  # type: ignore[misc]
        print(f"partitions: {args.count} ({keys.config}); start every process with "
              f"HOOKBUS_PARTITIONS={args.count}")  # fmt: skip
        return 0

    return with_redis(args, work)


def _dlq_list(args: argparse.Namespace) -> int:
    from bus.transport.keys import check_name
    from workers.ops.dead_letters import cut_dead_letters, list_dead_letters
    from workers.ops.render import make_console, render_dead_letters

    hook = check_name("hook name", args.hook) if args.hook else None
    if args.limit <= 0:
        raise UsageError("--limit must be a positive number of entries")

    async def work(redis: Redis, keys: Keys, settings: BusSettings) -> None:
        letters, more = await list_dead_letters(redis, keys, hook, args.limit)
        cuts = await cut_dead_letters(redis, keys, hook)
        make_console().print(render_dead_letters(letters, more, keys, hook, cuts))

    with_redis(args, work, reads_only=True)
    return 0


def _dlq_show(args: argparse.Namespace) -> int:
    from workers.ops.dead_letters import check_stream_id, get_dead_letter
    from workers.ops.render import make_console, render_dead_letter

    entry_id = check_stream_id(args.id)

    async def work(redis: Redis, keys: Keys, settings: BusSettings) -> int:
        letter = await get_dead_letter(redis, keys, entry_id)
        if letter is None:
            print(f"hookbus: no dead letter {entry_id} in any unit", file=sys.stderr)
            return 1
        make_console().print(render_dead_letter(letter))
        return 0

    return with_redis(args, work, reads_only=True)


def _with_progress(
    total: int, what: str, run: Callable[[Callable[[int], None] | None], int]
) -> int:
    """``run(progress)``, with a progress bar on stderr when there are many entries."""
    from rich.progress import Progress

    from workers.ops.common import MANY
    from workers.ops.render import make_console

    if total < MANY:
        return run(None)
    with Progress(console=make_console(stderr=True), transient=True) as bar:
        task = bar.add_task(what, total=total)
        return run(lambda n: bar.advance(task, n))


def _dlq_replay(args: argparse.Namespace) -> int:
    from bus.transport.keys import check_name

    return _replay_dead_letters(args, check_name("hook name", args.hook))


def _confirm(question: str, yes: bool, refused: str) -> bool | None:
    """True to go on; False if the operator said no; None (after saying why on stderr) if
    there is no terminal to ask on and no --yes."""
    if yes:
        return True
    if not sys.stdin.isatty():
        print(f"hookbus: {refused} without confirmation; stdin is not a terminal, so pass --yes",
              file=sys.stderr)  # fmt: skip
        return None
    from rich.prompt import Confirm

    try:
        return bool(Confirm.ask(question, default=False))
    except EOFError:
        return False


def _replay_dead_letters(args: argparse.Namespace, hook: str) -> int:
    """``hookbus replay HOOK --dlq`` and ``hookbus dlq replay HOOK``: show what would be
    re-fed (only letters of the hook's own stream, whole messages only), ask, re-feed."""
    from workers.ops.hooks import list_hooks
    from workers.ops.replay import DeadLetterPlan, check_replayable, plan_dead_letters
    from workers.ops.replay import replay_dead_letters as refeed

    async def plan(redis: Redis, keys: Keys, settings: BusSettings) -> tuple[DeadLetterPlan, int]:
        await check_replayable(redis, keys, hook)
        rows = [r for r in await list_hooks(redis, keys, settings.liveness_secs) if r.name == hook]
        return await plan_dead_letters(redis, keys, hook), rows[0].live if rows else 0

    p, live = with_redis(args, plan, reads_only=True)
    skipped = [
        f"{n} {what}"
        for n, what in (
            (p.cut, "whose message was cut to a prefix (only its size and digest are kept)"),
            (p.lost, "recording entries a stream's cap cut (no message)"),
            (p.empty, "with no message"),
        )
        if n
    ]
    if skipped:
        print(f"not re-fed, left in {p.stream}: " + "; ".join(skipped))
    if p.count == 0:
        print(f"no dead letters of {hook} to re-feed (from {p.stream}): nothing re-fed")
        return 0
    first = dt.datetime.fromtimestamp((p.first_ms or 0) / 1000, dt.UTC)
    last = dt.datetime.fromtimestamp((p.last_ms or 0) / 1000, dt.UTC)
    print(
        f"{_entries(p.count)} of {hook}'s own stream {p.stream} would be re-fed to it, written "
        f"{first:%Y-%m-%d %H:%M:%S} to {last:%Y-%m-%d %H:%M:%S} UTC; the first:"
    )
    for line in p.sample:
        print(f"  {line}")
    sure = _confirm(f"re-feed {_entries(p.count)} to {hook}?", args.yes, "not re-feeding")
    if sure is None:
        return 2
    if not sure:
        print("nothing re-fed")
        return 0

    def run(progress: Callable[[int], None] | None) -> int:
        async def work(redis: Redis, keys: Keys, settings: BusSettings) -> int:
            return await refeed(redis, keys, hook, p.upto, progress)

        return with_redis(args, work)

    done = _with_progress(p.count, f"re-feeding {hook}", run)
    print(f"re-fed {_entries(done)} to {hook}")
    if not live:
        print(f"note: {hook} has no live replica; they wait in {keys_replay(args, hook)} until "
              "one starts")  # fmt: skip
    return 0


def keys_replay(args: argparse.Namespace, hook: str) -> str:
    from bus.transport.keys import Keys

    return Keys.of(settings_of(args)).replay(hook)


def _dlq_purge(args: argparse.Namespace) -> int:
    from bus.transport.keys import check_name
    from workers.ops.dead_letters import count_dead_letters, purge_dead_letters

    hook = check_name("hook name", args.hook) if args.hook else None
    whose = f" of {hook}" if hook else ""

    async def count(redis: Redis, keys: Keys, settings: BusSettings) -> tuple[int, dict[str, str]]:
        return await count_dead_letters(redis, keys, hook)

    total, newest = with_redis(args, count, reads_only=True)
    if total == 0 or not newest:
        print(f"no dead letters{whose}: nothing to delete")
        return 0
    units = f" in {len(newest)} units" if len(newest) > 1 else ""
    sure = _confirm(f"delete {_entries(total)}{whose}{units}?", args.yes,
                    f"not deleting {_entries(total)}{whose}")  # fmt: skip
    if sure is None:
        return 2
    if not sure:
        print("nothing deleted")
        return 0

    def run(progress: Callable[[int], None] | None) -> int:
        async def work(redis: Redis, keys: Keys, settings: BusSettings) -> int:
            return await purge_dead_letters(redis, keys, newest, progress)

        return with_redis(args, work)

    done = _with_progress(total, "deleting", run)
    print(f"deleted {_entries(done)}{whose}")
    return 0


def _entries(n: int) -> str:
    return f"{n} dead letter" + ("" if n == 1 else "s")
