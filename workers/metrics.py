"""Metrics as an async hook service: counts and latencies, kept in Redis for ``hookbus metrics``.

``hookbus worker workers.metrics:AsyncMetricsHook`` adds up, per event batch, in the hash
``{p}:hook:{AsyncMetricsHook}:metrics``: events per type, tool calls, tool errors, total tool
latency,
sessions started and stopped (per terminal reason). Delivery is at least once, so after a
replica crash a few events may be counted twice; the audit log is the exact record.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

from bus import AsyncAgentHook
from bus.hooks import DeliveredEvent
from bus.keys import Keys
from bus.redis_io import connect
from bus.settings import BusSettings


class AsyncMetricsHook(AsyncAgentHook):
    """Accumulates figures for every event into a Redis hash."""

    name = "AsyncMetricsHook"
    handles_batches = True

    def __init__(self, settings: BusSettings | None = None) -> None:
        self.settings = settings or BusSettings.from_env()
        self.key = Keys.of(self.settings).metrics(self.name)
        self._redis: Any = None

    async def on_batch(self, batch: Sequence[DeliveredEvent]) -> None:
        counts: Counter[str] = Counter()
        latency = 0.0
        for d in batch:
            counts[f"events.{d.event.value}"] += 1
            ctx = d.context
            if d.event.value == "PostToolUse":
                counts["tool_calls"] += 1
                counts["tool_errors"] += int(ctx.is_error)
                latency += ctx.elapsed_ms
            elif d.event.value == "OnSessionStart":
                counts["sessions_started"] += 1
            elif d.event.value == "OnSessionStop":
                counts[f"sessions_stopped.{ctx.terminal.value}"] += 1
        if self._redis is None:
            self._redis = connect(self.settings)
        async with self._redis.pipeline(transaction=False) as pipe:
            for field, n in counts.items():
                pipe.hincrby(self.key, field, n)
            if latency:
                pipe.hincrbyfloat(self.key, "tool_latency_ms_total", latency)
            await pipe.execute()

    async def close(self) -> None:
        if self._redis is not None:
            await self._redis.aclose()
