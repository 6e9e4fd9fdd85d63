"""Fault-injection tests (marked ``chaos``): real Redis, real worker and coordinator processes,
faults injected under steady load, and a ledger that must reconcile.

Each test adds its ledger (what was sent, what was decided, what was handled, what faults were
injected) with ``ledger.add``; the table is printed at the end of the run, and its figures are
the ones quoted in docs/reliability.md.
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterator
from typing import Any

import msgspec
import pytest

from bus.settings import BusSettings
from tests.chaos.load import CHAOS_EVENTS_MAXLEN

ROWS: list[tuple[str, dict[str, Any]]] = []


@pytest.fixture
def bus_settings(bus_settings: BusSettings) -> BusSettings:
    return msgspec.structs.replace(bus_settings, events_maxlen=CHAOS_EVENTS_MAXLEN)


class Ledger:
    def __init__(self, test: str) -> None:
        self.test = test

    def add(self, **figures: Any) -> None:
        ROWS.append((self.test, figures))


@pytest.fixture
def ledger(request: pytest.FixtureRequest) -> Ledger:
    return Ledger(request.node.name)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = os.path.dirname(__file__)
    for item in items:
        if str(item.fspath).startswith(here):
            item.add_marker(pytest.mark.chaos)
            item.add_marker(pytest.mark.redis)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not ROWS:
        return
    terminalreporter.section("chaos ledger")
    for test, figures in ROWS:
        terminalreporter.write_line(test)
        for key, value in figures.items():
            terminalreporter.write_line(f"    {key:<34} {value}")


class Freezer:
    """SIGSTOP / SIGCONT child processes; every frozen one is thawed at the end of the test."""

    def __init__(self) -> None:
        self.frozen: set[subprocess.Popen[bytes]] = set()

    def freeze(self, proc: subprocess.Popen[bytes]) -> None:
        proc.send_signal(signal.SIGSTOP)
        self.frozen.add(proc)

    def thaw(self, proc: subprocess.Popen[bytes]) -> None:
        if proc.poll() is None:
            proc.send_signal(signal.SIGCONT)
        self.frozen.discard(proc)


@pytest.fixture
def freezer() -> Iterator[Freezer]:
    f = Freezer()
    try:
        yield f
    finally:
        for proc in list(f.frozen):
            f.thaw(proc)
