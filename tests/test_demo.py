"""``hookbus demo`` as a user runs it: distributed with Redis, embedded without, saying which."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

from bus import HookEvent
from tests.harness import ROOT


def run_demo(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "workers.cli", "demo", *args],
        cwd=ROOT,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=180,
    )


def check_session(stdout: str) -> None:
    for event in HookEvent:
        assert f"\n{event.value} " in stdout, f"{event.value} missing from the timeline"
    assert "turn ended: Cancelled after 7 steps" in stdout
    assert "API_KEY=[redacted]" in stdout
    assert "P0 Rule" in stdout and "P1 Rule" in stdout and "P3 Rule" in stdout
    assert "SESSION_STOP" in stdout and "tool_calls: 6" in stdout
    check_policy_decides(stdout)


def check_policy_decides(stdout: str) -> None:
    """The starter rules (examples/policy/starter.toml) are the demo's guards: each of their
    answers names the rule that decided, in the timeline and in what the agent saw."""
    lines = stdout.splitlines()

    def row(event: str, tool: str, says: str) -> None:
        assert any(x.startswith(f"{event:<19} {tool:<14}") and says in x for x in lines), (
            f"no {event} {tool} row with {says!r}"
        )

    row("PreToolUse", "file_read", "Policy: Block(policy rule no-env-files: .env files")
    row("PreToolUse", "run_shell", "Policy: Block(policy rule no-destructive-shell")
    row("PermissionRequest", "run_shell", "Policy: Override(Allow: policy rule read-only-shell")
    row("PostToolUse", "file_read", "Policy: MutateOutput(# service configuration API_KEY=[red")
    assert "file_read: P3 Rule — policy rule no-env-files: .env files hold secrets" in stdout
    assert "[Hook: Policy | PostToolUse] policy rule redact-secrets:" in stdout
    assert "SecretGuard" not in stdout and "ShellPolicy" not in stdout
    assert "Redactor" not in stdout


def test_demo_runs_distributed_with_separate_hook_processes(redis_server: Any) -> None:
    out = run_demo("--redis", redis_server.url)
    assert out.returncode == 0, out.stderr
    assert "distributed mode" in out.stdout and "all 7 hook services are live" in out.stdout
    check_session(out.stdout)


def test_demo_without_redis_runs_embedded_and_says_so_in_one_line() -> None:
    env = {k: v for k, v in os.environ.items() if k != "HOOKBUS_REDIS_URL"}
    out = subprocess.run(
        [sys.executable, "-m", "workers.cli", "demo"],
        cwd=ROOT,
        env={**env, "PATH": "/nonexistent"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    first = out.stdout.splitlines()[0]
    assert first.startswith("no Redis configured") and "running embedded" in first
    check_session(out.stdout)
    assert "Traceback" not in out.stderr


def test_demo_attaches_to_running_hook_services(bus_settings: Any, procs: Any) -> None:
    from tests.harness import worker_env

    procs.worker(bus_settings, "workers.builtins.demo_hooks:SecretGuard", "guard")
    out = subprocess.run(
        [sys.executable, "-m", "workers.cli", "demo", "--attach"],
        cwd=ROOT,
        env=worker_env(bus_settings),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert "attached to the running hook services: SecretGuard" in out.stdout
    assert "SecretGuard: Block(.env files hold secrets" in out.stdout
    assert "turn ended: Cancelled" not in out.stdout  # no cancellation service is running


def test_the_timeline_shows_what_a_dry_run_hook_would_have_done(
    bus_settings: Any, procs: Any
) -> None:
    """Issue 17, item 14: before, a dryrun hook's Block was shown as "Block(…)" although the
    agent went on."""
    from tests.harness import until, worker_env

    procs.worker(bus_settings, "workers.builtins.demo_hooks:SecretGuard", "guard")
    env = worker_env(bus_settings)

    def dry_run() -> bool:  # refused until the worker has registered the hook
        return subprocess.run(
            [sys.executable, "-m", "workers.cli", "hooks", "mode", "SecretGuard", "dryrun"],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=60,
        ).returncode == 0  # fmt: skip

    until(dry_run, "SecretGuard registered and set to dryrun", 60)
    out = subprocess.run(
        [sys.executable, "-m", "workers.cli", "demo", "--attach"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    line = next(x for x in out.stdout.splitlines() if x.startswith("PreToolUse          file_read"))
    assert "SecretGuard [dryrun]: would have blocked: .env files hold secrets" in line, line
    assert "SecretGuard: Block" not in out.stdout


def test_the_embedded_demo_redacts_its_audit_log() -> None:
    out = run_demo("--embedded")
    assert out.returncode == 0, out.stderr
    audit = out.stdout.split("\naudit log (")[1].split("\nmetrics:")[0]
    assert "rows, secrets redacted):" in audit and "API_KEY=[redacted]" in audit
    assert "sk-live" not in audit
