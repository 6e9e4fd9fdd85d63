"""Redis itself crashes (SIGKILL) under load and comes back from its append-only file.

A publisher XADDs events as fast as Redis acknowledges them and keeps the id of every event
Redis acknowledged; agents keep asking the ``fail`` hook Guard; the async hook Ledger keeps
handling events. Redis is SIGKILLed mid-stream and restarted on the same directory.

* ``appendfsync always``: no acknowledged event is lost.
* ``appendfsync everysec``: Redis promises to lose at most about one second of writes, and only
  when the machine (not the process) crashes: a killed process leaves what it wrote in the page
  cache. The loss is measured against that bound and reported.

Either way every event that survived is handled by Ledger, every decision taken while Redis was
down fails closed within its deadline, and no tool runs unchecked. A frozen Redis (SIGSTOP: the
connections stay open, nothing answers) holds no decision past its deadline either.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import msgspec
import pytest
from redis.asyncio import Redis
from redis.exceptions import RedisError

from agent_adapter.client import HookClient
from bus import HookEvent, HookSettings
from bus.protocol import EventMessage, encode, new_id, now_ms
from bus.settings import BusSettings
from bus.transport.keys import Keys
from tests.chaos.conftest import Freezer, Ledger
from tests.chaos.load import CHAOS_EVENTS_MAXLEN, GUARD_TIMEOUT, GuardedAgents, Services
from tests.harness import Processes, wait_for, wait_live
from workers.local.redis_server import RedisServer
from workers.testing import context

pytestmark = pytest.mark.timeout(240)

BEFORE, DOWN, AFTER = 2.0, 1.0, 2.0  # seconds of load before the crash, of outage, after
EVERYSEC_BOUND = 2.0  # seconds of acknowledged writes everysec may lose (1 s, plus slack)


@pytest.fixture(params=["always", "everysec"])
def aof_redis(request: pytest.FixtureRequest) -> Any:
    server = RedisServer(extra=["--appendonly", "yes", "--appendfsync", request.param])
    with server:
        yield request.param, server


async def publish_until(
    redis: Redis, keys: Keys, stop: asyncio.Event, acked: dict[str, float]
) -> int:
    """XADD events one at a time until ``stop``; ``acked`` gets each acknowledged event's id
    and when. Returns how many XADDs Redis refused or never answered (the publisher knows
    those were not stored, and would retry them)."""
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
            acked[message.id] = time.monotonic()
        except (RedisError, OSError):
            refused += 1
            await asyncio.sleep(0.01)
    return refused


def private_settings(server: RedisServer) -> BusSettings:
    return BusSettings(
        redis_url=server.url,
        prefix="chaos",
        heartbeat_secs=0.2,
        liveness_secs=1.0,
        claim_idle_secs=0.5,
        refresh_secs=0.2,
        events_maxlen=CHAOS_EVENTS_MAXLEN,
    )


async def test_a_redis_crash_loses_no_acknowledged_event_and_fails_closed(
    aof_redis: tuple[str, RedisServer], procs: Processes, ledger: Ledger, tmp_path: Path
) -> None:
    fsync, server = aof_redis
    settings = private_settings(server)
    keys = Keys(settings.prefix)
    services = Services(procs, settings, tmp_path)
    acked: dict[str, float] = {}
    publisher = Redis.from_url(server.url, socket_timeout=2, socket_connect_timeout=1)
    async with HookClient(settings, HookSettings(hook_timeout_secs=GUARD_TIMEOUT)) as client:
        await wait_live(client, "Guard", replicas=2)
        await wait_for(lambda: "Ledger" in client.directory.async_hooks, what="Ledger")
        load = GuardedAgents(client)
        stop = asyncio.Event()
        agents = asyncio.create_task(load.run(4, stop))
        publishing = asyncio.create_task(publish_until(publisher, keys, stop, acked))
        await asyncio.sleep(BEFORE)  # load before the crash (a duration, not a synchronisation)
        server.kill()
        killed_at = time.monotonic()
        await asyncio.sleep(DOWN)  # the outage's duration
        # An XADD Redis answered just before the kill is seen by the publisher only once this
        # task yields, after killed_at: every acknowledgement stamped before the restart came
        # from the killed process, so the window runs to here, not to killed_at.
        restarting_at = time.monotonic()
        server.start()
        await asyncio.sleep(AFTER)  # load after the restart
        stop.set()
        refused = await publishing
        await agents
        await publisher.aclose()

        entries = await client.redis.xrange(keys.event_partitions[0])
        present = {msgspec.json.decode(fields[b"data"])["id"] for _, fields in entries}
        lost = [i for i in acked if i not in present]
        window = [i for i, t in acked.items() if killed_at - EVERYSEC_BOUND <= t < restarting_at]
        async_figures = await services.reconcile(client.redis, keys)

    ledger.add(
        appendfsync=fsync,
        **{"events acknowledged": len(acked), "refused while Redis was down": refused},
        **{"acknowledged then lost": len(lost)},
        **({"bound (acked in the last 2 s)": len(window)} if fsync == "everysec" else {}),
        **async_figures,
        **load.figures(),
    )  # fmt: skip
    assert refused > 0, "the publisher never saw the outage"
    assert acked
    if fsync == "always":
        assert lost == []
    else:
        beyond = {i: round(acked[i] - killed_at, 3) for i in set(lost) - set(window)}
        assert not beyond, f"lost beyond everysec's bound (s after the kill): {beyond}"
    assert load.outcomes[load.BLOCKED] > 0, "no decision was taken while Redis was down"
    load.check()


async def test_a_frozen_redis_holds_no_decision_past_its_deadline(
    procs: Processes, freezer: Freezer, ledger: Ledger, tmp_path: Path
) -> None:
    """Redis SIGSTOPped for 2.5 s under load: connections stay open but nothing answers.
    Every decision still ends within its deadline (failing closed), and service resumes."""
    with RedisServer() as server:
        settings = private_settings(server)
        Services(procs, settings, tmp_path, ledgers=0)
        async with HookClient(settings, HookSettings(hook_timeout_secs=GUARD_TIMEOUT)) as client:
            await wait_live(client, "Guard", replicas=2)
            load = GuardedAgents(client)
            stop = asyncio.Event()
            agents = asyncio.create_task(load.run(4, stop))
            await asyncio.sleep(BEFORE)  # load before the freeze
            assert server.proc is not None
            freezer.freeze(server.proc)
            await asyncio.sleep(2.5)  # the freeze's duration
            frozen_decisions = load.outcomes[load.BLOCKED]
            freezer.thaw(server.proc)
            checked_before = load.outcomes["checked"]
            await wait_for(lambda: load.outcomes["checked"] > checked_before + 100, 30,
                           "decisions to be checked again after the thaw")  # fmt: skip
            stop.set()
            await agents
    ledger.add(faults="1x SIGSTOP redis-server 2.5s", **load.figures())
    assert frozen_decisions > 0, "no decision was taken while Redis was frozen"
    load.check()
