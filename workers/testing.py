"""Testing hooks: contexts with defaults, one call through the real dispatcher, and a contract
test against a real worker process on a private Redis.

::

    from workers.testing import context, dispatch, served

    result = await dispatch(MyHook(), "PreToolUse", tool_args={"path": ".env"})
    assert result.is_blocked                                 # tool_name defaults to file_read

    async with served("my_hooks:MyHook") as hooks:          # redis-server + `hookbus worker`
        result = await hooks.run_pre_tool_use(context("PreToolUse", tool_name="file_read"))
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from typing import Any

from bus.events import CONTEXT_TYPES, HookContext, HookEvent
from bus.hooks import AgentHook
from bus.registry import HookRegistry
from bus.runner import EventRunner
from bus.settings import HookSettings

#: Values used for a context's required fields when a test does not give them.
DEFAULTS: dict[str, Any] = {
    "session_id": "test-session",
    "parent_session_id": "test-session",
    "tool_name": "file_read",
    "subagent_name": "helper",
    "step": 1,
    "max_steps": 10,
}


def context(event: HookEvent | str, **fields: Any) -> HookContext:
    """A context for ``event``: the fields given, sensible defaults for the required rest."""
    kind = CONTEXT_TYPES[HookEvent.parse(event)]
    wanted = {name: DEFAULTS[name] for name in kind.__struct_fields__ if name in DEFAULTS}
    ctx: HookContext = kind(**{**wanted, **fields})  # type: ignore[assignment]
    return ctx


async def dispatch(
    hook: AgentHook, event: HookEvent | str, *, timeout: float = 5.0, **fields: Any
) -> Any:
    """Run one event through a real HookRegistry holding only ``hook``.

    Subscriptions, the match filter, timeouts, the failure policy and the enforcement mode all
    apply, exactly as in production. Returns the aggregated result of that event.
    """
    registry = HookRegistry(HookSettings(hook_timeout_secs=timeout))
    registry.add(hook)
    result = await registry.run(event, context(event, **fields))
    await registry.drain()
    return result


@contextlib.asynccontextmanager
async def served(
    target: str, *, redis_url: str | None = None, prefix: str | None = None, timeout: float = 30
) -> AsyncIterator[EventRunner]:
    """Serve ``package.module:HookClass`` with ``hookbus worker`` and yield a HookClient.

    Starts a private ``redis-server`` unless ``redis_url`` is given. The worker runs in its own
    process, exactly as deployed: this is the contract test of a hook service.
    """
    from agent_adapter.client import HookClient
    from bus.settings import BusSettings
    from workers.redis_server import RedisServer, stop_process

    server = None if redis_url else RedisServer().start()
    url = redis_url or server.url  # type: ignore[union-attr]
    settings = BusSettings(redis_url=url, prefix=prefix or f"test{os.getpid()}", refresh_secs=0.2)
    env = {**os.environ, "HOOKBUS_REDIS_URL": url, "HOOKBUS_PREFIX": settings.prefix}
    worker = subprocess.Popen(
        [sys.executable, "-m", "workers.cli", "worker", target],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    client = HookClient(settings, HookSettings(hook_timeout_secs=10))
    try:
        await client.start()
        name = target.rpartition(":")[2]
        deadline = time.monotonic() + timeout
        while not any(client.directory.live(n) for n in client.directory.by_name):
            if worker.poll() is not None or time.monotonic() > deadline:
                error = worker.stderr.read().decode() if worker.stderr else ""
                raise RuntimeError(f"hook service {name} did not start: {error[-1000:]}")
            await asyncio.sleep(0.02)
        yield client
    finally:
        await client.close()
        stop_process(worker, grace=15)
        if worker.stderr:
            worker.stderr.close()
        if server is not None:
            server.close()
