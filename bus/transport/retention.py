"""Retention of the streams async hooks read: trim history, never what a group still needs, and
count exactly what the last-resort cap cuts.

The streams: ``{p}:events``, each async hook's ``{p}:hook:{name}:replay`` and the audit trail
``{p}:audit`` (see docs/protocol.md, "Retention").

* **Retention pass** (every async worker, every 10 s, on each stream it reads): trims entries
  older than about ``maxlen``, but never past the oldest entry some consumer group still needs
  (its oldest pending entry, or the entry after its last delivered one).
* **Hard cap** (the last resort): publishers cap each stream at ``HARD_CAP_FACTOR × maxlen``
  (``XADD … MAXLEN ~``), so that a group that stopped cannot fill Redis's memory. What that cap
  cuts from a group's undelivered entries leaves a gap between the group's last delivered id and
  the stream's first entry. Redis 7 counts the entries ever added to a stream (``XINFO STREAM``
  entries-added) and read by each group (``XINFO GROUPS`` entries-read), so the size of the gap is
  exact: entries-added − entries-read − length.
* **Counting** (:class:`Retention`): every read of a group is preceded, in the same pipeline,
  by a Lua script that finds such a gap, settles it (``XGROUP SETID … ENTRIESREAD``, which
  keeps the group's lag exact) and returns it; :meth:`Retention.record` then reports it: a dead
  letter with the range, the count and the group, the group's ``{p}:hook:{name}:lost`` counter
  (``hookbus lag`` shows it), the ``hookbus.entries.lost`` metric and an error log line. A
  retention pass settles every group's gap too, so a group whose replicas are all down is
  reported within one pass. A pending entry the cap cut is reported by the replica whose
  ``XAUTOCLAIM`` drops it from the group (:meth:`Retention.record_trimmed`).

Why a script: Redis 7.0 has no ``XADD``/``XTRIM`` option that keeps what groups still need
(``KEEPREF``/``ACKED`` came in 8.2), and a gap must be settled just before the read: a read
that crosses it makes Redis count the first entry after the gap as the next one read, and the
loss goes uncounted: at the stream's end a counter short of entries-added is what a failover or
a restart from the AOF leaves too (a replica keeps a group's last-delivered-id, not its
entries-read), so it is re-based, not reported. A loss is counted only while the group's last
delivered entry is gone from the stream (retention keeps it), which no failover fakes. The scripts
touch one key, the stream, so they run on Redis Cluster too.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import NoScriptError, ResponseError

from bus.errors import HookBusError
from bus.telemetry import tracing as telemetry
from bus.transport.keys import Keys, check_name
from bus.transport.redis_io import (
    TRIMMED,
    Entry,
    dead_letter_entry,
    pipelined,
    xadd_dead_letter,
)

log = logging.getLogger("hookbus.retention")
HARD_CAP_FACTOR = 10
__all__ = ["HARD_CAP_FACTOR", "TRIMMED", "Gap", "Retention", "group_backlogs", "hard_cap"]


def hard_cap(maxlen: int) -> int:
    """The length publishers cap a stream at (``XADD … MAXLEN ~``), for a retention ``maxlen``."""
    return HARD_CAP_FACTOR * maxlen


def _id(value: Any) -> tuple[int, int]:
    text = value.decode() if isinstance(value, bytes) else str(value)
    ms, _, seq = text.partition("-")
    return int(ms), int(seq or 0)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


@dataclass(frozen=True)
class Gap:
    """Entries of ``stream`` the hard cap cut before ``group`` read them: ``count`` entries with
    ids after ``after`` and before ``before`` (both exclusive; "+" means up to the stream's end,
    "-" that the start is not known)."""

    stream: str
    group: str
    count: int
    after: str
    before: str


# Helpers shared by the scripts: exact stream-id comparison (ids are two 64-bit numbers, more
# than a Lua double holds) and a field of a flat XINFO reply.
_LUA_HELPERS = """
local function parts(id)
  local ms, seq = string.match(id, '^(%d+)-?(%d*)$')
  if seq == '' then seq = '0' end
  return ms, seq
end
local function num_cmp(a, b)
  if #a ~= #b then return #a < #b and -1 or 1 end
  if a ~= b then return a < b and -1 or 1 end
  return 0
end
local function cmp(a, b)
  local ams, aseq = parts(a)
  local bms, bseq = parts(b)
  local c = num_cmp(ams, bms)
  if c ~= 0 then return c end
  return num_cmp(aseq, bseq)
end
local function field(flat, name)
  for i = 1, #flat, 2 do
    if flat[i] == name then return flat[i + 1] end
  end
  return false
end
"""

# KEYS[1]: the stream. ARGV: group, and "1" where a read follows. Settles the gap the hard cap
# left before the group's next entry; returns {gap or false, the stream's last generated id}, a
# gap being {count, after, before}. The read itself follows, pipelined (Retention.read).
#
# Where a read follows, the usual case while a group works through a backlog is decided from
# the group's lag alone and returns {false, false}: entries wait and no more than the stream
# holds (0 < lag <= XLEN), so none the group has yet to read was cut. This holds however Redis 7
# computes the lag (streamReplyWithCGLag): exact, it is entries-added - entries-read, the count
# the gap test below compares with the length; estimated, entries-read is unknown, and the test
# below finds no gap then either. It spares XINFO STREAM, whose reply carries the first and last
# entries into Lua: about half of the script's time (19 µs a call before, on Redis's CPU). A
# group at the stream's end with a lag (its counter reset by a failover) reads nothing, and the
# caller then runs the full check (Retention.read).
#
# Failovers and restarts: a replica keeps a group's last-delivered-id but not its entries-read
# (Redis 7.0 propagates XREADGROUP as XCLAIM … LASTID), and an AOF replays the same commands, so
# a promoted replica or a Redis restarted from its AOF holds a counter that may be short by any
# number of entries. A loss is therefore never taken from the counters alone: only when the
# group's last delivered entry is gone from the stream (retention keeps it: group_backlogs), the
# one case where entries the group has yet to read can be gone. At the stream's end nothing can
# be gone, and the counter is re-based (exact again) without a report.
_CHECK = (
    _LUA_HELPERS
    + """
local stream, group = KEYS[1], ARGV[1]
local groups = redis.pcall('XINFO', 'GROUPS', stream)
if groups.err then
  return redis.error_reply('NOGROUP no stream ' .. stream .. ' for group ' .. group)
end
local g = false
for _, row in ipairs(groups) do
  if field(row, 'name') == group then g = row break end
end
if not g then return redis.error_reply('NOGROUP no group ' .. group .. ' on ' .. stream) end
if ARGV[2] == '1' then
  local lag = field(g, 'lag')
  if lag and lag > 0 and lag <= redis.call('XLEN', stream) then return {false, false} end
end
local info = redis.call('XINFO', 'STREAM', stream)
local added, length = field(info, 'entries-added'), field(info, 'length')
local last = field(info, 'last-generated-id')
local delivered, read = field(g, 'last-delivered-id'), field(g, 'entries-read')
local first = false
if length > 0 then first = field(info, 'recorded-first-entry-id') end
local gap = false
if delivered == last then
  -- Nothing after the group's last entry can be gone: no loss, whatever the counter says. A
  -- counter Redis lost (a group made without one), or one a failover or a restart from the AOF
  -- reset (a replica keeps last-delivered-id, not entries-read), is exact again.
  if read ~= added then
    redis.call('XGROUP', 'SETID', stream, group, delivered, 'ENTRIESREAD', added)
  end
elseif read and (not first or cmp(delivered, first) < 0) then
  -- Entries after the group's last one are gone: those the counters say it never read.
  if added - read > length then
    gap = {added - read - length, delivered, first or '+'}
    redis.call('XGROUP', 'SETID', stream, group, delivered, 'ENTRIESREAD', added - length)
  end
end
return {gap, last}
"""
)

# KEYS[1]: the stream. ARGV: group, start ("$", "0" or an id). XGROUP CREATE with the count of
# entries before the group's position (ENTRIESREAD), so that its losses can be counted from its
# first read; BUSYGROUP if it exists.
_CREATE = (
    _LUA_HELPERS
    + """
local stream, group, start = KEYS[1], ARGV[1], ARGV[2]
local info = redis.pcall('XINFO', 'STREAM', stream)
if info.err then
  return redis.pcall('XGROUP', 'CREATE', stream, group, start, 'MKSTREAM', 'ENTRIESREAD', 0)
end
local added, length = field(info, 'entries-added'), field(info, 'length')
local last = field(info, 'last-generated-id')
local read = false
if start == '$' or cmp(start, last) >= 0 then
  read = added
elseif length == 0 or cmp(start, field(info, 'recorded-first-entry-id')) < 0 then
  read = added - length
end
if read then
  return redis.pcall('XGROUP', 'CREATE', stream, group, start, 'ENTRIESREAD', read)
end
-- A start inside the stream: Redis counts from the group's first read of its newest entry.
return redis.pcall('XGROUP', 'CREATE', stream, group, start)
"""
)


class Retention:
    """Group reads that count what the hard cap cut, the reports of it, and retention passes,
    for one Redis client.

    Args:
        redis: a redis-py asyncio client (bytes in and out).
        keys: the key names.
    """

    def __init__(self, redis: Redis, keys: Keys) -> None:
        self.redis = redis
        self.keys = keys
        self._check = redis.register_script(_CHECK)
        self._create = redis.register_script(_CREATE)
        #: Streams read through this client's connections since the last connection error: the
        #: node that serves each had the check script at the last read. Any other stream (a new
        #: client, a restarted Redis, a new master after a failover) is checked alone before its
        #: first read (:meth:`read`).
        self._loaded: set[str] = set()

    # -- groups --------------------------------------------------------------------------------

    async def create_group(self, stream: str, group: str, start: str = "$") -> None:
        """Create ``group`` on ``stream`` (and the stream) at ``start`` unless it exists, with
        Redis's count of the entries before it set, so its losses can be counted."""
        try:
            await self._create(keys=[stream], args=[group, start])
        except ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise

    async def read(
        self, stream: str, group: str, consumer: str, count: int, acks: Sequence[bytes] = ()
    ) -> tuple[list[Entry], Gap | None, str]:
        """New entries for ``consumer`` (at most ``count``, without blocking); the gap the hard
        cap left before them, settled, which the caller must :meth:`record`; and, when it read
        nothing, the stream's last id (to wait for newer ones with ``XREAD BLOCK``; "" when it
        read something and that was not asked of Redis). NOGROUP if the group is gone.
        A ``count`` of 0 reads nothing (Redis would read everything: ``COUNT 0``).

        ``acks``: entries of ``stream`` the consumer handled, acknowledged first, in the same
        write as the read (one round trip a batch); acknowledged once this returns (Redis
        refusing the XACK is logged: they stay pending, claimed and run again)."""
        if acks and (not count or stream not in self._loaded):
            await self.redis.xack(stream, group, *acks)  # the rare paths below send it alone
            acks = ()
        if not count:
            return [], *await self._settled(stream, group)
        # The check, then the read, pipelined: Redis runs the commands a client sent together one
        # after the other before it serves another client, so no trim falls between them. (Should
        # one ever, the read crosses the gap and the loss goes uncounted: a counter short at the
        # stream's end is what a failover leaves too, and is re-based.) Not MULTI/EXEC: it costs the
        # consumer about 0.6 µs an event for no guarantee the pipeline lacks in practice. Not the
        # read inside the script: every entry would be copied into Lua and back (measured: about
        # half of Redis's work per event). EVALSHA directly: a pipeline holding a redis-py Script
        # sends SCRIPT EXISTS before every execution (and redis-py's cluster pipeline refuses its
        # evalsha method, not the command: both commands name the one stream).
        #
        # A node that may not have the script (this client's first read of the stream, or the
        # first since a connection failed: Redis restarted, or a replica took over) would answer
        # NOSCRIPT and the read would run unchecked, crossing any gap without counting it: the
        # check runs alone first (loading the script), and a gap it settles is returned with no
        # entries (the next read goes on).
        if stream not in self._loaded:
            first_gap, last = await self._settled(stream, group)
            self._loaded.add(stream)
            if first_gap is not None:
                return [], first_gap, last
        ack = [("XACK", stream, group, *acks)] if acks else []
        try:
            *acked, checked, got = await pipelined(
                self.redis,
                [
                    *ack,
                    ("EVALSHA", self._check.sha, 1, stream, group, "1"),
                    (
                        "XREADGROUP",
                        "GROUP",
                        group,
                        consumer,
                        "COUNT",
                        count,
                        "STREAMS",
                        stream,
                        ">",
                    ),
                ],
            )
        except BaseException:
            self._loaded.clear()  # the next connection may reach another Redis
            raise
        if isinstance(got, Exception):
            raise got
        if acked and isinstance(acked[0], Exception):
            log.warning("could not acknowledge %d entries of %s: %s", len(acks), stream, acked[0])
        entries: list[Entry] = []
        for _, batch in got or ():
            entries.extend(batch)
        if isinstance(checked, NoScriptError):  # Redis lost its scripts (SCRIPT FLUSH)
            gap, last = await self._settled(stream, group)
        elif isinstance(checked, Exception):
            raise checked
        elif checked[1] is None:  # the backlog case (_CHECK): nothing cut; no last id
            gap, last = None, ""
            if not entries:  # a lag with nothing to read: the full check says why
                gap, last = await self._settled(stream, group)
        else:
            gap, last = self._gap(stream, group, checked[0]), _text(checked[1])
        return entries, gap, last

    async def _settled(self, stream: str, group: str) -> tuple[Gap | None, str]:
        """The check alone (the script, loaded if Redis lost it): the settled gap, the last id."""
        raw_gap, last = await self._check(keys=[stream], args=[group])
        return self._gap(stream, group, raw_gap), _text(last)

    @staticmethod
    def _gap(stream: str, group: str, raw: Any) -> Gap | None:
        if not raw:
            return None
        lost, after, before = raw
        return Gap(stream, group, int(lost), _text(after), _text(before))

    async def settle(self, stream: str, group: str) -> Gap | None:
        """The gap the hard cap left before ``group``'s next entry on ``stream``, settled (to be
        recorded), or None."""
        gap, _ = await self._settled(stream, group)
        return gap

    # -- reports -------------------------------------------------------------------------------

    async def record(self, gap: Gap) -> None:
        """Report entries the hard cap cut before ``gap.group`` read them: a dead letter with
        the range, the count and the group; the group's lost counter; a metric; a log line."""
        reason = (
            f"{gap.count} entries of {gap.stream} cut by its hard cap before group {gap.group} "
            f"read them (ids after {gap.after}, before {gap.before})"
        )
        letter = dead_letter_entry(
            gap.stream, reason, b"", hook=gap.group, groups=gap.group, lost=str(gap.count),
            after=gap.after, before=gap.before,
        )  # fmt: skip
        await self._report(gap.stream, gap.group, gap.count, [letter])
        log.error("%s; add replicas or raise the cap", reason)

    async def record_trimmed(self, stream: str, group: str, entry_ids: list[bytes]) -> None:
        """Report pending entries of ``group`` that the hard cap cut before they were
        acknowledged (``XAUTOCLAIM`` dropped them from the group): a dead letter each."""
        if not entry_ids:
            return
        reason = f"{TRIMMED}: cut by the hard cap of {stream} while pending"
        extra = {"hook": group, "groups": group, "lost": "1", "after": "-", "before": "-"}
        letters = [
            dead_letter_entry(stream, reason, b"", entry_id=_text(i), **extra) for i in entry_ids
        ]
        await self._report(stream, group, len(entry_ids), letters)
        log.error(
            "%d pending entries of group %s on %s were %s (first %s); add replicas or raise the "
            "cap",
            len(entry_ids), group, stream, TRIMMED, _text(entry_ids[0]),
        )  # fmt: skip

    def _dlq(self, group: str) -> str:
        """A group's loss letters go to its unit: an async hook's group is named after it."""
        try:
            return self.keys.hook_dlq(group)
        except HookBusError:  # a group no hook service made: the coordinators' unit
            return self.keys.dlq

    async def _report(self, stream: str, group: str, count: int, letters: list[Any]) -> None:
        async with self.redis.pipeline(transaction=False) as pipe:
            for letter in letters:
                xadd_dead_letter(pipe, self._dlq(group), letter)
            # A group no hook service made has no counter: its dead letters say it.
            with contextlib.suppress(HookBusError):
                pipe.hincrby(self.keys.lost(check_name("hook name", group)), stream, count)
            await pipe.execute()
        telemetry.count_lost(group, stream, count)

    # -- retention pass ------------------------------------------------------------------------

    async def trim(self, stream: str, maxlen: int) -> dict[str, Any]:
        """One retention pass over ``stream``: settle and record every group's gap, warn about
        groups near the hard cap, trim history older than about ``maxlen`` entries but never
        what a group still needs. Returns what it did (for logs, ``hookbus lag`` and tests)."""
        lost = 0
        for group in await group_backlogs(self.redis, stream):
            gap = await self.settle(stream, group)
            if gap:
                await self.record(gap)
                lost += gap.count
        backlogs = await group_backlogs(self.redis, stream)
        at_risk = []
        cap = hard_cap(maxlen)
        for name, b in backlogs.items():
            backlog = (b["lag"] or 0) + b["pending"]
            if backlog > cap // 2:
                at_risk.append(name)
                log.warning(
                    "group %s is %d entries behind on %s: past %d the stream's cap drops "
                    "entries it has not handled yet; add replicas or fix the hook",
                    name, backlog, stream, cap,
                )  # fmt: skip
        length = await self.redis.xlen(stream)
        if length <= maxlen:
            return {"trimmed": 0, "at_risk": at_risk, "lost": lost}
        info: Any = await self.redis.xinfo_stream(stream)
        first, last = _id(info["first-entry"][0]), _id(info["last-entry"][0])
        # The stream id is a millisecond clock: estimate the id maxlen entries from the end.
        span = max(1, last[0] - first[0])
        boundary = (last[0] - int(span * maxlen / length), 0)
        floor = min([boundary, *(b["needs"] for b in backlogs.values())])
        trimmed = int(
            await self.redis.xtrim(stream, minid=f"{floor[0]}-{floor[1]}", approximate=True)
        )
        return {"trimmed": trimmed, "at_risk": at_risk, "lost": lost}


async def group_backlogs(redis: Redis, stream: str) -> dict[str, dict[str, Any]]:
    """Per group: lag (not yet delivered), pending, and the oldest id it still needs (its
    oldest pending entry, or its last delivered one)."""
    try:
        groups: Any = await redis.xinfo_groups(stream)
    except ResponseError:  # no stream yet
        return {}
    out: dict[str, dict[str, Any]] = {}
    for g in groups:
        name = _text(g["name"])
        # Its last delivered entry too: while it is in the stream, nothing the group has yet to
        # read can be gone, whatever a failover did to Redis's count (_CHECK).
        needs = _id(g["last-delivered-id"])
        if g["pending"]:
            summary: Any = await redis.xpending(stream, name)
            if summary["min"] is not None:  # None: acknowledged since XINFO GROUPS answered
                needs = min(needs, _id(summary["min"]))
        out[name] = {"lag": g.get("lag"), "pending": int(g["pending"]), "needs": needs}
    return out
