"""Break-glass: an operator's audited, time-limited bypass of every enforcing hook.

When a policy hook misbehaves in production (blocks everything, or its services are down and
its ``fail`` policy blocks every call), an operator can switch the bypass on for a while with a
reason (``hookbus breakglass on --reason … --for 15m``). While it is on, each hook in
``enforce`` mode is applied as in ``warn`` mode: its Block or Deny, or its ``fail`` policy,
becomes a warning for the agent, and each such answer is recorded in the audit trail with the
bypass's reason. Hooks keep running and answering; ``dryrun`` hooks stay ``dryrun``. Permission
rules are not hooks: a P0–P2 Deny still holds; nor is a cancellation (the CancellationHook is
left alone). The bypass ends by itself at ``until_ms``.

Pure: the transports read the switch (``{p}:breakglass`` or ``HookRegistry.break_glass``) and
hand it here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import msgspec

from bus.errors import ConfigError
from bus.hooks import HookSpec

__all__ = ["MAX_SECS", "BreakGlass", "apply", "bypass", "is_on", "switch"]

#: The longest a bypass may last: it must be renewed, with a reason, to go on.
MAX_SECS = 86_400


class BreakGlass(msgspec.Struct, frozen=True, kw_only=True):
    """The value of ``{p}:breakglass`` while an operator's bypass is on (the key has a TTL).

    While it is on, every sync hook in ``enforce`` mode is applied as in ``warn`` mode: a Block,
    a Deny or a ``fail`` policy becomes a warning for the agent and a "shadowed" audit record.
    Permission rules (P0–P8) are not hooks: a P0–P2 Deny still holds.
    """

    reason: str
    by: str
    since_ms: int
    until_ms: int


@dataclass(frozen=True, slots=True)
class _Bypassed:
    spec: HookSpec
    order: tuple[int, int]
    endpoint: Any


def switch(reason: str, seconds: float, by: str, now_ms: int) -> BreakGlass:
    """A bypass from now for ``seconds``; refuses one without a reason or past ``MAX_SECS``."""
    if not reason.strip():
        raise ConfigError("break-glass needs a reason (it goes to the audit trail)")
    if not 0 < seconds <= MAX_SECS:
        raise ConfigError(f"break-glass lasts from 0 s up to {MAX_SECS} s, not {seconds:g}")
    return BreakGlass(
        reason=reason.strip(), by=by, since_ms=now_ms, until_ms=now_ms + int(seconds * 1000)
    )


def is_on(glass: BreakGlass | None, now_ms: int) -> bool:
    return glass is not None and glass.since_ms <= now_ms < glass.until_ms


#: Hooks the bypass leaves alone: cancellation is a person stopping a session, not a policy.
NEVER_BYPASSED = frozenset({"CancellationHook"})


def bypass(targets: Sequence[Any]) -> tuple[list[Any], frozenset[str]]:
    """``targets`` as the bypass applies them — every ``enforce`` hook in ``warn`` mode (but the
    ``NEVER_BYPASSED`` ones) — and the names of the hooks it softened."""
    applied: list[Any] = []
    softened: set[str] = set()
    for t in targets:
        if t.spec.mode != "enforce" or t.spec.name in NEVER_BYPASSED:
            applied.append(t)
            continue
        applied.append(_Bypassed(msgspec.structs.replace(t.spec, mode="warn"), t.order, t.endpoint))
        softened.add(t.spec.name)
    return applied, frozenset(softened)


def apply(
    glass: BreakGlass | None, targets: Sequence[Any], now_ms: int
) -> tuple[Sequence[Any], str, frozenset[str]]:
    """The targets of one dispatch under the switch ``glass`` (None: off), the bypass's reason
    ("" when off) and the hooks it softened (their held-back answers carry the reason)."""
    if glass is None or not is_on(glass, now_ms):
        return targets, "", frozenset()
    applied, softened = bypass(targets)
    return applied, glass.reason, softened
