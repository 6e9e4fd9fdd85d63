"""Issue 30, items 1-3: one hook class decides alike in ``workers.testing``, ``HookRegistry``,
``HookClient`` (through a real ``hookbus worker`` process) and ``hookbus worker`` itself.

Each authoring mistake (tests/mistaken_hooks.py) runs through all four paths. What can be known
when the class loads is refused there, everywhere, with one line saying what to change; the rest
fails under the hook's failure policy (here ``fail``: PreToolUse is Blocked) and is logged by the
process that ran the hook, a traceback once per kind. A hook that holds the event loop past its
timeout, which nothing can pre-empt, is recorded as a timeout embedded, and named, with the line
it is stuck on, in the worker's log while it holds the loop.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import pytest

from agent_adapter.client import HookClient
from bus import HookRegistry
from bus.errors import ConfigError
from bus.settings import BusSettings, HookSettings
from tests import mistaken_hooks
from tests.harness import Processes, wait_for, wait_live
from workers.testing import context, dispatch


@dataclass(frozen=True)
class Mistake:
    hook: str
    refused: str = ""  # refused at load, saying this; else it fails when called:
    kind: str = ""  # the failure kind recorded (error, timeout)
    reason: str = ""  # the Block's reason, the same in every path ("" if it differs by path)
    embedded: tuple[str, ...] = ()  # in the embedded reason
    worker_log: tuple[str, ...] = field(default=())  # in the worker process's log
    calls: int = 3


ACCEPTS = "PreToolUse accepts Continue, Block, MutateInput, PermissionRequired"
MISTAKES = [
    Mistake("PlainDef", refused="hook PlainDef: pre_tool_use() is a plain def; write "
            "`async def pre_tool_use(self, ctx)`"),
    Mistake("Misspelt", refused="pre_tooluse() is not a method an AgentHook is called with: "
            "did you mean 'pre_tool_use'?"),
    Mistake("AsyncProblem", refused="hook AsyncProblem: problem() is async; it is asked at "
            "each heartbeat and must be a plain def returning one line"),
    Mistake("WrongType", kind="error",
            reason=f"hook WrongType failed: answered str; {ACCEPTS} (failure_policy=fail)",
            worker_log=(f"hook WrongType failed on PreToolUse: answered str; {ACCEPTS}",)),
    Mistake("Raises", kind="error",
            reason="hook Raises failed: RuntimeError: the rules file is missing "
            "(failure_policy=fail)",
            worker_log=("hook Raises raised on PreToolUse: RuntimeError: the rules file is "
                        "missing (it fails under its failure policy)",
                        'raise RuntimeError("the rules file is missing")')),
    Mistake("Blocks", kind="timeout", calls=1,
            embedded=("hook Blocks timed out: held the event loop 1.5", "past its 0.5s timeout",
                      "use `await asyncio.to_thread(...)`"),
            worker_log=("hook Blocks has held this worker's event loop for",
                        "in pre_tool_use, ", "time.sleep(BLOCK_SECS)",
                        "so this replica shows as not live meanwhile",
                        "hook Blocks held the event loop 1.5",
                        "the event loop turns again")),
    Mistake("BlocksLater", kind="timeout", calls=1,
            embedded=("hook BlocksLater timed out: answered after 1.5", "past its 0.5s timeout",
                      "the event loop was blocked meanwhile"),
            worker_log=("hook BlocksLater has held this worker's event loop for",
                        "time.sleep(BLOCK_SECS)", "hook BlocksLater answered after 1.5")),
]  # fmt: skip


def tracebacks(records: list[logging.LogRecord], hook: str) -> int:
    return sum(1 for r in records if r.exc_info and f"hook {hook} " in r.getMessage())


@pytest.mark.redis
@pytest.mark.parametrize("mistake", MISTAKES, ids=[m.hook for m in MISTAKES])
async def test_each_authoring_mistake_gets_one_outcome_in_all_four_paths(
    mistake: Mistake,
    bus_settings: BusSettings,
    procs: Processes,
    caplog: pytest.LogCaptureFixture,
) -> None:
    cls = getattr(mistaken_hooks, mistake.hook)
    caplog.set_level(logging.WARNING, logger="hookbus")
    worker = procs.worker(bus_settings, f"tests.mistaken_hooks:{mistake.hook}", mistake.hook)

    if mistake.refused:
        # workers.testing and HookRegistry refuse it when it loads...
        with pytest.raises(ConfigError) as in_testing:
            await dispatch(cls(), "PreToolUse")
        with pytest.raises(ConfigError) as in_registry:
            HookRegistry().add(cls())
        assert mistake.refused in str(in_testing.value)
        assert str(in_registry.value) == str(in_testing.value)
        # ...and so does hookbus worker: exit 2, the same words, no traceback, never registered.
        await wait_for(lambda: worker.poll() is not None, 60, "the worker to refuse the hook")
        assert worker.returncode == 2, procs.logs()
        assert mistake.refused in procs.logs() and "Traceback" not in procs.logs()
        async with HookClient(bus_settings, HookSettings(hook_timeout_secs=5)) as client:
            assert mistake.hook not in client.directory.by_name
        return

    # Embedded: workers.testing, then a HookRegistry of the agent's.
    embedded = [await dispatch(cls(), "PreToolUse", timeout=5) for _ in range(mistake.calls)]
    registry = HookRegistry(HookSettings(hook_timeout_secs=5))
    registry.add(cls())
    embedded.append(await registry.run_pre_tool_use(context("PreToolUse")))
    registry = HookRegistry(HookSettings(hook_timeout_secs=5))  # as a session's hook: the
    registry.add_session_hook("test-session", cls())  # dispatcher's general path
    embedded.append(await registry.run_pre_tool_use(context("PreToolUse")))
    # Distributed: a HookClient asks the hook in a real hookbus worker process.
    async with HookClient(bus_settings, HookSettings(hook_timeout_secs=5)) as client:
        await wait_live(client, mistake.hook)
        remote = [
            await client.run_pre_tool_use(context("PreToolUse")) for _ in range(mistake.calls)
        ]
        for expected in mistake.worker_log:  # logged where the hook ran, by the worker
            await wait_for(lambda e=expected: e in procs.logs(), 30, f"{expected!r} in its log")

    for result in [*embedded, *remote]:
        assert result.is_blocked, result
        [skipped] = result.skipped
        assert (skipped.hook_name, skipped.kind, skipped.enforced) == (cls.name, mistake.kind, True)
        [error] = result.blocking_errors
        if mistake.reason:
            assert error.reason == mistake.reason
    for result in embedded:
        for said in mistake.embedded:
            assert said in result.blocking_errors[0].reason
    # Logged by the process that ran it: in this one for the embedded calls (a traceback once,
    # however many calls), in the worker's for the remote ones (the same).
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert f"hook {cls.name} skipped for PreToolUse ({mistake.kind})" in logged
    if mistake.hook == "Raises":
        assert tracebacks(caplog.records, "Raises") == 1
        assert procs.logs().count("Traceback") == 1, procs.logs()
