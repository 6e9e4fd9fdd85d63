"""What a first week of operating HookBus ran into (issue 17): each test runs the ``hookbus``
command line, or a service, against a real redis-server, the way an operator would."""

from __future__ import annotations

import contextlib
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from importlib.metadata import version
from pathlib import Path

import pytest
import redis

from bus.actions import Block
from bus.events import HookEvent
from bus.protocol import HookManifest, encode, now_ms
from bus.settings import BusSettings
from bus.transport.keys import Keys
from tests.harness import ROOT, until, wait_for, worker_env
from tests.test_deploy import AclRedis
from tests.test_operator_cli import env_for, hookbus, ok, table_rows
from workers.local.redis_server import RedisServer

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
    r.sadd(keys.hooks, "Guard") and r.set(
        keys.manifest("Guard"), encode(HookManifest(name="Guard"))
    )
    r.sadd(keys.hooks, "Shadow") and r.set(
        keys.manifest("Shadow"), encode(HookManifest(name="Shadow", mode="warn"))
    )
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
    worker = start(bus_settings, tmp_path, "worker", "workers.builtins.demo_hooks:SecretGuard")
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
    r.xadd(keys.event_partitions[0], {"data": b"{}"})
    args = ["dlq", "replay", "NoSuchHook"] if dlq else ["replay", "NoSuchHook", "--from", "0"]
    result = hookbus(bus_settings, *args)
    assert result.returncode == 2, result.stdout
    assert "no hook named 'NoSuchHook' is registered" in result.stderr
    assert "re-fed" not in result.stdout
    assert not r.exists(keys.replay("NoSuchHook"))


def test_replay_refuses_a_sync_hook(bus_settings: BusSettings, r: redis.Redis) -> None:
    keys = Keys(bus_settings.prefix)
    r.sadd(keys.hooks, "Guard") and r.set(
        keys.manifest("Guard"), encode(HookManifest(name="Guard", kind="sync"))
    )
    r.xadd(keys.event_partitions[0], {"data": b"{}"})
    result = hookbus(bus_settings, "replay", "Guard", "--from", "0")
    assert result.returncode == 2, result.stdout
    assert "Guard is a sync hook: only async hooks read a replay stream" in result.stderr
    assert not r.exists(keys.replay("Guard"))


def test_replay_still_feeds_an_async_hook(bus_settings: BusSettings, r: redis.Redis) -> None:
    keys = Keys(bus_settings.prefix)
    r.sadd(keys.hooks, "Audit") and r.set(
        keys.manifest("Audit"), encode(HookManifest(name="Audit", kind="async"))
    )
    r.xadd(keys.event_partitions[0], {"data": b"{}"})
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
        ["worker", "workers.builtins.demo_hooks:SecretGuard"],
        ["worker", "workers.builtins.demo_hooks:EventCounter"],
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


# -- item 6: hooks remove, safe while replicas run (under the deploy's ACL users) ---------------


@pytest.fixture
def acl_redis(tmp_path: Path) -> Iterator[AclRedis]:
    server = AclRedis(tmp_path)
    try:
        yield server
    finally:
        server.close()


def acl_env(url: str) -> dict[str, str]:
    settings = BusSettings(
        redis_url=url, prefix="hookbus", heartbeat_secs=0.2, liveness_secs=1.0, claim_idle_secs=0.5
    )
    return worker_env(settings, COLUMNS="250", NO_COLOR="1", PYTHONIOENCODING="utf-8")


def acl_hookbus(url: str, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "workers.cli", *args],
        env={**acl_env(url), **env}, cwd=ROOT, stdin=subprocess.DEVNULL, capture_output=True,
        text=True, timeout=TIMEOUT,
    )  # fmt: skip


def acl_worker(url: str, target: str, log: Path) -> subprocess.Popen[str]:
    with open(log, "a") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "workers.cli", "worker", target],
            env=acl_env(url), cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip


async def test_hooks_remove_retires_a_fail_hook_while_its_replicas_run(
    acl_redis: AclRedis, tmp_path: Path
) -> None:
    from agent_adapter.client import HookClient
    from workers.testing import context

    admin, keys = acl_redis.admin, Keys("hookbus")
    worker_url, operator = acl_redis.url("hook-SecretGuard"), acl_redis.url("operator")
    log = tmp_path / "workers.log"
    target = "workers.builtins.demo_hooks:SecretGuard"
    replicas = [acl_worker(worker_url, target, log) for _ in range(2)]
    client = HookClient(
        BusSettings(redis_url=acl_redis.url("agent"), prefix="hookbus", refresh_secs=0.2)
    )
    env_read = context("PreToolUse", tool_name="file_read", tool_args={"path": "app/.env"})
    try:
        until(
            lambda: admin.zcount(keys.replicas("SecretGuard"), now_ms() - 1000, "+inf") == 2,
            "two live SecretGuard replicas", explain=log.read_text,
        )  # fmt: skip
        await client.start()
        assert (await client.run_pre_tool_use(env_read)).is_blocked
        # One replica freezes: it will beat again after the removal (HSETNX + its check).
        replicas[0].send_signal(signal.SIGSTOP)
        # (Liveness 60 s for the operator: the frozen replica still counts as live.)
        remove = ("hooks", "remove", "SecretGuard", "--wait", "1")
        removed = acl_hookbus(operator, *remove, HOOKBUS_LIVENESS_SECS="60")
        assert removed.returncode == 1, removed.stderr
        assert "1 replica of SecretGuard still live" in removed.stderr
        # The running one saw the tombstone and stopped serving; so did the frozen one, once
        # it woke up. Both stay up, idle (issue 30, item 8: a Deployment would restart them).
        stopped = "SecretGuard was removed by an operator: this replica stops serving it"
        until(lambda: stopped in log.read_text(), "the running replica to stop serving")
        replicas[0].send_signal(signal.SIGCONT)
        until(lambda: log.read_text().count(stopped) == 2, "the frozen one to stop serving")
        assert replicas[0].poll() is None and replicas[1].poll() is None
        # Neither heartbeat wrote the manifest back.
        assert b'"retired":"SecretGuard"' in admin.get(keys.manifest("SecretGuard"))
        # No longer selected: not "unreachable", not blocking (the failure policy was "fail").
        await wait_for(
            lambda: "SecretGuard" not in client.directory.by_name, what="the directory to drop it"
        )
        result = await client.run_pre_tool_use(env_read)
        assert not result.is_blocked and not result.skipped, result
        listed = table_rows(ok(acl_hookbus(operator, "hooks", "list")))
        assert listed["SecretGuard"][1] == "removed"
        # A replica that starts now (a pod restarted) does not serve it either: it stays up,
        # idle, and says why and how to undo it (as the two above do), instead of exiting 2.
        idle = "hookbus hooks restore SecretGuard; this replica stays up, idle"
        replicas.append(acl_worker(worker_url, target, log))
        until(lambda: log.read_text().count(idle) == 3, "the late replica to idle", TIMEOUT)
        assert "SecretGuard was removed by " in log.read_text() and replicas[2].poll() is None
        assert "SecretGuard" not in client.directory.by_name
        # Restored: the replicas register again and the hook blocks again.
        ok(acl_hookbus(operator, "hooks", "restore", "SecretGuard"))
        await wait_for(lambda: client.directory.live("SecretGuard"), what="the hook live again")
        assert (await client.run_pre_tool_use(env_read)).is_blocked
    finally:
        await client.close()
        for proc in replicas:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGCONT)
            stop(proc)
    assert acl_redis.denied() == []  # the operator and the workers were allowed what they did
    # ... and no more: the operator still may not delete the hooks hash or a request stream.
    refused = acl_hookbus(operator, "hooks", "list")  # (a working command, for contrast)
    assert refused.returncode == 0
    import redis as redis_py

    op = redis_py.Redis.from_url(operator)
    try:
        with pytest.raises(redis_py.exceptions.NoPermissionError):
            op.delete(keys.hooks)
        with pytest.raises(redis_py.exceptions.NoPermissionError):
            op.xgroup_destroy(keys.requests("SecretGuard"), "workers")
    finally:
        op.close()


def test_hooks_remove_destroys_an_async_hooks_group_once_its_replicas_stopped(
    tmp_path: Path,
) -> None:
    # EventCounter is no service of the stack: its user is generated here, as for any new hook.
    acl_redis = AclRedis(tmp_path, hooks=("workers.builtins.demo_hooks:EventCounter",))
    admin, keys = acl_redis.admin, Keys("hookbus")
    log = tmp_path / "workers.log"

    def groups() -> set[bytes]:
        if not admin.exists(keys.event_partitions[0]):
            return set()
        return {g["name"] for g in admin.xinfo_groups(keys.event_partitions[0])}

    replica = acl_worker(
        acl_redis.url("hook-EventCounter"), "workers.builtins.demo_hooks:EventCounter", log
    )
    try:
        until(
            lambda: b"EventCounter" in groups(),
            "the EventCounter group", explain=log.read_text,
        )  # fmt: skip
        out = ok(acl_hookbus(acl_redis.url("operator"), "hooks", "remove", "EventCounter"))
        assert "its consumer group on the events stream is destroyed" in out
        assert replica.wait(TIMEOUT) == 0
        assert b"EventCounter" not in groups()
    finally:
        stop(replica)
        denied = acl_redis.denied()
        acl_redis.close()
    assert denied == []


def test_hooks_remove_refuses_an_unknown_hook(bus_settings: BusSettings) -> None:
    result = hookbus(bus_settings, "hooks", "remove", "NoSuchHook")
    assert result.returncode == 2
    assert "no hook named 'NoSuchHook' is registered" in result.stderr


# -- item 11: coordinators beat, and coordinator --check is true --------------------------------


def check(settings: BusSettings, *args: str) -> tuple[int, str]:
    result = subprocess.run(
        [sys.executable, "-m", "workers.cli", "coordinator", "--check", *args],
        env=worker_env(settings), cwd=ROOT, capture_output=True, text=True, timeout=TIMEOUT,
    )  # fmt: skip
    return result.returncode, (result.stdout + result.stderr).strip()


def test_coordinator_check_needs_a_live_coordinator_not_just_its_group(
    bus_settings: BusSettings, r: redis.Redis, tmp_path: Path
) -> None:
    keys = Keys(bus_settings.prefix)
    # What a coordinator that has since died leaves behind: before the fix, this passed.
    r.xgroup_create(keys.decision_partitions[0], "coordinators", id="0", mkstream=True)
    assert check(bus_settings) == (
        1, f"hookbus: no coordinator has a heartbeat in {keys.coordinators}",
    )  # fmt: skip
    service = start(bus_settings, tmp_path, "coordinator")
    try:
        until(lambda: check(bus_settings)[0] == 0, "a live coordinator")
        host = socket.gethostname()
        assert check(bus_settings, "--here") == (
            0, f"ok: coordinator: 1 live replica on {host} (of 1)",
        )  # fmt: skip
        # It stays live while idle (no request ever arrives): the heartbeat, not consumer activity.
        [(member, first)] = r.zrange(keys.coordinators, 0, -1, withscores=True)
        until(lambda: r.zscore(keys.coordinators, member) > first, "a second heartbeat")
        assert check(bus_settings)[0] == 0
    finally:
        assert stop(service) == 0
    # A clean stop leaves no live coordinator.
    assert check(bus_settings) == (
        1, f"hookbus: no coordinator has a heartbeat in {keys.coordinators}",
    )  # fmt: skip
    # One that died without a word: its last beat ages past liveness (1 s here).
    r.zadd(keys.coordinators, {f"{host}-1-abcdef": now_ms() - 30_000})
    code, line = check(bus_settings)
    assert code == 1 and line.startswith("hookbus: no live coordinator: last heartbeat 3"), line


# -- item 12: shutdown hands pending entries over ------------------------------------------------


def deliver_to(r: redis.Redis, stream: str, group: str, consumer: str, data: bytes) -> bytes:
    """XADD an entry and deliver it to ``consumer`` in one transaction, so that no live reader
    can take it first: the entry is pending with a consumer that does not know about it, as
    when a reply or an acknowledgement was lost."""
    with r.pipeline(transaction=True) as pipe:
        pipe.xadd(stream, {"data": data})
        pipe.xreadgroup(group, consumer, {stream: ">"}, count=1)
        entry_id, [[_, [(delivered, _)]]] = pipe.execute()
    assert delivered == entry_id
    return entry_id


def test_a_stopping_hook_replica_hands_its_pending_requests_over(
    bus_settings: BusSettings, r: redis.Redis, tmp_path: Path
) -> None:
    import msgspec

    from bus.protocol import HookReply, HookRequest, new_id, raw
    from workers.testing import context

    # Takeover of an idle entry only after 30 s: what is taken sooner was handed over.
    settings = msgspec.structs.replace(bus_settings, claim_idle_secs=30.0)
    keys = Keys(settings.prefix)
    target = "workers.builtins.demo_hooks:SecretGuard"
    leaving = start(settings, tmp_path, "worker", target)
    staying = start(settings, tmp_path, "worker", target)
    try:
        until(
            lambda: r.zcount(keys.replicas("SecretGuard"), now_ms() - 3000, "+inf") == 2,
            "two live replicas",
        )
        ids = {
            m.decode().rsplit("-", 2)[1]: m.decode()
            for m in r.zrange(keys.replicas("SecretGuard"), 0, -1)
        }
        replica = ids[str(leaving.pid)]
        ctx = context("PreToolUse", tool_name="file_read", tool_args={"path": ".env"})
        request = HookRequest(
            id=new_id(), ts=now_ms(), hook="SecretGuard", event=HookEvent.PRE_TOOL_USE,
            session_id="s", context=raw(ctx), deadline=now_ms() + 60_000,
            reply_to=keys.inbox("handover-test"),
        )  # fmt: skip
        deliver_to(r, keys.requests("SecretGuard"), "workers", replica, encode(request))
        assert stop(leaving) == 0
        popped = r.blpop([keys.inbox("handover-test")], timeout=20)
        assert popped is not None, "the pending request was neither answered nor taken over"
        reply = msgspec.json.decode(popped[1], type=HookReply)
        assert reply.request_id == request.id and reply.replica != replica
        assert isinstance(reply.action, Block)
    finally:
        stop(leaving)
        stop(staying)


def test_a_stopping_coordinator_hands_its_pending_decisions_over(
    bus_settings: BusSettings, r: redis.Redis, tmp_path: Path
) -> None:
    import msgspec

    from bus.protocol import DecisionReply, DecisionRequest, new_id, raw
    from workers.testing import context

    settings = msgspec.structs.replace(bus_settings, claim_idle_secs=30.0)
    keys = Keys(settings.prefix)
    leaving = start(settings, tmp_path, "coordinator")
    staying = start(settings, tmp_path, "coordinator")
    try:
        until(lambda: r.zcount(keys.coordinators, now_ms() - 3000, "+inf") == 2, "two coordinators")
        by_pid = {
            m.decode().rsplit("-", 2)[1]: m.decode() for m in r.zrange(keys.coordinators, 0, -1)
        }
        consumer = by_pid[str(leaving.pid)]
        ctx = context("PreToolUse", tool_name="file_read", tool_args={"path": "notes.md"})
        request = DecisionRequest(
            id=new_id(), ts=now_ms(), event=HookEvent.PRE_TOOL_USE, context=raw(ctx),
            reply_to=keys.inbox("handover-test"), timeout_ms=60_000,
        )  # fmt: skip
        deliver_to(r, keys.decision_partitions[0], "coordinators", consumer, encode(request))
        assert stop(leaving) == 0
        popped = r.blpop([keys.inbox("handover-test")], timeout=20)
        assert popped is not None, "the pending decision was neither answered nor taken over"
        reply = msgspec.json.decode(popped[1], type=DecisionReply)
        assert reply.request_id == request.id and reply.status == "ok", reply
        # The replica that stopped holds nothing any more, and is gone from the heartbeats.
        assert r.zscore(keys.coordinators, consumer) is None
    finally:
        stop(leaving)
        stop(staying)


# -- item 10: a misspelled variable is said, not silently defaulted -------------------------------


def test_an_unknown_hookbus_variable_is_warned_about_with_a_did_you_mean(
    bus_settings: BusSettings,
) -> None:
    result = hookbus(bus_settings, "check", HOOKBUS_REDIS_URI="redis://elsewhere:6379/0")
    assert result.returncode == 0, result.stderr  # it goes on, with HOOKBUS_REDIS_URL
    [warning] = result.stderr.splitlines()
    assert warning.startswith("hookbus: warning: unknown environment variable HOOKBUS_REDIS_URI")
    assert "(did you mean HOOKBUS_REDIS_URL?)" in warning
    clean = hookbus(bus_settings, "check", HOOKBUS_TEST_ANYTHING="1")
    assert clean.stderr == ""  # known variables, and the test suites' own, are not warned about


def test_every_variable_hookbus_reads_is_documented() -> None:
    import re

    from bus.settings import KNOWN_VARIABLES

    docs = "".join(p.read_text() for p in (ROOT / "docs").glob("*.md"))
    assert sorted(v for v in KNOWN_VARIABLES if f"`{v}`" not in docs) == []
    # and every HOOKBUS_* name the code reads is known (else it would be warned about)
    read = set()
    for package in ("bus", "workers", "agent_adapter"):
        for path in (ROOT / package).rglob("*.py"):
            read |= set(re.findall(r'"(HOOKBUS_[A-Z_]*[A-Z])"', path.read_text()))
    assert sorted(read - KNOWN_VARIABLES - {"HOOKBUS_REDIS_URI"}) == []


def test_a_service_freezes_its_start_up_heap_before_it_serves() -> None:
    """What start-up made is out of the collector's reach while the service runs, so that a full
    collection walks only what came after (docs/performance.md, "Garbage collection")."""
    import gc

    from workers.cli.common import serve

    seen: list[int] = []

    async def main(stop: object) -> None:
        seen.append(gc.get_freeze_count())

    gc.unfreeze()
    try:
        assert serve(main, "test") == 0
    finally:
        gc.unfreeze()
    assert seen and seen[0] > 10_000  # the interpreter, the modules, pytest's own objects
