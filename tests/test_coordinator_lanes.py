"""The coordinator's write lanes (bus/transport/coordinator.py ``_flush``/``_send_lane``,
bus/transport/redis_io.py ``Lanes``), against a real redis-server, its sends slowed where a
case needs a slow Redis:

* A dispatch whose deadline passes while Redis hangs leaves nothing unsent: another
  dispatch's request queued behind it goes out, with no further traffic to carry it (the first
  lanes left it in the lane until an unrelated flush).
* Each send takes what its lane holds, once: under load, with every dispatch's send step
  bounded by a short deadline, no entry is written twice (a dispatch that kept sending the
  others' batches until its deadline was cancelled mid-send: 342 duplicates in one second).
"""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

import pytest

from bus.dispatch import _within
from bus.settings import BusSettings
from bus.transport import coordinator as coordinator_module
from bus.transport.coordinator import Coordinator
from tests.harness import wait_for

pytestmark = pytest.mark.redis


async def test_a_request_queued_behind_a_send_cut_short_still_goes_out(
    bus_settings: BusSettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    coordinator = Coordinator(bus_settings)
    real, calls = coordinator_module.xadd_batch, []

    async def first_hangs(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        if len(calls) == 1:
            await asyncio.sleep(2.0)  # Redis hangs for 2 s (a WAIT, a network blip)
        return await real(*args, **kwargs)

    monkeypatch.setattr(coordinator_module, "xadd_batch", first_hangs)
    loop = asyncio.get_running_loop()
    stream = f"{bus_settings.prefix}:lanes"
    for request_id in ("a", "b"):
        coordinator._waiting[request_id] = loop.create_future()

    async def dispatch(request_id: str, deadline: float) -> None:
        coordinator._enqueue(stream, request_id.encode(), 1000, request_id, False)
        await _within(lambda: coordinator._flush(stream), loop.time() + deadline)

    try:
        first = asyncio.create_task(dispatch("a", 0.5))  # its hook's timeout: 0.5 s
        await wait_for(lambda: bool(calls), 10, "the first send")
        await dispatch("b", 30)  # queued behind it
        await first

        async def both() -> bool:
            return await coordinator.redis.xlen(stream) >= 2

        await wait_for(both, 10, "both requests written")
        rows = await coordinator.redis.xrange(stream)
        assert sorted(f[b"data"] for _, f in rows) == [b"a", b"b"]
        assert not coordinator._outbox
        assert not any(lane.pending for lane in coordinator._lanes.lanes.values())
    finally:
        await coordinator.redis.aclose()


async def test_under_load_each_entry_is_written_once(
    bus_settings: BusSettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    coordinator = Coordinator(bus_settings)
    real = coordinator_module.xadd_batch

    async def round_trip(*args: Any, **kwargs: Any) -> Any:  # a 2 ms network, Redis healthy
        result = await real(*args, **kwargs)
        await asyncio.sleep(0.002)
        return result

    monkeypatch.setattr(coordinator_module, "xadd_batch", round_trip)
    loop = asyncio.get_running_loop()
    stream = f"{bus_settings.prefix}:load"
    numbers = itertools.count()
    stop = asyncio.Event()

    async def agent() -> None:  # each dispatch's send step bounded by a 0.1 s deadline
        while not stop.is_set():
            coordinator._enqueue(stream, b"%d" % next(numbers), 1_000_000, None, False)
            await _within(lambda: coordinator._flush(stream), loop.time() + 0.1)
            await asyncio.sleep(0.001)

    try:
        agents = [asyncio.create_task(agent()) for _ in range(20)]
        await asyncio.sleep(1.0)  # the load's length (a duration, not a synchronisation)
        stop.set()
        await asyncio.gather(*agents)
        if coordinator._outbox:
            await coordinator._flush()
        sent = next(numbers)

        async def written() -> bool:
            return await coordinator.redis.xlen(stream) >= sent

        await wait_for(written, 30, "every entry written")
        payloads = [f[b"data"] for _, f in await coordinator.redis.xrange(stream)]
        assert len(payloads) == len(set(payloads)) == sent
    finally:
        await coordinator.redis.aclose()
