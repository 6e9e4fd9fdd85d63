"""``hookbus up`` (workers/local/launcher.py) end to end, and the health checks: ``hookbus check``,
``hookbus worker MODULE:CLASS --check [--here]``, ``hookbus coordinator --check``.

``hookbus up`` runs as a subprocess; every process it starts inherits a marker variable, so
that "every child is gone" is checked over all processes of the machine (/proc), not only over
the pids it printed.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import msgspec
import pytest
import redis
import yaml

from bus.protocol import now_ms
from bus.settings import BusSettings
from bus.transport.keys import Keys
from tests.harness import ROOT, Processes, audit_events, until, worker_env
from workers.local.launcher import DEMO, STACK
from workers.local.redis_server import free_port

MARK = "HOOKBUS_TEST_UP_MARK"
SERVICES = {
    "coordinator", "cancellation", "audit-log", "metrics", "policy", "secret-guard-1",
    "secret-guard-2",
}  # fmt: skip
HOOKS = {
    "CancellationHook": 1, "AsyncAuditLogHook": 1, "AsyncMetricsHook": 1, "Policy": 1,
    "SecretGuard": 2,
}  # fmt: skip


def clean_env(**extra: str) -> dict[str, str]:
    """This environment without HookBus settings, plain console output, and ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HOOKBUS_", "OTEL_"))}
    env.pop("FORCE_COLOR", None)
    return {**env, "COLUMNS": "250", "NO_COLOR": "1", "PYTHONIOENCODING": "utf-8", **extra}


def marked(mark: str) -> list[int]:
    """The pids of every process whose environment holds MARK=mark."""
    needle = f"{MARK}={mark}".encode()
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:  # gone meanwhile, or not ours to read
            continue
        if needle in environ.split(b"\0"):
            pids.append(int(entry.name))
    return pids


def running(pid: int) -> bool:
    """Alive, and not a zombie waiting for its parent."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def table(output: str) -> dict[str, tuple[str, int, str]]:
    """name -> (role, pid, command) from the table ``hookbus up`` prints."""
    lines = output.splitlines()
    start = lines.index(next(x for x in lines if re.match(r"^ROLE\s+NAME\s+PID\s+COMMAND$", x)))
    rows = {}
    for line in lines[start + 1 :]:
        m = re.match(r"^(\S+)\s+(\S+)\s+(\d+)\s+(\S.*)$", line)
        if m is None:
            break
        rows[m[2]] = (m[1], int(m[3]), m[4])
    return rows


class Up:
    """``hookbus up ARGS`` as a subprocess, output to a file; killed (with everything it
    started) if the test leaves it running."""

    def __init__(self, tmp: Path, *args: str, **env: str) -> None:
        self.mark = uuid.uuid4().hex
        self.out = tmp / "up.out"
        self.logs = tmp / "logs"
        with self.out.open("w") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "workers.cli", "up", "--logs", str(self.logs), *args],
                env=clean_env(**{MARK: self.mark}, **env),
                cwd=ROOT, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
            )  # fmt: skip

    def output(self) -> str:
        return self.out.read_text()

    def cleanup(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        for pid in marked(self.mark):
            os.kill(pid, signal.SIGKILL)

    def assert_all_gone(self) -> None:
        rows = table(self.output())
        assert set(rows) >= SERVICES, self.output()
        left = [name for name, (_, pid, _) in rows.items() if running(pid)]
        assert left == [], f"still running after hookbus up exited: {left}"
        assert [p for p in marked(self.mark) if running(p)] == []


@pytest.fixture
def up_runs(tmp_path: Path) -> Iterator[Callable[..., Up]]:
    started: list[Up] = []

    def start(*args: str, **env: str) -> Up:
        started.append(Up(tmp_path, *args, **env))
        return started[-1]

    try:
        yield start
    finally:
        for up in started:
            up.cleanup()


# -- the same topology as docker-compose.yml -------------------------------------------------


def test_up_runs_the_services_of_the_compose_file() -> None:
    services = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]
    expected = {}
    for name, s in services.items():
        if s.get("image") != "hookbus:latest" or "profiles" in s:
            continue
        if name == "gateway":  # needs tokens and a port: started beside `hookbus up` (README)
            continue
        user = re.match(r"redis://([\w.-]+)@", s["environment"]["HOOKBUS_REDIS_URL"])
        assert user, name
        # A hook service runs as its hook's own user (hook-NAME), the others as their role.
        role = "worker" if user[1].startswith("hook-") else user[1]
        expected[name] = (tuple(s["command"]), s.get("deploy", {}).get("replicas", 1), role)
    launched = {s.name: (s.args, s.replicas, s.role) for s in (*STACK, DEMO)}
    assert launched == expected


# -- hookbus up, end to end -----------------------------------------------------------------


@pytest.mark.redis
@pytest.mark.timeout(240)
def test_up_demo_once_runs_the_demo_on_a_private_redis_and_stops_everything(
    up_runs: Callable[..., Up],
) -> None:
    up = up_runs("--demo", "--once")
    assert up.proc.wait(200) == 0, up.output()
    output = up.output()
    rows = table(output)
    assert set(rows) == SERVICES | {"redis"}, output
    assert rows["redis"][0] == "redis" and "(private)" in rows["redis"][2]
    assert rows["coordinator"] == ("coordinator", rows["coordinator"][1], "hookbus coordinator")
    assert rows["secret-guard-2"][2] == "hookbus worker workers.builtins.demo_hooks:SecretGuard"
    assert f"logs:  {up.logs}/NAME.log" in output
    assert re.search(r"^ready: the coordinator and 5 hooks \(.*\) are live$", output, re.M)
    assert "attached to the running hook services: CancellationHook, Policy, SecretGuard" in output
    # The starter rules decide, and say which rule did (the policy service runs them).
    assert "Policy: Block(policy rule no-env-files: .env files hold secrets" in output
    assert "Policy: MutateOutput(# service configuration API_KEY=[redacted]" in output
    assert "was cancelled by the user" in output  # the demo's session, blocked by the hook
    # The rows the audit log service stored for the session (before: "audit log (0 rows)"),
    # with the secret the demo's config file holds redacted, there and in the database.
    stored = re.search(r"^audit log \((\d+) rows, secrets redacted\):$", output, re.M)
    assert stored and int(stored[1]) > 20, output
    assert "API_KEY=[redacted]" in output.split("audit log (")[1]
    assert "SESSION_STOP" in output.split("audit log (")[1]
    previews = [p for (p,) in audit_events(up.logs / "audit.db", "output_preview")]
    assert any("API_KEY=[redacted]" in p for p in previews)
    assert not any("sk-live" in p for p in previews)
    assert "the demo agent exited with code 0" in output
    assert "stopped 7 processes\nstopped the private redis-server" in output
    assert {p.name for p in up.logs.glob("*.log")} == {f"{n}.log" for n in SERVICES | {"redis"}}
    up.assert_all_gone()


def live_hooks(settings: BusSettings) -> dict[str, int]:
    """Live replicas per hook, as ``hookbus hooks list`` shows them."""
    result = subprocess.run(
        [sys.executable, "-m", "workers.cli", "hooks", "list"],
        env=clean_env(HOOKBUS_REDIS_URL=settings.redis_url, HOOKBUS_PREFIX=settings.prefix),
        cwd=ROOT, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60,
        check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    live = {}
    for line in result.stdout.splitlines():
        cells = [c.strip() for c in line.strip().strip("│").split("│")]
        if len(cells) >= 10 and cells[0] in HOOKS:
            live[cells[0]] = int(cells[8].split()[0])  # "2" or "1 of 2"
    return live


@pytest.mark.redis
@pytest.mark.timeout(240)
def test_up_runs_until_sigterm_then_stops_every_child_and_exits_0(
    up_runs: Callable[..., Up], bus_settings: BusSettings
) -> None:
    up = up_runs("--redis", bus_settings.redis_url, "--prefix", bus_settings.prefix)

    def all_live() -> bool:
        assert up.proc.poll() is None, up.output()
        live = live_hooks(bus_settings)
        return all(live.get(hook, 0) >= n for hook, n in HOOKS.items())

    until(all_live, "hookbus hooks list to show every hook live", timeout=90)
    rows = table(up.output())
    assert "redis" not in rows  # it uses the Redis it was given
    assert f"redis: {bus_settings.redis_url} (given)" in up.output()
    up.proc.send_signal(signal.SIGTERM)
    assert up.proc.wait(60) == 0, up.output()
    assert "stopped 7 processes" in up.output()
    up.assert_all_gone()
    # They deregistered as they stopped.
    assert live_hooks(bus_settings) == dict.fromkeys(HOOKS, 0)


def test_up_says_in_one_line_when_redis_cannot_be_reached(up_runs: Callable[..., Up]) -> None:
    up = up_runs("--redis", f"redis://127.0.0.1:{free_port()}/0")
    assert up.proc.wait(60) == 1
    (line,) = up.output().splitlines()
    assert line.startswith("hookbus: cannot reach Redis at redis://127.0.0.1:")


# -- health checks ------------------------------------------------------------------------------


def hookbus(settings: BusSettings, *args: str) -> tuple[int, str]:
    """Exit code and the one line of output of ``hookbus ARGS`` (it must print exactly one)."""
    result = subprocess.run(
        [sys.executable, "-m", "workers.cli", *args],
        env=worker_env(settings), cwd=ROOT, stdin=subprocess.DEVNULL, capture_output=True,
        text=True, timeout=60, check=False,
    )  # fmt: skip
    lines = (result.stdout + result.stderr).splitlines()
    assert len(lines) == 1, (args, result.stdout, result.stderr)
    if result.returncode == 0:
        assert result.stdout and not result.stderr
    return result.returncode, lines[0]


@pytest.mark.redis
@pytest.mark.timeout(180)
def test_check_commands_exit_0_with_a_live_service_and_1_without(
    bus_settings: BusSettings, procs: Processes
) -> None:
    s, prefix, host = bus_settings, bus_settings.prefix, socket.gethostname()
    guard = "workers.builtins.demo_hooks:SecretGuard"
    assert hookbus(s, "check") == (0, f"ok: Redis at {s.redis_url} answers")
    assert hookbus(s, "worker", guard, "--check") == (
        1,
        f"hookbus: hook SecretGuard is not registered in {prefix}:hooks",
    )
    assert hookbus(s, "coordinator", "--check") == (
        1,
        f"hookbus: no coordinator has a heartbeat in {prefix}:coordinators",
    )

    worker = procs.worker(s, guard, "guard")
    procs.start(["coordinator"], worker_env(s), "coordinator")
    until(lambda: hookbus(s, "worker", guard, "--check")[0] == 0, "a live SecretGuard")
    assert hookbus(s, "worker", guard, "--check") == (
        0,
        "ok: hook SecretGuard: 1 live replica (of 1)",
    )
    assert hookbus(s, "worker", guard, "--check", "--here") == (
        0,
        f"ok: hook SecretGuard: 1 live replica on {host} (of 1)",
    )
    until(lambda: hookbus(s, "coordinator", "--check")[0] == 0, "a live coordinator")
    assert hookbus(s, "coordinator", "--check") == (0, "ok: coordinator: 1 live replica (of 1)")

    # The replica stops: it deregisters.
    worker.send_signal(signal.SIGTERM)
    assert worker.wait(30) == 0
    assert hookbus(s, "worker", guard, "--check") == (
        1,
        f"hookbus: hook SecretGuard has no replica in {prefix}:hook:{{SecretGuard}}:replicas",
    )
    # A live replica on another host: live, but not here (a heartbeat dated ahead is not live,
    # so the check is given a liveness window longer than it takes to start).
    keys = Keys(prefix)
    with redis.Redis.from_url(s.redis_url) as r:
        r.zadd(keys.replicas("SecretGuard"), {"elsewhere-42-beef": now_ms()})
    patient = msgspec.structs.replace(s, liveness_secs=120.0)
    assert hookbus(patient, "worker", guard, "--check")[0] == 0
    assert hookbus(patient, "worker", guard, "--check", "--here") == (
        1,
        f"hookbus: hook SecretGuard has no replica on {host} in "
        f"{prefix}:hook:{{SecretGuard}}:replicas",
    )
    # A replica that stopped beating.
    with redis.Redis.from_url(s.redis_url) as r:
        r.zadd(keys.replicas("SecretGuard"), {"elsewhere-42-beef": now_ms() - 30_000})
    code, line = hookbus(s, "worker", guard, "--check")
    assert code == 1
    assert re.fullmatch(
        r"hookbus: hook SecretGuard has no live replica: last heartbeat 3\d\.\ds ago "
        r"\(live means within 1s\)",
        line,
    ), line


def test_checks_fail_in_one_line_when_redis_cannot_be_reached() -> None:
    dead = BusSettings(redis_url=f"redis://user:secret@127.0.0.1:{free_port()}/0")
    for args in (
        ("check",),
        ("worker", "workers.builtins.demo_hooks:SecretGuard", "--check", "--here"),
        ("coordinator", "--check"),
    ):
        code, line = hookbus(dead, *args)
        assert code == 1, line
        assert line.startswith("hookbus: cannot reach Redis at redis://user:***@127.0.0.1:"), line
        assert "secret" not in line


def test_a_check_of_a_hook_that_does_not_import_is_a_usage_error() -> None:
    code, line = hookbus(BusSettings(), "worker", "no.such.module:Hook", "--check")
    assert code == 2
    assert line.startswith("hookbus: cannot import 'no.such.module'")
