"""Clients in other languages, built from docs/protocol.md alone, against real processes.

A real Redis (``bus_settings``), real hook services (``hookbus worker``) and the coordinator
service (``hookbus coordinator``) answer:

* the Node.js client (``examples/node``) as an untrusted agent of a tenant — connected as the
  tenant's own Redis user, which may only XADD to ``{p}:t:{T}:decisions`` and pop
  ``{p}:t:{T}:inbox:*`` — and as a trusted agent: the conformance vectors' decisions, all 12
  events, the cancellation of its own session, error replies naming the offending field; and
  the same client on a Redis Cluster (``redis+cluster://``);
* the shell client (``examples/shell/pretooluse.sh``, redis-cli only), in both tiers.

Nothing here is skipped: without ``node`` or the client's npm dependencies the tests fail and
say how to install them (``make node-deps``).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple
from urllib.parse import urlsplit, urlunsplit

import msgspec
import pytest
from redis import Redis
from redis.cluster import RedisCluster

from bus import Block, HookEvent, Override, PermissionDecision
from bus.events import session_of
from bus.protocol import EventMessage, decode, decode_context, new_id, now_ms
from bus.settings import BusSettings
from bus.transport.keys import Keys
from bus.transport.redis_io import CLUSTER_SCHEMES
from tests.harness import Processes, worker_env
from tests.remote_hooks import HookConfig
from tests.test_conformance import VECTOR_FILES, load_vector, mismatches, vector_hooks

ROOT = Path(__file__).resolve().parent.parent
NODE_DIR = ROOT / "examples" / "node"
NODE_CLI = NODE_DIR / "cli.mjs"
SHELL_CLIENT = ROOT / "examples" / "shell" / "pretooluse.sh"
HEX_ID = re.compile(r"^[0-9a-f]{32}$")
READY_SECS = 30.0  # how long the coordinator service may take to see freshly started hooks

BLOCKER = HookConfig(
    name="Guard",
    events=[HookEvent.PRE_TOOL_USE],
    names=["file_*"],
    answers={"PreToolUse": Block(reason=".env files hold secrets")},
)


def node() -> str:
    path = shutil.which("node")
    if path is None:
        pytest.fail("node is not on PATH: the Node.js client tests need Node.js >= 20.15")
    if not (NODE_DIR / "node_modules" / "redis" / "package.json").is_file():
        pytest.fail(
            "examples/node/node_modules is missing: run `make node-deps` "
            "(npm ci --prefix examples/node --no-audit --no-fund)"
        )
    return path


class Tenant(NamedTuple):
    """An untrusted agent's identity: its tenant's name and a URL with its own Redis user."""

    name: str
    url: str


def tenant_rules(prefix: str, name: str) -> list[str]:
    """The ACL rules of user ``tenant-NAME`` (docs/security.md): XADD to its own decisions
    stream, BLPOP/BLMPOP its own inboxes, PING; nothing else (CLIENT SETINFO, which the
    template allows from Redis 7.2 on, is not known to the 7.0 server here: node-redis ignores
    its refusal)."""
    own = f"{prefix}:t:{{{name}}}"
    return [
        "on", "resetchannels", "-@all", "+ping",
        f"(%W~{own}:decisions +xadd)", f"(~{own}:inbox:* +blpop +blmpop)",
    ]  # fmt: skip


@pytest.fixture
def tenant(bus_settings: BusSettings) -> Iterator[Tenant]:
    """A tenant the operator registered (``{p}:tenants``), with its own Redis user."""
    name, password = f"acme-{new_id()[:6]}", new_id()
    user = f"tenant-{name}"
    with Redis.from_url(bus_settings.redis_url) as redis:
        redis.sadd(Keys(bus_settings.prefix).tenants, name)
        redis.execute_command("ACL", "SETUSER", user, "reset", f">{password}",
                              *tenant_rules(bus_settings.prefix, name))  # fmt: skip
        try:
            parts = urlsplit(bus_settings.redis_url)
            netloc = f"{user}:{password}@{parts.hostname}:{parts.port}"
            yield Tenant(name, urlunsplit(parts._replace(netloc=netloc)))
        finally:
            redis.execute_command("ACL", "DELUSER", user)


def sync_client(settings: BusSettings) -> Any:
    """A blocking redis-py client of the settings' Redis (node or cluster)."""
    scheme, _, rest = settings.redis_url.partition("://")
    if scheme in CLUSTER_SCHEMES:
        return RedisCluster.from_url(f"{CLUSTER_SCHEMES[scheme]}://{rest}")
    return Redis.from_url(settings.redis_url, socket_timeout=30)


def run_node(
    settings: BusSettings,
    *args: str,
    tenant: Tenant | None = None,
    timeout: float = 60,
    expect: int = 0,
) -> list[dict[str, Any]]:
    """Run the Node client's CLI (as ``tenant``'s untrusted agent, with its Redis user, when
    given); its JSON lines."""
    url = tenant.url if tenant else settings.redis_url
    command = [node(), str(NODE_CLI), "--url", url, "--prefix", settings.prefix,
               "--partitions", str(settings.partitions)]  # fmt: skip
    if tenant:
        command += ["--tenant", tenant.name]
    proc = subprocess.run(
        [*command, *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout, check=False
    )
    assert proc.returncode == expect, f"node cli.mjs {args} exited {proc.returncode}: {proc.stderr}"
    return [json.loads(line) for line in proc.stdout.splitlines() if line.strip()]


def decisions(lines: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [line["reply"] for line in lines if line["kind"] == "decision"]


def start_services(procs: Processes, settings: BusSettings, *hooks: HookConfig) -> None:
    """The hooks as worker processes and one coordinator service; wait until the hooks are live."""
    for hook in hooks:
        procs.scripted(settings, hook)
    procs.start(["coordinator"], worker_env(settings, HOOKBUS_REFRESH_SECS="0.2"), "coordinator")
    keys = Keys(settings.prefix)
    with sync_client(settings) as redis:
        deadline = time.monotonic() + READY_SECS
        while not all(redis.zcard(keys.replicas(h.name)) for h in hooks):
            assert time.monotonic() < deadline, f"hooks did not register:\n{procs.logs()}"
            time.sleep(0.05)


def check_envelope(reply: dict[str, Any]) -> None:
    assert reply["v"] == 3 and HEX_ID.match(reply["id"]), reply
    assert isinstance(reply["ts"], int) and abs(reply["ts"] - now_ms()) < 60_000, reply
    assert HEX_ID.match(reply["request_id"]), reply


# -- Node.js: the conformance vectors --------------------------------------------------------


@pytest.mark.parametrize("tier", ["untrusted", "trusted"])
@pytest.mark.parametrize("path", VECTOR_FILES, ids=lambda p: p.stem)
def test_node_client_decisions_match_the_vectors(
    bus_settings: BusSettings, procs: Processes, tenant: Tenant, path: Path, tier: str
) -> None:
    vector = load_vector(path)
    start_services(procs, bus_settings, *vector_hooks(vector))
    asker = tenant if tier == "untrusted" else None
    # The service's directory may lag the hooks' registration by a refresh: ask again until
    # the expected decision arrives, within a deadline.
    deadline = time.monotonic() + READY_SECS
    while True:
        lines = run_node(bus_settings, "--timeout-ms", "10000", "vector", str(path), tenant=asker)
        assert [(line["kind"], line["vector"]) for line in lines] == [("decision", path.stem)]
        reply = lines[0]["reply"]
        problems = mismatches(vector["expect"], reply["result"] or {})
        if reply["status"] == "ok" and not problems:
            break
        if time.monotonic() > deadline:
            pytest.fail(f"{path.name}: {problems or reply}\n{procs.logs()}")
        time.sleep(0.2)
    check_envelope(reply)
    assert (reply["event"], reply["error"], reply["field"]) == (vector["event"], "", "")


# -- Node.js: events ---------------------------------------------------------------------------


def published(settings: BusSettings) -> dict[str, list[tuple[str, EventMessage]]]:
    """Every event on the events partitions, decoded as an async hook service does, by source."""
    keys = Keys.of(settings)
    by_source: dict[str, list[tuple[str, EventMessage]]] = {}
    with sync_client(settings) as redis:
        for stream in keys.event_partitions:
            for entry_id, fields in redis.xrange(stream):
                message = decode(fields[b"data"], EventMessage)
                ctx = decode_context(message.event, message.context)
                assert session_of(ctx) == message.session_id, ctx
                assert stream == keys.events(message.session_id), (stream, message)
                by_source.setdefault(message.source, []).append((entry_id.decode(), message))
    for events in by_source.values():
        events.sort(key=lambda e: (int(e[0].split("-")[0]), int(e[0].split("-")[1])))
    return by_source


def test_node_client_emits_all_12_events_as_a_trusted_agent(
    bus_settings: BusSettings, procs: Processes
) -> None:
    """A trusted agent XADDs its events to its session's partition of ``{p}:events`` (three
    partitions here: the client computes the hash tags and the partition as bus/transport/keys.py
    does)."""
    settings = msgspec.structs.replace(bus_settings, partitions=3)
    start_services(procs, settings)
    session = f"node-{new_id()[:8]}"
    lines = run_node(settings, "--session", session, "scenario")

    emitted = [line for line in lines if line["kind"] == "emitted"]
    assert [line["event"] for line in emitted] == [e.value for e in HookEvent]  # all 12, in order
    replies = decisions(lines)
    assert [r["event"] for r in replies] == ["PreToolUse", "PermissionRequest"]
    for reply in replies:
        check_envelope(reply)
        assert reply["status"] == "ok", reply
    # No hooks: the defaults of section 5.3.
    assert replies[0]["result"]["action"] == {"type": "Continue"}
    assert replies[0]["result"]["final_args"] == {"path": "app/.env"}
    assert replies[1]["result"]["overridden_by"] is None

    by_source = published(settings)
    ours = by_source.get("node-example", [])
    for entry_id, message in ours:
        assert message.session_id == session and message.v == 3, message
        assert HEX_ID.match(message.id) and abs(message.ts - now_ms()) < 60_000, message
        assert message.traceparent == "" and message.tracestate == ""
        assert entry_id in {line["entry"] for line in emitted}
    assert [m.event for _, m in ours] == list(HookEvent), [m.event for _, m in ours]
    assert [m.id for _, m in ours] == [line["id"] for line in emitted]
    # The two decisions were published by the service itself (protocol.md, 6.1).
    service = by_source.get("coordinator-service", [])
    assert [m.event.value for _, m in service] == ["PreToolUse", "PermissionRequest"]
    assert {m.session_id for _, m in service} == {session}


NOTIFIED = HookConfig(
    name="Notified", events=[HookEvent.ON_SESSION_START, HookEvent.ON_SESSION_STOP]
)


def test_node_client_on_another_partition_count_than_the_bus_refuses_to_start(
    bus_settings: BusSettings,
) -> None:
    """The partition count is the bus's shared configuration (``{p}:config``, section 2): a
    trusted Node agent on 1 partition, on a bus of 3, refuses to start with one line naming
    both, instead of sending its decisions where no coordinator reads them."""
    keys = Keys(bus_settings.prefix)
    with sync_client(bus_settings) as redis:
        redis.hsetnx(keys.config, "partitions", "3")
    command = [node(), str(NODE_CLI), "--url", bus_settings.redis_url, "--prefix",
               bus_settings.prefix, "--partitions", "1", "scenario"]  # fmt: skip
    proc = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and proc.stdout == "", proc.stdout
    (line,) = proc.stderr.splitlines()
    assert "partitions=1 but the bus" in line and "has 3 partitions" in line
    with sync_client(bus_settings) as redis:
        assert redis.hget(keys.config, "partitions") == b"3"
        assert redis.xlen(keys.event_partitions[0]) == 0


def test_node_client_as_an_untrusted_agent_sends_everything_through_the_service(
    bus_settings: BusSettings, procs: Processes, tenant: Tenant
) -> None:
    """An untrusted agent's 12 events are dispatched and published by the coordinator service
    (sync hooks of notify events run too), with its session qualified ``TENANT/SID``; its
    decisions come back to its tenant's inbox; it needs no key but its tenant's."""
    start_services(procs, bus_settings, BLOCKER, NOTIFIED)
    session = f"node-{new_id()[:8]}"
    deadline = time.monotonic() + READY_SECS
    while True:  # until the service's directory shows both hooks
        lines = run_node(bus_settings, "--session", session, "scenario", tenant=tenant)
        emitted = [line for line in lines if line["kind"] == "emitted"]
        if emitted[0]["reply"]["result"]["called"] == ["Notified"]:
            break
        assert time.monotonic() < deadline, f"{emitted[0]}\n{procs.logs()}"
        time.sleep(0.2)

    assert [line["event"] for line in emitted] == [e.value for e in HookEvent]
    for line in emitted:
        reply = line["reply"]
        check_envelope(reply)
        assert (reply["status"], reply["event"]) == ("ok", line["event"]), reply
        assert reply["request_id"] == line["id"], reply
    results = {line["event"]: line["reply"]["result"] for line in emitted}
    assert results["OnSessionStop"]["called"] == ["Notified"]
    assert results["OnStepComplete"] == {"called": [], "skipped": []}
    assert results["PreToolUse"]["action"]["type"] == "Block"  # Guard blocks every file_* tool
    assert results["PermissionDenied"] is None
    replies = decisions(lines)
    assert [r["event"] for r in replies] == ["PreToolUse", "PermissionRequest"]
    assert replies[0]["result"]["action"] == {"type": "Block", "reason": ".env files hold secrets"}

    by_source = published(bus_settings)
    assert "node-example" not in by_source  # the client published nothing itself
    mine = [m for _, m in by_source[f"tenant:{tenant.name}"] if m.session_id.endswith(session)]
    qualified = f"{tenant.name}/{session}"
    assert {m.session_id for m in mine} == {qualified}
    # The last of the retries: 12 events, then the two decisions, in order in one partition.
    last = [m.event.value for m in mine][-14:]
    assert last == [e.value for e in HookEvent] + ["PreToolUse", "PermissionRequest"], last
    with Redis.from_url(bus_settings.redis_url) as redis:
        keys = Keys(bus_settings.prefix)
        assert redis.xlen(keys.decision_partitions[0]) == 0  # nothing on the trusted path
        sent = [
            json.loads(fields[b"data"])["id"]
            for _, fields in redis.xrange(keys.tenant_decisions(tenant.name))
        ]
    assert sent[-14:] == [line["id"] for line in emitted] + [r["request_id"] for r in replies]


def test_node_client_cancels_its_own_session(
    bus_settings: BusSettings, procs: Processes, tenant: Tenant
) -> None:
    """``cancel`` adds the tenant's own (qualified) session to the cancelled set; the
    CancellationHook then blocks its tool calls, not those of any other session, and nothing the
    agent sends — OnSessionStop included — lifts it."""
    procs.worker(
        bus_settings, "workers.builtins.cancellation:RedisCancellationHook", "cancellation"
    )
    start_services(procs, bus_settings)
    keys = Keys(bus_settings.prefix)
    with Redis.from_url(bus_settings.redis_url) as redis:
        deadline = time.monotonic() + READY_SECS
        while not redis.zcard(keys.replicas("CancellationHook")):
            assert time.monotonic() < deadline, procs.logs()
            time.sleep(0.05)
    session, other = f"s-{new_id()[:8]}", f"s-{new_id()[:8]}"
    read = json.dumps({"session_id": session, "tool_name": "file_read", "tool_args": {}})

    (line,) = run_node(bus_settings, "--session", session, "cancel", tenant=tenant)
    assert line["kind"] == "cancelled" and line["session"] == session, line
    check_envelope(line["reply"])
    qualified = f"{tenant.name}/{session}"
    assert line["reply"]["status"] == "ok"
    assert line["reply"]["result"] == {"cancelled": qualified}, line
    with Redis.from_url(bus_settings.redis_url) as redis:
        assert redis.smembers(keys.cancelled(qualified)) == {f"tenant:{tenant.name}".encode()}
        assert 0 < redis.ttl(keys.cancelled(qualified)) <= bus_settings.session_ttl_secs
        assert not redis.exists(keys.cancelled(session))  # another tenant's (or a trusted) s

    def action(context: str) -> dict[str, Any]:
        (reply,) = decisions(run_node(bus_settings, "decide", "PreToolUse", context, tenant=tenant))
        assert reply["status"] == "ok", reply
        return reply["result"]["action"]  # type: ignore[no-any-return]

    deadline = time.monotonic() + READY_SECS
    while (blocked := action(read))["type"] != "Block":  # until the service sees the hook
        assert time.monotonic() < deadline, f"{blocked}\n{procs.logs()}"
        time.sleep(0.2)
    assert blocked == {"type": "Block", "reason": f"session {qualified} was cancelled by the user"}
    assert action(read.replace(session, other)) == {"type": "Continue"}
    # The agent stops its session: the cancellation stands (only its TTL or an operator ends it).
    stop = json.dumps({"session_id": session, "terminal": "Completed", "total_steps": 1})
    (reply,) = decisions(run_node(bus_settings, "decide", "OnSessionStop", stop, tenant=tenant))
    assert reply["status"] == "ok", reply
    assert action(read)["type"] == "Block"


def test_node_and_shell_clients_on_a_redis_cluster(
    cluster_settings: BusSettings, redis_cluster: Any, procs: Processes
) -> None:
    """Both clients given a ``redis+cluster://`` URL (node-redis' cluster client; ``redis-cli
    -c``), as a tenant's own Redis user: the tenant's stream and inbox share its hash tag, so
    each command goes to one node. On a cluster the user also needs ``CLUSTER SLOTS``, which
    node-redis runs to learn the slot map."""
    settings = msgspec.structs.replace(cluster_settings, partitions=3)
    start_services(procs, settings, BLOCKER)
    name, password = f"acme-{new_id()[:6]}", new_id()
    with sync_client(settings) as redis:
        redis.sadd(Keys(settings.prefix).tenants, name)
    for server in redis_cluster.nodes:  # ACL users are per node: every master and replica
        with Redis.from_url(server.url) as node_client:
            node_client.execute_command("ACL", "SETUSER", f"tenant-{name}", "reset",
                                        f">{password}", *tenant_rules(settings.prefix, name),
                                        "+cluster|slots")  # fmt: skip
    parts = urlsplit(settings.redis_url)
    netloc = f"tenant-{name}:{password}@{parts.hostname}:{parts.port}"
    asker = Tenant(name, urlunsplit(parts._replace(netloc=netloc)))
    session = f"node-{new_id()[:8]}"
    context = json.dumps({"session_id": session, "tool_name": "file_read", "tool_args": {}})
    deadline = time.monotonic() + READY_SECS
    while True:
        (reply,) = decisions(run_node(settings, "decide", "PreToolUse", context, tenant=asker))
        if reply["status"] == "ok" and reply["result"]["action"]["type"] == "Block":
            break
        assert time.monotonic() < deadline, f"{reply}\n{procs.logs()}"
        time.sleep(0.2)
    check_envelope(reply)
    proc = run_shell(
        settings, "file_read", "{}", REDIS_URL=asker.url, TENANT=name, SESSION_ID=session
    )
    assert proc.returncode == 0, (proc.stdout, proc.stderr)
    assert json.loads(proc.stdout)["result"]["action"]["type"] == "Block"
    # The trusted path on the cluster too (the default user): events to the session's
    # partition (3 partitions, their tags spread over the masters), a decision.
    lines = run_node(settings, "--session", session, "scenario")
    assert len([line for line in lines if line["kind"] == "emitted"]) == 12
    assert decisions(lines)[0]["result"]["action"]["type"] == "Block"
    sources = published(settings)
    assert len(sources["node-example"]) == 12
    assert {m.session_id for _, m in sources[f"tenant:{name}"]} == {f"{name}/{session}"}


# -- errors ------------------------------------------------------------------------------------


def test_schema_violations_get_error_replies_naming_the_field(
    bus_settings: BusSettings, procs: Processes
) -> None:
    start_services(procs, bus_settings)
    keys = Keys(bus_settings.prefix)
    # A raw foreign message (any language), straight onto the stream.
    bad = {
        "v": 3, "id": "bad-1", "ts": now_ms(), "event": "PreToolUse",
        "context": {"session_id": "s1", "tool_name": 42}, "reply_to": keys.inbox("raw-client"),
    }  # fmt: skip
    with Redis.from_url(bus_settings.redis_url, socket_timeout=30) as redis:
        redis.xadd(keys.decision_partitions[0], {"data": json.dumps(bad)})
        popped = redis.blpop([keys.inbox("raw-client")], timeout=15)
    assert popped is not None, f"no error reply from the coordinator service\n{procs.logs()}"
    reply = json.loads(popped[1])
    assert reply["status"] == "error" and reply["field"] == "$.context.tool_name", reply
    assert (reply["request_id"], reply["event"], reply["result"]) == ("bad-1", None, None)

    # The same from the Node client, which sends contexts exactly as given.
    (reply,) = decisions(
        run_node(bus_settings, "decide", "PreToolUse", '{"session_id":"s1","tool_name":42}')
    )
    check_envelope(reply)
    assert reply["status"] == "error" and reply["field"] == "$.context.tool_name", reply
    assert "tool_name" in reply["error"] and reply["event"] is None and reply["result"] is None
    (reply,) = decisions(run_node(bus_settings, "decide", "PreToolCall", '{"session_id":"s1"}'))
    assert reply["status"] == "error" and reply["field"] == "$.event", reply
    (reply,) = decisions(run_node(bus_settings, "decide", "PreToolUse", '{"session_id":"s1"}'))
    assert reply["status"] == "error" and reply["field"] == "$.context", reply
    assert "`tool_name`" in reply["error"], reply


def test_node_client_gets_a_refusal_for_a_context_no_hook_can_inspect(
    bus_settings: BusSettings, procs: Processes
) -> None:
    """Tool arguments nested 1,000 levels deep (far below what breaks JSON.stringify): the
    service decides without any hook — Block, Deny — although its only hook would allow all."""
    allow = Override(decision=PermissionDecision.ALLOW, reason="fine")
    start_services(
        procs, bus_settings, HookConfig(name="Allower", answers={"PermissionRequest": allow})
    )
    deep = '{"a":' * 999 + "{}" + "}" * 999
    context = f'{{"session_id":"s1","tool_name":"act","tool_args":{deep}}}'
    (reply,) = decisions(run_node(bus_settings, "decide", "PreToolUse", context))
    check_envelope(reply)
    assert (reply["status"], reply["event"]) == ("ok", "PreToolUse"), reply
    action = reply["result"]["action"]
    assert action["type"] == "Block" and "(MAX_DEPTH)" in action["reason"], reply
    assert [e["hook_name"] for e in reply["result"]["blocking_errors"]] == ["HookBus"]
    (reply,) = decisions(run_node(bus_settings, "decide", "PermissionRequest", context))
    assert reply["result"]["action"]["decision"] == "Deny", reply
    assert reply["result"]["overridden_by"] == "HookBus", reply
    # 10,000 levels: JSON.stringify throws before anything is sent (the README says so).
    keys = Keys(bus_settings.prefix)
    with Redis.from_url(bus_settings.redis_url) as redis:
        sent = redis.xlen(keys.decision_partitions[0])
        deeper = '{"a":' * 9_999 + "{}" + "}" * 9_999
        command = [node(), str(NODE_CLI), "--url", bus_settings.redis_url, "--prefix",
                   bus_settings.prefix, "decide", "PreToolUse",
                   f'{{"session_id":"s1","tool_name":"act","tool_args":{deeper}}}']  # fmt: skip
        proc = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=60)
        assert proc.returncode == 1 and "call stack" in proc.stderr, proc
        assert redis.xlen(keys.decision_partitions[0]) == sent


# -- shell (redis-cli only) --------------------------------------------------------------------


def run_shell(settings: BusSettings, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    if shutil.which("redis-cli") is None:
        pytest.fail("redis-cli is not on PATH: the shell client needs it (it ships with Redis)")
    environ = {**os.environ, "REDIS_URL": settings.redis_url, "PREFIX": settings.prefix, **env}
    return subprocess.run(
        ["bash", str(SHELL_CLIENT), *args],
        cwd=ROOT,
        env=environ,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.parametrize("tier", ["untrusted", "trusted"])
def test_shell_client_pre_tool_use_round_trip(
    bus_settings: BusSettings, procs: Processes, tenant: Tenant, tier: str
) -> None:
    """As a tenant's untrusted agent (its own Redis user, its tenant's stream and inbox) and as
    a trusted one (partition 0 of ``{p}:decisions``)."""
    start_services(procs, bus_settings, BLOCKER)
    as_tenant = {"REDIS_URL": tenant.url, "TENANT": tenant.name} if tier == "untrusted" else {}

    def run(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
        return run_shell(bus_settings, *args, **as_tenant, **env)

    deadline = time.monotonic() + READY_SECS
    while True:
        proc = run("file_read", '{"path":"app/.env"}', SESSION_ID="sh-1")
        assert proc.returncode == 0, (proc.returncode, proc.stdout, proc.stderr)
        reply = json.loads(proc.stdout)
        if reply["result"]["action"]["type"] == "Block":
            break
        assert time.monotonic() < deadline, f"{reply}\n{procs.logs()}"
        time.sleep(0.2)
    check_envelope(reply)
    assert reply["event"] == "PreToolUse" and reply["status"] == "ok", reply
    assert reply["result"]["action"] == {"type": "Block", "reason": ".env files hold secrets"}
    assert reply["result"]["blocking_errors"] == [
        {"hook_name": "Guard", "reason": ".env files hold secrets"}
    ]
    assert reply["result"]["final_args"] == {"path": "app/.env"}

    # A tool the hook does not match: Continue.
    proc = run("run_shell", '{"command":"ls"}')
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["result"]["action"] == {"type": "Continue"}
    # A schema violation: an error reply (exit 1) naming the field.
    proc = run("file_read", '"not an object"')
    assert proc.returncode == 1, (proc.stdout, proc.stderr)
    assert json.loads(proc.stdout)["field"] == "$.context.tool_args"
    # Where the requests went: the tenant's own stream, or partition 0.
    keys = Keys(bus_settings.prefix)
    with Redis.from_url(bus_settings.redis_url) as redis:
        tenant_stream = redis.xlen(keys.tenant_decisions(tenant.name))
        trusted_stream = redis.xlen(keys.decision_partitions[0])
    assert (tenant_stream > 0, trusted_stream > 0) == (tier == "untrusted", tier == "trusted")


def test_shell_client_refuses_a_bad_tenant(bus_settings: BusSettings) -> None:
    proc = run_shell(bus_settings, TENANT="a/b")
    assert proc.returncode == 4 and "TENANT must be" in proc.stderr, proc


def test_shell_client_fails_on_timeout(bus_settings: BusSettings) -> None:
    # Nobody serves this prefix: no reply, exit status 2 after TIMEOUT_MS + 1 s.
    t0 = time.monotonic()
    proc = run_shell(bus_settings, TIMEOUT_MS="300")
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    assert proc.stdout == "" and "no DecisionReply" in proc.stderr
    assert time.monotonic() - t0 < 10
