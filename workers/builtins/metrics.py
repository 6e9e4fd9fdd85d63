"""Metrics as an async hook service: counts and latencies, kept in Redis for ``hookbus metrics``.

``hookbus worker workers.builtins.metrics:AsyncMetricsHook`` adds up, per event batch, in the hash
``{p}:hook:{AsyncMetricsHook}:metrics``: events per type, tool calls, tool errors, total tool
latency, sessions started and stopped (per terminal reason). Delivery is at least once, so
after a replica crash a few events may be counted twice; the audit log is the exact record.

A batch's figures are added whole or not at all (one script on the one key), so a batch that
failed and is retried is not counted twice. A tool latency that is not a number of milliseconds
from 0 to :data:`MAX_ELAPSED_MS` (NaN, infinite, negative, 1e308…: whatever an agent sent) is
left out of ``tool_latency_ms_total`` and counted in ``tool_latency_rejected`` instead; the
call itself is still counted in ``tool_calls``.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from typing import Any

from bus import AsyncAgentHook
from bus.hooks import DeliveredEvent
from bus.settings import BusSettings
from bus.transport.keys import Keys
from bus.transport.redis_io import connect

#: The longest tool call whose latency is added to the total: a week. Skipped, not clamped,
#: beyond it: a clamped value would put a figure no tool measured into the total; a skipped one
#: is counted (``tool_latency_rejected``), so the total stays the sum of real latencies and an
#: operator sees how many were left out. With every value at most a week, the total cannot
#: overflow (HINCRBYFLOAT refuses an infinite result) in fewer than 10^299 calls.
MAX_ELAPSED_MS = 7 * 24 * 3600 * 1000.0

#: Adds one batch's figures to the hash KEYS[1]: ARGV[1] is the latency to add, then come field,
#: count pairs. All or nothing: Redis keeps the writes a script (or a MULTI/EXEC) made before a
#: command that fails, so the script first checks that every count field holds an integer it
#: can add to (at most 18 digits: no int64 overflow), then runs the one write that can still
#: fail, HINCRBYFLOAT (on a value that is not a float), before any HINCRBY. Why a script and not
#: MULTI/EXEC: a transaction does not undo its other commands when one fails at run time (it
#: would count a retried batch twice, as the pipeline did), and a hook service's Redis user may
#: run EVALSHA and SCRIPT LOAD but not MULTI/EXEC (workers/ops/acl.py). The one key is one cluster
#: slot.
_ADD = """
local key = KEYS[1]
local fields = {}
for i = 2, #ARGV, 2 do fields[#fields + 1] = ARGV[i] end
if #fields > 0 then
  local values = redis.call('HMGET', key, unpack(fields))
  for i, value in ipairs(values) do
    if value and not (#value <= 18 and string.match(value, '^%-?%d+$')) then
      return redis.error_reply('metrics field ' .. fields[i] .. ' holds ' .. value
        .. ', not an integer to add to: nothing of this batch was counted')
    end
  end
end
if tonumber(ARGV[1]) ~= 0 then
  redis.call('HINCRBYFLOAT', key, 'tool_latency_ms_total', ARGV[1])
end
for i = 2, #ARGV, 2 do redis.call('HINCRBY', key, ARGV[i], ARGV[i + 1]) end
return 0
"""


def latency_of(elapsed_ms: float) -> float | None:
    """``elapsed_ms`` if it is a latency to add up (finite, 0 to a week), else None."""
    if math.isfinite(elapsed_ms) and 0 <= elapsed_ms <= MAX_ELAPSED_MS:
        return float(elapsed_ms)
    return None


class AsyncMetricsHook(AsyncAgentHook):
    """Accumulates figures for every event into a Redis hash."""

    name = "AsyncMetricsHook"
    handles_batches = True

    def __init__(self, settings: BusSettings | None = None) -> None:
        self.settings = settings or BusSettings.from_env()
        self.key = Keys.of(self.settings).metrics(self.name)
        self._redis: Any = None
        self._add: Any = None

    async def on_batch(self, batch: Sequence[DeliveredEvent]) -> None:
        counts: Counter[str] = Counter()
        latency = 0.0
        for d in batch:
            counts[f"events.{d.event.value}"] += 1
            ctx = d.context
            if d.event.value == "PostToolUse":
                counts["tool_calls"] += 1
                counts["tool_errors"] += int(ctx.is_error)
                elapsed = latency_of(ctx.elapsed_ms)
                if elapsed is None:
                    counts["tool_latency_rejected"] += 1
                else:
                    latency += elapsed
            elif d.event.value == "OnSessionStart":
                counts["sessions_started"] += 1
            elif d.event.value == "OnSessionStop":
                counts[f"sessions_stopped.{ctx.terminal.value}"] += 1
        if self._redis is None:
            self._redis = connect(self.settings)
            self._add = self._redis.register_script(_ADD)  # EVALSHA; SCRIPT LOAD if missing
        pairs = [item for field_and_count in counts.items() for item in field_and_count]
        await self._add(keys=[self.key], args=[repr(latency), *pairs])

    async def close(self) -> None:
        if self._redis is not None:
            await self._redis.aclose()
