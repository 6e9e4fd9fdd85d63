"""What a first week of operating HookBus ran into (issue 17): each test runs the ``hookbus``
command line, or a service, against a real redis-server, the way an operator would."""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Iterator
from importlib.metadata import version
from pathlib import Path

import pytest
import redis

from bus.keys import Keys
from bus.protocol import HookManifest, encode, now_ms
from bus.settings import BusSettings
from tests.harness import ROOT, until, worker_env
from tests.test_operator_cli import env_for, hookbus, ok, table_rows
from workers.redis_server import RedisServer

TIMEOUT = 60


@pytest.fixture
def r(bus_settings: BusSettings) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(bus_settings.redis_url)
    try:
        yield client
    finally:
        client.close()


def start(settings: BusSettings, tmp_path: Path, *args: str, **env: str) -> subprocess.Popen[str]:
    log = open(tmp_path / f"{args[0]}-{len(list(tmp_path.iterdir()))}.log", "w")  # noqa: SIM115
    proc = subprocess.Popen(
        [sys.executable, "-m", "workers.cli", *args],
        env=worker_env(settings, **env),
        cwd=ROOT,
        stdout=log,
        stderr=subprocess.STDOUT,
        text=True,
    )
    log.close()
    return proc


def stop(proc: subprocess.Popen[str]) -> int:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    return proc.wait(TIMEOUT)


# -- item 15: --version, and -v after the command ----------------------------------------------


def test_version_prints_the_installed_version() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "workers.cli", "--version"],
        cwd=ROOT, capture_output=True, text=True, timeout=TIMEOUT,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"hookbus {version('hookbus')}"


def test_verbose_is_accepted_after_the_command(bus_settings: BusSettings) -> None:
    # Before the fix: "unrecognized arguments: -v", exit status 2.
    ok(hookbus(bus_settings, "check", "-v"))
    ok(hookbus(bus_settings, "hooks", "list", "--verbose"))
    ok(hookbus(bus_settings, "-v", "check"))


# -- item 7: hooks list shows the mode, and "stopped" for a hook that stopped cleanly -------------


def test_hooks_list_shows_the_mode_the_operator_set(
    bus_settings: BusSettings, r: redis.Redis
) -> None:
    keys = Keys(bus_settings.prefix)
    r.hset(keys.hooks, "Guard", encode(HookManifest(name="Guard")))
    r.hset(keys.hooks, "Shadow", encode(HookManifest(name="Shadow", mode="warn")))
    rows = table_rows(ok(hookbus(bus_settings, "hooks", "list")))
    assert rows["Guard"][2] == "enforce" and rows["Shadow"][2] == "warn"
    ok(hookbus(bus_settings, "hooks", "mode", "Guard", "dryrun"))
    rows = table_rows(ok(hookbus(bus_settings, "hooks", "list")))
    assert rows["Guard"][2] == "dryrun (operator)"
    assert rows["Shadow"][2] == "warn"


def test_a_hook_that_stopped_cleanly_shows_stopped_not_never(
    bus_settings: BusSettings, r: redis.Redis, tmp_path: Path
) -> None:
    keys = Keys(bus_settings.prefix)
    worker = start(bus_settings, tmp_path, "worker", "workers.demo_hooks:SecretGuard")
    try:
        until(lambda: r.zcount(keys.replicas("SecretGuard"), now_ms() - 3000, "+inf"), "a beat")
    finally:
        assert stop(worker) == 0
    rows = table_rows(ok(hookbus(bus_settings, "hooks", "list")))
    guard = rows["SecretGuard"]
    assert guard[8] == "0"  # no live replica (and none left in the set)
    assert guard[9].startswith("stopped ") and guard[9].endswith(" ago"), guard
    # Coordinators never count the marker live: its score is negative.
    assert r.zcount(keys.replicas("SecretGuard"), now_ms() - 3000, "+inf") == 0


# -- item 8: replay refuses a hook nobody would re-read -------------------------------------------


@pytest.mark.parametrize("dlq", [False, True])
def test_replay_refuses_an_unknown_hook(
    bus_settings: BusSettings, r: redis.Redis, dlq: bool
) -> None:
    keys = Keys(bus_settings.prefix)
    r.xadd(keys.events, {"data": b"{}"})
    args = ["dlq", "replay", "NoSuchHook"] if dlq else ["replay", "NoSuchHook", "--from", "0"]
    result = hookbus(bus_settings, *args)
    assert result.returncode == 2, result.stdout
    assert "no hook named 'NoSuchHook' is registered" in result.stderr
    assert "re-fed" not in result.stdout
    assert not r.exists(keys.replay("NoSuchHook"))


def test_replay_refuses_a_sync_hook(bus_settings: BusSettings, r: redis.Redis) -> None:
    keys = Keys(bus_settings.prefix)
    r.hset(keys.hooks, "Guard", encode(HookManifest(name="Guard", kind="sync")))
    r.xadd(keys.events, {"data": b"{}"})
    result = hookbus(bus_settings, "replay", "Guard", "--from", "0")
    assert result.returncode == 2, result.stdout
    assert "Guard is a sync hook: only async hooks read a replay stream" in result.stderr
    assert not r.exists(keys.replay("Guard"))


def test_replay_still_feeds_an_async_hook(bus_settings: BusSettings, r: redis.Redis) -> None:
    keys = Keys(bus_settings.prefix)
    r.hset(keys.hooks, "Audit", encode(HookManifest(name="Audit", kind="async")))
    r.xadd(keys.events, {"data": b"{}"})
    assert "re-fed 1 events to Audit" in ok(hookbus(bus_settings, "replay", "Audit", "--from", "0"))
    assert r.xlen(keys.replay("Audit")) == 1


# -- item 9: a refused password is said plainly, and services stop --------------------------------


@pytest.fixture(scope="module")
def locked_redis() -> Iterator[RedisServer]:
    server = RedisServer(extra=["--requirepass", "right-password"]).start()
    try:
        yield server
    finally:
        server.close()


@pytest.mark.parametrize("password", ["", ":wrong-password@"], ids=["missing", "wrong"])
@pytest.mark.parametrize(
    "command",
    [
        ["worker", "workers.demo_hooks:SecretGuard"],
        ["worker", "workers.demo_hooks:EventCounter"],
        ["coordinator"],
        ["hooks", "list"],
    ],
    ids=["sync-worker", "async-worker", "coordinator", "hooks-list"],
)
def test_a_refused_password_says_authentication_failed_and_stops(
    locked_redis: RedisServer, password: str, command: list[str]
) -> None:
    url = locked_redis.url.replace("redis://", "redis://" + password)
    settings = BusSettings(redis_url=url, prefix="auth")
    # Before the fix the services retried forever (this run would time out).
    result = subprocess.run(
        [sys.executable, "-m", "workers.cli", *command],
        env=env_for(settings), cwd=ROOT, capture_output=True, text=True, timeout=TIMEOUT,
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert "hookbus: authentication failed" in result.stderr
    assert "Traceback" not in result.stderr
    assert "wrong-password" not in result.stderr  # never the password itself


def test_the_right_password_still_works(locked_redis: RedisServer) -> None:
    url = locked_redis.url.replace("redis://", "redis://:right-password@")
    ok(hookbus(BusSettings(redis_url=url, prefix="auth"), "check"))
