"""Run a child process with its wall clock moved, by libfaketime (Debian package ``faketime``).

Only the wall clock moves: the monotonic clock, which asyncio's timers use, stays true, as on a
host whose NTP is off. A test that needs it FAILS (never skips) when libfaketime is missing.
"""

from __future__ import annotations

import glob

import pytest

LIBFAKETIME_PATHS = (
    "/usr/lib/*-linux-gnu/faketime/libfaketime.so.1",  # Debian, Ubuntu (dpkg -L libfaketime)
    "/usr/lib/faketime/libfaketime.so.1",
    "/usr/lib64/faketime/libfaketime.so.1",
    "/usr/local/lib/faketime/libfaketime.so.1",
)


def libfaketime() -> str:
    """The libfaketime library; fails the test, saying what to install, when it is missing."""
    for pattern in LIBFAKETIME_PATHS:
        if found := sorted(glob.glob(pattern)):
            return found[0]
    pytest.fail("the clock-skew tests need libfaketime: apt install faketime (see .ci/run)")


def faked(offset: str = "+5s") -> dict[str, str]:
    """Environment variables that run a process with its wall clock moved by ``offset``."""
    return {
        "LD_PRELOAD": libfaketime(),
        "FAKETIME": offset,
        "FAKETIME_DONT_FAKE_MONOTONIC": "1",
    }
