"""Testing hooks: contexts with defaults, one call through the real dispatcher, and a contract
test against a real worker process on a private Redis.

::

    from workers.testing import context, dispatch, served

    result = await dispatch(MyHook(), "PreToolUse", tool_args={"path": ".env"})
    assert result.is_blocked                                 # tool_name defaults to file_read

    async with served("my_hooks:MyHook", "my_hooks:Audit --set table=t") as hooks:
        # a private redis-server and one `hookbus worker` per target, each of them live
        result = await hooks.run_pre_tool_use(context("PreToolUse", tool_name="file_read"))

``wait_for_hooks(client, "MyHook", ...)`` waits for hook services a test started itself.

The same contract test without asyncio, as the pytest plugin's fixtures serve it
(``workers/pytest_plugin.py``: ``hookbus_redis``, ``hookbus_serve``)::

    with ServedHooks(["my_hooks:MyHook"], redis_url=url) as hooks:
        result = hooks.run("PreToolUse", tool_args={"path": ".env"})

A hook's mistakes get here the outcome they get in production (docs/writing-hooks.md, "When a
hook goes wrong"): a plain ``def`` hook method is refused when ``dispatch`` loads the hook, as
``hookbus worker`` refuses it; a hook that raises, answers the wrong type or holds the event
loop past its timeout fails under its failure policy, as it does behind ``served``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shlex
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Coroutine, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from agent_adapter.client import HookClient
from bus.events import CONTEXT_TYPES, HookContext, HookEvent
from bus.hooks import AgentHook
from bus.registry import HookRegistry
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


T = TypeVar("T")

#: One hook service for ``served``: the arguments of ``hookbus worker``, as one string
#: (``"my_hooks:Guard --set limit=3"``, split like a shell line) or a list.
Target = str | Sequence[str]


@contextlib.asynccontextmanager
async def served(
    *targets: Target,
    redis_url: str | None = None,
    prefix: str | None = None,
    timeout: float = 30,
    cwd: str | os.PathLike[str] | None = None,
) -> AsyncIterator[HookClient]:
    """Serve each target with its own ``hookbus worker`` process and yield a HookClient, once
    every one of them is live.

    Each target is what follows ``hookbus worker``: ``"my_hooks:MyHook"``, or with options,
    ``"my_hooks:MyHook --set limit=3"``. The workers run in ``cwd`` (default: the current
    directory), which is where they import from (``--app-dir``). Starts a private
    ``redis-server`` unless ``redis_url`` is given. Each worker runs in its own process,
    exactly as deployed: this is the contract test of a hook service. A worker that exits, or
    is not live within ``timeout`` seconds, fails with its log.
    """
    from bus.settings import BusSettings
    from workers.local.redis_server import RedisServer, stop_process

    if not targets:
        raise ValueError("served() needs at least one target (package.module:HookClass)")
    argvs = [shlex.split(t) if isinstance(t, str) else list(t) for t in targets]
    server = None if redis_url else RedisServer().start()
    url = redis_url or server.url  # type: ignore[union-attr]
    settings = BusSettings(redis_url=url, prefix=prefix or f"test{os.getpid()}", refresh_secs=0.2)
    env = {**os.environ, "HOOKBUS_REDIS_URL": url, "HOOKBUS_PREFIX": settings.prefix}
    logs = tempfile.TemporaryDirectory(prefix="hookbus-served-")
    workers: list[Worker] = []
    client = HookClient(settings, HookSettings(hook_timeout_secs=10))
    try:
        for i, argv in enumerate(argvs):
            log = Path(logs.name) / f"worker-{i}.log"
            with log.open("wb") as out:
                proc = subprocess.Popen(
                    [sys.executable, "-m", "workers.cli", "worker", *argv],
                    env=env, cwd=cwd, stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                )  # fmt: skip
            workers.append(Worker(" ".join(argv), proc, log))
        await client.start()
        names = await _own_hooks(client, workers, timeout)
        await wait_for_hooks(client, *names, timeout=timeout)
        yield client
    finally:
        await client.close()
        for worker in workers:
            stop_process(worker.proc, grace=15)
        logs.cleanup()
        if server is not None:
            server.close()


@dataclass
class Worker:
    """One ``hookbus worker`` process ``served`` started."""

    target: str
    proc: subprocess.Popen[bytes]
    log: Path

    def failed(self) -> str:
        tail = self.log.read_text(errors="replace")[-2000:] if self.log.exists() else ""
        return f"hook service `hookbus worker {self.target}` did not start: {tail}"


async def _own_hooks(client: HookClient, workers: Sequence[Worker], timeout: float) -> list[str]:
    """The hook name each worker process registered under: the hook whose replicas hold one
    with the process's id (``HOST-PID-…``), whatever the hook calls itself."""
    host = socket.gethostname()
    found: dict[int, str] = {}
    deadline = time.monotonic() + timeout
    while len(found) < len(workers):
        for worker in workers:
            if worker.proc.poll() is not None:
                raise RuntimeError(worker.failed())
        names = {*client.directory.by_name, *client.directory.async_hooks}
        for name in names:
            members: Any = await client.redis.zrange(client.keys.replicas(name), 0, -1)
            for member in members:
                text = member.decode() if isinstance(member, bytes) else str(member)
                for worker in workers:
                    if text.startswith(f"{host}-{worker.proc.pid}-"):
                        found[worker.proc.pid] = name
        if time.monotonic() > deadline:
            waiting = [w for w in workers if w.proc.pid not in found]
            raise RuntimeError(f"not registered after {timeout:g}s: " + waiting[0].failed())
        await asyncio.sleep(0.05)
    return list(dict.fromkeys(found[w.proc.pid] for w in workers))


async def wait_for_hooks(client: HookClient, *names: str, timeout: float = 30) -> None:
    """Wait until ``client`` sees each named hook service live: a sync hook in its directory
    with a live replica, an async hook registered with a replica whose heartbeat is within
    the liveness time. For tests that start ``hookbus worker`` processes themselves."""
    deadline = time.monotonic() + timeout
    while True:
        waiting = [n for n in names if not await _live(client, n)]
        if not waiting:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"hooks not live after {timeout:g}s: {', '.join(waiting)}")
        await asyncio.sleep(0.05)


async def _live(client: HookClient, name: str) -> bool:
    if client.directory.live(name):
        return True
    if name not in client.directory.async_hooks:
        return False
    now, window = client.directory.clock.now_ms(), int(client.bus.liveness_secs * 1000)
    live: Any = await client.redis.zrange(
        client.keys.replicas(name), now - window, now + window, byscore=True
    )  # a heartbeat dated ahead is not live either (bus/transport/directory.py)
    return bool(live)


class ServedHooks:
    """:func:`served`, for tests that do not run an event loop: the workers started, each live,
    on return; ``run`` dispatches one event through them and returns its result; ``close``
    (or leaving the ``with`` block) stops them. The client lives on an event loop of its own,
    in a thread, so ``await ask(...)`` works from any test's loop too.

    Args: as :func:`served` (``targets``: a list of them).
    """

    def __init__(
        self,
        targets: Sequence[Target],
        *,
        redis_url: str | None = None,
        prefix: str | None = None,
        timeout: float = 30,
        cwd: str | os.PathLike[str] | None = None,
    ) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="hookbus-served", daemon=True
        )
        self._thread.start()
        self._hooks = contextlib.AsyncExitStack()
        try:
            self.client: HookClient = self._call(
                self._hooks.enter_async_context(
                    served(*targets, redis_url=redis_url, prefix=prefix, timeout=timeout, cwd=cwd)
                )
            )
        except BaseException:
            self._stop_loop()
            raise

    def run(self, event: HookEvent | str, **fields: Any) -> Any:
        """Dispatch ``event`` (its context: :func:`context` of ``fields``); the result."""
        return self._call(self.client.run(event, context(event, **fields)))

    async def ask(self, event: HookEvent | str, **fields: Any) -> Any:
        """:meth:`run`, awaited from another event loop."""
        coro = self.client.run(event, context(event, **fields))
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, self._loop))

    def close(self) -> None:
        """Stop the workers (and the private Redis, if one was started); idempotent."""
        if self._loop.is_closed():
            return
        try:
            self._call(self._hooks.aclose())
        finally:
            self._stop_loop()

    def __enter__(self) -> ServedHooks:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def _stop_loop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()
