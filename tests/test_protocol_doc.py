"""What docs/protocol.md says about hooks, the audit log, the notify events' path and the
conformance vectors (issue 17, item 18), checked against the code and real processes."""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import msgspec
import pytest
import yaml
from redis import Redis

from bus import HookEvent
from bus.errors import ProtocolError
from bus.events import PostToolUseContext, PreToolUseContext, SessionStopContext
from bus.events import TurnTerminal as Terminal
from bus.hooks import AgentHook, AsyncAgentHook, DeliveredEvent, spec_of
from bus.protocol import (
    MAX_TIMEOUT_MS,
    MIN_TIMEOUT_MS,
    PROTOCOL_VERSION,
    AuditRecord,
    CancelRequest,
    DecisionReply,
    DecisionRequest,
    EventMessage,
    decode,
    encode,
    new_id,
    now_ms,
    raw,
)
from bus.schema import json_schemas
from bus.settings import BusSettings
from bus.transport.clock import MAX_SKEW_MS
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
HOOKBUS = str(Path(sys.executable).with_name("hookbus"))
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


# -- issue 35, item 15: what a client written from the document alone ran into ---------------


def test_the_envelope_names_the_version_this_side_speaks() -> None:
    (row,) = [r for r in table(section("1.3"), "field") if r[0] == "`v`"]
    assert row[2] == f"default `{PROTOCOL_VERSION}`" and f"its own (`{PROTOCOL_VERSION}`)" in row[3]


def test_the_timeout_ms_bounds_in_3_5_are_the_codes() -> None:
    (row,) = [r for r in table(section("3.5"), "field") if r[0] == "`timeout_ms`"]
    bounds = [int(n.replace(" ", "")) for n in re.findall(r"\*\*([\d ]+)\*\*", row[1])]
    assert bounds == [MIN_TIMEOUT_MS, MAX_TIMEOUT_MS]
    assert "`MIN_TIMEOUT_MS`, `MAX_TIMEOUT_MS` in `bus/protocol.py`" in row[1]
    schema = json_schemas()["DecisionRequest.json"]["$defs"]["DecisionRequest"]["properties"]
    assert (schema["timeout_ms"]["minimum"], schema["timeout_ms"]["maximum"]) == (
        MIN_TIMEOUT_MS,
        MAX_TIMEOUT_MS,
    )
    assert "never dropped" in row[3] and "`$.timeout_ms`" in row[3]
    # ts: replaced by the time Redis took the request when it is off by more than the bound.
    (envelope,) = [r for r in table(section("3.5"), "field") if r[0].startswith("`v`, `id`, `ts`")]
    assert f"more than {MAX_SKEW_MS // 1000} s (`MAX_SKEW_MS`)" in envelope[3]
    assert "`agent_clock_skewed`" in envelope[3]
    checklist = " ".join(PROTOCOL[PROTOCOL.index("## 10. Checklists") :].split())
    assert f"wait, {MIN_TIMEOUT_MS} to {MAX_TIMEOUT_MS:_} ms".replace("_", " ") in checklist


def rejections() -> dict[str, tuple[list[str], str]]:
    """Section 8.1's rows for the bounds: what is checked → (the error texts, the field)."""
    rows = table(section("8.1"), "stage")
    return {
        check: (re.findall(r"`` (.*?) ``", error), field.strip("`"))
        for _, check, error, field in rows
        if check.startswith("bounds:")
    }


def test_section_8_1_gives_the_errors_decoding_raises_for_the_bounds() -> None:
    (timeout, session) = rejections().values()
    request = {"id": "r", "ts": 1, "event": "PreToolUse", "context": {}, "reply_to": "x"}
    for value, error in zip((0, MAX_TIMEOUT_MS + 1), timeout[0], strict=True):
        with pytest.raises(ProtocolError) as raised:
            decode(json.dumps({**request, "timeout_ms": value}), DecisionRequest)
        assert (str(raised.value), raised.value.field) == (error, timeout[1])
    with pytest.raises(ProtocolError) as raised:
        decode('{"id":"c","ts":1,"op":"cancel","session_id":"","reply_to":"x"}', CancelRequest)
    assert (str(raised.value), raised.value.field) == (session[0][0], session[1])


@pytest.mark.redis
def test_out_of_bounds_requests_get_error_replies_and_change_nothing(
    bus_settings: BusSettings, procs: Processes
) -> None:
    """timeout_ms 0 or below was dropped as expired without a word, and a cancel of the empty
    session id was answered {"cancelled": ""}: now each gets the error reply 8.1 documents."""
    keys = Keys(bus_settings.prefix)
    procs.start(["coordinator"], worker_env(bus_settings, HOOKBUS_REFRESH_SECS="0.2"), "coord")
    (timeout, session) = rejections().values()
    inbox = keys.inbox(f"doc-{new_id()[:8]}")
    ctx = {"session_id": "s-bounds", "tool_name": "file_read"}
    asked: dict[str, dict[str, Any]] = {
        f"t{value}": {"event": "PreToolUse", "context": ctx, "timeout_ms": value}
        for value in (0, -5, MAX_TIMEOUT_MS + 1)
    }
    asked["cancel"] = {"op": "cancel", "session_id": ""}
    with Redis.from_url(bus_settings.redis_url, socket_timeout=30) as r:
        for rid, fields in asked.items():
            request = {"v": 3, "id": rid, "ts": now_ms(), "reply_to": inbox, **fields}
            r.xadd(keys.decisions("s-bounds"), {"data": json.dumps(request)})
        replies = {}
        while len(replies) < len(asked):
            popped = r.blpop([inbox], 20)
            assert popped is not None, f"no reply for {set(asked) - set(replies)}\n{procs.logs()}"
            reply = json.loads(popped[1])
            replies[reply["request_id"]] = reply
        assert not r.exists(keys.cancelled("")), "the empty session was cancelled"
        assert not r.exists(keys.events("s-bounds")), "an out-of-bounds request was dispatched"
    said = {rid: (r["status"], r["error"], r["field"]) for rid, r in replies.items()}
    assert said == {
        "t0": ("error", timeout[0][0], timeout[1]),
        "t-5": ("error", timeout[0][0], timeout[1]),
        f"t{MAX_TIMEOUT_MS + 1}": ("error", timeout[0][1], timeout[1]),
        "cancel": ("error", session[0][0], session[1]),
    }


@pytest.mark.redis
async def test_the_gateway_refuses_what_the_service_refuses(bus_settings: BusSettings) -> None:
    """Over HTTP too: timeout_ms 0 was a 504 "no decision within timeout_ms=0", after the
    request had been read as valid; now a 400 naming the field. An empty session id to cancel
    is a 400."""
    from bus.transport.coordinator import Coordinator
    from workers.services.gateway import Gateway, Tokens

    (timeout, _) = rejections().values()
    async with Coordinator(bus_settings, source="gateway") as coordinator:
        gateway = Gateway(coordinator, Tokens((("t", b""),)))
        body = {"event": "PreToolUse", "context": {"session_id": "s", "tool_name": "t"}}
        answer = await gateway.decisions("t", json.dumps({**body, "timeout_ms": 0}).encode())
        reply = json.loads(answer.body)
        assert answer.status == 400, reply
        error = timeout[0][0].replace("DecisionRequest", "HttpDecisionRequest")  # its own type
        assert (reply["error"], reply["field"]) == (error, timeout[1])
        answer = await gateway.cancel("t", "")
        assert answer.status == 400 and json.loads(answer.body)["field"] == "session_id"


@pytest.mark.redis
def test_hookbus_cancel_refuses_an_empty_session_id(bus_settings: BusSettings) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "workers.cli", "cancel", ""], env=worker_env(bus_settings),
        cwd=ROOT, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert proc.returncode == 2, proc
    assert proc.stderr == (
        "hookbus: hookbus cancel: the session id is empty; name the session to cancel\n"
    )
    with Redis.from_url(bus_settings.redis_url) as r:
        assert not r.exists(Keys(bus_settings.prefix).cancelled(""))


def test_section_1_5_sends_to_time_only_the_users_that_may_run_it() -> None:
    """A tenant's user may not run TIME: the document must not ask an untrusted agent to."""
    from workers.ops.acl import ROLES, HookUser, hook_rules, tenant_rules

    text = " ".join(section("1.5").split())
    rules = {user: r for user, _, r in ROLES}
    for who in (rules["agent"], rules["coordinator"], hook_rules(HookUser("Guard"))):
        assert "+time" in who.split()
    assert re.findall(r"\+(\w+)", tenant_rules("acme")) == ["ping", "xadd", "blpop", "blmpop"]
    assert "An untrusted agent cannot and need not" in text
    assert "its tenant's user may only `XADD` to its decisions stream and `BLPOP`/`BLMPOP`" in text
    assert "Clients in other languages should read `TIME`" not in text


def test_the_scripts_the_document_names_are_the_ones_retention_runs() -> None:
    """6.7 and 10 once described a `read` script; the reads are `check` + XREADGROUP."""
    from bus.transport import retention

    lua = {
        name.strip("_").lower()
        for name, value in vars(retention).items()
        if isinstance(value, str) and "redis.pcall(" in value and name.isupper()
    }
    assert lua == {"check", "create"}
    named = set(re.findall(r"EVALSHA (\w+) 1", PROTOCOL))
    named |= set(re.findall(r"(?:the|its) `(\w+)` script", PROTOCOL))
    named |= set(re.findall(r"script `(\w+)`", PROTOCOL))
    assert named == lua, named
    # the read: the last batch's XACK (if any), the check and the read, in one write
    assert re.search(
        r"pipeline: XACK \{p\}:events:\{TAG\} \{name\} IDS… \([^)]*\), "
        r"EVALSHA check 1 \{p\}:events:\{TAG\} \{name\} 1, XREADGROUP GROUP",
        PROTOCOL,
    )


@pytest.mark.redis
def test_the_vector_hook_command_of_1_8_runs_as_written(
    bus_settings: BusSettings, tmp_path: Path
) -> None:
    """From any directory (here: one outside the checkout), as section 1.8 writes it."""
    (command,) = re.findall(r"```sh\n(HOOKBUS_TEST_HOOK=.*?)```", section("1.8"), re.S)
    command = command.replace("/path/to/hookbus", str(ROOT))
    env = {**worker_env(bus_settings), "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin"}
    env.pop("PYTHONPATH", None)
    log = tmp_path / "worker.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(["bash", "-c", command], cwd=tmp_path, env=env, stdout=out,
                                stderr=out, start_new_session=True)  # fmt: skip
    try:
        check = [HOOKBUS, "worker", "tests.remote_hooks:Scripted", "--app-dir", str(ROOT)]

        def live() -> bool:
            assert proc.poll() is None, log.read_text()
            return subprocess.run(
                [*check, "--check"], cwd=tmp_path, capture_output=True, timeout=60,
                env={**env, "HOOKBUS_TEST_HOOK": '{"name": "Guard"}'}, check=False,
            ).returncode == 0  # fmt: skip

        until(live, "the vector hook Guard live", 60, log.read_text)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)  # bash and the worker it started
        proc.wait(60)


async def test_the_hook_client_refuses_an_empty_session_id(bus_settings: BusSettings) -> None:
    """An agent's own `HookClient.cancel("")` is refused like the service's and the CLI's."""
    from agent_adapter.client import HookClient
    from bus.errors import InvalidInputError
    from bus.settings import HookSettings

    async with HookClient(bus_settings, HookSettings(hook_timeout_secs=5)) as client:
        with pytest.raises(InvalidInputError, match="the session id is empty"):
            await client.cancel("")
    with Redis.from_url(bus_settings.redis_url) as r:
        assert not r.exists(Keys(bus_settings.prefix).cancelled(""))
