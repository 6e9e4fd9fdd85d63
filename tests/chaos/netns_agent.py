"""The agent side of the network-namespace chaos test, run inside the agent's namespace.

``ip netns exec NS python -m tests.chaos.netns_agent --redis URL --handled FILE --progress FILE
--out FILE``

It runs what ``tests/chaos/load.py`` runs in the other chaos tests — closed-loop agents asking
the ``fail`` hook Guard through a ``HookClient`` — plus a publisher that XADDs events and keeps
the id of every one Redis acknowledged. While it runs it rewrites ``--progress`` (JSON: the
decisions so far and Guard's live replicas as the client sees them) for the test to wait on.
On SIGTERM it stops the load, checks every acknowledged event is still in ``{p}:events``, waits
until the async hook Ledger has handled every event there, and writes its figures to ``--out``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import msgspec
from redis.asyncio import Redis
from redis.exceptions import RedisError

from agent_adapter.client import HookClient
from bus import HookEvent, HookSettings
from bus.protocol import EventMessage, encode, new_id, now_ms
from bus.settings import BusSettings
from bus.transport.keys import Keys
from tests.chaos.load import CHAOS_EVENTS_MAXLEN, GUARD_TIMEOUT, GuardedAgents, reconcile
from tests.harness import wait_for
from workers.testing import context


def settings_for(url: str) -> BusSettings:
    return BusSettings(
        redis_url=url,
        prefix="chaos",
        heartbeat_secs=0.2,
        liveness_secs=1.0,
        claim_idle_secs=0.5,
        refresh_secs=0.2,
        events_maxlen=CHAOS_EVENTS_MAXLEN,
    )


async def publish_until(redis: Redis, keys: Keys, stop: asyncio.Event, acked: list[str]) -> int:
    """XADD events one at a time until ``stop``; ``acked`` gets the id of each one Redis
    acknowledged. Returns how many XADDs failed or timed out (the publisher knows those were
    not acknowledged, and would retry them)."""
    encoded = msgspec.Raw(msgspec.json.encode(context(HookEvent.ON_STEP_COMPLETE)))
    refused = 0
    while not stop.is_set():
        message = EventMessage(
            id=new_id(),
            ts=now_ms(),
            event=HookEvent.ON_STEP_COMPLETE,
            session_id="publisher",
            context=encoded,
        )
        try:
            await redis.xadd(keys.event_partitions[0], {"data": encode(message)})
            acked.append(message.id)
        except (RedisError, OSError):
            refused += 1
            await asyncio.sleep(0.01)
    return refused


def write_json(path: Path, data: dict[str, Any]) -> None:
    partial = path.with_suffix(".partial")
    partial.write_text(json.dumps(data))
    os.replace(partial, path)  # the test never reads half a file


async def run(args: argparse.Namespace) -> None:
    settings = settings_for(args.redis)
    keys = Keys(settings.prefix)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    # The publisher's own connection, with a short timeout: an XADD lost in a partition is
    # given up (and counted as refused) rather than waited on for redis-py's default.
    publisher = Redis.from_url(args.redis, socket_timeout=2, socket_connect_timeout=1)
    async with HookClient(settings, HookSettings(hook_timeout_secs=GUARD_TIMEOUT)) as client:

        def guards() -> int:
            target = client.directory.by_name.get("Guard")
            return target.replicas if target is not None else 0

        await wait_for(lambda: guards() == 2, 60, "both Guard replicas to be live")
        await wait_for(lambda: "Ledger" in client.directory.async_hooks, 60, "Ledger")
        load = GuardedAgents(client)
        acked: list[str] = []
        agents = asyncio.create_task(load.run(args.agents, stop))
        publishing = asyncio.create_task(publish_until(publisher, keys, stop, acked))
        while not stop.is_set():
            write_json(
                args.progress,
                {**load.outcomes, "guard replicas": guards(), "acknowledged": len(acked)},
            )
            await asyncio.sleep(0.05)  # the report's period, not a synchronisation
        stopped = time.monotonic()
        refused = await publishing
        await agents
        await publisher.aclose()

        entries = await client.redis.xrange(keys.event_partitions[0])
        present = {msgspec.json.decode(fields[b"data"])["id"] for _, fields in entries}
        lost = [i for i in acked if i not in present]
        async_figures = await reconcile(client.redis, keys, args.handled)
        figures = {
            "events acknowledged (publisher)": len(acked),
            "not acknowledged (publisher knows)": refused,
            "acknowledged then lost": len(lost),
            "agent events not published (counted)": client.stats["publish_failures"],
            "late replies discarded": client.stats["late_replies"],
            **async_figures,
            **load.figures(),
            "reconciled in (s)": round(time.monotonic() - stopped, 1),
        }
    write_json(
        args.out,
        {
            "figures": figures,
            "outcomes": load.outcomes,
            "latencies": load.latencies,
            "ran": len(load.ran),
            "unchecked": sum(a != {"x": -1} for a in load.ran),
            "lost": lost,
        },
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--redis", required=True)
    parser.add_argument("--handled", type=Path, required=True, help="Ledger's record file")
    parser.add_argument("--progress", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--agents", type=int, default=4)
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
