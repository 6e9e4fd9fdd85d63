"""Every attack a leaked credential allows, run with that credential against the generated ACL
(tests/security/conftest.py): each is refused with NOPERM, and Redis records it in ACL LOG.

* ``tenant-acme`` — an untrusted agent's credential, which the agent's shell tool can read: it
  reaches nothing but its own decisions stream (XADD) and its own inboxes (BLPOP).
* ``hook-Rogue`` — one hook service's credential: nothing of another hook (``Guard``).
* ``agent`` — the trusted agents' credential: it can add a cancellation, never lift one.
* ``hook-CancellationHook`` — reads cancellations; cannot remove one.
* ``hook-Tail`` — an async hook: the residual risk docs/security.md names, checked to be what
  it says (it reads the events as any group) and no more.
"""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import pytest

from bus.protocol import HookManifest, encode
from tests.harness import ROOT
from tests.security.conftest import KEYS, AclServer, Attacker

MAX_ID = "18446744073709551615-18446744073709551615"
EVENTS, DECISIONS = KEYS.event_partitions[0], KEYS.decision_partitions[0]
GUARD_REQUESTS, GUARD_SHARD = KEYS.requests("Guard"), KEYS.requests("Guard", 1, 2)
CANCEL_REQUESTS = KEYS.requests("CancellationHook")
BETA_STREAM, BETA_INBOX = KEYS.tenant_decisions("beta"), KEYS.tenant_inbox("beta", "c1")
ACME_STREAM, ACME_INBOX = KEYS.tenant_decisions("acme"), KEYS.tenant_inbox("acme", "c1")
VICTIM = "beta/s1"  # a session of tenant beta, as the bus names it (qualified)
CANCELLED, SESSION = KEYS.cancelled(VICTIM), KEYS.session_hooks(VICTIM)


def scene(acl: AclServer) -> dict[str, Any]:
    """The victims' keys, set by the admin; returns a snapshot to compare with afterwards."""
    a = acl.admin
    a.sadd(CANCELLED, "operator")
    a.expire(CANCELLED, 3600)
    a.sadd(SESSION, "Guard")
    a.set(KEYS.manifest("Guard"), b'{"name":"Guard"}')
    a.sadd(KEYS.hooks, "Guard", "CancellationHook")
    a.zadd(KEYS.replicas("Guard"), {"host-1-ab": 1})
    a.xadd(GUARD_REQUESTS, {"data": "{}"})
    a.xgroup_create(GUARD_REQUESTS, "workers", id="0")
    a.xadd(EVENTS, {"data": "{}"})
    a.xgroup_create(EVENTS, "AsyncAuditLogHook", id="0")
    a.xadd(BETA_STREAM, {"data": "{}"})
    a.xgroup_create(BETA_STREAM, "coordinators", id="0")
    a.rpush(BETA_INBOX, b'{"reply":"for beta"}')
    a.sadd(KEYS.tenants, "acme", "beta")
    return snapshot(acl)


def snapshot(acl: AclServer) -> dict[str, Any]:
    a = acl.admin
    return {
        "cancelled": (a.smembers(CANCELLED), a.ttl(CANCELLED) > 3000),
        "session": a.smembers(SESSION),
        "manifest": a.get(KEYS.manifest("Guard")),
        "hooks": a.smembers(KEYS.hooks),
        "replicas": a.zrange(KEYS.replicas("Guard"), 0, -1, withscores=True),
        "guard": (a.xrange(GUARD_REQUESTS), a.xinfo_groups(GUARD_REQUESTS)),
        "events": (a.xrange(EVENTS), a.xinfo_groups(EVENTS)),
        "beta": (a.xrange(BETA_STREAM), a.xinfo_groups(BETA_STREAM)),
        "beta_inbox": a.lrange(BETA_INBOX, 0, -1),
        "tenants": a.smembers(KEYS.tenants),
        "modes": a.hgetall(KEYS.modes),
        "breakglass": a.get(KEYS.breakglass),
        "keys": sorted(a.keys("*")),
    }


def cancellation_attacks(sid: str) -> list[tuple[Any, ...]]:
    """Every way to lift, shorten or read a cancellation."""
    k = KEYS.cancelled(sid)
    return [
        ("SET", k, "1", "PX", "1"), ("SADD", k, "x"), ("SREM", k, "operator"), ("DEL", k),
        ("UNLINK", k), ("EXPIRE", k, "1"), ("PEXPIRE", k, "1"), ("PERSIST", k),
        ("GETDEL", k), ("RENAME", k, "elsewhere"), ("SMEMBERS", k), ("EXISTS", k),
        ("SPOP", k), ("SMOVE", k, "x", "operator"), ("RESTORE", k, "0", "x", "REPLACE"),
    ]  # fmt: skip


SERVER_ATTACKS: list[tuple[Any, ...]] = [
    ("EVAL", "return redis.call('DEL', KEYS[1])", "1", CANCELLED),
    ("FCALL", "anything", "1", CANCELLED), ("FUNCTION", "LIST"), ("SCRIPT", "LOAD", "return 1"),
    ("KEYS", "*"), ("SCAN", "0"), ("CONFIG", "GET", "*"), ("ACL", "LIST"), ("ACL", "LOG"),
    ("CLIENT", "LIST"), ("CLIENT", "KILL", "TYPE", "normal"), ("FLUSHALL",), ("INFO",),
    ("SHUTDOWN", "NOSAVE"), ("SELECT", "1"), ("MIGRATE", "h", "1",
    "k", "0", "1"), ("PUBSUB", "CHANNELS"),
]  # fmt: skip

TENANT_ATTACKS: list[tuple[Any, ...]] = [
    # Lift, shorten or read a cancellation: the victim's, its own, an unqualified one.
    *cancellation_attacks(VICTIM), *cancellation_attacks("acme/s1"), ("DEL", KEYS.cancelled("s1")),
    # Forge what a hook is asked (an OnSessionStop to the CancellationHook), or an event.
    ("XADD", CANCEL_REQUESTS, "*", "data", "{}"), ("XADD", GUARD_REQUESTS, "*", "data", "{}"),
    ("XADD", GUARD_SHARD, "*", "data", "{}"), ("XADD", GUARD_REQUESTS, MAX_ID, "data", "x"),
    ("XADD", EVENTS, "*", "data", "{}"), ("XADD", EVENTS, MAX_ID, "data", "x"),
    ("XADD", DECISIONS, "*", "data", "{}"), ("XADD", KEYS.audit, "*", "data", "{}"),
    ("XADD", KEYS.dlq, "*", "data", "{}"), ("XRANGE", KEYS.dlq, "-", "+"),
    # Dead letters (key layout 3): not even its own unit's (the coordinator service writes
    # them), nor another's.
    ("XADD", KEYS.tenant_dlq("acme"), "*", "data", "{}"),
    ("XADD", KEYS.tenant_dlq("acme"), "MAXLEN", "0", "*", "data", "{}"),
    ("XADD", KEYS.tenant_dlq("beta"), MAX_ID, "data", "{}"),
    ("XADD", KEYS.hook_dlq("Guard"), "*", "data", "{}"), ("XADD", KEYS.config, "*", "d", "x"),
    ("HSET", KEYS.config, "partitions", "1"), ("HSETNX", KEYS.config, "partitions", "1"),
    ("XRANGE", GUARD_REQUESTS, "-", "+"), ("XREAD", "STREAMS", EVENTS, "0"),
    ("XREADGROUP", "GROUP", "AsyncAuditLogHook", "x", "STREAMS", EVENTS, ">"),
    # Another tenant: its decisions stream (a maximal id would stop it) and its replies.
    ("XADD", BETA_STREAM, "*", "data", "{}"), ("XADD", BETA_STREAM, MAX_ID, "data", "x"),
    ("BLPOP", BETA_INBOX, "0.1"), ("BLMPOP", "0.1", "1", BETA_INBOX, "LEFT"),
    ("LPOP", BETA_INBOX), ("LRANGE", BETA_INBOX, "0", "-1"), ("RPUSH", BETA_INBOX, "forged"),
    ("DEL", BETA_INBOX), ("XGROUP", "SETID", BETA_STREAM, "coordinators", "$"),
    # Trusted agents' and coordinators' inboxes: read their replies, or forge them.
    ("RPUSH", KEYS.inbox("c1"), "forged"), ("BLPOP", KEYS.inbox("c1"), "0.1"),
    # Its own stream: only XADD; no group, no trim, no delete, no reading others' requests.
    ("XRANGE", ACME_STREAM, "-", "+"), ("XTRIM", ACME_STREAM, "MAXLEN", "0"),
    ("DEL", ACME_STREAM), ("XGROUP", "CREATE", ACME_STREAM, "g", "0", "MKSTREAM"),
    ("XREADGROUP", "GROUP", "coordinators", "x", "STREAMS", ACME_STREAM, ">"),
    ("RPUSH", ACME_INBOX, "forged"),
    # Session keys: attach or detach a session's hooks.
    ("SADD", SESSION, "Evil"), ("SREM", SESSION, "Guard"), ("DEL", SESSION),
    ("SMEMBERS", SESSION), ("EXPIRE", SESSION, "1"),
    # The directory, modes, tenants, break-glass: read or change how hooks are applied.
    ("GET", KEYS.manifest("Guard")), ("SET", KEYS.manifest("Guard"), "{}"),
    ("SMEMBERS", KEYS.hooks), ("SADD", KEYS.hooks, "Evil"), ("SREM", KEYS.hooks, "Guard"),
    ("ZRANGE", KEYS.replicas("Guard"), "0", "-1"), ("ZADD", KEYS.replicas("Guard"), "1", "x"),
    ("HGETALL", KEYS.modes), ("HSET", KEYS.modes, "Guard", "dryrun"),
    ("SMEMBERS", KEYS.tenants), ("SADD", KEYS.tenants, "evil"), ("SREM", KEYS.tenants, "beta"),
    ("GET", KEYS.breakglass), ("SET", KEYS.breakglass, "{}"), ("TIME",),
    # The control channel: other sessions' announcements, forged ones.
    ("PUBLISH", KEYS.control, '{"type":"session","session_id":"beta/s1"}'),
    ("PUBLISH", "anything", "x"),
    *SERVER_ATTACKS,
]  # fmt: skip


def _id(command: tuple[Any, ...]) -> str:
    return " ".join(str(c) for c in command[:3])[:60]


def run_all(acl: AclServer, attacker: Attacker, attacks: list[tuple[Any, ...]]) -> None:
    """Every attack refused; nothing of the victims' changed; each one in ACL LOG."""
    before = scene(acl)
    for command in attacks:
        attacker.refused(*command)
    assert snapshot(acl) == before
    logged = sum(int(e["count"]) for e in acl.denied(attacker.user))
    assert logged == len(attacks)


def test_a_tenant_credential_reaches_nothing_but_its_own_stream_and_inboxes(
    acl: AclServer, attacker: Any
) -> None:
    acme: Attacker = attacker("tenant-acme")
    run_all(acl, acme, TENANT_ATTACKS)
    # What it may do: ask (XADD, its own stream only, any id), read its own replies.
    assert acme.redis.ping()
    assert acme.redis.xadd(ACME_STREAM, {"data": "{}"})
    acl.admin.rpush(ACME_INBOX, "reply")
    assert acme.redis.blpop([ACME_INBOX], 1) == (ACME_INBOX.encode(), b"reply")
    assert acme.redis.blmpop(0.1, 1, ACME_INBOX, direction="LEFT") is None


def test_a_tenant_credential_cannot_subscribe_to_any_channel(acl: AclServer, attacker: Any) -> None:
    """The control channel announces every session: a tenant sees none of it."""
    acme: Attacker = attacker("tenant-acme")
    acme.subscribe_refused(KEYS.control)
    acme.subscribe_refused("*", pattern=True)
    acme.subscribe_refused(f"{KEYS.prefix}:*", pattern=True)
    denied = acl.denied("tenant-acme")
    assert {e["reason"] for e in denied} == {"command"}  # it has no SUBSCRIBE at all
    assert sum(int(e["count"]) for e in denied) == 3


HOOK_ATTACKS: list[tuple[Any, ...]] = [
    # Read another hook's requests (its own consumer group, or Guard's), answer in its place.
    ("XGROUP", "CREATE", GUARD_REQUESTS, "rogue", "0"),
    ("XGROUP", "CREATE", GUARD_SHARD, "rogue", "0", "MKSTREAM"),
    ("XGROUP", "CREATECONSUMER", GUARD_REQUESTS, "workers", "rogue"),
    ("XREADGROUP", "GROUP", "workers", "rogue", "STREAMS", GUARD_REQUESTS, ">"),
    ("XREADGROUP", "GROUP", "workers", "rogue", "STREAMS", GUARD_SHARD, ">"),
    ("XREAD", "STREAMS", GUARD_REQUESTS, "0"), ("XRANGE", GUARD_REQUESTS, "-", "+"),
    ("XAUTOCLAIM", GUARD_REQUESTS, "workers", "rogue", "0", "0"),
    ("XCLAIM", GUARD_REQUESTS, "workers", "rogue", "0", "0-1"),
    ("XACK", GUARD_REQUESTS, "workers", "0-1"), ("XINFO", "GROUPS", GUARD_REQUESTS),
    ("XGROUP", "SETID", GUARD_REQUESTS, "workers", "$"),
    ("XGROUP", "DESTROY", GUARD_REQUESTS, "workers"), ("XADD", GUARD_REQUESTS, "*", "d", "x"),
    ("XADD", GUARD_REQUESTS, MAX_ID, "d", "x"), ("XTRIM", GUARD_REQUESTS, "MAXLEN", "0"),
    ("DEL", GUARD_REQUESTS),
    # Overwrite Guard's manifest (its policy, mode, events) or unregister it.
    ("SET", KEYS.manifest("Guard"), "{}"), ("GET", KEYS.manifest("Guard")),
    ("DEL", KEYS.manifest("Guard")), ("SREM", KEYS.hooks, "Guard"), ("DEL", KEYS.hooks),
    ("SMEMBERS", KEYS.hooks),
    # Fake or remove Guard's replicas and clock offsets.
    ("ZADD", KEYS.replicas("Guard"), "9999999999999", "fake"),
    ("ZREM", KEYS.replicas("Guard"), "host-1-ab"), ("HSET", KEYS.clocks("Guard"), "x", "0"),
    # Decide how hooks are applied, forge decisions, events, cancellations, sessions.
    ("HSET", KEYS.modes, "Guard", "dryrun"), ("SET", KEYS.breakglass, "{}"),
    ("XADD", DECISIONS, "*", "d", "x"), ("XADD", BETA_STREAM, "*", "d", "x"),
    ("XADD", EVENTS, "*", "d", "x"),
    ("XREADGROUP", "GROUP", "AsyncAuditLogHook", "x", "STREAMS", EVENTS, ">"),
    ("XADD", KEYS.audit, "*", "d", "x"), ("XDEL", KEYS.dlq, "0-1"),
    # Dead letters of any unit but its own (issue 31 #1, #2): erase the coordinators' or a
    # tenant's (MAXLEN 0), block them (a maximal id), forge another hook's (replayed to it).
    ("XADD", KEYS.dlq, "MAXLEN", "0", "*", "d", "x"), ("XADD", KEYS.dlq, MAX_ID, "d", "x"),
    ("XADD", KEYS.dlq, "*", "d", "x"), ("XTRIM", KEYS.dlq, "MAXLEN", "0"),
    ("XADD", KEYS.tenant_dlq("beta"), "MAXLEN", "0", "*", "d", "x"),
    ("XADD", KEYS.tenant_dlq("beta"), MAX_ID, "d", "x"),
    ("XADD", KEYS.hook_dlq("Guard"), "*", "hook", "Guard", "data", "{}"),
    ("XADD", KEYS.hook_dlq("AsyncAuditLogHook"), "*", "hook", "AsyncAuditLogHook", "data", "{}"),
    ("XTRIM", KEYS.hook_dlq("Guard"), "MAXLEN", "0"), ("XDEL", KEYS.dlq_purged, "x"),
    ("HINCRBY", KEYS.dlq_purged, KEYS.hook_dlq("Rogue"), "-5"),
    # The shared configuration: only set if absent (HSETNX), never changed.
    ("HSET", KEYS.config, "partitions", "7"), ("DEL", KEYS.config),
    ("XRANGE", KEYS.dlq, "-", "+"), *cancellation_attacks(VICTIM), ("SADD", SESSION, "Evil"),
    ("SREM", SESSION, "Guard"), ("SADD", KEYS.tenants, "evil"),
    # Read replies meant for others.
    ("BLPOP", KEYS.inbox("c1"), "0.1"), ("LRANGE", KEYS.inbox("c1"), "0", "-1"),
    ("BLPOP", BETA_INBOX, "0.1"), ("RPUSH", BETA_INBOX, "forged"),
    *SERVER_ATTACKS,
]  # fmt: skip


def test_a_hook_credential_reaches_nothing_of_another_hook(acl: AclServer, attacker: Any) -> None:
    rogue: Attacker = attacker("hook-Rogue")
    run_all(acl, rogue, HOOK_ATTACKS)
    rogue.subscribe_refused(KEYS.control)
    # What it may do: its own keys, register, answer, dead-letter.
    r = rogue.redis
    assert r.set(KEYS.manifest("Rogue"), "{}") and r.sadd(KEYS.hooks, "Rogue") == 1
    r.xgroup_create(KEYS.requests("Rogue"), "workers", id="0", mkstream=True)
    r.xgroup_create(KEYS.requests("Rogue", 3, 4), "workers", id="0", mkstream=True)
    assert r.zadd(KEYS.replicas("Rogue"), {"h-1-ab": 1}) == 1
    assert r.rpush(KEYS.inbox("c1"), "{}") == 1 and r.xadd(KEYS.hook_dlq("Rogue"), {"data": "x"})
    assert r.publish(KEYS.control, '{"type":"manifest","name":"Rogue"}') == 0


TRUSTED_AGENT_ATTACKS = [
    *[c for c in cancellation_attacks(VICTIM) if c[0] != "SADD"],
    ("SET", KEYS.cancelled("s2"), "1", "PX", "1"),  # a new key of another type, expiring
    ("EXPIRE", KEYS.cancelled("s2"), "1"),
    *SERVER_ATTACKS,
]


def test_the_trusted_agent_credential_can_add_a_cancellation_but_never_lift_one(
    acl: AclServer, attacker: Any
) -> None:
    agent: Attacker = attacker("agent")
    run_all(acl, agent, TRUSTED_AGENT_ATTACKS)
    # Adding is all it can do: one more member, the TTL untouched.
    assert agent.redis.sadd(CANCELLED, "agent") == 1
    assert acl.admin.smembers(CANCELLED) == {b"operator", b"agent"}
    assert acl.admin.ttl(CANCELLED) > 3000


def test_the_cancellation_hook_credential_reads_cancellations_and_cannot_remove_one(
    acl: AclServer, attacker: Any
) -> None:
    """It needs EXISTS, and EXPIRE to start the TTL of a cancellation an agent added (agents
    cannot set one). Removing, rewriting or shrinking the set is refused. (Its EXPIRE could
    shorten a TTL: that credential answers for cancellations anyway — docs/security.md.)"""
    hook: Attacker = attacker("hook-CancellationHook")
    attacks = [c for c in cancellation_attacks(VICTIM) if c[0] not in ("EXISTS", "EXPIRE")]
    run_all(acl, hook, [*attacks, *HOOK_ATTACKS[:6]])
    assert hook.redis.exists(CANCELLED) == 1


def test_residual_an_async_hook_credential_reads_the_events_as_any_group(
    acl: AclServer, attacker: Any
) -> None:
    """docs/security.md, residual risks: Redis ACLs restrict keys, not consumer group names, so
    an async hook's credential reads the events partitions as any group, moves another group's
    position and trims them.
    It reaches nothing else another credential guards."""
    tail: Attacker = attacker("hook-Tail")
    # (It may SCRIPT LOAD: bus/transport/retention.py's scripts run by EVALSHA on the events
    # partitions, and every command inside runs under this user's ACL.)
    attacks = [c for c in HOOK_ATTACKS if EVENTS not in c and c[:2] != ("SCRIPT", "LOAD")]
    run_all(
        acl, tail, [*attacks, ("XADD", EVENTS, "*", "d", "x"), ("XADD", EVENTS, MAX_ID, "d", "x")]
    )
    # The residual risk, as documented: another hook's group (the audit log's), read and reset.
    read = tail.redis.xreadgroup("AsyncAuditLogHook", "tail", {EVENTS: ">"})
    assert len(read[0][1]) == 1
    assert tail.redis.xgroup_setid(EVENTS, "AsyncAuditLogHook", "0")
    assert tail.redis.xtrim(EVENTS, maxlen=0) == 1


@pytest.mark.parametrize("user", ["coordinator", "operator"])
def test_the_service_credentials_cannot_forge_what_they_do_not_write(
    acl: AclServer, attacker: Any, user: str
) -> None:
    """The coordinator adds cancellations (a tenant's own) and never lifts one; the operator
    alone lifts them. Neither reads a hook's requests as a worker, deletes a stream or trims
    one."""
    who: Attacker = attacker(user)
    attacks: list[tuple[Any, ...]] = [
        ("SREM", KEYS.hooks, "Guard"), ("DEL", GUARD_REQUESTS), ("XTRIM", EVENTS, "MAXLEN", "0"),
        ("XREADGROUP", "GROUP", "workers", "x", "STREAMS", GUARD_REQUESTS, ">"),
        *SERVER_ATTACKS,
    ]  # fmt: skip
    if user == "coordinator":
        attacks += [
            ("SET", KEYS.manifest("Guard"), "{}"),  # (the operator's tombstone: hooks remove)
            ("DEL", CANCELLED), ("SREM", CANCELLED, "operator"), ("SET", CANCELLED, "1"),
            ("HSET", KEYS.modes, "Guard", "dryrun"), ("SET", KEYS.breakglass, "{}"),
            ("SADD", KEYS.tenants, "evil"),
        ]  # fmt: skip
    run_all(acl, who, attacks)


def test_a_hook_credential_cannot_put_terminal_escapes_on_the_operators_screen(
    acl: AclServer, attacker: Any
) -> None:
    """A hook's user writes its manifest and its replicas' problems (``hooks list`` shows
    them): an escape
    sequence written there (a window title, a cleared screen, a forged line) reaches the
    operator's terminal escaped, and a flood of text is cut to a few hundred characters."""
    rogue: Attacker = attacker("hook-Rogue")
    r = rogue.redis
    manifest = HookManifest(
        name="Rogue", kind="sync", events=["PreToolUse"], registered_at=1,
        tool_names=["Bash\x1b]0;owned\x07"],
    )  # fmt: skip
    assert r.set(KEYS.manifest("Rogue"), encode(manifest)) and r.sadd(KEYS.hooks, "Rogue")
    seconds, _ = acl.admin.time()
    members = {f"h-{n}-ab": seconds * 1000 for n in range(8)}
    r.zadd(KEYS.replicas("Rogue"), members)
    for n, member in enumerate(members):
        r.hset(KEYS.problems("Rogue"), member, f"\x1b]0;owned\x07\x1b[2J{n}\r\n" + "x" * 5000)
    shown = subprocess.run(
        [sys.executable, "-m", "workers.cli", "hooks", "list"],
        env={**os.environ, "HOOKBUS_REDIS_URL": acl.url("operator"), "COLUMNS": "100000",
             "NO_COLOR": "1"},
        capture_output=True, text=True, timeout=60, cwd=ROOT,
    )  # fmt: skip
    assert shown.returncode == 0, shown.stderr
    (row,) = [line for line in shown.stdout.splitlines() if "Rogue" in line]
    assert "\x1b" not in shown.stdout and "\x07" not in shown.stdout and "\r" not in shown.stdout
    assert "\\x1b]0;owned\\x07\\x1b[2J" in row
    assert "tool Bash\\x1b]0;owned\\x07" in row  # its manifest's pattern, escaped too
    assert row.count("\\x1b]0;owned\\x07\\x1b[2J") == 5 and "and 3 more" in row
    assert len(row) < 5 * 600
