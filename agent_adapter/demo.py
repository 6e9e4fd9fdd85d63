"""``hookbus demo``: one scripted session that shows every lifecycle event and intervention.

The session blocks a call, rewrites an input, redacts an output, warns about a long output,
lets a hook override a permission, is denied a dangerous command, recovers from a failed call,
runs a subagent, compacts its context and is finally cancelled. The timeline shows each
dispatch: the event, the tool, every hook called with its answer, and the latency.

The guards are the starter policy file (``examples/policy/starter.toml``, served by the
``Policy`` hook): it blocks the ``.env`` read, denies ``rm -rf``, lets ``ls`` through without a
person and redacts the API key, and each of those answers names the rule that decided
(``policy rule no-env-files: …``). The other interventions are hooks in code
(``workers/builtins/demo_hooks.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import msgspec

from agent_adapter.client import HookClient
from agent_adapter.llm import ChatMessage, LLMReply, ScriptedLLM, answer, call, tools
from agent_adapter.permissions import PermissionChecker, PermissionRule
from agent_adapter.runtime import AgentRuntime, TurnResult
from agent_adapter.tools import sandbox_tools
from bus import EventRunner, HookContext, HookEvent, HookSettings, PermissionDecision
from bus.aggregation import Outcome, would_do
from bus.errors import ConfigError
from bus.logfmt import LineFormatter
from bus.settings import BusSettings, env_value
from bus.telemetry import tracing as telemetry
from workers.builtins.demo_hooks import (
    DenialAlarm,
    EventCounter,
    FailureAdvisor,
    LongOutputWarning,
    NotesFolder,
)
from workers.builtins.embedded import MetricsData, MetricsHook, with_builtins
from workers.builtins.policy import Policy
from workers.local.redis_server import RedisServer, find_redis_server

CONFIG = "\n".join(
    ["# service configuration", "API_KEY=sk-live-51Hx9d2", "region=eu-west-1"]
    + [f"feature_{i}=enabled  # rolled out in wave {i % 4}" for i in range(12)]
)
CORPUS = {
    "hooks": "Hooks plug cross-cutting concerns into the agent loop.",
    "streams": "Redis Streams keep events for consumer groups.",
    "tracing": "Every hook execution is a span in one trace.",
}
QUESTION = "Tidy up the project notes and check the configuration."
#: The starter rules of a HookBus checkout, the demo's guards: SecretGuard, ShellPolicy and
#: Redactor (``demo_hooks``) as rules.
STARTER_RULES = Path(__file__).resolve().parents[1] / "examples" / "policy" / "starter.toml"
#: The demo's hooks in code (the starter rules do the rest).
CODE_HOOKS = (NotesFolder, LongOutputWarning, FailureAdvisor, DenialAlarm)


def starter_rules() -> str:
    """The starter rules file's path, or a ConfigError when this is not a checkout."""
    if not STARTER_RULES.is_file():
        raise ConfigError(
            f"the demo's policy file {STARTER_RULES} is missing: run the demo from a HookBus "
            "checkout"
        )
    return str(STARTER_RULES)


Cancel = Callable[[], Awaitable[None]]


def session_plan(cancel: Cancel) -> list[Any]:
    """The main agent's script: one step per intervention the demo shows."""

    async def cancel_then_read(_: Sequence[ChatMessage]) -> LLMReply:
        await cancel()  # the user presses "stop" while the model is thinking
        return tools(call("file_read", path="notes/todo.txt"))

    return [
        tools(call("file_read", path=".env"), call("file_write", path="todo.txt", content="- a")),
        tools(call("file_read", path="config.txt")),
        tools(call("run_shell", command="ls notes"), call("run_shell", command="rm -rf notes")),
        tools(call("file_read", path="missing.txt")),
        tools(call("file_write", path="notes/secrets.txt", content="x")),
        tools(call("run_subagent", name="researcher", prompt="What are hooks for?")),
        cancel_then_read,
        answer("never reached: the session is cancelled first"),
    ]


def researcher() -> ScriptedLLM:
    return ScriptedLLM(
        [tools(call("search_corpus", query="hooks")), answer("Hooks add concerns to the loop.")]
    )


@dataclass
class Timeline:
    """A DispatchObserver that prints one line per dispatch."""

    out: TextIO
    rows: list[tuple[str, str, str, float]] = field(default_factory=list)

    def __call__(
        self, event: HookEvent, ctx: HookContext, outcomes: Sequence[Outcome], seconds: float
    ) -> None:
        tool = getattr(ctx, "tool_name", "") or getattr(ctx, "subagent_name", "")
        answers = "; ".join(_describe(event, o) for o in outcomes) or "-"
        self.rows.append((event.value, tool, answers, seconds))
        print(f"{event.value:<19} {tool:<14} {seconds * 1e6:>8.0f} µs  {answers}", file=self.out)


def _describe(event: HookEvent, o: Outcome) -> str:
    if o.spec.mode != "enforce":  # not applied as given: say what it would have done
        would = would_do(event, o)
        text = f"{o.spec.name} [{o.spec.mode}]: " + (would[1] if would else "ok")
        return text if len(text) <= 70 else text[:67] + "..."
    if o.failure is not None:
        return f"{o.spec.name}: {o.failure}"
    a = o.action
    if a is None:
        return f"{o.spec.name}: ok"
    name = type(a).__name__
    detail = next(
        (
            getattr(a, f)
            for f in ("reason", "updated_content", "message", "context")
            if hasattr(a, f)
        ),
        None,
    )
    if name == "MutateInput":
        detail = a.updated_args
    if name == "Override":
        detail = f"{a.decision.value}: {a.reason}"
    text = f"{o.spec.name}: {name}" + (f"({detail})" if detail not in (None, "") else "")
    text = text.replace("\n", " ")
    return text if len(text) <= 70 else text[:67] + "..."


def build_runtime(
    hooks: EventRunner,
    workdir: Path,
    cancelled: set[str],
    metrics: MetricsData,
    session_id: str,
    cancel: Cancel,
) -> AgentRuntime:
    """The demo's agent: sandbox tools, a deny rule for secrets, the scripted plan."""
    sandbox = workdir / "sandbox"
    box = sandbox_tools(sandbox, CORPUS)
    (sandbox / "config.txt").write_text(CONFIG)
    checker = PermissionChecker(
        [PermissionRule.parse("file_write", PermissionDecision.DENY, content=["path:secrets"])]
    )
    return AgentRuntime(
        hooks,
        ScriptedLLM(session_plan(cancel)),
        box,
        session_id=session_id,
        checker=checker,
        subagents={"researcher": researcher()},
        cancelled=cancelled,
        metrics=metrics,
        max_steps=10,
        token_limit=400,
    )


def _demo_settings() -> HookSettings:
    return msgspec.structs.replace(HookSettings.from_env(), truncate_chars=240)  # shows a cut


def embedded_registry(
    workdir: Path, cancelled: set[str], metrics: MetricsData
) -> tuple[Any, EventCounter]:
    registry = with_builtins(
        workdir / "audit.db", cancelled, metrics, _demo_settings(), redact=True
    )
    registry.add(Policy(starter_rules()))
    for hook_class in CODE_HOOKS:
        registry.add(hook_class())
    counter = EventCounter()
    registry.add_async(counter)
    return registry, counter


async def run_embedded(workdir: Path, out: TextIO) -> tuple[TurnResult, list[dict[str, Any]]]:
    """Run the demo session in embedded mode; returns the turn and the audit rows."""
    cancelled: set[str] = set()
    metrics = MetricsData()
    registry, counter = embedded_registry(workdir, cancelled, metrics)
    timeline = Timeline(out)
    registry.observers.append(timeline)
    try:
        print(f"{'event':<19} {'tool':<14} {'latency':>11}  hooks and their answers", file=out)

        async def cancel() -> None:
            cancelled.add("demo-session")

        runtime = build_runtime(registry, workdir, cancelled, metrics, "demo-session", cancel)
        result = await runtime.run_turn(QUESTION)
        await registry.drain()
        await registry.audit_log.flush()
        rows = registry.audit_log.rows()
        report(result, rows, runtime.get_metrics(), counter.counts, out)
        return result, rows
    finally:
        registry.close()


def report(
    result: TurnResult,
    rows: list[dict[str, Any]] | str,
    metrics: dict[str, Any],
    async_counts: dict[str, int] | None,
    out: TextIO,
) -> None:
    """The end of the demo; ``rows`` are the session's audit rows, or why they cannot be read
    here."""
    print(f"\nturn ended: {result.terminal.value} after {result.steps} steps", file=out)
    print(f"answer: {result.answer}", file=out)
    print(f"\nsystem reminders the agent saw ({len(result.reminders)}):", file=out)
    for r in result.reminders:
        print("  " + r.replace("\n", " "), file=out)
    print("\ndenials:", file=out)
    for d in result.denials:
        print(f"  {d.tool_name}: P{d.level} {d.source.value} — {d.reason}", file=out)
    if isinstance(rows, str):
        print(f"\naudit log: {rows}", file=out)
        rows = []
    else:
        print(f"\naudit log ({len(rows)} rows, secrets redacted):", file=out)
        print(f"  {'status':<13} {'tool':<14} preview", file=out)
    for row in rows:
        preview = (row["output_preview"] or "").replace("\n", " ")[:50]
        print(f"  {row['status']:<13} {row['tool_name'] or '-':<14} {preview}", file=out)
    print("\nmetrics:", file=out)
    for key, value in metrics.items():
        print(f"  {key}: {value}", file=out)
    if async_counts is not None:
        print(f"\nasync hook EventCounter saw: {async_counts}", file=out)


#: The hook services the distributed demo starts: the arguments of ``hookbus worker``.
HOOK_SERVICES: list[list[str]] = [
    ["workers.builtins.policy:Policy", "--set", f"rules={STARTER_RULES}"],
    *([f"workers.builtins.demo_hooks:{cls.__name__}"] for cls in CODE_HOOKS),
    ["workers.builtins.cancellation:RedisCancellationHook"],
    ["workers.builtins.embedded:AuditLogHook", "--set", "redact=true"],
]


async def run_distributed(
    workdir: Path, settings: BusSettings, out: TextIO, attach: bool = False
) -> tuple[TurnResult, list[dict[str, Any]]]:
    """The same session with every hook in its own ``hookbus worker`` process.

    With ``attach`` it starts no process and uses the hook services already running (the
    docker-compose stack, say).
    """
    audit_db = workdir / "audit.db"
    env = {
        **os.environ,
        "HOOKBUS_REDIS_URL": settings.redis_url,
        "HOOKBUS_PREFIX": settings.prefix,
        "HOOKBUS_AUDIT_DB": str(audit_db),
    }
    if not attach:
        starter_rules()  # missing: say so before starting anything
        print(f"starting {len(HOOK_SERVICES)} hook services, one process each ...", file=out)
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "workers.cli", "worker", *target],
            # each service its own name in a trace, as under `hookbus up` and Compose
            env={**env, "OTEL_SERVICE_NAME": f"hookbus-{target[0].rpartition(':')[2]}"},
            # the console exporter writes the hook services' spans beside the agent's
            stdout=None if telemetry.console() else subprocess.DEVNULL,
            stderr=(workdir / f"worker-{i}.log").open("wb"),
        )
        for i, target in enumerate([] if attach else HOOK_SERVICES)
    ]
    cancelled: set[str] = set()
    metrics = MetricsData()
    client = HookClient(settings, _demo_settings(), source="hookbus-demo")
    client.add(MetricsHook(metrics))  # shares the runtime's metrics, so it runs in-process
    try:
        await client.start()
        if attach:
            await _wait_any(client, out)
        else:
            names = [t[0].rpartition(":")[2] for t in HOOK_SERVICES]
            names[names.index("RedisCancellationHook")] = "CancellationHook"
            await _wait_live(client, names, procs, out)
        timeline = Timeline(out)
        client.observers.append(timeline)
        print(f"\n{'event':<19} {'tool':<14} {'latency':>11}  hooks and their answers", file=out)
        session_id = f"demo-{os.getpid()}"

        async def cancel() -> None:
            await client.cancel(session_id)  # what `hookbus cancel SESSION_ID` does

        runtime = build_runtime(client, workdir, cancelled, metrics, session_id, cancel)
        result = await runtime.run_turn(QUESTION)
        await client.drain()
    finally:
        await client.close()
        for p in procs:
            p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                p.kill()
    rows = await attached_audit_rows(session_id) if attach else read_audit_rows(audit_db)
    report(result, rows, runtime.get_metrics(), None, out)
    return result, rows if isinstance(rows, list) else []


async def _wait_any(client: HookClient, out: TextIO) -> None:
    deadline = time.monotonic() + 60
    while not (live := sorted(n for n in client.directory.by_name if client.directory.live(n))):
        if time.monotonic() > deadline:
            raise ConfigError("no hook service is live: start some with `hookbus worker ...`")
        await asyncio.sleep(0.1)
    print(f"attached to the running hook services: {', '.join(live)}", file=out)


async def _wait_live(
    client: HookClient, names: list[str], procs: list[subprocess.Popen[bytes]], out: TextIO
) -> None:
    deadline = time.monotonic() + 60
    while True:
        live = [n for n in names if client.directory.live(n)]
        if len(live) == len(names):
            print(f"all {len(names)} hook services are live", file=out)
            return
        dead = [p for p in procs if p.poll() is not None]
        if dead or time.monotonic() > deadline:
            missing = sorted(set(names) - set(live))
            raise ConfigError(f"hook services did not come up: {', '.join(missing)}")
        await asyncio.sleep(0.05)


async def attached_audit_rows(session_id: str, timeout: float = 15.0) -> list[dict[str, Any]] | str:
    """The session's rows in the audit log the running audit log service writes
    (``AsyncAuditLogHook``, ``HOOKBUS_AUDIT_DB``), once its stop row is there: the service
    stores events a moment after they happen. Or why they cannot be read from here."""
    target = env_value("HOOKBUS_AUDIT_DB")
    if not target or target.startswith(("postgresql://", "postgres://")):
        return (
            "kept by the audit log service (set HOOKBUS_AUDIT_DB to its SQLite file to show "
            "it here)"
        )
    path = Path(target)
    deadline = time.monotonic() + timeout
    while True:
        rows = await asyncio.to_thread(_service_rows, path, session_id)
        if any(r["status"] == "SESSION_STOP" for r in rows):
            return rows
        if time.monotonic() > deadline:
            return rows or f"no rows for session {session_id} in {path} after {timeout:g}s"
        await asyncio.sleep(0.2)


def _service_rows(path: Path, session_id: str) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    with contextlib.closing(sqlite3.connect(path, timeout=30)) as conn:
        conn.row_factory = sqlite3.Row
        try:
            cursor = conn.execute(
                "SELECT status, tool_name, output_preview FROM agent_audit_events "
                "WHERE session_id = ? ORDER BY ts, rowid",
                (session_id,),
            )
        except sqlite3.OperationalError:  # the table comes with the first batch
            return []
        return [dict(r) for r in cursor]


def read_audit_rows(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    with sqlite3.connect(path) as conn:
        conn.row_factory = sqlite3.Row
        rows = [dict(r) for r in conn.execute("SELECT * FROM agent_audit_log ORDER BY id")]
    conn.close()
    return rows


def main(
    out: TextIO, *, redis_url: str | None = None, embedded: bool = False, attach: bool = False
) -> int:
    """Run the demo: distributed when Redis is at hand, else embedded (and say so)."""
    # The timeline already shows blocks, warnings and denials; keep the log for real trouble.
    handler = logging.StreamHandler()
    handler.setFormatter(LineFormatter("%(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=logging.ERROR, handlers=[handler])
    logging.getLogger().setLevel(logging.ERROR)
    telemetry.configure("agent")  # OTEL_* decides: Jaeger over OTLP, the console, or nothing
    try:
        return _run(out, redis_url, embedded, attach)
    finally:
        telemetry.shutdown()


def _run(out: TextIO, redis_url: str | None, embedded: bool, attach: bool) -> int:
    with tempfile.TemporaryDirectory(prefix="hookbus-demo-") as tmp:
        workdir = Path(tmp)
        url = redis_url or os.environ.get("HOOKBUS_REDIS_URL")
        if embedded or (not url and find_redis_server() is None):
            if not embedded:
                print(
                    "no Redis configured (HOOKBUS_REDIS_URL) and no redis-server binary found: "
                    "running embedded, with every hook in this process",
                    file=out,
                )
            print("hookbus demo — embedded mode (hooks in this process)\n", file=out)
            asyncio.run(run_embedded(workdir, out))
            return 0
        server = None if url else RedisServer().start()
        try:
            settings = BusSettings.from_env(redis_url=url or server.url)  # type: ignore[union-attr]
            if not os.environ.get("HOOKBUS_PREFIX") and not attach:
                settings = msgspec.structs.replace(settings, prefix=f"hookbus-demo-{os.getpid()}")
            where = "a private redis-server" if server else settings.redis_url
            print(f"hookbus demo — distributed mode, Redis at {where}", file=out)
            asyncio.run(run_distributed(workdir, settings, out, attach))
        finally:
            if server is not None:
                server.close()
    return 0
