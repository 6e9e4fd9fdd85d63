"""The loop-lag watchdog of hook services (workers/services/loopwatch.py, issue 30 item 3): while a
hook's code holds the event loop, a line names the hook and the line it is stuck on; code that
is not the hook's is not blamed on it; a loop that only waits is never reported."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import pytest

from bus import CONTINUE, AgentHook
from tests.harness import wait_for
from workers.services.loopwatch import LoopWatch, hook_codes


class Stuck(AgentHook):
    async def pre_tool_use(self, ctx: Any) -> Any:
        time.sleep(0.6)  # the line the watchdog names
        return CONTINUE


def lines(caplog: pytest.LogCaptureFixture) -> str:
    return "\n".join(r.getMessage() for r in caplog.records if r.name == "hookbus.loopwatch")


async def test_a_hook_holding_the_loop_is_named_with_its_line_while_it_holds_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="hookbus.loopwatch")
    hook = Stuck()
    watch = LoopWatch("Stuck", hook_codes(hook), threshold=0.2, tick=0.02)
    async with watch:
        await hook.pre_tool_use(None)
        await wait_for(lambda: watch.stalls and not watch.held, 10, "it to see the loop turn")
    assert watch.stalls == 1
    said = lines(caplog)
    assert "hook Stuck has held this worker's event loop for 0." in said
    assert f"(in pre_tool_use, {__file__}:" in said and "time.sleep(0.6)" in said
    assert "shows as not live meanwhile" in said


async def test_code_that_is_not_the_hooks_is_not_blamed_and_waiting_is_never_reported(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="hookbus.loopwatch")
    watch = LoopWatch("Stuck", hook_codes(Stuck()), threshold=0.2, tick=0.02)
    async with watch:
        await asyncio.sleep(0.5)  # waiting, not held: nothing to say
        assert watch.stalls == 0 and lines(caplog) == ""
        time.sleep(0.6)  # held, by this test's code
        await wait_for(lambda: watch.stalls and not watch.held, 10, "it to see the loop turn")
    said = lines(caplog)
    assert "this worker's event loop has not turned for 0." in said
    assert "not in the hook's code: at test_code_that_is_not_the_hooks" in said
    assert "has held" not in said
