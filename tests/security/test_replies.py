"""A hook's credential against the coordinators' inboxes (issue 31, item 3).

Every hook user may RPUSH to any ``{p}:inbox:*`` (it answers whichever coordinator asked it) and
learns each coordinator's inbox from its requests' ``reply_to``. A reply the coordinator did not
ask for at that size costs it nothing but its length: each request says how large a reply it
reads (``HookRequest.reply_max``: 16 KiB for events whose answers carry no content, twice the
context and 16 KiB for a tool event), and a reply over the bound of every pending request is
dropped unread and counted (``oversized_replies``). So a leaked hook credential slows or forges
only its own hook's answers, and every other tenant is decided within its deadline.
"""

from __future__ import annotations

import json
import re
import statistics
import threading
import time
from typing import Any

import pytest

from bus import HookEvent
from bus.events import PreToolUseContext
from bus.protocol import HookRequest, decode
from tests.harness import until
from tests.security.conftest import KEYS, Attacker
from tests.security.test_isolation import Bus, bus  # noqa: F401  (the running bus)

pytestmark = [pytest.mark.redis, pytest.mark.timeout(240)]

#: The attack's junk: just under MAX_MESSAGE_BYTES, nested 174,000 levels deep. Read as a
#: reply, each cost its coordinator ~16 ms of its event loop (bus/limits.py's scan).
JUNK = b'[{"a":' * 174_000
FLOOD, BATCH = 300, 10


def test_a_hook_credential_flooding_a_coordinators_inbox_holds_up_no_tenant(
    bus: Bus,  # noqa: F811
    attacker: Any,
) -> None:
    """hook-Guard reads the inbox of the coordinator service from a request it was sent, and
    pushes 300 one-megabyte replies nested 174,000 deep into it while beta asks for decisions
    (timeout 1.5 s). Every one of beta's is answered by Guard (Block), none "no decision
    within timeout_ms"; the junk is dropped unread: counted as oversized, never as malformed
    (which would mean it was decoded). Before, the service read each (1,000 of them cut beta
    from ~2,500 decisions per 5 s to 8-10 in 12 s, some answered with that error)."""
    guard: Attacker = attacker("hook-Guard")
    got = guard.redis.xread({KEYS.requests("Guard"): "0"}, count=1)
    inbox = decode(got[0][1][0][1][b"data"], HookRequest).reply_to
    assert inbox.startswith(KEYS.inbox(""))
    assert len(JUNK) < 1_048_576

    def flood() -> None:
        for _ in range(FLOOD // BATCH):
            guard.redis.rpush(inbox, *[JUNK] * BATCH)

    pusher = threading.Thread(target=flood)
    pusher.start()
    answers: list[Any] = []
    took: list[float] = []
    try:
        while pusher.is_alive() or len(answers) < 10:
            ctx = PreToolUseContext(session_id=f"s{len(answers)}", tool_name="rm")
            started = time.monotonic()
            answers.append(bus.beta.ask(HookEvent.PRE_TOOL_USE, ctx, timeout_ms=1_500))
            took.append(time.monotonic() - started)
    finally:
        pusher.join(120)
    took.sort()
    figures = {"asked": len(took), "p50_ms": round(statistics.median(took) * 1000),
               "max_ms": round(took[-1] * 1000)}  # fmt: skip
    print(f"\nbeta while hook-Guard floods the inbox: {json.dumps(figures)}")  # not asserted
    admin = bus.acl.admin
    until(lambda: admin.llen(inbox) == 0, "the coordinator to empty its inbox", 60)
    missed = [a for a in answers if a is None or a["status"] != "ok"]
    assert not missed, f"{len(missed)} of {len(answers)} decisions missed: {missed[:3]}"
    assert {a["result"]["action"]["type"] for a in answers} == {"Block"}, answers[:3]

    log = bus.stop_coordinator()
    (stats,) = re.findall(r"dispatch: (\{.*\})", log)
    counted = json.loads(stats.replace("'", '"'))
    assert counted["oversized_replies"] == FLOOD, counted
    assert counted["malformed_replies"] == 0, counted  # none was decoded
    assert f"dropped a reply of {len(JUNK)} bytes in {inbox}, unread" in log


def test_a_hook_credential_cannot_expire_or_delete_a_coordinators_inbox(
    bus: Bus,  # noqa: F811
    attacker: Any,
) -> None:
    """``PEXPIRE inbox 0`` deleted a coordinator's inbox and every other hook's reply waiting in
    it (the asked hooks then failed under their policies: an ``ignore`` guard's Block gone).
    A hook's user may now only RPUSH there; the inbox's owner sets its TTL."""
    guard: Attacker = attacker("hook-Guard")
    got = guard.redis.xread({KEYS.requests("Guard"): "0"}, count=1)
    inbox = decode(got[0][1][0][1][b"data"], HookRequest).reply_to
    commands = [("PEXPIRE", inbox, 0), ("EXPIRE", inbox, 0), ("PEXPIREAT", inbox, 1),
                ("DEL", inbox), ("UNLINK", inbox), ("LPOP", inbox),
                ("LTRIM", inbox, 1, 0)]  # fmt: skip
    for command in commands:
        guard.refused(*command)
    # Only the attacker was refused anything; its refusals leave the log clean for the check
    # that no role of the running bus was (the bus fixture's teardown).
    assert [e for e in bus.acl.denied() if e["username"] != "hook-Guard"] == []
    bus.acl.admin.acl_log_reset()
