"""Time on the bus: Redis's clock, as each process estimates it, and what expires against it.

Deadlines and liveness are absolute epoch-ms times written by one process and compared by
another (docs/protocol.md 1.5): a ``HookRequest.deadline``, a heartbeat's score, a
``DecisionRequest``'s ``ts + timeout_ms``. Comparing them on each host's own clock made a worker
whose clock ran 5 s ahead drop every request as expired. So every process measures its offset
from Redis's clock (``TIME``, the local time taken halfway through the round trip) at start and
at each heartbeat (a coordinator: each directory refresh), and reads the time as
``RedisClock.now_ms()``: Redis's clock as this process estimates it. One reference clock for all.

An offset is corrected whatever its size, but one beyond ``MAX_SKEW_MS`` means the host's clock
is not kept in sync (NTP), and a clock that drifted that far may step again between two
measurements: the process logs an error, ``hookbus worker --check`` fails, and a worker
publishes its offset in ``{p}:hook:{name}:clocks`` so that coordinators can name the hook as
skewed.

``ExpiredDrops`` counts what is dropped because its time had passed, and says so in one log line
per interval with the count: never silently, never a line per request.
"""

from __future__ import annotations

import logging
import math
import time
from typing import Any

from redis.exceptions import ResponseError

log = logging.getLogger("hookbus.clock")

#: The documented bound (docs/protocol.md 1.5): a process whose clock is further than this from
#: Redis's is "skewed". Its deadlines are still corrected; it is reported, not trusted silently.
MAX_SKEW_MS = 1000
#: Samples taken at start; the one with the shortest round trip is kept (its error is smallest).
START_SAMPLES = 3
#: While skewed, the error is repeated at most this often.
REPEAT_ERROR_SECS = 60.0


def local_ms() -> int:
    """This host's clock, epoch ms (what ``bus.protocol.now_ms`` reads)."""
    return time.time_ns() // 1_000_000


def describe(offset_ms: int) -> str:
    """``+5.003 s ahead of`` / ``0.250 s behind`` Redis's clock."""
    side = "ahead of" if offset_ms > 0 else "behind"
    return f"{abs(offset_ms) / 1000:.3f} s {side}"


def is_skewed(offset_ms: int) -> bool:
    return abs(offset_ms) > MAX_SKEW_MS


async def offset_from(redis: Any, samples: int = 1) -> tuple[int, float]:
    """(this host's clock minus Redis's, round trip), both in ms, from the fastest of
    ``samples`` readings of ``TIME``: the local time is taken halfway through the round trip,
    so the error is at most half of it. Raises what the command raises (a refusal, a lost
    connection)."""
    best: tuple[int, float] | None = None
    for _ in range(max(1, samples)):
        wall0, t0 = time.time_ns(), time.perf_counter_ns()
        reply = await redis.time()
        rtt = time.perf_counter_ns() - t0  # monotonic: the wall clock may be the faulty one
        if isinstance(reply, dict):  # a cluster client answers per node: any node will do
            reply = next(iter(reply.values()))
        secs, micros = reply
        offset = (wall0 + rtt // 2 - (int(secs) * 1_000_000_000 + int(micros) * 1000)) / 1e6
        if best is None or rtt / 1e6 < best[1]:
            best = (round(offset), rtt / 1e6)
    assert best is not None
    return best


async def redis_ms(redis: Any) -> int:
    """Redis's clock now, from one ``TIME``, for a one-shot command (an operator's); this
    host's clock if ``TIME`` is refused."""
    try:
        offset, _ = await offset_from(redis)
    except ResponseError:
        return local_ms()
    return local_ms() - offset


class RedisClock:
    """One process's estimate of Redis's clock.

    Attributes:
        offset_ms: this host's clock minus Redis's (positive: this host runs ahead).
        rtt_ms: round trip of the sample the offset came from (its error is at most half).
        measured: whether any measurement succeeded (until then the offset is 0).
        refused: Redis refused ``TIME`` (an ACL without ``+time``): the local clock is used.
    """

    def __init__(self, who: str = "this process") -> None:
        self.who = who
        self.offset_ms = 0
        self.rtt_ms: float | None = None
        self.measured = False
        self.refused = False
        self._error_logged_at = -math.inf

    def now_ms(self) -> int:
        """Redis's clock now, as this process estimates it (epoch ms)."""
        return time.time_ns() // 1_000_000 - self.offset_ms

    @property
    def skewed(self) -> bool:
        return self.measured and is_skewed(self.offset_ms)

    async def measure(self, redis: Any, samples: int = 1) -> int | None:
        """Read ``TIME`` ``samples`` times and adopt the offset of the fastest round trip.

        Returns the offset, or None if it could not be measured: ``TIME`` refused (logged once;
        the offset stays as it was) or every round trip too slow to bound the error (over
        ``MAX_SKEW_MS``). Redis being unreachable raises, as any command does.
        """
        try:
            offset, rtt = await offset_from(redis, samples)
        except ResponseError as exc:
            if not self.refused:
                log.error(
                    "cannot read Redis's clock (TIME: %s): %s checks deadlines on its own "
                    "clock; allow +time for its Redis user (deploy/redis/users.acl)",
                    exc,
                    self.who,
                )
            self.refused = True
            return None
        self.refused = False
        if rtt > MAX_SKEW_MS:
            return None
        self.offset_ms, self.rtt_ms = offset, rtt
        first = not self.measured
        self.measured = True
        self._report(first)
        return self.offset_ms

    def _report(self, first: bool) -> None:
        now = time.monotonic()
        if self.skewed:
            if now - self._error_logged_at >= REPEAT_ERROR_SECS:
                self._error_logged_at = now
                log.error(
                    "%s's clock is %s Redis's: beyond the %g s bound (docs/protocol.md 1.5). "
                    "Deadlines are corrected by the measured offset, but keep the host's clock "
                    "in sync (NTP): until then this process is reported as skewed",
                    self.who,
                    describe(self.offset_ms),
                    MAX_SKEW_MS / 1000,
                )
        elif self._error_logged_at > -math.inf:
            self._error_logged_at = -math.inf
            log.warning(
                "%s's clock is back within %g s of Redis's (%s Redis's)",
                self.who,
                MAX_SKEW_MS / 1000,
                describe(self.offset_ms),
            )
        elif first:
            log.info("%s's clock is %s Redis's", self.who, describe(self.offset_ms))


class ExpiredDrops:
    """Counts what was dropped because its deadline had passed; one log line per interval.

    The first drop is logged at once; later ones are summed and logged with their count at most
    once per ``interval`` seconds. ``tick()``, called from a periodic loop, says the last ones
    once the interval is over; ``flush()`` says them now (at shutdown).
    """

    def __init__(self, logger: logging.Logger, what: str, interval: float = 10.0) -> None:
        self.log = logger
        self.what = what
        self.interval = interval
        self.total = 0
        self._unlogged = 0
        self._last = ""
        self._logged_at = -math.inf

    def drop(self, detail: str) -> None:
        """One more dropped; ``detail`` says which and how late (kept for the next line)."""
        self.total += 1
        self._unlogged += 1
        self._last = detail
        self.tick()

    def tick(self) -> None:
        if self._unlogged and time.monotonic() - self._logged_at >= self.interval:
            self.flush()

    def flush(self) -> None:
        if not self._unlogged:
            return
        self._logged_at = time.monotonic()
        self.log.warning(
            "%s dropped past their deadline: %d since the last report, %d in all (last: %s)",
            self.what,
            self._unlogged,
            self.total,
            self._last,
        )
        self._unlogged = 0
