"""Synchronous decisions under steady load while every hook worker's clock is 5 s off.

Guard (``failure_policy="fail"``, MutateInput ``{"x": -1}``) runs as two replicas under
libfaketime, one 5 s ahead and one 5 s behind; the async hook Ledger runs 5 s ahead too. Redis,
the agents and their coordinator keep the true clock. Before bus/transport/clock.py the replica
ahead dropped every request as expired, silently, and the one behind looked dead (its heartbeats 5 s
old): every call was blocked by Guard's failure policy — or, with ``ignore``, run unchecked —
while ``--check`` called the hook healthy. The ledger must show every call checked, no request
dropped, the hook named as skewed, and its ``--check`` failing with the reason.
"""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import msgspec
import pytest

from agent_adapter.client import HookClient
from bus import HookSettings
from bus.settings import BusSettings
from bus.transport.clock import is_skewed
from tests.chaos.conftest import Ledger
from tests.chaos.load import GUARD, GUARD_TIMEOUT, GuardedAgents, Services
from tests.faketime import faked
from tests.harness import ROOT, Processes, wait_for, wait_live, worker_env
from tests.remote_hooks import AsyncConfig

LOAD_SECS = float(os.environ.get("HOOKBUS_CHAOS_SECS", "16")) / 2
pytestmark = pytest.mark.timeout(LOAD_SECS + 200)
AGENTS = 4


class SkewedServices(Services):
    """Guard's replicas 5 s ahead and 5 s behind; Ledger's 5 s ahead."""

    def __init__(self, procs: Processes, settings: BusSettings, tmp: Path) -> None:
        self.offsets = iter(["+5s", "-5s"])
        super().__init__(procs, settings, tmp)

    def guard(self) -> Any:
        return self.procs.scripted(self.settings, GUARD, **faked(next(self.offsets)))

    def ledger(self) -> Any:
        config = msgspec.json.encode(AsyncConfig(name="Ledger", record=str(self.handled)))
        return self.procs.worker(
            self.settings,
            "tests.remote_hooks:ScriptedAsync",
            "ledger",
            HOOKBUS_TEST_ASYNC=config.decode(),
            **faked("+5s"),
        )


def check(settings: BusSettings, *env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    payload = msgspec.json.encode(GUARD).decode()
    extra = {k: v for e in env for k, v in e.items()}
    return subprocess.run(
        [sys.executable, "-m", "workers.cli", "worker", "tests.remote_hooks:Scripted", "--check"],
        env=worker_env(settings, HOOKBUS_TEST_HOOK=payload, **extra),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )


async def test_workers_5s_ahead_and_behind_check_every_call_and_are_named_skewed(
    bus_settings: BusSettings, procs: Processes, ledger: Ledger, tmp_path: Path
) -> None:
    services = SkewedServices(procs, bus_settings, tmp_path)
    async with HookClient(bus_settings, HookSettings(hook_timeout_secs=GUARD_TIMEOUT)) as client:
        await wait_live(client, "Guard", replicas=2)  # the one 5 s behind is live too
        await wait_for(lambda: "Ledger" in client.directory.async_hooks, what="Ledger")
        await wait_for(lambda: "Guard" in client.directory.skewed, what="Guard named skewed")
        clocks = await client.redis.hgetall(client.keys.clocks("Guard"))
        offsets = sorted(int(v) for v in clocks.values())
        ledger_clocks = await client.redis.hgetall(client.keys.clocks("Ledger"))
        ledger_offsets = ", ".join(f"{int(v):+d}" for v in ledger_clocks.values())
        load = GuardedAgents(client)
        stop = asyncio.Event()
        agents = asyncio.create_task(load.run(AGENTS, stop))
        await asyncio.sleep(LOAD_SECS)  # the load's duration, not a synchronisation
        stop.set()
        await agents
        await client.drain()
        async_figures = await services.reconcile(client.redis, client.keys)
        skewed_calls = client.skewed_calls.get("Guard", 0)

    here = check(bus_settings, faked("+5s"))
    there = check(bus_settings)
    logs = procs.logs()
    dropped = [int(n) for n in re.findall(r"requests for Guard dropped past .*?: (\d+)", logs)]
    ledger.add(
        faults="Guard replicas' clocks +5 s and -5 s, Ledger's +5 s (libfaketime)",
        **{"Guard clock offsets measured (ms)": ", ".join(f"{o:+d}" for o in offsets)},
        **{"Ledger clock offsets measured (ms)": ledger_offsets},
        **load.figures(),
        **{"requests dropped as expired": sum(dropped)},
        **{"calls counted as to a skewed hook": skewed_calls},
        **{"--check where the worker runs": f"exit {here.returncode}: {here.stderr.strip()}"},
        **{"--check from a true clock": f"exit {there.returncode}: {there.stderr.strip()}"},
        **async_figures,
    )  # fmt: skip
    assert len(offsets) == 2 and offsets[0] < 0 < offsets[1], offsets
    assert all(is_skewed(o) for o in offsets), offsets
    load.check()
    assert load.outcomes[GuardedAgents.BLOCKED] == 0  # no fault: every call answered by Guard
    assert sum(dropped) == 0, logs
    assert skewed_calls == sum(load.outcomes.values())
    assert here.returncode == 1 and "this host's clock is" in here.stderr, here
    assert "ahead of Redis's, beyond the 1 s bound" in here.stderr, here
    assert there.returncode == 1, there
    assert "hook Guard: 2 live replicas report a clock beyond the 1 s bound" in there.stderr
    assert async_figures["PreToolUse events published"] == sum(load.outcomes.values())
