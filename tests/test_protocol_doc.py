"""What docs/protocol.md says about hooks, the audit log, the notify events' path and the
conformance vectors (issue 17, item 18), checked against the code and real processes."""

from __future__ import annotations

import datetime as dt
import json
import re
import sqlite3
import subprocess
from pathlib import Path
from typing import Any

import msgspec
import pytest
import yaml
from redis import Redis

from bus import HookEvent
from bus.events import PostToolUseContext, PreToolUseContext, SessionStopContext
from bus.events import TurnTerminal as Terminal
from bus.hooks import AgentHook, AsyncAgentHook, DeliveredEvent, spec_of
from bus.protocol import (
    AuditRecord,
    DecisionReply,
    DecisionRequest,
    EventMessage,
    decode,
    encode,
    new_id,
    now_ms,
    raw,
)
from bus.settings import BusSettings
from bus.transport.keys import Keys
from tests.harness import ROOT, Processes, until, worker_env
from tests.remote_hooks import HookConfig
from tests.test_conformance import VECTORS_DIR, load_vector, mismatches
from tests.test_foreign_clients import SHELL_CLIENT, start_services
from workers.builtins import audit
from workers.builtins import embedded as builtins
from workers.builtins.redaction import Redaction
from workers.services.loading import import_target, load_hook

PROTOCOL = (ROOT / "docs" / "protocol.md").read_text()
MODULE_CLASS = re.compile(r"\b((?:[a-z_]+\.)+[a-z_]+):([A-Z]\w+)\b")


def section(title: str) -> str:
    """The text of the section (### or ##) whose heading starts with ``title``."""
    start = PROTOCOL.index(f"\n### {title}") if f"\n### {title}" in PROTOCOL else None
    assert start is not None, title
    rest = PROTOCOL[start + 1 :]
    end = re.search(r"^#{2,3} ", rest[4:], re.M)
    return rest[: end.start() + 4] if end else rest


def table(text: str, first_header: str) -> list[list[str]]:
    """The body rows of the first table whose header starts with ``| first_header |``."""
    lines = text.splitlines()
    start = next(i for i, x in enumerate(lines) if x.startswith(f"| {first_header} |"))
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        cells = re.split(r"(?<!\\)\|", line.strip().strip("|"))
        rows.append([c.strip() for c in cells])
    return rows


def ticked(cell: str) -> list[str]:
    return re.findall(r"`([^`]+)`", cell)


# -- 1.9: every hook the document names is a class with its module path, or a data hook ------


def named_hooks() -> tuple[dict[str, str], set[str]]:
    """Section 1.9: name → MODULE:CLASS, and the names that are data hooks (no class)."""
    classes: dict[str, str] = {}
    data: set[str] = set()
    for names, what in table(section("1.9"), "name (the `name` hooks register under)"):
        paths = [t for t in ticked(what) if MODULE_CLASS.fullmatch(t)]
        if what.startswith("no class"):  # a data hook, or no hook at all ("HookBus", 5.6)
            data |= set(ticked(names))
            continue
        for name in ticked(names):
            (path,) = [p for p in paths if p.endswith(f":{name}")] or [paths[0]]
            classes[name] = path
    return classes, data


def test_every_module_path_in_the_protocol_imports() -> None:
    found = {m.group(0) for m in MODULE_CLASS.finditer(PROTOCOL)}
    assert "workers.builtins.demo_hooks:ShellPolicy" in found
    for path in found:
        obj = import_target(path)
        assert isinstance(obj, type) and issubclass(obj, AgentHook | AsyncAgentHook), path


def test_section_1_9_gives_each_class_its_registered_name() -> None:
    classes, data = named_hooks()
    assert classes["CancellationHook"] == "workers.builtins.cancellation:RedisCancellationHook"
    for name, path in classes.items():
        assert spec_of(load_hook(path)).name == name, path
    assert "Slowpoke" in data
    for name in data:  # no class of that name anywhere a reader would look
        for module in ("workers.builtins.demo_hooks", "workers.builtins.embedded", "bus"):
            with pytest.raises(Exception, match="has no"):
                import_target(f"{module}:{name}")


def test_every_hook_named_in_an_example_is_in_section_1_9() -> None:
    classes, data = named_hooks()
    patterns = [
        r'"hook_name": ?"(\w+)"',
        r'"hook": ?"(\w+)"',
        r'"overridden_by": ?"(\w+)"',
        r'"name": ?"(\w+)"',
        r"participant \w+ as ([A-Z]\w+) replica",
        r"hook (\w+) timed out",
        r"hookbus:hook:(\w+):",
        r"\{p\}:hook:(\w+):",
        r'k\.(?:requests|replicas|replay|failures|metrics|clocks|lost)\("(\w+)"\)',
        r"hook `(\w+)`",
        r"`(\w+)`, a vector hook",
        r'HookSpec\(name="(\w+)"\)',
        r"sent to (\w+)",
    ]
    mentioned = {m for p in patterns for m in re.findall(p, PROTOCOL)}
    mentioned -= {"name", "NAME"}
    assert {"SecretGuard", "Slowpoke", "Warner", "AsyncMetricsHook"} <= mentioned
    assert mentioned <= set(classes) | data, mentioned - set(classes) - data


# -- 1.8: the conformance vector format ------------------------------------------------------


def test_the_conformance_vector_format_is_what_the_vectors_and_their_tests_use() -> None:
    text = section("1.8")
    top = {ticked(row[0])[0] for row in table(text, "key | type | meaning")}
    hook_keys = {k for row in table(text, "key | type | default") for k in ticked(row[0])}
    assert top == {"description", "hooks", "event", "context", "expect"}
    # Every HookConfig field a vector may set ("record" is a test's own tracing of calls).
    assert hook_keys == set(HookConfig.__struct_fields__) - {"record"}
    for path in sorted(VECTORS_DIR.glob("*.json")):
        vector = json.loads(path.read_text())
        assert set(vector) == top, path
        for hook in vector["hooks"]:
            assert set(hook) <= hook_keys and "name" in hook, (path, hook)
    defaults = HookConfig(name="x")
    for row in table(text, "key | type | default"):
        for key in ticked(row[0]):
            if key != "name":
                default = json.loads(ticked(row[2])[0])
                assert msgspec.to_builtins(getattr(defaults, key)) == default, key


def test_the_permission_request_example_is_its_conformance_vector() -> None:
    lead = "Example (`PermissionRequest`; the conformance vector"
    after = PROTOCOL[PROTOCOL.index(lead) :]
    vector_file = re.search(r"`tests/conformance/(\w+)\.json`", after)[1]  # type: ignore[index]
    example = json.loads(re.search(r"```json\n(.*?)```", after, re.S)[1])  # type: ignore[index]
    vector = load_vector(VECTORS_DIR / f"{vector_file}.json")
    assert mismatches(vector["expect"], example) == []
    slowpoke = next(h for h in vector["hooks"] if h["name"] == "Slowpoke")
    assert "answers after 3 s with a declared timeout of 0.5 s" in " ".join(after[:400].split())
    assert (slowpoke["delay"], slowpoke["timeout"], slowpoke["failure_policy"]) == (
        3.0,
        0.5,
        "fail",
    )


@pytest.mark.redis
def test_the_slowpoke_row_is_what_the_coordinator_service_answers(
    bus_settings: BusSettings, procs: Processes
) -> None:
    """Section 6.3's row: SecretGuard and the data hook Slowpoke (its configuration taken
    from the document), a 2 s decision: answered in time, Slowpoke skipped as a timeout."""
    (row,) = [r for r in table(section("6.3"), "request (`event`, context)") if "Slowpoke" in r[0]]
    config = msgspec.json.decode(re.search(r"`(\{.*?\})`", row[0])[1], type=HookConfig)  # type: ignore[index]
    assert (config.delay, config.timeout) == (10, None) and "timeout_ms: 2000" in row[0]
    procs.worker(bus_settings, "workers.builtins.demo_hooks:SecretGuard", "guard")
    start_services(procs, bus_settings, config)

    def answer() -> dict[str, Any] | None:
        env = {
            "REDIS_URL": bus_settings.redis_url,
            "PREFIX": bus_settings.prefix,
            "TIMEOUT_MS": "2000",
            "SESSION_ID": f"s-{new_id()[:6]}",
        }
        proc = subprocess.run(
            ["bash", str(SHELL_CLIENT), "file_read", '{"path":"app/.env"}'],
            env={**worker_env(bus_settings), **env},
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert proc.returncode == 0, (proc.stdout, proc.stderr)
        result: dict[str, Any] = json.loads(proc.stdout)["result"]
        skipped = [s["hook_name"] for s in result["skipped"]]
        return result if "Slowpoke" in skipped and result["action"]["type"] == "Block" else None

    result = until(answer, "both hooks in the coordinator service's directory", 60, procs.logs)
    assert result["blocking_errors"][0]["hook_name"] == "SecretGuard"
    (skipped,) = result["skipped"]
    assert {k: skipped[k] for k in ("hook_name", "event", "kind", "enforced")} == {
        "hook_name": "Slowpoke",
        "event": "PreToolUse",
        "kind": "timeout",
        "enforced": False,
    }
    assert re.fullmatch(r"no answer within 1\.\d+s", skipped["detail"]), skipped
    assert '`skipped: [{"hook_name":"Slowpoke","event":"PreToolUse","kind":"timeout"' in row[1]


# -- 6.1 and 6.6: the notify events' path, and what lifts a cancellation -----------------------


def decide(r: Redis, keys: Keys, event: HookEvent, ctx: Any) -> dict[str, Any]:
    """One DecisionRequest to the coordinator service; its reply."""
    inbox = keys.inbox(f"doc-{new_id()[:8]}")
    request = DecisionRequest(
        id=new_id(), ts=now_ms(), event=event, context=raw(ctx), reply_to=inbox, timeout_ms=5000
    )
    r.xadd(keys.decisions(ctx.session_id), {"data": encode(request)})
    popped = r.blpop([inbox], 4)  # within redis-py's 5 s socket timeout
    assert popped is not None, "no DecisionReply"
    reply = decode(popped[1], DecisionReply)
    assert reply.status == "ok", reply
    return msgspec.to_builtins(reply.result)  # type: ignore[no-any-return]


@pytest.mark.redis
def test_no_on_session_stop_lifts_a_cancellation(
    bus_settings: BusSettings, procs: Processes
) -> None:
    """6.6: only the TTL or an operator lifts a cancellation; an OnSessionStop, through a
    coordinator or straight to the events stream, does not."""
    keys = Keys(bus_settings.prefix)
    procs.worker(bus_settings, "workers.builtins.cancellation:RedisCancellationHook", "cancel")
    procs.start(["coordinator"], worker_env(bus_settings, HOOKBUS_REFRESH_SECS="0.2"), "coord")
    r = Redis.from_url(bus_settings.redis_url)
    try:
        for sid in ("via-decision", "via-events"):
            r.sadd(keys.cancelled(sid), "operator")  # what hookbus cancel SID does
            r.expire(keys.cancelled(sid), 3600)

        def blocked(sid: str) -> bool:
            ctx = PreToolUseContext(session_id=sid, tool_name="file_read")
            return decide(r, keys, HookEvent.PRE_TOOL_USE, ctx)["action"]["type"] == "Block"

        until(lambda: blocked("via-decision"), "the CancellationHook serving", 60, procs.logs)
        stop = SessionStopContext(session_id="via-decision", terminal=Terminal.COMPLETED)
        decide(r, keys, HookEvent.ON_SESSION_STOP, stop)
        assert r.exists(keys.cancelled("via-decision")) and blocked("via-decision")

        stop = SessionStopContext(session_id="via-events", terminal=Terminal.COMPLETED)
        message = EventMessage(
            id=new_id(),
            ts=now_ms(),
            event=HookEvent.ON_SESSION_STOP,
            session_id="via-events",
            context=raw(stop),
        )
        r.xadd(keys.events("via-events"), {"data": encode(message)})
        assert blocked("via-events")  # still cancelled after its OnSessionStop went by
        assert 0 < r.ttl(keys.cancelled("via-events")) <= 3600
    finally:
        r.close()
    lifting = next(row for row in table(section("6.6"), "item") if row[0] == "lifting")[1]
    assert "**only the TTL**" in lifting and "**or an operator**" in lifting
    acl = (ROOT / "deploy" / "redis" / "users.acl").read_text()
    for line in acl.splitlines():
        if line.startswith("user ") and not line.startswith("user operator "):
            rules = line.split("cancelled:*")[1].split(")")[0] if "cancelled:*" in line else ""
            assert "+del" not in rules and "+set" not in rules and "+srem" not in rules, line


# -- 6.10: the audit log ---------------------------------------------------------------------


def test_the_audit_log_table_is_the_documented_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    text = section("6.10")
    with sqlite3.connect(":memory:") as conn:
        conn.execute(audit.SQLITE_SCHEMA)
        info = conn.execute("PRAGMA table_info(agent_audit_events)").fetchall()
    actual = {
        name: (kind + (" PRIMARY KEY" if pk else "") + (" NOT NULL" if notnull and not pk else ""))
        for _, name, kind, notnull, _, pk in info
    }
    documented = {ticked(c)[0]: ticked(t)[0] for c, t, _ in table(text, "column")}
    assert documented == actual
    assert list(documented) == list(audit.COLUMNS)
    assert "table | `agent_audit_events`" in text
    assert f"Default: `{audit.DEFAULT_AUDIT_DB}` in the service's working directory" in text
    monkeypatch.delenv("HOOKBUS_AUDIT_DB", raising=False)
    monkeypatch.delenv("HOOKBUS_AUDIT_DB_FILE", raising=False)
    assert audit.AsyncAuditLogHook().target == audit.DEFAULT_AUDIT_DB
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]["audit-log"]
    assert f"Docker Compose: `{compose['environment']['HOOKBUS_AUDIT_DB']}`" in text
    assert compose["command"][-2:] == ["--set", "redact=true"]
    embedded = builtins.AuditLogHook(tmp_path / "embedded.db")
    try:
        columns = [c.strip() for c in builtins._COLUMNS.split(",")]
        assert f"`agent_audit_log`: `id INTEGER PRIMARY KEY`, `{'`, `'.join(columns[1:6])}`" in (
            " ".join(text.split())
        )
    finally:
        embedded.close()


def test_the_audit_rows_hold_what_section_6_10_says() -> None:
    ts = 1_796_020_448_614
    when = dt.datetime.fromtimestamp(ts / 1000, dt.UTC).isoformat()
    redact = Redaction(True)

    def row(event: HookEvent, ctx: Any) -> tuple[str, ...]:
        return audit.audit_row(DeliveredEvent("e1", event, ts, ctx), redact)

    ok = row(
        HookEvent.POST_TOOL_USE,
        PostToolUseContext(
            session_id="s", tool_name="read", output_content="API_KEY=sk-live-51Hx9d2 x" * 20
        ),
    )
    assert ok[4] == "OK" and ok[5].startswith("API_KEY=[redacted] x") and len(ok[5]) == 200
    assert "sk-live" not in ok[5] and ok[6] == when
    failed = row(
        HookEvent.POST_TOOL_USE, PostToolUseContext(session_id="s", tool_name="r", is_error=True)
    )
    assert failed[4] == "FAIL"
    stop = row(
        HookEvent.ON_SESSION_STOP, SessionStopContext(session_id="s", terminal=Terminal.CANCELLED)
    )
    assert stop[4:6] == ("SESSION_STOP", "Cancelled")
    pre = row(HookEvent.PRE_TOOL_USE, PreToolUseContext(session_id="s", tool_name="read"))
    assert pre[4:6] == ("PreToolUse", "")
    held = audit.audit_record_row(
        AuditRecord(
            id="a1",
            ts=ts,
            kind="shadowed",
            event=HookEvent.PRE_TOOL_USE,
            hook="Guard",
            mode="dryrun",
            detail="would have blocked: token=abc12345",
            breakglass="INC-1",
        ),
        redact,
    )
    assert held[1] == "PreToolUse" and held[4] == "DRYRUN"
    assert held[5] == "Guard: would have blocked: token=[redacted] [break-glass: INC-1]"
    glass = audit.audit_record_row(
        AuditRecord(
            id="a2", ts=ts, kind="breakglass", mode="on", by="ops", detail="INC-1", until_ms=ts
        )
    )
    assert glass[1] == "" and glass[4] == "BREAKGLASS_ON"
    assert glass[5] == f"ops: INC-1 (until {when})"
