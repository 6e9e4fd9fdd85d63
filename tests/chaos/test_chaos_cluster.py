"""A Redis Cluster master is SIGKILLed under load and its replica is promoted.

A private cluster (3 masters, 3 replicas, ``cluster-node-timeout`` 1 s). Agents keep asking the
``fail`` hook Guard through a HookClient on the cluster; a publisher XADDs events the way the
coordinator does (``bus.transport.redis_io.xadd_batch``) and keeps the id of every event Redis
acknowledged; the async hook Ledger handles events. The master that holds the events stream is
SIGKILLed; its replica takes over.

* Decisions keep coming within their deadlines, failing closed during the window.
* Replication is asynchronous: an event the master acknowledged but had not yet sent to its
  replica is lost with the master. That loss is measured (default mode) and reported.
* The durable mode (``HOOKBUS_DURABLE_REPLICAS=1``: ``WAIT`` after each batch) counts an event
  as published only once the replica has it: no acknowledged event is lost.
"""

from __future__ import annotations

import asyncio
import gc
import time
from pathlib import Path
from typing import Any

import msgspec
import pytest

from agent_adapter.client import HookClient
from bus import HookEvent, HookSettings
from bus.protocol import EventMessage, encode, new_id, now_ms
from bus.settings import BusSettings
from bus.transport.keys import Keys
from bus.transport.redis_io import close, connect, xadd_batch
from tests.chaos.conftest import Ledger
from tests.chaos.load import CHAOS_EVENTS_MAXLEN, GUARD_TIMEOUT, GuardedAgents, Services
from tests.harness import Processes, wait_for, wait_live
from workers.local.redis_cluster import LocalCluster
from workers.ops.lag import consumer_lag
from workers.testing import context

pytestmark = pytest.mark.timeout(300)

BEFORE, AFTER = 2.0, 2.0  # seconds of load before the kill, and after the promotion


async def publish_until(
    settings: BusSettings, stop: asyncio.Event, acked: dict[str, float], refusals: list[float]
) -> int:
    """XADD events in batches of 8 until ``stop``; ``acked`` gets each acknowledged event's id
    and when, ``refusals`` when each refused one was refused. Returns how many were refused
    (the publisher knows those were not stored)."""
    redis = connect(settings)
    keys = Keys(settings.prefix)
    encoded = msgspec.Raw(msgspec.json.encode(context(HookEvent.ON_STEP_COMPLETE)))
    refused = 0
    try:
        while not stop.is_set():
            messages = [
                EventMessage(
                    id=new_id(),
                    ts=now_ms(),
                    event=HookEvent.ON_STEP_COMPLETE,
                    session_id="publisher",
                    context=encoded,
                )
                for _ in range(8)
            ]
            results = await xadd_batch(
                redis,
                [(keys.event_partitions[0], encode(m), settings.events_maxlen) for m in messages],
                replicas=settings.durable_replicas,
                wait_ms=settings.durable_wait_ms,
            )
            for message, result in zip(messages, results, strict=True):
                if isinstance(result, Exception):
                    refused += 1
                    refusals.append(time.monotonic())
                else:
                    acked[message.id] = time.monotonic()
            if any(isinstance(r, Exception) for r in results):
                await asyncio.sleep(0.01)
    finally:
        await close(redis)
    return refused


async def losses_reported(redis: Any, keys: Keys, settings: BusSettings) -> int:
    """What the hard cap is said to have cut from Ledger's group (nothing was cut: the stream
    stays below its cap): its lost counter and ``hookbus lag``'s LOST, once Ledger's group has
    read to the stream's end on the promoted master (where a reset counter shows)."""
    stream = keys.event_partitions[0]

    async def at_end() -> bool:
        info: Any = await redis.xinfo_stream(stream)
        groups: Any = await redis.xinfo_groups(stream)
        ledger = next(g for g in groups if g["name"] == b"Ledger")
        return bool(ledger["last-delivered-id"] == info["last-generated-id"])

    await wait_for(at_end, 60, "Ledger to read to the end of the events stream")
    rows = await consumer_lag(redis, keys, settings.events_maxlen, settings.requests_maxlen)
    shown = sum(r.lost for r in rows if r.group == "Ledger")
    counted: Any = await redis.hgetall(keys.lost("Ledger"))
    return shown + sum(int(v) for v in counted.values())


# After a master dies, redis-py's cluster client rebuilds its node map and leaves the dropped
# nodes' connections to the garbage collector (bus/transport/redis_io.py closes those its own
# refresh drops; redis-py's internal refreshes it cannot reach). Those unclosed sockets to the dead
# master are what this test's fault leaves behind, not a leak of HookBus's: not errors here.
@pytest.mark.filterwarnings("ignore:unclosed:ResourceWarning")
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
@pytest.mark.parametrize("durable", [0, 1], ids=["async-replication", "durable"])
async def test_a_master_killed_under_load_is_replaced_and_decisions_fail_closed(
    durable: int, procs: Processes, ledger: Ledger, tmp_path: Path
) -> None:
    with LocalCluster() as cluster:
        settings = BusSettings(
            redis_url=cluster.url.replace("redis://", "redis+cluster://", 1),
            prefix="chaos",
            heartbeat_secs=0.2,
            liveness_secs=1.0,
            claim_idle_secs=0.5,
            refresh_secs=0.2,
            events_maxlen=CHAOS_EVENTS_MAXLEN,
            durable_replicas=durable,
        )
        keys = Keys(settings.prefix)
        services = Services(procs, settings, tmp_path)
        acked: dict[str, float] = {}
        refusals: list[float] = []
        async with HookClient(settings, HookSettings(hook_timeout_secs=GUARD_TIMEOUT)) as client:
            await wait_live(client, "Guard", replicas=2)
            await wait_for(lambda: "Ledger" in client.directory.async_hooks, what="Ledger")
            load = GuardedAgents(client)
            stop = asyncio.Event()
            agents = asyncio.create_task(load.run(4, stop))
            publishing = asyncio.create_task(publish_until(settings, stop, acked, refusals))
            await asyncio.sleep(BEFORE)  # load before the kill (a duration, not a synchronisation)
            victim = client.redis.get_node_from_key(keys.event_partitions[0]).port  # type: ignore[attr-defined]
            cluster.kill_master(victim)
            killed_at = time.monotonic()
            await asyncio.to_thread(cluster.wait_promoted, victim)
            promoted_at = time.monotonic()
            promoted_after = promoted_at - killed_at
            blocked_in_window = load.outcomes[load.BLOCKED]
            checked = load.outcomes["checked"]
            await wait_for(lambda: load.outcomes["checked"] > checked + 50, 60,
                           "decisions to be checked again after the promotion")  # fmt: skip
            await asyncio.sleep(AFTER)  # load after the promotion
            stop.set()
            refused = await publishing
            await agents

            entries = await client.redis.xrange(keys.event_partitions[0])
            present = {msgspec.json.decode(fields[b"data"])["id"] for _, fields in entries}
            lost = [i for i in acked if i not in present]
            async_figures = await services.reconcile(client.redis, keys)
            false_losses = await losses_reported(client.redis, keys, settings)

    ledger.add(
        mode="durable (WAIT 1)" if durable else "asynchronous replication",
        **{"promotion took (s)": f"{promoted_after:.1f}"},
        **{"events acknowledged": len(acked), "refused during failover": refused},
        # Durable mode: the promoted master has no replica left, so WAIT 1 fails until one is
        # back (a replica restarted, or migrated from a master that has two).
        **{"refused after the promotion": sum(t > promoted_at for t in refusals)},
        **{"acknowledged then lost": len(lost)},
        **{"blocked while failing over": blocked_in_window},
        **async_figures,
        **{"losses reported (none was cut)": false_losses},
        **load.figures(),
    )  # fmt: skip
    # The sockets redis-py left to the dead master are collected now, under this test's
    # filters, not in whichever test the garbage collector happens to run next.
    gc.collect()
    assert acked and refused > 0, "the publisher never saw the failover"
    if durable:
        assert lost == [], f"{len(lost)} acknowledged events lost in durable mode"
    # The promoted replica kept Ledger's last-delivered-id, not its entries-read: no loss.
    assert false_losses == 0, f"the failover was reported as {false_losses} entries lost"
    load.check()
