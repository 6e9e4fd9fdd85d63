"""Run the same hooks embedded or as worker processes over a real Redis."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import msgspec

from agent_adapter.client import HookClient
from bus import EventRunner, HookRegistry, HookSettings
from bus.settings import BusSettings
from tests.remote_hooks import HookConfig, Scripted

ROOT = Path(__file__).resolve().parent.parent


def worker_env(settings: BusSettings, **extra: str) -> dict[str, str]:
    return {
        **os.environ,
        "HOOKBUS_REDIS_URL": settings.redis_url,
        "HOOKBUS_PREFIX": settings.prefix,
        "HOOKBUS_HEARTBEAT_SECS": str(settings.heartbeat_secs),
        "HOOKBUS_LIVENESS_SECS": str(settings.liveness_secs),
        "HOOKBUS_CLAIM_IDLE_SECS": str(settings.claim_idle_secs),
        "HOOKBUS_PARTITIONS": str(settings.partitions),
        "HOOKBUS_EVENTS_MAXLEN": str(settings.events_maxlen),
        **extra,
    }


class Processes:
    """Child processes of one test, each logging to its own file; all killed at the end."""

    def __init__(self, logdir: Path) -> None:
        self.logdir = logdir
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self, args: list[str], env: dict[str, str], label: str) -> subprocess.Popen[bytes]:
        log = open(self.logdir / f"{label}-{len(self.procs)}.log", "wb")  # noqa: SIM115
        proc = subprocess.Popen(
            [sys.executable, "-m", "workers.cli", *args], env=env, cwd=ROOT, stdout=log, stderr=log
        )
        log.close()
        self.procs.append(proc)
        return proc

    def worker(
        self, settings: BusSettings, target: str, label: str, *extra_args: str, **env: str
    ) -> subprocess.Popen[bytes]:
        return self.start(["worker", target, *extra_args], worker_env(settings, **env), label)

    def scripted(self, settings: BusSettings, config: HookConfig, *args: str, **env: str) -> Any:
        payload = msgspec.json.encode(config).decode()
        return self.worker(
            settings,
            "tests.remote_hooks:Scripted",
            config.name,
            *args,
            HOOKBUS_TEST_HOOK=payload,
            **env,
        )

    def logs(self) -> str:
        return "\n".join(p.read_text() for p in sorted(self.logdir.glob("*.log")))

    def stop_all(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
        for proc in self.procs:
            proc.wait(10)


async def wait_for(condition: Any, timeout: float = 20.0, what: str = "condition") -> Any:
    """Poll ``condition()`` (sync or async) until it returns something true, and return that;
    fail with ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = condition()
        if inspect.isawaitable(result):
            result = await result
        if result:
            return result
        await asyncio.sleep(0.02)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def until(condition: Any, what: str, timeout: float = 60.0, explain: Any = lambda: "") -> Any:
    """``wait_for`` for code outside an event loop: poll ``condition()`` until it returns
    something true, and return that; fail with ``what`` (and ``explain()``) after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        result = condition()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what} {explain()}")
        time.sleep(0.1)


def audit_events(db: Path, *columns: str) -> list[tuple[Any, ...]]:
    """``columns`` of every row the AsyncAuditLogHook service wrote to ``db`` (SQLite); none
    while the database or its table does not exist yet."""
    if not db.exists():
        return []
    with contextlib.closing(sqlite3.connect(db, timeout=30)) as conn:
        try:
            return conn.execute(f"SELECT {', '.join(columns)} FROM agent_audit_events").fetchall()
        except sqlite3.OperationalError:  # created with the first batch
            return []


async def wait_live(client: HookClient, *names: str, replicas: int = 1) -> None:
    def ready() -> bool:
        targets = client.directory.by_name
        return all(n in targets and targets[n].replicas >= replicas for n in names)

    client.directory  # noqa: B018 - refreshed by the client's own loop
    await wait_for(ready, what=f"hooks {names} to be live")


class Harness:
    """Hooks from HookConfigs, run embedded or as one worker process each."""

    def __init__(self, mode: str, settings: BusSettings, procs: Processes) -> None:
        self.mode = mode
        self.settings = settings
        self.procs = procs
        self.runner: EventRunner | None = None

    async def start(self, *configs: HookConfig, hook_timeout: float = 10.0) -> EventRunner:
        hook_settings = HookSettings(hook_timeout_secs=hook_timeout)
        if self.mode == "embedded":
            registry = HookRegistry(hook_settings)
            for c in configs:
                registry.add(Scripted(c))
            self.runner = registry
            return registry
        for c in configs:
            self.procs.scripted(self.settings, c)
        client = await HookClient(self.settings, hook_settings).start()
        self.runner = client
        await wait_live(client, *(c.name for c in configs))
        return client

    async def close(self) -> None:
        if isinstance(self.runner, HookClient):
            await self.runner.close()


def put_manifest(redis: Any, keys: Any, name: str, data: bytes) -> None:
    """Register a manifest as a hook service does (``{p}:hook:{NAME}:manifest`` and its name in
    ``{p}:hooks``), with a synchronous client: for tests that plant one, broken or not."""
    redis.set(keys.manifest(name), data)
    redis.sadd(keys.hooks, name)


async def all_dead_letters(redis: Any, keys: Any) -> list[dict[bytes, bytes]]:
    """The fields of every dead letter of every unit (key layout 3: the coordinators', each
    registered hook's, each served tenant's), unit by unit."""
    from workers.ops.dead_letters import dead_letter_units

    out: list[dict[bytes, bytes]] = []
    for unit in await dead_letter_units(redis, keys):
        out += [f for _, f in await redis.xrange(unit.stream)]
    return out
