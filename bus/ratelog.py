"""Rate-limited logging of failures that repeat once per message.

A poison message sent 400 times must not write 400 tracebacks. Each kind of failure (by
default its format string) logs its first occurrence at once; later ones within
``interval`` seconds are only counted, and one line with the count and the last occurrence is
written when the interval ends (on a running event loop: at the end of the interval; otherwise
with the next occurrence after it). A traceback, when asked for, is attached to the first line
of a kind only, never repeated.

Usage::

    failures = RateLimitedLog(logging.getLogger("hookbus.worker"))
    failures.warning("malformed request %s dead-lettered: %s", entry_id, exc)

Why not a ``logging.Filter``: a filter can drop records but cannot write the count of what it
dropped once the burst is over; and every service needs the same behaviour from one place.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass
from typing import Any

#: What ``exc_info`` may be: True for the exception being handled, or an exception.
ExcInfo = bool | BaseException

#: Seconds between two lines of the same kind of failure.
INTERVAL_SECS = 10.0


@dataclass
class _Kind:
    since: float
    suppressed: int = 0
    last: tuple[int, str, tuple[Any, ...]] | None = None
    flush: asyncio.TimerHandle | None = None
    traced: bool = False


class RateLimitedLog:
    """One logger's repeated failures, one line per kind per ``interval`` seconds."""

    def __init__(self, logger: logging.Logger, interval: float = INTERVAL_SECS) -> None:
        self.logger = logger
        self.interval = interval
        self._kinds: dict[str, _Kind] = {}

    def warning(self, msg: str, *args: Any, key: str = "", exc_info: ExcInfo = False) -> None:
        self.log(logging.WARNING, msg, *args, key=key, exc_info=exc_info)

    def error(self, msg: str, *args: Any, key: str = "", exc_info: ExcInfo = False) -> None:
        self.log(logging.ERROR, msg, *args, key=key, exc_info=exc_info)

    def info(self, msg: str, *args: Any, key: str = "") -> None:
        self.log(logging.INFO, msg, *args, key=key)

    def log(
        self, level: int, msg: str, *args: Any, key: str = "", exc_info: ExcInfo = False
    ) -> None:
        """Log ``msg % args`` now, or count it if its kind (``key``, else ``msg``) was logged
        less than ``interval`` seconds ago. ``exc_info``: True (the exception being handled)
        or an exception, whose traceback goes with the kind's first line only."""
        if not self.logger.isEnabledFor(level):
            return
        kind_key = key or msg
        now = time.monotonic()
        kind = self._kinds.get(kind_key)
        if kind is None:
            if len(self._kinds) > 1000:  # bounded: keys are a program's call sites
                self._kinds.clear()
            kind = self._kinds[kind_key] = _Kind(since=now)
        elif now - kind.since < self.interval:
            kind.suppressed += 1
            kind.last = (level, msg, args)
            if kind.flush is None:
                with contextlib.suppress(RuntimeError):  # no loop: the next one reports it
                    due = kind.since + self.interval - now
                    kind.flush = asyncio.get_running_loop().call_later(due, self._flush, kind)
            return
        elif kind.flush is not None:  # its loop ended before the timer fired
            kind.flush.cancel()
            kind.flush = None
        repeats = kind.suppressed + 1
        self._emit(kind, level, msg, args, repeats, exc_info if not kind.traced else False)
        kind.traced = kind.traced or bool(exc_info)

    def _flush(self, kind: _Kind) -> None:
        kind.flush = None
        if kind.suppressed and kind.last is not None:
            level, msg, args = kind.last
            self._emit(kind, level, msg, args, kind.suppressed, False)

    def _emit(
        self,
        kind: _Kind,
        level: int,
        msg: str,
        args: tuple[Any, ...],
        repeats: int,
        exc_info: ExcInfo,
    ) -> None:
        """One line: the occurrence, and how many of its kind it stands for if more than one."""
        if repeats > 1:
            msg = f"{msg} (%d times in the last %.3gs; this is the last)"
            args = (*args, repeats, time.monotonic() - kind.since)
        kind.suppressed = 0
        kind.last = None
        kind.since = time.monotonic()
        self.logger.log(level, msg, *args, exc_info=exc_info)
