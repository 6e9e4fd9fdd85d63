"""Issue 30, item 8: retiring a hook. A fail-closed hook whose replicas are stopped but which is
left registered blocks every call it would be asked about; ``hookbus hooks remove`` clears it.
A replica of a removed hook, already serving or started afterwards (a Deployment's restart),
stays up, ready but idle: it answers nothing, says once why and how to undo it, answers
``/readyz``, and serves again after ``hookbus hooks restore`` — it never exits 2 and crash-loops.
"""

from __future__ import annotations

import asyncio
import signal
import socket
import subprocess
import sys
from typing import Any

import pytest

from agent_adapter.client import HookClient
from bus.settings import BusSettings, HookSettings
from tests.harness import ROOT, Processes, wait_for, wait_live, worker_env
from tests.test_probes import get
from workers.testing import context, wait_for_hooks

HOOK = "SecretGuard"  # workers.builtins.demo_hooks: failure_policy "fail", PreToolUse on .env files
IDLE = (
    f"hook {HOOK} was removed by test-operator at ",
    f"(hookbus hooks remove): not serving it. To serve it again: hookbus hooks restore {HOOK}; "
    "this replica stays up, idle (it answers nothing), until then",
)


def operator(settings: BusSettings, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "workers.cli", "hooks", *args], env=worker_env(settings),
        cwd=ROOT, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def ask(client: HookClient) -> Any:
    return await client.run_pre_tool_use(context("PreToolUse", tool_args={"path": "app/.env"}))


@pytest.mark.redis
async def test_a_removed_hooks_replicas_stay_up_idle_and_serve_again_once_restored(
    bus_settings: BusSettings, procs: Processes
) -> None:
    target = f"workers.builtins.demo_hooks:{HOOK}"
    async with HookClient(bus_settings, HookSettings(hook_timeout_secs=5)) as client:
        first = procs.worker(bus_settings, target, "first")
        await wait_live(client, HOOK)
        assert (await ask(client)).is_blocked

        # Stopped but left registered, a fail-closed hook blocks every call it is asked about.
        first.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(first.wait, 60) == 0
        stopped = await ask(client)
        assert stopped.is_blocked and "no live replica" in stopped.blocking_errors[0].reason

        # Removed while a replica serves: that replica stops serving and stays up, idle.
        serving = procs.worker(bus_settings, target, "serving")
        await wait_live(client, HOOK)
        removed = await asyncio.to_thread(operator, bus_settings, "remove", HOOK, "--by",
                                          "test-operator")  # fmt: skip
        assert removed.returncode == 0, removed.stderr  # no replica of it is live any more
        await wait_for(lambda: HOOK not in client.directory.by_name, 30, "the hook to go")
        assert not (await ask(client)).is_blocked  # no longer selected: the call goes on

        # A replica started for the removed hook (a Deployment restarting a pod) stays up,
        # ready and idle, and says so once; it does not exit 2.
        port = free_port()
        late = procs.worker(bus_settings, target, "late", HOOKBUS_HEALTH_PORT=str(port))
        await wait_for(lambda: procs.logs().count(IDLE[1]) == 2, 60, "both to say they idle")
        assert serving.poll() is None and late.poll() is None, procs.logs()
        assert IDLE[0] in procs.logs()
        status = await wait_for(lambda: get(port, "/readyz")[0] == 200, 30, "/readyz 200")
        assert status
        assert not (await ask(client)).is_blocked

        restored = await asyncio.to_thread(operator, bus_settings, "restore", HOOK)
        assert restored.returncode == 0, restored.stderr
        await wait_live(client, HOOK, replicas=2)  # both serve again, without a restart
        assert (await ask(client)).is_blocked
        assert procs.logs().count(f"hook {HOOK} was restored: serving it again") == 2
        assert procs.logs().count(IDLE[1]) == 2  # one line each, however long they idled

    for proc in (serving, late):
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(proc.wait, 60) == 0


@pytest.mark.redis
async def test_a_replica_started_for_a_removed_async_hook_stays_up_idle(
    bus_settings: BusSettings, procs: Processes
) -> None:
    name, target = "AsyncMetricsHook", "workers.builtins.metrics:AsyncMetricsHook"
    async with HookClient(bus_settings, HookSettings(hook_timeout_secs=5)) as client:
        first = procs.worker(bus_settings, target, "first")
        await wait_for_hooks(client, name, timeout=60)
        removed = await asyncio.to_thread(operator, bus_settings, "remove", name)
        assert removed.returncode == 0, removed.stderr
        assert await asyncio.to_thread(first.wait, 60) == 0  # the running one stops (exit 0)

        late = procs.worker(bus_settings, target, "late")  # its restart: up, idle, says so
        idle = f"hookbus hooks restore {name}; this replica stays up, idle"
        await wait_for(lambda: idle in procs.logs(), 60, "the late replica to say it idles")
        assert late.poll() is None, procs.logs()

        restored = await asyncio.to_thread(operator, bus_settings, "restore", name)
        assert restored.returncode == 0, restored.stderr
        await wait_for(lambda: f"hook {name} was restored" in procs.logs(), 60, "restored")
        await wait_for_hooks(client, name, timeout=60)  # it serves again, without a restart
    late.send_signal(signal.SIGTERM)
    assert await asyncio.to_thread(late.wait, 60) == 0
