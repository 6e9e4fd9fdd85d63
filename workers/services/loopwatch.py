"""A loop-lag watchdog: a thread that says, while it happens, that a service's event loop has
stopped turning, and which hook's code holds it.

A hook service runs its hook on one event loop. A blocking call in an ``async def`` hook
(``time.sleep``, a synchronous HTTP client, a long computation) holds that loop: no other
request is read, no reply is sent, and no heartbeat reaches Redis, so coordinators see the
replica as not live and ``hookbus hooks list`` shows fewer live replicas. Nothing on the loop can
notice while it is held; this thread can. The loop moves a timestamp every ``tick`` seconds;
when the timestamp is older than ``threshold``, the thread logs one line that names the hook,
the line of its code the loop thread is running (from ``sys._current_frames``) and what to
change; then, every ``repeat_secs`` while it lasts, how long so far; and one line when the loop
turns again. A hook that blocks on every request gets these lines at a bounded rate
(bus/ratelog.py: the first at once, then one per 10 s with the count).

Usage (``HookWorker.run``)::

    async with LoopWatch("NoSecrets", hook_codes(hook), threshold=1.0):
        ...  # serve
"""

from __future__ import annotations

import asyncio
import linecache
import logging
import sys
import threading
import time
import types
from typing import Any

from bus.ratelog import RateLimitedLog

log = logging.getLogger("hookbus.loopwatch")
_lines = RateLimitedLog(log)  # a hook that blocks on every request: one line per 10 s, counted

#: How often the loop moves its timestamp, and how often the thread looks at it (seconds).
TICK_SECS = 0.1
#: While the loop stays held, a line every so many seconds.
REPEAT_SECS = 10.0


def hook_codes(hook: object) -> frozenset[types.CodeType]:
    """The code objects of the functions a hook's own classes define (not HookBus's bases)."""
    codes = set()
    for cls in type(hook).__mro__:
        if cls.__module__ == "bus.hooks" or cls is object:
            continue
        for value in vars(cls).values():
            func = getattr(value, "__func__", value)
            code = getattr(func, "__code__", None)
            if isinstance(code, types.CodeType):
                codes.add(code)
    return frozenset(codes)


class LoopWatch:
    """Watch the running event loop from a thread, for the hook ``name``.

    Args:
        name: the hook the service runs (every line names it).
        codes: its methods' code objects (``hook_codes``), to find its line on the stack.
        threshold: seconds the loop may stay held before a line is logged.
    """

    def __init__(
        self,
        name: str,
        codes: frozenset[types.CodeType],
        threshold: float = 1.0,
        *,
        tick: float = TICK_SECS,
        repeat_secs: float = REPEAT_SECS,
    ) -> None:
        self.name = name
        self.codes = codes
        self.threshold = threshold
        self.tick = tick
        self.repeat_secs = repeat_secs
        self.turned = time.monotonic()
        #: How many times the loop was found held past the threshold (for tests and stats).
        self.stalls = 0
        #: True from a stall's first line until the loop turns again.
        self.held = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread = 0

    async def __aenter__(self) -> LoopWatch:
        self.start()
        return self

    async def __aexit__(self, *_: Any) -> None:
        self.stop()

    def start(self) -> None:
        """Start watching the running loop (call from it)."""
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        self.turned = time.monotonic()
        self._move()
        self._thread = threading.Thread(target=self._watch, name="hookbus-loopwatch", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._timer is not None:
            self._timer.cancel()
        if self._thread is not None:
            self._thread.join(5)

    def _move(self) -> None:
        self.turned = time.monotonic()
        if self._loop is not None and not self._stop.is_set():
            self._timer = self._loop.call_later(self.tick, self._move)

    def _watch(self) -> None:
        held_since: float | None = None  # when the loop last turned before the stall reported
        said = 0.0
        while not self._stop.wait(self.tick):
            turned = self.turned
            lag = time.monotonic() - turned
            if lag <= self.threshold:
                if held_since is not None:
                    _lines.warning(
                        "hook %s: the event loop turns again, after %.1fs held",
                        self.name,
                        turned - held_since,
                        key="turns",
                    )
                    held_since, self.held = None, False
                continue
            if held_since != turned:
                in_hook, where = self.where()
                if where is None or self.turned != turned:  # waiting for I/O, or turning now:
                    continue  # this whole process was paused (SIGSTOP, a starved machine)
                held_since, said = turned, time.monotonic()
                self.stalls, self.held = self.stalls + 1, True
                if in_hook:
                    _lines.error(
                        "hook %s has held this worker's event loop for %.1fs (in %s): requests "
                        "wait and heartbeats stop, so this replica shows as not live meanwhile. "
                        "A hook must not block: use `await asyncio.to_thread(...)` or an async "
                        "library",
                        self.name,
                        lag,
                        where,
                        key="held",
                    )
                else:
                    _lines.error(
                        "hook %s: this worker's event loop has not turned for %.1fs (not in the "
                        "hook's code: at %s): requests wait and heartbeats stop meanwhile",
                        self.name,
                        lag,
                        where,
                        key="held elsewhere",
                    )
            elif time.monotonic() - said >= self.repeat_secs:
                said = time.monotonic()
                log.error("hook %s: the event loop still held, %.0fs so far (at %s)", self.name,
                          lag, self.where()[1])  # fmt: skip

    def where(self) -> tuple[bool, str | None]:
        """Whether the loop thread runs the hook's own code, and the line it runs there (else
        its innermost line); None for the line when the loop only waits for I/O (its selector)."""
        frame = sys._current_frames().get(self._loop_thread)
        innermost = frame
        while frame is not None:
            if frame.f_code in self.codes:
                return True, _describe(frame)
            frame = frame.f_back
        if innermost is None:
            return False, "an unknown line"
        if innermost.f_code.co_name in ("select", "poll") and "selectors" in (
            innermost.f_code.co_filename
        ):
            return False, None
        return False, _describe(innermost)


def _describe(frame: types.FrameType) -> str:
    code = frame.f_code
    line = linecache.getline(code.co_filename, frame.f_lineno).strip()
    return f"{code.co_name}, {code.co_filename}:{frame.f_lineno}" + (f": {line}" if line else "")
