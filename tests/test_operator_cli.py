"""The operator commands (``hooks list``, ``lag``, ``events tail``, ``dlq …``, ``metrics``)
against a real Redis, run as the ``hookbus`` command line in a subprocess."""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from redis.asyncio import Redis

from bus.events import (
    HookEvent,
    PostToolUseContext,
    PreToolUseContext,
    SessionStartContext,
)
from bus.protocol import EventMessage, HookManifest, encode, new_id, now_ms, raw
from bus.settings import BusSettings
from bus.transport.keys import WORKERS_GROUP, Keys
from bus.transport.redis_io import connect
from tests.harness import ROOT, put_manifest, wait_for, worker_env
from workers.ops.common import MANY
from workers.ops.hooks import list_hooks
from workers.ops.lag import consumer_lag
from workers.ops.replay import replay_dead_letters

PRE = HookEvent.PRE_TOOL_USE
TIMEOUT = 60


def env_for(settings: BusSettings, **extra: str) -> dict[str, str]:
    env = worker_env(
        settings,
        COLUMNS="250",
        NO_COLOR="1",
        PYTHONIOENCODING="utf-8",
        HOOKBUS_LIVENESS_SECS="60",
        **extra,
    )
    env.pop("FORCE_COLOR", None)
    return env


def hookbus(settings: BusSettings, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "workers.cli", *args],
        env=env_for(settings, **env),
        cwd=ROOT,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )


def ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    return result.stdout


def table_rows(output: str) -> dict[str, list[str]]:
    """The body rows of a rich table, keyed by their first cell."""
    rows = {}
    for line in output.splitlines():
        if "│" in line:
            cells = [c.strip() for c in line.strip().strip("│").split("│")]
            rows[cells[0]] = cells
    return rows


@pytest.fixture
def r(bus_settings: BusSettings) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(bus_settings.redis_url)
    try:
        yield client
    finally:
        client.close()


def event(kind: HookEvent, ctx: Any, session: str) -> dict[str, bytes]:
    message = EventMessage(
        id=new_id(), ts=now_ms(), event=kind, session_id=session, context=raw(ctx)
    )
    return {"data": encode(message)}


def pre(session: str, tool: str = "Bash") -> dict[str, bytes]:
    ctx = PreToolUseContext(session_id=session, tool_name=tool, tool_args={"path": "/x"})
    return event(PRE, ctx, session)


def post(session: str) -> dict[str, bytes]:
    return event(
        HookEvent.POST_TOOL_USE, PostToolUseContext(session_id=session, tool_name="Bash"), session
    )


# -- hooks list ---------------------------------------------------------------------------------


def register(r: redis.Redis, keys: Keys) -> None:
    guard = HookManifest(
        name="Guard", events=[PRE], tool_names=["Bash"], failure_policy="fail", priority=5,
        timeout=2.0,
    )  # fmt: skip
    put_manifest(r, keys, "Guard", encode(guard))
    r.sadd(keys.hooks, "Audit") and r.set(
        keys.manifest("Audit"), encode(HookManifest(name="Audit", kind="async"))
    )
    put_manifest(r, keys, "Broken", b"{not json")
    now = now_ms()
    r.zadd(keys.replicas("Guard"), {"a": now, "b": now, "gone": now - 3_600_000})


def test_hooks_list_shows_every_hook_with_live_replicas_and_flags_a_malformed_manifest(
    bus_settings: BusSettings, r: redis.Redis
) -> None:
    register(r, Keys(bus_settings.prefix))
    rows = table_rows(ok(hookbus(bus_settings, "hooks", "list")))
    guard, audit, broken = rows["Guard"], rows["Audit"], rows["Broken"]
    guard_cells = ["sync", "enforce", "PreToolUse", "tool Bash", "fail", "5", "2s", "2 of 3"]
    assert guard[1:9] == guard_cells
    assert guard[9].endswith("s")  # seconds since the freshest heartbeat
    assert audit[1:5] == ["async", "enforce", "all", "any"]
    assert audit[8:10] == ["0", "never"]
    assert "malformed manifest" in broken[-1]


async def test_list_hooks_counts_replicas_whose_heartbeat_is_within_liveness(
    bus_settings: BusSettings, r: redis.Redis
) -> None:
    keys = Keys(bus_settings.prefix)
    register(r, keys)
    client = connect(bus_settings)
    try:
        rows = {h.name: h for h in await list_hooks(client, keys, liveness_secs=5, now=now_ms())}
    finally:
        await client.aclose()
    assert (rows["Guard"].live, rows["Guard"].replicas) == (2, 3)
    assert rows["Guard"].events == ("PreToolUse",) and not rows["Guard"].problem
    assert rows["Audit"].kind == "async" and rows["Audit"].last_heartbeat_secs is None
    assert rows["Broken"].problem.startswith("malformed manifest")


# -- lag ----------------------------------------------------------------------------------------


def backlog(r: redis.Redis, keys: Keys) -> None:
    """Six events; group Audit has had two delivered (pending) and four not yet (lag)."""
    for i in range(6):
        r.xadd(keys.event_partitions[0], pre(f"s{i}"))
    r.xgroup_create(keys.event_partitions[0], "Audit", id="0")
    r.xreadgroup("Audit", "replica-1", {keys.event_partitions[0]: ">"}, count=2)
    r.sadd(keys.hooks, "Guard") and r.set(
        keys.manifest("Guard"), encode(HookManifest(name="Guard"))
    )
    r.xgroup_create(keys.requests("Guard"), WORKERS_GROUP, id="0", mkstream=True)


def test_lag_shows_each_groups_lag_pending_and_consumers(
    bus_settings: BusSettings, r: redis.Redis
) -> None:
    keys = Keys(bus_settings.prefix)
    backlog(r, keys)
    out = ok(hookbus(bus_settings, "lag"))
    rows = table_rows(out)
    audit = rows[keys.event_partitions[0]]
    assert audit[1:5] == ["Audit", "4", "2", "0"]  # lag, pending, lost
    assert audit[5].endswith("s")  # the oldest pending entry's age
    assert audit[6] == "1"
    assert rows[keys.requests("Guard")][1:7] == [WORKERS_GROUP, "0", "0", "0", "-", "0"]
    assert "AT RISK" not in out
    # With a stream cap of 10 × 1, a backlog of 6 is past half of it.
    risky = table_rows(ok(hookbus(bus_settings, "lag", HOOKBUS_EVENTS_MAXLEN="1")))
    assert "AT RISK" in risky[keys.event_partitions[0]][-1]


async def test_consumer_lag_reports_at_risk_past_half_the_hard_cap(
    bus_settings: BusSettings, r: redis.Redis
) -> None:
    keys = Keys(bus_settings.prefix)
    backlog(r, keys)
    client = connect(bus_settings)
    try:
        safe = await consumer_lag(client, keys, events_maxlen=2, requests_maxlen=10)
        risky = await consumer_lag(client, keys, events_maxlen=1, requests_maxlen=10)
    finally:
        await client.aclose()
    assert [(g.group, g.lag, g.pending, g.consumers) for g in safe] == [
        ("Audit", 4, 2, 1),
        (WORKERS_GROUP, 0, 0, 0),
    ]
    assert not safe[0].at_risk and risky[0].at_risk


async def test_consumer_lag_survives_entries_acknowledged_between_xinfo_and_xpending(
    bus_settings: BusSettings, r: redis.Redis
) -> None:
    """Under load a replica acknowledges between ``XINFO GROUPS`` (pending entries) and
    ``XPENDING`` (none left, no ``min``): the row shows what XPENDING found, no crash. The race
    is made deterministic: the acknowledgement runs just before XPENDING, on the real Redis."""
    keys = Keys(bus_settings.prefix)
    backlog(r, keys)  # Audit: 2 pending, 4 not yet delivered
    client = connect(bus_settings)
    real_xpending = client.xpending
    acked: list[int] = []

    async def ack_first(name: Any, groupname: Any) -> Any:
        held: Any = await client.xpending_range(name, groupname, "-", "+", 100)
        acked.append(await client.xack(name, groupname, *(p["message_id"] for p in held)))
        return await real_xpending(name, groupname)

    client.xpending = ack_first  # type: ignore[method-assign]
    try:
        rows = await consumer_lag(client, keys, events_maxlen=100, requests_maxlen=10)
    finally:
        await client.aclose()
    assert acked == [2]
    audit = next(g for g in rows if g.group == "Audit")
    assert (audit.lag, audit.pending, audit.lost, audit.oldest_pending_secs) == (4, 0, 0, None)


# -- events tail ----------------------------------------------------------------------------------


class Tail:
    """``hookbus events tail`` in the background, its stdout and stderr in files."""

    def __init__(self, settings: BusSettings, tmp: Path, *args: str) -> None:
        self.out, self.err = tmp / "tail.out", tmp / "tail.err"
        with self.out.open("wb") as out, self.err.open("wb") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "workers.cli", "events", "tail", *args],
                env=env_for(settings),
                cwd=ROOT,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
            )

    async def ready(self) -> None:
        """Once it says whence it follows, every event added later reaches it."""

        def following() -> bool:
            assert self.proc.poll() is None, self.err.read_text()
            return "following" in self.err.read_text()

        await wait_for(following, timeout=TIMEOUT, what="events tail to start")

    def finish(self) -> list[str]:
        assert self.proc.wait(TIMEOUT) == 0, self.err.read_text()
        assert "Traceback" not in self.err.read_text()
        return self.out.read_text().splitlines()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


async def test_events_tail_prints_exactly_the_matching_events_then_exits_after_count(
    bus_settings: BusSettings, r: redis.Redis, tmp_path: Path
) -> None:
    keys = Keys(bus_settings.prefix)
    r.xadd(keys.event_partitions[0], pre("before"))  # already there: not new, never shown
    tail = Tail(bus_settings, tmp_path, "--event", "PreToolUse", "--count", "2")
    try:
        await tail.ready()
        with r.pipeline(transaction=False) as pipe:
            pipe.xadd(keys.event_partitions[0], post("s1"))
            pipe.xadd(keys.event_partitions[0], {"data": b"not json"})
            pipe.xadd(keys.event_partitions[0], pre("s1", "Bash"))
            pipe.xadd(
                keys.event_partitions[0],
                event(HookEvent.ON_SESSION_START, SessionStartContext(session_id="s2"), "s2"),
            )
            pipe.xadd(keys.event_partitions[0], pre("s2", "Read"))
            pipe.xadd(keys.event_partitions[0], pre("s3", "Write"))  # past --count
            pipe.execute()
        lines = tail.finish()
    finally:
        tail.kill()
    assert len(lines) == 2, lines
    assert lines[0].split()[1:4] == ["PreToolUse", "s1", "Bash"]
    assert lines[1].split()[1:4] == ["PreToolUse", "s2", "Read"]
    assert '"path":"/x"' in lines[0]
    assert "malformed entry" in tail.err.read_text()


async def test_events_tail_filters_by_session(
    bus_settings: BusSettings, r: redis.Redis, tmp_path: Path
) -> None:
    keys = Keys(bus_settings.prefix)
    tail = Tail(bus_settings, tmp_path, "--session", "s2", "--count", "1")
    try:
        await tail.ready()
        r.xadd(keys.event_partitions[0], pre("s1"))
        r.xadd(keys.event_partitions[0], post("s2"))
        lines = tail.finish()
    finally:
        tail.kill()
    assert [line.split()[1:3] for line in lines] == [["PostToolUse", "s2"]]


def test_events_tail_names_the_12_events_for_an_unknown_one(bus_settings: BusSettings) -> None:
    result = hookbus(bus_settings, "events", "tail", "--event", "PreToolUsed", "--count", "1")
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    [line] = result.stderr.splitlines()
    assert "'PreToolUsed'" in line
    assert all(e.value in line for e in HookEvent)


# -- dead letters -------------------------------------------------------------------------------


def dead_letters(r: redis.Redis, keys: Keys) -> list[str]:
    """Two dead letters of async hook h1, one of h2, one of a sync hook's request stream: each
    in its hook's own dead-letter stream (key layout 3), the hooks registered."""
    data = pre("s1")["data"]
    long_reason = "failed 5 deliveries; last: ValueError: " + "x" * 300
    fields: list[dict[str, Any]] = [
        {"source": keys.event_partitions[0], "reason": long_reason, "data": data, "ts": now_ms(),
         "hook": "h1", "entry_id": "1-0", "deliveries": "5"},
        {"source": keys.event_partitions[0], "reason": "timed out", "data": data, "ts": now_ms(),
         "hook": "h1", "entry_id": "2-0", "deliveries": "5"},
        {"source": keys.event_partitions[0], "reason": "boom", "data": data, "ts": now_ms(),
         "hook": "h2", "entry_id": "3-0", "deliveries": "5"},
        {"source": keys.requests("Guard"), "reason": "malformed HookRequest", "data": "not [json",
         "ts": now_ms()},
    ]  # fmt: skip
    r.sadd(keys.hooks, "h1", "h2", "Guard")
    units = ["h1", "h1", "h2", "Guard"]
    at = now_ms()  # distinct ids (each stream would start its own at -0)
    return [
        r.xadd(keys.hook_dlq(u), f, id=f"{at}-{k}").decode()
        for k, (u, f) in enumerate(zip(units, fields, strict=True))
    ]


def test_dlq_list_shows_the_newest_dead_letters_with_shortened_reasons(
    bus_settings: BusSettings, r: redis.Redis
) -> None:
    keys = Keys(bus_settings.prefix)
    ids = dead_letters(r, keys)
    rows = table_rows(ok(hookbus(bus_settings, "dlq", "list")))
    assert [rows[i][2:5] for i in ids] == [
        ["hook h1", "h1", "5"], ["hook h1", "h1", "5"], ["hook h2", "h2", "5"],
        ["hook Guard", keys.requests("Guard"), "-"],
    ]  # fmt: skip
    assert rows[ids[0]][5].endswith("…") and len(rows[ids[0]][5]) < 100
    out = ok(hookbus(bus_settings, "dlq", "list", "--hook", "h1", "--limit", "1"))
    assert list(table_rows(out)) == [ids[1]]  # the newest of h1
    assert "raise --limit" in out
    assert "no dead letters of h3" in ok(hookbus(bus_settings, "dlq", "list", "--hook", "h3"))


def test_dlq_show_prints_every_field_and_the_data_as_pretty_json(
    bus_settings: BusSettings, r: redis.Redis
) -> None:
    keys = Keys(bus_settings.prefix)
    ids = dead_letters(r, keys)
    out = ok(hookbus(bus_settings, "dlq", "show", ids[0]))
    assert ids[0] in out and "x" * 300 in out.replace("\n", "").replace(" ", "")
    assert {"source", "reason", "hook", "entry_id", "deliveries"} <= {
        line.split()[0] for line in out.splitlines() if line.strip()
    }
    assert '  "event": "PreToolUse",' in out
    assert '"tool_name": "Bash"' in out
    assert "not [json" in ok(hookbus(bus_settings, "dlq", "show", ids[3]))
    missing = hookbus(bus_settings, "dlq", "show", "1-1")
    assert missing.returncode == 1 and "no dead letter 1-1" in missing.stderr
    bad = hookbus(bus_settings, "dlq", "show", "yesterday")
    assert bad.returncode == 2 and "not a stream id" in bad.stderr


def test_dlq_show_prints_a_poison_message_nested_100000_levels_as_text(
    bus_settings: BusSettings, r: redis.Redis
) -> None:
    """What no decoder could take is still shown: as text, not parsed (no RecursionError)."""
    keys = Keys(bus_settings.prefix)
    poison = "[" * 100_000 + "]" * 100_000
    source = keys.event_partitions[0]
    entry = r.xadd(keys.dlq, {"source": source, "reason": "nests more", "data": poison})
    # (as the operator or an old bus wrote it: the bus itself keeps a 4 KiB prefix)
    out = ok(hookbus(bus_settings, "dlq", "show", entry.decode()))
    assert "data:" in out and "data (JSON):" not in out
    assert out.count("[") >= 100_000 and "Traceback" not in out


def test_dlq_replay_refeeds_one_hooks_dead_letters(
    bus_settings: BusSettings, r: redis.Redis
) -> None:
    keys = Keys(bus_settings.prefix)
    dead_letters(r, keys)
    r.set(keys.manifest("h1"), encode(HookManifest(name="h1", kind="async")))
    refused = hookbus(bus_settings, "dlq", "replay", "h1")
    assert refused.returncode == 2 and "--yes" in refused.stderr
    assert "2 dead letters of h1's own stream" in refused.stdout and r.xlen(keys.replay("h1")) == 0
    out = ok(hookbus(bus_settings, "dlq", "replay", "h1", "--yes"))
    assert "re-fed 2 dead letters to h1" in out
    assert r.xlen(keys.replay("h1")) == 2
    assert r.xlen(keys.hook_dlq("h1")) == 0 and r.xlen(keys.hook_dlq("h2")) == 1
    assert "no dead letters of h1" in ok(hookbus(bus_settings, "dlq", "replay", "h1", "--yes"))
    # Deleted by the operator: not counted as cut by a cap.
    assert "CUT" not in ok(hookbus(bus_settings, "dlq", "list"))


def test_dlq_purge_asks_for_yes_when_not_on_a_terminal(
    bus_settings: BusSettings, r: redis.Redis
) -> None:
    keys = Keys(bus_settings.prefix)
    ids = dead_letters(r, keys)
    refused = hookbus(bus_settings, "dlq", "purge")
    assert refused.returncode == 2
    where, line = refused.stderr.splitlines()  # the Redis it talks to, then the refusal
    assert where.startswith("hookbus: talking to Redis at ")
    assert "4 dead letters" in line and "--yes" in line
    assert r.xlen(keys.hook_dlq("h1")) == 2
    assert "deleted 1 dead letter of h2" in ok(
        hookbus(bus_settings, "dlq", "purge", "--hook", "h2", "--yes")
    )
    assert r.xlen(keys.hook_dlq("h2")) == 0 and r.xlen(keys.hook_dlq("Guard")) == 1
    assert [i.decode() for i, _ in r.xrange(keys.hook_dlq("h1"))] == ids[:2]
    assert "deleted 3 dead letters" in ok(hookbus(bus_settings, "dlq", "purge", "--yes"))
    assert sum(r.xlen(keys.hook_dlq(h)) for h in ("h1", "h2", "Guard")) == 0
    assert "CUT" not in ok(hookbus(bus_settings, "dlq", "list"))
    assert "nothing to delete" in ok(hookbus(bus_settings, "dlq", "purge", "--yes"))


def test_dlq_purge_of_many_entries(bus_settings: BusSettings, r: redis.Redis) -> None:
    keys = Keys(bus_settings.prefix)
    with r.pipeline(transaction=False) as pipe:
        for i in range(MANY + 100):
            letter = {"source": "x", "reason": "r", "data": "d", "ts": i, "hook": "h"}
            pipe.xadd(keys.hook_dlq("h"), letter)
        pipe.execute()
    out = ok(hookbus(bus_settings, "dlq", "purge", "--hook", "h", "--yes"))
    assert f"deleted {MANY + 100} dead letters of h" in out
    assert r.xlen(keys.hook_dlq("h")) == 0


# -- metrics --------------------------------------------------------------------------------------


def test_metrics_shows_every_metrics_hash(bus_settings: BusSettings, r: redis.Redis) -> None:
    keys = Keys(bus_settings.prefix)
    assert "no metrics collected yet" in ok(hookbus(bus_settings, "metrics"))
    r.hset(keys.metrics("AsyncMetricsHook"), mapping={"events.PreToolUse": 3, "tool_calls": 2})
    r.hincrbyfloat(keys.metrics("AsyncMetricsHook"), "tool_latency_ms_total", 12.25)
    r.hset(keys.metrics("Other"), "sessions_started", 1)
    r.set(keys.metrics("not-a-hash"), "x")
    r.sadd(keys.hooks, "AsyncMetricsHook", "Other", "not-a-hash")  # hooks are found by name
    out = ok(hookbus(bus_settings, "metrics"))
    rows = [line.strip("│ ").split("│") for line in out.splitlines() if "│" in line]
    assert [[c.strip() for c in row] for row in rows] == [
        ["AsyncMetricsHook", "events.PreToolUse", "3"],
        ["AsyncMetricsHook", "tool_calls", "2"],
        ["AsyncMetricsHook", "tool_latency_ms_total", "12.25"],
        ["Other", "sessions_started", "1"],
    ]
    assert "not-a-hash" not in out


# -- errors ---------------------------------------------------------------------------------------


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


def closed_port_of(url: str) -> str:
    return url.rsplit(":", 1)[1].split("/")[0]


@pytest.mark.parametrize(
    "command",
    [["hooks", "list"], ["lag"], ["events", "tail", "--count", "1"], ["dlq", "list"],
     ["dlq", "purge", "--yes"], ["metrics"]],
)  # fmt: skip
def test_unreachable_redis_is_said_where_and_that_it_is_unreachable_exit_code_2(
    bus_settings: BusSettings, command: list[str]
) -> None:
    url = f"redis://127.0.0.1:{closed_port()}/0"
    result = hookbus(bus_settings, *command, HOOKBUS_REDIS_URL=url, HOOKBUS_RETRY_SECS="1")
    assert result.returncode == 2
    where, line = result.stderr.splitlines()
    assert where.startswith(f"hookbus: talking to Redis at 127.0.0.1:{closed_port_of(url)} db 0")
    assert line.startswith(f"hookbus: cannot reach Redis at {url}: ")
    assert result.stdout == ""


def test_a_cluster_url_with_a_malformed_seed_is_one_line_naming_it(
    bus_settings: BusSettings,
) -> None:
    url = "redis+cluster://127.0.0.1:7000,127.0.0.1:x/0"
    result = hookbus(bus_settings, "lag", HOOKBUS_REDIS_URL=url)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    (line,) = result.stderr.splitlines()
    assert "'127.0.0.1:x' is not a host:port seed" in line
    assert "redis+cluster://h1:7000,h2:7001/0" in line  # the form it takes


# -- tenants and repair -------------------------------------------------------------------------


def audit_kinds(r: redis.Redis, keys: Keys) -> list[tuple[str, str, str]]:
    from bus.protocol import AuditRecord, decode

    out = []
    for _, fields in r.xrange(keys.audit):
        record = decode(fields[b"data"], AuditRecord)
        out.append((record.kind, record.mode, record.detail))
    return out


def test_tenants_add_list_remove_each_recorded(bus_settings: BusSettings, r: redis.Redis) -> None:
    keys = Keys.of(bus_settings)
    assert ok(hookbus(bus_settings, "tenants", "list")).strip() == f"no tenants in {keys.tenants}"
    out = ok(hookbus(bus_settings, "tenants", "add", "acme", "--by", "ops"))
    assert out.startswith(
        f"tenant acme added: the coordinator service answers {keys.tenant_decisions('acme')}"
    )
    assert "already" in ok(hookbus(bus_settings, "tenants", "add", "acme"))
    ok(hookbus(bus_settings, "tenants", "add", "beta"))
    assert ok(hookbus(bus_settings, "tenants", "list")).split() == ["acme", "beta"]
    assert r.smembers(keys.tenants) == {b"acme", b"beta"}
    assert "removed" in ok(hookbus(bus_settings, "tenants", "remove", "acme"))
    assert "was not served" in ok(hookbus(bus_settings, "tenants", "remove", "acme"))
    assert r.smembers(keys.tenants) == {b"beta"}
    assert audit_kinds(r, keys) == [
        ("tenant", "add", "acme"), ("tenant", "add", "beta"), ("tenant", "remove", "acme"),
    ]  # fmt: skip
    assert "tenant add" in ok(hookbus(bus_settings, "audit", "list"))
    # A name that cannot be a tenant (it would break a qualified session id) is refused.
    bad = hookbus(bus_settings, "tenants", "add", "a/b")
    assert bad.returncode == 2 and "tenant 'a/b' must be" in bad.stderr
    assert hookbus(bus_settings, "tenants", "add").returncode == 2
    assert r.smembers(keys.tenants) == {b"beta"}


MAX_ID = "18446744073709551615-18446744073709551615"


def poisoned_stream(r: redis.Redis, stream: str) -> tuple[list[bytes], bytes]:
    """Three entries, group ``slow`` after the first, group ``fast`` past the poison (it read
    it), then a maximal id: every later XADD * fails."""
    valid = [r.xadd(stream, {"data": f"ok-{i}"}) for i in range(3)]
    r.xgroup_create(stream, "slow", id=valid[0])
    r.xgroup_create(stream, "fast", id="0")
    poison = r.xadd(stream, {"data": "poison"}, id=MAX_ID)
    r.xreadgroup("fast", "c1", {stream: ">"})
    with pytest.raises(redis.exceptions.ResponseError, match="exhausted"):
        r.xadd(stream, {"data": "later"})
    return valid, poison


def test_repair_takes_out_a_maximal_id_and_keeps_groups_and_entries(
    bus_settings: BusSettings, r: redis.Redis
) -> None:
    keys = Keys.of(bus_settings)
    stream = keys.tenant_decisions("acme")
    valid, poison = poisoned_stream(r, stream)
    out = ok(hookbus(bus_settings, "repair", "--tenant", "acme", "--by", "ops"))
    assert f"repaired {stream}: last id {MAX_ID} set back to {valid[-1].decode()}" in out
    assert f"group fast moved back from {MAX_ID}" in out
    # Every valid entry and both groups stay; the slow group's position too.
    assert [i for i, _ in r.xrange(stream)] == valid
    groups = {g["name"]: g for g in r.xinfo_groups(stream)}
    assert groups[b"slow"]["last-delivered-id"] == valid[0]
    assert groups[b"fast"]["last-delivered-id"] == valid[-1]
    assert groups[b"fast"]["pending"] == 3  # the poison's delivery was acknowledged
    # XADD * works again, on Redis's clock, and both groups get the new entry.
    new = r.xadd(stream, {"data": "later"})
    assert abs(int(new.split(b"-")[0]) - now_ms()) < 60_000
    assert r.xreadgroup("fast", "c1", {stream: ">"})[0][1] == [(new, {b"data": b"later"})]
    slow = r.xreadgroup("slow", "c1", {stream: ">"})[0][1]
    assert [i for i, _ in slow] == [*valid[1:], new]
    # The poison is a dead letter with why, and the repair is in the audit trail.
    (letter,) = [f for _, f in r.xrange(keys.tenant_dlq("acme"))]  # the tenant's unit
    assert letter[b"source"] == stream.encode() and letter[b"entry_id"] == poison
    assert letter[b"data"] == b"poison"
    assert letter[b"reason"].startswith(f"repair: its id {MAX_ID} was beyond".encode())
    ((kind, mode, detail),) = audit_kinds(r, keys)
    assert (kind, mode) == ("repair", "stream") and detail.startswith(f"{stream}: last id {MAX_ID}")
    # Repaired: a second run changes nothing.
    again = ok(hookbus(bus_settings, "repair", stream))
    assert f"{stream} is not poisoned" in again
    assert r.xlen(keys.tenant_dlq("acme")) == 1 and len(audit_kinds(r, keys)) == 1


def test_repair_takes_out_every_entry_a_future_id_pushed_ahead(
    bus_settings: BusSettings, r: redis.Redis
) -> None:
    """An id far ahead, not maximal: later XADD * still work but get ids after it. All of them
    are taken out (dead-lettered, so nothing is lost) and the stream is on Redis's clock again."""
    keys = Keys.of(bus_settings)
    stream = keys.event_partitions[0]
    valid = r.xadd(stream, {"data": "ok"})
    r.xgroup_create(stream, "g", id="0")
    ahead = f"{now_ms() + 10 * 365 * 86_400_000}-0"
    r.xadd(stream, {"data": "ahead"}, id=ahead)
    pushed = [r.xadd(stream, {"data": f"pushed-{i}"}) for i in range(3)]
    assert all(p.startswith(ahead.split("-")[0].encode()) for p in pushed)
    ok(hookbus(bus_settings, "repair", stream))
    assert [i for i, _ in r.xrange(stream)] == [valid]
    letters = [(f[b"entry_id"], f[b"data"]) for _, f in r.xrange(keys.dlq)]
    assert letters == [
        (ahead.encode(), b"ahead"),
        *((p, f"pushed-{i}".encode()) for i, p in enumerate(pushed)),
    ]
    new = r.xadd(stream, {"data": "now"})
    assert abs(int(new.split(b"-")[0]) - now_ms()) < 60_000
    assert [i for i, _ in r.xreadgroup("g", "c", {stream: ">"})[0][1]] == [valid, new]


def test_repair_refuses_what_is_not_a_bus_stream(bus_settings: BusSettings) -> None:
    keys = Keys.of(bus_settings)
    for stream in ("elsewhere:stream", f"{keys.prefix}:hooks", keys.inbox("x")):
        result = hookbus(bus_settings, "repair", stream)
        assert result.returncode == 2 and "is not one of the bus's streams" in result.stderr
    missing = hookbus(bus_settings, "repair", keys.tenant_decisions("nobody"))
    assert missing.returncode == 2 and "no stream" in missing.stderr


async def test_repair_on_a_redis_cluster(cluster_settings: BusSettings) -> None:
    """The repair's transaction is on one key (one slot); its dead letters and audit record
    go to other slots after it."""
    from workers.ops.repair import repair_stream

    keys = Keys.of(cluster_settings)
    client = connect(cluster_settings)
    try:
        stream = keys.requests("Guard")
        first = await client.xadd(stream, {"data": "ok"})
        await client.xadd(stream, {"data": "poison"}, id=MAX_ID)
        done = await repair_stream(client, keys, stream, "ops")
        assert done.poisoned and done.new_last_id == first.decode()
        assert await client.xlen(keys.hook_dlq("Guard")) == 1  # the hook's unit
        assert (await client.xadd(stream, {"data": "later"})) > first
    finally:
        await client.aclose()


async def test_dlq_replay_stops_at_the_end_it_found_while_the_hook_dead_letters_again(
    bus_settings: BusSettings,
) -> None:
    """A re-fed letter the hook dead-letters again while the replay runs lands after the end the
    replay started from: it is not re-fed again (the replay once chased its own tail, re-feeding
    16 letters 48 times)."""
    keys = Keys(bus_settings.prefix)
    client = Redis.from_url(bus_settings.redis_url)
    again = redis.Redis.from_url(bus_settings.redis_url)
    try:
        for n in range(3):
            await client.xadd(keys.hook_dlq("h1"), {"source": "s", "reason": "r", "data": f"{n}"})

        def dead_lettered_again(count: int) -> None:  # as the hook would, at once
            for _ in range(count):
                again.xadd(keys.hook_dlq("h1"), {"source": "s", "reason": "r", "data": "x"})

        refed = await replay_dead_letters(client, keys, "h1", progress=dead_lettered_again)
        assert refed == 3
        assert await client.xlen(keys.replay("h1")) == 3
        assert await client.xlen(keys.hook_dlq("h1")) == 3  # the three new ones, left for later
    finally:
        await client.aclose()
        again.close()
