"""One backoff policy for every retry on the bus: exponential, capped, with equal jitter.

The k-th delay after a run of failures (k = 0, 1, …) is drawn in ``[c/2, c]``, where
``c = min(cap, first · 2^k)`` is its ceiling. So a delay never exceeds the cap, each one is at
least the one before it until the cap is reached (the k-th delay's floor is the (k-1)-th's
ceiling), and replicas that lost Redis at the same moment spread their retries over half of
each interval instead of reconnecting in lockstep.

Why redis-py's backoff classes (``redis.backoff``, the ones its ``Retry`` takes) and not a loop
of our own: there were three hand-written loops (the coordinator's inbox reader, the consumer
loop of ``redis_io.consume``, the sync worker's registration), each with its own figures and
no jitter; redis-py already has the curve and the jitter, tested and documented, and this
module only adds what a loop needs around them (the count of failures, a reset after a
success). Why not its ``Retry`` object itself: the loops never give up (they retry until
stopped, and log each delay), and the async hook service's redelivery needs the delay for a
delivery count, not a retried call.
"""

from __future__ import annotations

import zlib

from redis.backoff import EqualJitterBackoff, ExponentialBackoff

from bus.errors import ConfigError

#: The longest an async hook's failed entry waits before it is delivered again.
REDELIVERY_CAP_SECS = 60.0


class Backoff:
    """Delays for one retry loop: :meth:`next` after each failure, :meth:`reset` after a
    success. ``first``: the first delay's ceiling (seconds); ``cap``: no delay is longer."""

    def __init__(self, first: float, cap: float) -> None:
        if not 0 < first <= cap:
            raise ConfigError(f"a backoff needs 0 < first <= cap (got {first}, {cap})")
        self.first = first
        self.cap = cap
        self.failures = 0
        self._jittered = EqualJitterBackoff(cap=cap, base=first)
        self._curve = ExponentialBackoff(cap=cap, base=first)

    def ceiling(self, failures: int) -> float:
        """The longest delay after ``failures`` earlier failures: min(cap, first · 2^failures)."""
        return float(self._curve.compute(failures))

    def next(self) -> float:
        """The delay after one more failure (counted), drawn in [ceiling/2, ceiling]."""
        delay = float(self._jittered.compute(self.failures))
        self.failures += 1
        return delay

    def reset(self) -> None:
        """After a success: the next failure waits the shortest delay again."""
        self.failures = 0

    def at(self, failures: int, fraction: float) -> float:
        """The delay after ``failures`` earlier failures with the jitter given (``fraction`` in
        [0, 1)): the same equal jitter as :meth:`next`, drawn by the caller."""
        ceiling = self.ceiling(failures)
        return ceiling / 2 + ceiling / 2 * min(max(fraction, 0.0), 1.0)


def redelivery_idle_ms(deliveries: int, entry_id: bytes, claim_idle_secs: float) -> int:
    """How long an async hook's entry delivered ``deliveries`` times must stay idle (its hook
    failed, or its replica went silent) before it is delivered again.

    After the first delivery, ``claim_idle_secs``, as the takeover of a silent replica's
    entries always was; after delivery n ≥ 2, a delay drawn in [claim_idle_secs · 2^(n-2),
    claim_idle_secs · 2^(n-1)], at most ``REDELIVERY_CAP_SECS`` (claim_idle_secs 1 s: 1 s, then
    1–2 s, 2–4 s, 4–8 s, …, up to 60 s). The jitter comes from the entry id and the count
    (CRC-32), not from a random draw: every claim pass (once per ``claim_idle_secs``) and every
    replica computes the same threshold for an entry, whereas a fresh draw at each pass would
    claim it at the lowest of several draws."""
    if deliveries <= 1:
        return int(claim_idle_secs * 1000)
    cap = max(REDELIVERY_CAP_SECS, claim_idle_secs)
    backoff = Backoff(min(2 * claim_idle_secs, cap), cap)
    fraction = zlib.crc32(b"%s:%d" % (entry_id, deliveries)) / 2**32
    return int(backoff.at(deliveries - 2, fraction) * 1000)
