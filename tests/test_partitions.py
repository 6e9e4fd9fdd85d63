"""The partition count is the bus's shared configuration (issue 32 item 7): an agent on 3
partitions and an async hook on 1 silently lost every event for the hook (8,502 published, 0
handled, no warning). Now the first process writes the count to ``{p}:config`` (HSETNX), and
every process checks it at start: one on another count refuses to start with one line naming
both counts; ``hooks list`` and ``lag`` show each hook's partitions and shards."""

from __future__ import annotations

import subprocess
import sys

import msgspec
import pytest
from redis.asyncio import Redis

from agent_adapter.client import HookClient
from bus.errors import ConfigError
from bus.settings import BusSettings, HookSettings
from bus.transport.keys import Keys
from tests.harness import ROOT, Processes, wait_for, worker_env
from tests.remote_hooks import AsyncConfig

pytestmark = [pytest.mark.redis, pytest.mark.timeout(180)]


def hookbus(settings: BusSettings, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "workers.cli", *args], cwd=ROOT, capture_output=True, text=True,
        timeout=60, env=worker_env(settings, COLUMNS="250", NO_COLOR="1", **env),
        stdin=subprocess.DEVNULL,
    )  # fmt: skip


def on(settings: BusSettings, partitions: int) -> BusSettings:
    return msgspec.structs.replace(settings, partitions=partitions)


async def first_agent_writes_three(settings: BusSettings) -> None:
    """An agent on 3 partitions is the bus's first process: it writes the count."""
    async with HookClient(on(settings, 3), HookSettings(hook_timeout_secs=5)) as client:
        assert await client.redis.hget(Keys(settings.prefix).config, "partitions") == b"3"


async def test_an_async_hook_on_one_partition_refuses_a_bus_on_three(
    bus_settings: BusSettings, procs: Processes
) -> None:
    await first_agent_writes_three(bus_settings)
    payload = msgspec.json.encode(AsyncConfig(name="Counter")).decode()
    worker = procs.worker(on(bus_settings, 1), "tests.remote_hooks:ScriptedAsync", "counter",
                          HOOKBUS_TEST_ASYNC=payload)  # fmt: skip
    assert worker.wait(60) == 2  # it exits: it does not serve streams no agent writes
    log = procs.logs()
    said = [line for line in log.splitlines() if "HOOKBUS_PARTITIONS" in line]
    assert len(said) == 1 and "Traceback" not in log, log
    assert "this process has HOOKBUS_PARTITIONS=1 but the bus" in said[0]
    assert "has 3 partitions" in said[0] and "start it with HOOKBUS_PARTITIONS=3" in said[0]
    redis = Redis.from_url(bus_settings.redis_url)
    try:
        keys = Keys(bus_settings.prefix)
        assert await redis.exists(keys.manifest("Counter")) == 0  # never registered
        assert await redis.hget(keys.config, "partitions") == b"3"  # and changed nothing
    finally:
        await redis.aclose()


async def test_an_agent_on_another_partition_count_refuses_to_start(
    bus_settings: BusSettings,
) -> None:
    await first_agent_writes_three(bus_settings)
    client = HookClient(on(bus_settings, 1), HookSettings(hook_timeout_secs=5))
    with pytest.raises(ConfigError) as refused:
        await client.start()
    await client.close()
    text = str(refused.value)
    assert "\n" not in text
    assert "HOOKBUS_PARTITIONS=1" in text and "has 3 partitions" in text


async def test_hooks_list_and_lag_show_the_partitions_and_shards(
    bus_settings: BusSettings, procs: Processes
) -> None:
    three = on(bus_settings, 3)
    payload = msgspec.json.encode(AsyncConfig(name="Counter")).decode()
    procs.worker(three, "tests.remote_hooks:ScriptedAsync", "counter", HOOKBUS_TEST_ASYNC=payload)
    redis = Redis.from_url(bus_settings.redis_url)
    keys = Keys(bus_settings.prefix, 3)
    try:
        await wait_for(lambda: redis.exists(keys.manifest("Counter")), 30, "Counter registered")
    finally:
        await redis.aclose()
    listed = hookbus(three, "hooks", "list")
    assert listed.returncode == 0, listed.stderr
    row = next(line for line in listed.stdout.splitlines() if "Counter" in line)
    assert "3 partitions" in row
    assert f"partitions: 3 ({keys.config})" in listed.stdout
    lag = hookbus(three, "lag")
    assert lag.returncode == 0 and f"partitions: 3 ({keys.config})" in lag.stdout
    wrong = hookbus(on(bus_settings, 1), "lag")
    assert "WARNING: the bus has 3 partitions" in wrong.stdout
    assert hookbus(three, "partitions").stdout.strip() == "3"
    refused = hookbus(three, "partitions", "5")
    assert refused.returncode == 2 and "--force" in refused.stderr


async def test_the_coordinator_service_on_another_partition_count_refuses_to_start(
    bus_settings: BusSettings,
) -> None:
    await first_agent_writes_three(bus_settings)
    out = hookbus(on(bus_settings, 1), "coordinator")
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    said = [line for line in out.stderr.splitlines() if "HOOKBUS_PARTITIONS" in line]
    assert len(said) == 1 and "HOOKBUS_PARTITIONS=1" in said[0] and "has 3 partitions" in said[0]
