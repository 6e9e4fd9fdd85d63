"""The steady load of the chaos tests, and the hook services it runs against."""

from __future__ import annotations

import asyncio
import itertools
import time
from pathlib import Path
from typing import Any

import msgspec
from redis.asyncio import Redis

from agent_adapter.client import HookClient
from agent_adapter.executor import ToolExecutor
from agent_adapter.llm import call
from agent_adapter.permissions import ToolKind
from agent_adapter.tools import Tool, Toolbox
from bus import HookEvent, MutateInput
from bus.settings import BusSettings
from bus.transport.keys import Keys
from tests.harness import Processes, wait_for
from tests.remote_hooks import AsyncConfig, HookConfig

PRE = HookEvent.PRE_TOOL_USE
#: The events stream keeps every event of a run: the ledger reads them all back (reconcile), and
#: retention trims what every group has handled once a stream passes its events_maxlen. Every
#: chaos test's settings carry it (the fixture's, and each private server's or cluster's).
CHAOS_EVENTS_MAXLEN = 10_000_000
GUARD_TIMEOUT = 1.0
SLACK = 1.0  # event-loop lag on a loaded two-core machine; the figure is reported
#: Guard has failure_policy "fail" and answers MutateInput({"x": -1}): a tool that runs with
#: x == -1 was checked by Guard; one that runs with anything else was not.
GUARD = HookConfig(
    name="Guard",
    events=[PRE],
    answers={PRE.value: MutateInput(updated_args={"x": -1})},
    timeout=GUARD_TIMEOUT,
    failure_policy="fail",
)


class Services:
    """Two replicas of Guard and two of the async hook Ledger (which records every event id it
    handles), restartable by role."""

    def __init__(
        self, procs: Processes, settings: BusSettings, tmp: Path, ledgers: int = 2
    ) -> None:
        self.procs, self.settings = procs, settings
        self.handled = tmp / "handled.txt"
        self.handled.touch()
        self.guards = [self.guard() for _ in range(2)]
        self.ledgers = [self.ledger() for _ in range(ledgers)]

    def guard(self) -> Any:
        return self.procs.scripted(self.settings, GUARD)

    def ledger(self) -> Any:
        config = AsyncConfig(name="Ledger", record=str(self.handled))
        return self.procs.worker(
            self.settings,
            "tests.remote_hooks:ScriptedAsync",
            "ledger",
            HOOKBUS_TEST_ASYNC=msgspec.json.encode(config).decode(),
        )

    async def reconcile(self, redis: Redis, keys: Keys) -> dict[str, int]:
        """Wait until Ledger has handled every event in ``{p}:events``; the figures."""
        return await reconcile(redis, keys, self.handled)


async def reconcile(redis: Redis, keys: Keys, handled_file: Path) -> dict[str, int]:
    """Wait until Ledger (recording to ``handled_file``) has handled every event in
    ``{p}:events``; the figures."""
    stream = keys.event_partitions[0]
    info: Any = await redis.xinfo_stream(stream)
    # Retention trims what every group has handled once the stream passes events_maxlen: the
    # count below needs every event still there (CHAOS_EVENTS_MAXLEN).
    assert info["entries-added"] == info["length"], (
        f"{stream} was trimmed during the run ({info['entries-added']} added, "
        f"{info['length']} kept): raise CHAOS_EVENTS_MAXLEN"
    )
    entries = await redis.xrange(stream)
    events = [msgspec.json.decode(fields[b"data"]) for _, fields in entries]
    wanted = {e["id"] for e in events}

    def missing() -> set[str]:
        return wanted - set(handled_file.read_text().split())

    await wait_for(lambda: not missing(), 60, "Ledger to handle every published event")
    handled = handled_file.read_text().split()
    return {
        "events published": len(wanted),
        "handled (incl. redeliveries)": len(handled),
        "redelivered after kills": len(handled) - len(set(handled)),
        "PreToolUse events published": sum(e["event"] == PRE.value for e in events),
    }


class GuardedAgents:
    """Agents calling the tool ``act`` through the real executor in a closed loop; a ledger
    of what was checked, what was blocked, what ran, and how long each PreToolUse took."""

    BLOCKED = "blocked by Guard's failure policy"

    def __init__(self, client: HookClient) -> None:
        self.ran: list[dict[str, Any]] = []
        self.latencies: list[float] = []
        self.outcomes = {"checked": 0, self.BLOCKED: 0}
        self.blocked_at: list[float] = []  # when each block came (time.monotonic())

        async def act(args: dict[str, Any]) -> str:
            self.ran.append(dict(args))
            return "done"

        self.executor = ToolExecutor(
            client, Toolbox([Tool("act", "", ToolKind.READ, {"x": int}, act)])
        )
        client.observers.append(
            lambda event, ctx, o, secs: self.latencies.append(secs) if event is PRE else None
        )

    async def run(self, agents: int, stop: asyncio.Event) -> None:
        async def agent(n: int) -> None:
            for i in itertools.count(1):
                if stop.is_set():
                    return
                result = await self.executor.execute_parallel(f"s{n}", [call("act", x=i)], step=i)
                if any(b.hook_name == "Guard" for b in result.blocking_errors):
                    self.outcomes[self.BLOCKED] += 1
                    self.blocked_at.append(time.monotonic())
                else:
                    self.outcomes["checked"] += 1

        await asyncio.gather(*(agent(n) for n in range(agents)))

    def figures(self) -> dict[str, Any]:
        ordered = sorted(self.latencies)
        return {
            "decisions": sum(self.outcomes.values()),
            **self.outcomes,
            "tool runs": len(self.ran),
            "tool runs unchecked": sum(a != {"x": -1} for a in self.ran),
            "blocks, first to last (s)": (
                f"{self.blocked_at[-1] - self.blocked_at[0]:.1f}" if self.blocked_at else "-"
            ),
            "dispatch p50 / max (s)": f"{ordered[len(ordered) // 2]:.4f} / {ordered[-1]:.3f} "
            f"(deadline {GUARD_TIMEOUT:g} s)",
        }

    def check(self) -> None:
        """Never unchecked, always within the deadline (plus slack), every decision timed."""
        assert self.outcomes["checked"] > 0
        assert all(args == {"x": -1} for args in self.ran), "a tool ran without Guard's answer"
        assert len(self.ran) == self.outcomes["checked"]
        assert len(self.latencies) == sum(self.outcomes.values())
        assert max(self.latencies) <= GUARD_TIMEOUT + SLACK, sorted(self.latencies)[-5:]
