"""The attacks that need a running bus, against real processes under their own users: the
coordinator service (``coordinator``), the hook services ``Guard`` (blocks ``rm``) and
``CancellationHook`` (each as ``hook-NAME``), tenants ``acme`` (the attacker) and ``beta`` (the
victim) added by the operator's command line. Each attacker holds only its own credential.

* A tenant's request naming the victim's session id cancels or reaches only the tenant's own
  (the coordinator service qualifies sessions ``TENANT/SID`` from the stream a request arrived
  on), and it cannot have its replies sent to the victim's inbox.
* A cancellation is never lifted: not by the victim's own OnSessionStop, not by another tenant,
  not by a trusted agent forging an OnSessionStop to the CancellationHook.
* A maximal id on a tenant's own stream stops only that tenant; ``hookbus repair`` (operator)
  brings it back.
* A hook service answering in another hook's name is dropped and counted (``forged_replies``).
* A tenant the operator removes is no longer answered.
"""

from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import pytest
import redis

from bus import CONTINUE, Block, HookEvent
from bus.events import PermissionRequestContext, PreToolUseContext, SessionStopContext
from bus.protocol import (
    CancelRequest,
    ControlMessage,
    DecisionRequest,
    HookManifest,
    HookReply,
    HookRequest,
    decode,
    encode,
    new_id,
    now_ms,
    raw,
)
from tests.harness import ROOT, Processes, until, worker_env
from tests.remote_hooks import HookConfig
from tests.security.conftest import KEYS, AclServer, Attacker

PRE, STOP = HookEvent.PRE_TOOL_USE, HookEvent.ON_SESSION_STOP
MAX_ID = "18446744073709551615-18446744073709551615"
pytestmark = [pytest.mark.redis, pytest.mark.timeout(240)]


class Tenant:
    """An untrusted agent of one tenant, holding only ``tenant-NAME``: it XADDs to its own
    decisions stream and BLPOPs its own inbox, as the Node client and the redis-cli example do."""

    def __init__(self, acl: AclServer, name: str) -> None:
        self.name = name
        self.redis = acl.client(f"tenant-{name}")
        self.stream = KEYS.tenant_decisions(name)

    def send(self, message: Any, reply_to: str, wait: float = 20) -> dict[str, Any] | None:
        self.redis.xadd(self.stream, {"data": encode(message)})
        if not reply_to.startswith(KEYS.tenant_inbox(self.name, "")):
            return None  # not ours to read
        popped = self.redis.blpop([reply_to], wait)
        return None if popped is None else dict(json.loads(popped[1]))

    def ask(
        self, event: HookEvent, ctx: Any, reply_to: str = "", wait: float = 20,
        timeout_ms: int = 15_000,
    ) -> Any:  # fmt: skip
        inbox = reply_to or KEYS.tenant_inbox(self.name, new_id())
        request = DecisionRequest(
            id=new_id(), ts=now_ms(), event=event, context=raw(ctx), reply_to=inbox,
            timeout_ms=timeout_ms,
        )  # fmt: skip
        return self.send(request, inbox, wait)

    def tool(self, session: str, tool: str, timeout_ms: int = 15_000) -> str:
        """The decision on a tool call of ``session``: Block or Continue."""
        ctx = PreToolUseContext(session_id=session, tool_name=tool)
        reply = self.ask(PRE, ctx, timeout_ms=timeout_ms)
        assert reply is not None and reply["status"] == "ok", reply
        return str(reply["result"]["action"]["type"])

    def cancel(self, session: str) -> Any:
        inbox = KEYS.tenant_inbox(self.name, new_id())
        request = CancelRequest(id=new_id(), ts=now_ms(), op="cancel", session_id=session,
                                reply_to=inbox)  # fmt: skip
        reply = self.send(request, inbox)
        assert reply is not None and reply["status"] == "ok", reply
        return reply["result"]

    def stop_session(self, session: str) -> None:
        reply = self.ask(STOP, SessionStopContext(session_id=session))
        assert reply is not None and reply["status"] == "ok", reply

    def close(self) -> None:
        self.redis.close()


def hookbus(acl: AclServer, user: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = worker_env(acl.settings(user), COLUMNS="250", NO_COLOR="1")
    return subprocess.run(
        [sys.executable, "-m", "workers.cli", *args], env=env, cwd=ROOT, capture_output=True,
        text=True, timeout=60, check=False, stdin=subprocess.DEVNULL,
    )  # fmt: skip


def operator(acl: AclServer, *args: str) -> str:
    result = hookbus(acl, "operator", *args)
    assert result.returncode == 0, (args, result.stdout, result.stderr)
    return result.stdout


@dataclass
class Bus:
    acl: AclServer
    procs: Processes
    coordinator: subprocess.Popen[bytes]
    acme: Tenant
    beta: Tenant

    def coordinator_log(self) -> str:
        return "\n".join(p.read_text() for p in sorted(self.procs.logdir.glob("coordinator-*.log")))

    def stop_coordinator(self) -> str:
        """SIGTERM it; its log, which ends with its counters."""
        self.coordinator.send_signal(signal.SIGTERM)
        assert self.coordinator.wait(60) == 0
        return self.coordinator_log()


@pytest.fixture
def bus(acl: AclServer, procs: Processes) -> Iterator[Bus]:
    guard = HookConfig(
        name="Guard", events=[PRE], answers={"PreToolUse": Block(reason="no rm")}, names=["rm"]
    )
    procs.scripted(acl.settings("hook-Guard"), guard)
    procs.worker(
        acl.settings("hook-CancellationHook"),
        "workers.builtins.cancellation:RedisCancellationHook",
        "cancellation",
    )
    operator(acl, "tenants", "add", "acme")
    operator(acl, "tenants", "add", "beta")
    coordinator = procs.start(
        ["coordinator"], worker_env(acl.settings("coordinator")), "coordinator"
    )
    acme, beta = Tenant(acl, "acme"), Tenant(acl, "beta")
    try:
        # Ready: both hooks answer through the coordinator, for both tenants.
        for tenant in (acme, beta):
            until(lambda t=tenant: t.tool("s0", "rm") == "Block", f"{tenant.name} answered", 60,  # type: ignore[misc]
                  procs.logs)  # fmt: skip
        until(lambda: acl.admin.exists(KEYS.manifest("CancellationHook")), "CancellationHook")
        yield Bus(acl, procs, coordinator, acme, beta)
    finally:
        acme.close()
        beta.close()
    assert not acl.denied(), acl.denied()  # no role was refused anything it needs


def test_a_tenant_naming_another_tenants_session_cancels_only_its_own(bus: Bus) -> None:
    acme, beta, admin = bus.acme, bus.beta, bus.acl.admin
    assert beta.tool("s1", "ls") == "Continue"
    # acme cancels "s1" and "beta/s1": each becomes a session of acme's own.
    assert acme.cancel("s1") == {"cancelled": "acme/s1"}
    assert acme.cancel("beta/s1") == {"cancelled": "acme/beta/s1"}
    assert admin.exists(KEYS.cancelled("beta/s1")) == 0
    assert beta.tool("s1", "ls") == "Continue"  # the victim is untouched
    assert acme.tool("s1", "ls") == "Block"  # acme's own cancellation holds for acme
    # beta can cancel its own.
    assert beta.cancel("s1") == {"cancelled": "beta/s1"}
    assert beta.tool("s1", "ls") == "Block"


def test_a_tenant_cannot_have_its_replies_sent_to_another_tenants_inbox(bus: Bus) -> None:
    """reply_to must be under the asker's own inboxes: a request naming beta's inbox is not
    answered there (nor is any key it names at will); it is dead-lettered, with why."""
    acme, admin = bus.acme, bus.acl.admin
    targets = [KEYS.tenant_inbox("beta", "c1"), KEYS.inbox("c1"), KEYS.cancelled("beta/s1")]
    for target in targets:
        acme.ask(PRE, PreToolUseContext(session_id="s1", tool_name="ls"), reply_to=target)
        cancel = CancelRequest(id=new_id(), ts=now_ms(), op="cancel", session_id="s1",
                               reply_to=target)  # fmt: skip
        acme.send(cancel, target)

    def letters() -> list[dict[bytes, bytes]]:
        rows = admin.xrange(KEYS.tenant_dlq("acme"))  # the tenant's own unit
        return [f for _, f in rows if f[b"source"] == acme.stream.encode()]

    until(lambda: len(letters()) == 2 * len(targets), "the requests dead-lettered", 30)
    assert all(b"reply_to must be a key under" in f[b"reason"] for f in letters())
    for target in targets:
        assert admin.exists(target) == 0
    assert admin.exists(KEYS.cancelled("acme/s1")) == 0  # the cancel was not carried out either


def test_no_agent_lifts_a_cancellation_not_even_its_own_session_stop(
    bus: Bus, attacker: Any
) -> None:
    acme, beta, admin = bus.acme, bus.beta, bus.acl.admin
    operator(bus.acl, "cancel", "beta/s1")
    assert beta.tool("s1", "ls") == "Block"
    # The victim's own OnSessionStop, and acme's, through the coordinator service.
    beta.stop_session("s1")
    acme.stop_session("s1")
    acme.stop_session("beta/s1")
    # A trusted agent's credential forges an OnSessionStop straight to the CancellationHook
    # (it may XADD hook requests: it embeds a coordinator), and waits for the hook's answer.
    agent: Attacker = attacker("agent")
    inbox = KEYS.inbox(new_id())
    forged = HookRequest(
        id=new_id(), ts=now_ms(), hook="CancellationHook", event=STOP, session_id="beta/s1",
        context=raw(SessionStopContext(session_id="beta/s1")), deadline=now_ms() + 10_000,
        reply_to=inbox,
    )  # fmt: skip
    agent.redis.xadd(KEYS.requests("CancellationHook"), {"data": encode(forged)})
    assert agent.redis.blpop([inbox], 20) is not None  # handled: the hook answered it
    # And the agent credential's own ways to lift it are refused.
    for command in (("DEL", KEYS.cancelled("beta/s1")), ("EXPIRE", KEYS.cancelled("beta/s1"), 1),
                    ("SREM", KEYS.cancelled("beta/s1"), "operator")):  # fmt: skip
        agent.refused(*command)
    # Still cancelled, with its TTL.
    assert beta.tool("s1", "ls") == "Block"
    assert admin.smembers(KEYS.cancelled("beta/s1")) == {b"operator"}
    assert admin.ttl(KEYS.cancelled("beta/s1")) > 0
    bus.acl.admin.acl_log_reset()  # (those refusals were the point)


def test_a_maximal_id_on_a_tenants_own_stream_stops_only_that_tenant_and_repair_fixes_it(
    bus: Bus,
) -> None:
    acme, beta, admin = bus.acme, bus.beta, bus.acl.admin
    acme.redis.xadd(acme.stream, {"data": "x"}, id=MAX_ID)
    with pytest.raises(redis.exceptions.ResponseError, match="exhausted"):
        acme.tool("s1", "rm")
    # Every other tenant is answered as before, and the service stays up.
    assert beta.tool("s1", "rm") == "Block"
    assert beta.tool("s1", "ls") == "Continue"
    assert bus.coordinator.poll() is None
    # The operator repairs acme's stream: acme is answered again.
    out = operator(bus.acl, "repair", "--tenant", "acme")
    assert f"repaired {acme.stream}: last id {MAX_ID}" in out
    assert "group coordinators moved back" in out
    assert acme.tool("s1", "rm") == "Block"
    assert acme.tool("s1", "ls") == "Continue"
    assert "repair" in operator(bus.acl, "audit", "list")
    letters = [
        f for _, f in admin.xrange(KEYS.tenant_dlq("acme")) if f.get(b"entry_id") == MAX_ID.encode()
    ]
    repaired = [f for f in letters if f[b"reason"].startswith(b"repair: its id")]
    assert len(repaired) == 1 and repaired[0][b"data"] == b"x"


def test_a_hook_answering_in_another_hooks_name_is_dropped_and_counted(
    bus: Bus, attacker: Any
) -> None:
    """hook-Rogue registers a hook of its own (all its credential allows), gets asked, and
    answers in Guard's name (Continue, to lift Guard's Block); it cannot read Guard's requests
    to learn their ids. The coordinator drops the forged reply and counts it."""
    rogue: Attacker = attacker("hook-Rogue")
    r = rogue.redis
    manifest = HookManifest(name="Rogue", events=[PRE], timeout=10.0, registered_at=now_ms())
    r.set(KEYS.manifest("Rogue"), encode(manifest))
    r.sadd(KEYS.hooks, "Rogue")
    r.xgroup_create(KEYS.requests("Rogue"), "workers", id="0", mkstream=True)
    beat = {f"{socket.gethostname()}-1-abcd": now_ms()}  # dated ahead, it would not be live
    r.zadd(KEYS.replicas("Rogue"), beat)
    r.publish(KEYS.control, encode(ControlMessage(type="manifest", name="Rogue")))
    decisions: list[str] = []

    def asked() -> HookRequest | None:
        """Ask (acme, rm) in the background until the coordinator asks Rogue too (Rogue's
        heartbeat kept fresh meanwhile, as a replica's)."""
        r.zadd(KEYS.replicas("Rogue"), {member: now_ms() for member in beat})
        thread = threading.Thread(target=lambda: decisions.append(bus.acme.tool("s1", "rm")))
        thread.start()
        # Well within the client's socket timeout (redis-py 8: 5 s), however loaded the machine.
        got = r.xreadgroup("workers", "rogue", {KEYS.requests("Rogue"): ">"}, count=1, block=1000)
        if not got:
            thread.join(30)
            return None
        asked.thread = thread  # type: ignore[attr-defined]
        return decode(got[0][1][0][1][b"data"], HookRequest)

    request = until(asked, "the coordinator asking Rogue", 60, bus.coordinator_log)
    rogue.refused("XREADGROUP", "GROUP", "workers", "rogue", "STREAMS", KEYS.requests("Guard"), ">")
    reply = HookReply(
        id=new_id(), ts=now_ms(), request_id=request.id, hook="Guard", action=CONTINUE
    )
    r.rpush(request.reply_to, encode(reply))  # forged: Guard was not asked this
    guessed = HookReply(
        id=new_id(), ts=now_ms(), request_id=new_id(), hook="Guard", action=CONTINUE
    )
    r.rpush(request.reply_to, encode(guessed))  # a request id it guessed: no such request
    own = HookReply(id=new_id(), ts=now_ms(), request_id=request.id, hook="Rogue", action=CONTINUE)
    r.rpush(request.reply_to, encode(own))
    asked.thread.join(30)  # type: ignore[attr-defined]
    assert decisions[-1] == "Block"  # Guard's own answer stands
    log = bus.stop_coordinator()
    assert "dropped a reply from hook 'Guard' to a request for hook 'Rogue'" in log
    (stats,) = re.findall(r"dispatch: (\{.*\})", log)
    counted = json.loads(stats.replace("'", '"'))
    assert counted["forged_replies"] == 1
    assert counted["late_replies"] >= 1
    bus.acl.admin.acl_log_reset()  # (the refusal above was the point)


def test_a_tenant_the_operator_removes_is_no_longer_answered(bus: Bus) -> None:
    acme, beta, admin = bus.acme, bus.beta, bus.acl.admin
    assert "removed" in operator(bus.acl, "tenants", "remove", "acme")
    until(lambda: "tenant acme removed" in bus.coordinator_log(), "the coordinator to drop acme")
    inbox = KEYS.tenant_inbox("acme", new_id())
    ctx = raw(PreToolUseContext(session_id="s1", tool_name="rm"))
    request = DecisionRequest(id=new_id(), ts=now_ms(), event=PRE, reply_to=inbox, context=ctx)
    acme.redis.xadd(acme.stream, {"data": encode(request)})
    assert beta.tool("s1", "rm") == "Block"  # the service answers, but not acme
    (group,) = admin.xinfo_groups(acme.stream)
    assert group["lag"] == 1 and group["pending"] == 0
    assert admin.exists(inbox) == 0
    # Added again: answered, the waiting request included.
    operator(bus.acl, "tenants", "add", "acme")
    assert acme.redis.blpop([inbox], 20) is not None


def test_the_http_gateway_runs_as_the_coordinator_and_qualifies_a_tenants_sessions(
    bus: Bus, tmp_path: Path
) -> None:
    """Through the HTTP gateway an untrusted agent holds a bearer token only; the gateway holds
    the coordinator's credential (and needs nothing more: ACL LOG stays empty). A request
    naming beta's cancelled session is acme's own session, untouched by beta's cancellation."""
    from tests.test_gateway import post, start_gateway

    operator(bus.acl, "cancel", "beta/s1")
    gateway = start_gateway(bus.procs, bus.acl.settings("coordinator"), tmp_path, tenant="acme")

    def decide(session: str, tool: str) -> str:
        body = {"event": "PreToolUse", "context": {"session_id": session, "tool_name": tool}}
        status, reply, _ = post(gateway.port, "/v1/decisions", body, gateway.token)
        assert status == 200, reply
        return str(reply["result"]["action"]["type"])

    assert decide("s1", "rm") == "Block"  # Guard answers through the gateway
    assert decide("beta/s1", "ls") == "Continue"  # acme's "beta/s1", not beta's s1
    assert bus.beta.tool("s1", "ls") == "Block"  # beta's own session is still cancelled


def test_a_tenant_cannot_write_a_line_of_its_own_into_the_coordinators_log(bus: Bus) -> None:
    """The coordinator service logs what a tenant chose: the session it cancels, and a refused
    request's error, which quotes the bad value. Newlines, a carriage return, an ANSI sequence
    and a Unicode line separator in them come out escaped, on the line that quotes them: no
    line of the log is the tenant's."""
    forged = "2026-12-03 12:00:00,000 WARNING hookbus.coordinator: break-glass is ON for 3600s"
    session = f"s1\n{forged}\r\x1b[2K\u2028"
    assert bus.acme.cancel(session) == {"cancelled": f"acme/{session}"}
    inbox = KEYS.tenant_inbox("acme", new_id())
    bad_event = {"id": new_id(), "ts": now_ms(), "event": f"PreToolUse\n{forged}",
                 "context": {"session_id": "s2"}, "reply_to": inbox}  # fmt: skip
    reply = bus.acme.send(bad_event, inbox)
    assert reply is not None and reply["status"] == "error" and reply["field"] == "$.event", reply

    log = bus.stop_coordinator()
    assert "session acme/s1\\n" + forged + "\\r\\x1b[2K\\u2028 cancelled by tenant:acme" in log
    assert "rejected decision request" in log and "PreToolUse\\n" + forged in log
    for line in log.splitlines():
        assert not line.startswith(forged), line
        assert not {"\r", "\x1b", "\u2028"} & set(line), repr(line)


def test_a_long_session_id_cannot_push_a_hooks_request_over_the_message_limit(bus: Bus) -> None:
    """A context within ``MAX_CONTEXT_BYTES`` whose session id is 30 kB: every request to a hook
    repeats the session id outside the context, so it would be over ``MAX_MESSAGE_BYTES``, each
    hook would fail under its own policy (a PermissionRequest then went on unchecked). The
    context counts its session id twice: the dispatch is refused, by HookBus, before any hook."""
    session, pad = "s" * 30_000, "A" * 999_000

    def ask(event: HookEvent, ctx: Any) -> Any:
        inbox = KEYS.tenant_inbox("acme", new_id())
        context = msgspec.Raw(msgspec.json.encode(ctx))  # as sent: raw() would refuse it here
        request = DecisionRequest(id=new_id(), ts=now_ms(), event=event, context=context,
                                  reply_to=inbox, timeout_ms=15_000)  # fmt: skip
        reply = bus.acme.send(request, inbox)
        assert reply is not None and reply["status"] == "ok", reply
        return reply["result"]

    args = {"command": "rm -rf /", "pad": pad}
    result = ask(PRE, PreToolUseContext(session_id=session, tool_name="rm", tool_args=args))
    assert result["action"]["type"] == "Block", result
    assert [e["hook_name"] for e in result["blocking_errors"]] == ["HookBus"], result
    assert "its session id of 30007 bytes" in result["action"]["reason"], result  # acme/s…
    permission = PermissionRequestContext(session_id=session, tool_name="rm", tool_args=args)
    result = ask(HookEvent.PERMISSION_REQUEST, permission)
    assert result["action"] == {"type": "Override", "decision": "Deny",
                                "reason": result["action"]["reason"]}, result  # fmt: skip
    assert result["overridden_by"] == "HookBus", result


def test_a_tenants_flood_of_requests_over_the_bounds_holds_up_no_other_tenant(bus: Bus) -> None:
    """acme sends 30 requests of a megabyte each, every one 349 000 empty arrays (over
    MAX_CONTAINERS, under MAX_MESSAGE_BYTES): each is refused, by HookBus, naming the limit, and
    beta's decisions, asked meanwhile, are taken by its hooks within their timeout (5 s). What
    is needed to answer such a request used to be walked token by token on the service's event
    loop, twice (about 1.1 s a request: this test took 47 s); msgspec reads it in C now (about
    4 ms; 8.5 s). Not asserted: the machines are noisy."""
    inbox = KEYS.tenant_inbox("acme", new_id())
    body = json.dumps(
        {"id": "ID", "ts": now_ms(), "event": "PreToolUse", "reply_to": inbox,
         "timeout_ms": 60_000, "context": {"session_id": "s", "tool_name": "rm",
                                            "tool_args": {"a": [[]] * 349_000}}},
        separators=(",", ":"),
    )  # fmt: skip
    assert len(body) < 1_048_576
    ids = [new_id() for _ in range(30)]
    for request_id in ids:
        bus.acme.redis.xadd(bus.acme.stream, {"data": body.replace('"ID"', f'"{request_id}"')})
    # 5 s: a decision takes milliseconds; the flood's reading took 0.6 s a request.
    assert [bus.beta.tool(f"s{i}", "rm", timeout_ms=5_000) for i in range(5)] == ["Block"] * 5
    answered = set()
    for _ in ids:
        popped = bus.acme.redis.blpop([inbox], 60)
        assert popped is not None, f"{len(answered)} of {len(ids)} refused"
        reply = json.loads(popped[1])
        assert reply["status"] == "ok", reply
        assert reply["result"]["blocking_errors"][0]["hook_name"] == "HookBus", reply
        assert "(MAX_CONTAINERS)" in reply["result"]["action"]["reason"], reply
        answered.add(reply["request_id"])
    assert answered == set(ids)


def test_a_lone_surrogate_in_a_tenants_context_is_refused_not_left_unanswered(bus: Bus) -> None:
    """``JSON.stringify`` writes a lone surrogate as ``\\ud800``: valid JSON syntax, but no text
    can hold it, and msgspec refuses the whole message. The request got no answer at all (its
    reply_to could not be read); now it is refused like any input no hook can inspect."""
    inbox = KEYS.tenant_inbox("acme", new_id())
    body = json.dumps(
        {"id": "lone-1", "ts": now_ms(), "event": "PreToolUse", "reply_to": inbox,
         "timeout_ms": 15_000, "context": {"session_id": "s", "tool_name": "rm",
                                            "tool_args": {"command": "rm -rf / #"}}},
    ).replace("#", "\\ud800")  # fmt: skip
    bus.acme.redis.xadd(bus.acme.stream, {"data": body})
    popped = bus.acme.redis.blpop([inbox], 20)
    assert popped is not None, "no answer"
    reply = json.loads(popped[1])
    assert (reply["status"], reply["request_id"]) == ("ok", "lone-1"), reply
    assert reply["result"]["action"]["type"] == "Block", reply
    assert "lone UTF-16 surrogate" in reply["result"]["action"]["reason"], reply
    assert reply["result"]["blocking_errors"][0]["hook_name"] == "HookBus", reply


# -- dead letters (issue 31 items 1, 2, 5; key layout 3) -------------------------------------------


def junk_letters(admin: redis.Redis, tenant: str) -> list[dict[bytes, bytes]]:
    return [f for _, f in admin.xrange(KEYS.tenant_dlq(tenant))]


def test_a_hook_credential_erases_or_blocks_no_dead_letter_but_its_own(
    bus: Bus, attacker: Any
) -> None:
    """hook-Guard's MAXLEN 0 and maximal id on ``{p}:dlq`` (which erased 30 letters and blocked
    every later one) are refused; on its own stream they harm only its own unit: another
    tenant's refusals are still recorded, every one."""
    admin = bus.acl.admin
    for i in range(30):
        admin.xadd(KEYS.dlq, {"source": "x", "reason": f"kept {i}", "data": ""})
    guard: Attacker = attacker("hook-Guard")
    guard.refused("XADD", KEYS.dlq, "MAXLEN", "0", "*", "source", "x")
    guard.refused("XADD", KEYS.dlq, MAX_ID, "source", "x")
    guard.refused("XADD", KEYS.tenant_dlq("beta"), MAX_ID, "source", "x")
    assert admin.xlen(KEYS.dlq) == 30
    # Its own unit: it may, and only it suffers.
    own = KEYS.hook_dlq("Guard")
    guard.redis.execute_command("XADD", own, "MAXLEN", "0", "*", "source", "x")
    guard.redis.execute_command("XADD", own, MAX_ID, "source", "x")
    for i in range(10):
        bus.acme.send({"junk": i}, KEYS.tenant_inbox("beta", "c1"))  # refused: dead-lettered
    until(lambda: len(junk_letters(admin, "acme")) == 10, "acme's 10 refusals recorded", 30)
    assert admin.xlen(KEYS.dlq) == 30 and "could not dead-letter" not in bus.coordinator_log()
    bus.acl.admin.acl_log_reset()  # (those refusals were the point)


def test_a_forged_dead_letter_is_never_replayed_into_another_hooks_audit_log(
    bus: Bus, attacker: Any
) -> None:
    """Issue 31 item 2: Rogue's credential forges a letter that looks like the audit log
    hook's own (a victim's ``rm -rf /srv/data`` that never happened). It cannot write the audit
    log hook's stream; what it writes in its own is never re-fed to the audit log hook, and the
    replay shows what it will re-feed (only the hook's own letter) before it does."""
    admin = bus.acl.admin
    name = "AsyncAuditLogHook"
    admin.set(KEYS.manifest(name), encode(HookManifest(name=name, kind="async")))
    admin.sadd(KEYS.hooks, name, "Rogue")
    ctx = PreToolUseContext(session_id="beta/victim", tool_name="Bash",
                            tool_args={"command": "rm -rf /srv/data"})  # fmt: skip
    forged = {"source": KEYS.event_partitions[0], "reason": "failed 5 deliveries", "hook": name,
              "entry_id": "1-0", "deliveries": "5", "data": json.dumps(
                  {"v": 3, "id": new_id(), "ts": now_ms(), "event": "PreToolUse",
                   "context": msgspec.to_builtins(ctx)})}  # fmt: skip
    rogue: Attacker = attacker("hook-Rogue")
    rogue.refused("XADD", KEYS.hook_dlq(name), "*", *[x for kv in forged.items() for x in kv])
    rogue.refused("XADD", KEYS.dlq, "*", *[x for kv in forged.items() for x in kv])
    rogue.redis.xadd(KEYS.hook_dlq("Rogue"), forged)  # its own unit: allowed, never replayed
    genuine = {**forged, "data": '{"genuine": true}'}
    attacker(f"hook-{name}").redis.xadd(KEYS.hook_dlq(name), genuine)
    asked = hookbus(bus.acl, "operator", "replay", name, "--dlq")
    assert asked.returncode == 2 and "--yes" in asked.stderr  # not on a terminal: not without
    assert f"1 dead letter of {name}'s own stream {KEYS.hook_dlq(name)}" in asked.stdout
    assert '{"genuine": true}' in asked.stdout and admin.xlen(KEYS.replay(name)) == 0
    out = operator(bus.acl, "replay", name, "--dlq", "--yes")
    assert f"re-fed 1 dead letter to {name}" in out
    refed = [f[b"data"] for _, f in admin.xrange(KEYS.replay(name))]
    assert refed == [b'{"genuine": true}']
    assert admin.xlen(KEYS.hook_dlq("Rogue")) == 1  # still there, and shown as Rogue's
    listed = operator(bus.acl, "dlq", "list")
    assert "hook Rogue" in listed
    bus.acl.admin.acl_log_reset()  # (those refusals were the point)


def test_a_tenants_junk_fills_only_its_own_dead_letters_and_the_cut_is_counted(bus: Bus) -> None:
    """Issue 31 item 5: a tenant's flood of junk requests went past the shared cap and rolled
    every other tenant's dead letters out, unreported. Now it fills only its own unit; what the
    cap cut is counted exactly and reported by ``dlq list`` and ``lag``."""
    from bus.transport.keys import DLQ_MAXLEN

    admin, acme, beta = bus.acl.admin, bus.acme, bus.beta
    beta.send({"junk": "beta's own"}, KEYS.tenant_inbox("acme", "c1"))  # a refusal of beta's
    until(lambda: len(junk_letters(admin, "beta")) == 1, "beta's refusal recorded", 30)
    flood = DLQ_MAXLEN + 1_000
    for start in range(0, flood, 1000):
        with acme.redis.pipeline(transaction=False) as pipe:
            for i in range(start, start + 1000):
                pipe.xadd(acme.stream, {"data": f"junk {i}"})
            pipe.execute()

    def added() -> int:
        return int(admin.xinfo_stream(KEYS.tenant_dlq("acme"))["entries-added"])

    until(lambda: added() == flood, f"acme's {flood} junk requests dead-lettered", 120)
    assert junk_letters(admin, "beta")[0][b"data"] == b'{"junk":"beta\'s own"}'
    length = admin.xlen(KEYS.tenant_dlq("acme"))
    assert DLQ_MAXLEN <= length < flood  # the cap bounds acme's unit (MAXLEN ~: whole nodes)
    cut = flood - length
    line = f"CUT {cut}: tenant acme's dead letters ({KEYS.tenant_dlq('acme')}) cut by its cap"
    assert line in operator(bus.acl, "dlq", "list")
    assert line in operator(bus.acl, "lag")
    assert "tenant beta's" not in operator(bus.acl, "dlq", "list")
    # And the coordinator service, which writes acme's unit, logs it (once it grew: one line).
    said = f"dead letters of {KEYS.tenant_dlq('acme')} cut by its cap (MAXLEN ~{DLQ_MAXLEN})"

    def logged() -> bool:  # (a look during the flood may have logged part of it first)
        return any(said in x and f", {cut} in all" in x for x in bus.coordinator_log().split("\n"))

    until(logged, "the whole cut logged by the service", 60)


def test_a_1mb_refused_request_leaves_a_bounded_letter_with_its_size_and_digest(bus: Bus) -> None:
    """120 refused 1 MB requests made the shared DLQ 126 MB: a letter kept each whole. Now it
    keeps a 4 KiB prefix, the size and the SHA-256; such a letter is never replayed."""
    import hashlib

    from bus.transport.keys import DLQ_DATA_BYTES

    admin, acme = bus.acl.admin, bus.acme
    body = b"[" * 1_000_000
    acme.redis.xadd(acme.stream, {"data": body})
    until(lambda: len(junk_letters(admin, "acme")) == 1, "the 1 MB request dead-lettered", 60)
    (letter,) = junk_letters(admin, "acme")
    assert letter[b"data"] == body[:DLQ_DATA_BYTES] and letter[b"cut"] == b"1"
    assert letter[b"size"] == b"1000000"
    assert letter[b"sha256"] == hashlib.sha256(body).hexdigest().encode()
    assert sum(len(k) + len(v) for k, v in letter.items()) < 8 * 1024
    assert admin.memory_usage(KEYS.tenant_dlq("acme")) < 64 * 1024
