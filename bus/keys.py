"""Every Redis key and channel HookBus uses, under one configurable prefix (default ``hookbus``).

Each command touches one key, so that keys can live on different Redis Cluster slots; the
per-session and per-hook keys are the unit a later step partitions by.

========================================  ======  =================================================
key                                       type    holds
========================================  ======  =================================================
``{p}:events``                            stream  every lifecycle event (bounded, see protocol.md)
``{p}:hooks``                             hash    hook name → manifest (JSON)
``{p}:modes``                             hash    hook name → enforcement mode set by an operator
``{p}:hook:{name}:requests``              stream  requests for one sync hook; group ``workers``
``{p}:hook:{name}:replicas``              zset    replica id → last heartbeat (ms, Redis's clock)
``{p}:hook:{name}:clocks``                hash    replica id → its clock minus Redis's (ms)
``{p}:inbox:{id}``                        list    replies for one coordinator or one client
``{p}:decisions``                         stream  decision requests for the coordinator service;
                                                  group ``coordinators``
``{p}:session:{sid}:hooks``               set     names of hooks attached to one session (TTL)
``{p}:cancelled:{sid}``                   string  present while a session is cancelled (TTL)
``{p}:control``                           pubsub  announcements: manifests, replicas, sessions
``{p}:dlq``                               stream  dead letters: malformed or undeliverable messages
``{p}:hook:{name}:replay``                stream  entries re-fed to one async hook (same group)
``{p}:hook:{name}:failures``              hash    entry id → last failure of an async hook (TTL)
``{p}:hook:{name}:lost``                  hash    stream → entries the hard cap cut before the
                                                  hook's group handled them (bus/retention.py)
``{p}:metrics:{name}``                    hash    figures collected by an async MetricsHook
========================================  ======  =================================================
"""

from __future__ import annotations

import re

from bus.errors import ConfigError

WORKERS_GROUP = "workers"
COORDINATORS_GROUP = "coordinators"
_NAME = re.compile(r"^[A-Za-z0-9_.\-]{1,128}$")


def check_name(kind: str, value: str) -> str:
    """Hook names, prefixes and ids become parts of keys: letters, digits, ``_ . -`` only."""
    if not isinstance(value, str) or not _NAME.match(value):
        raise ConfigError(
            f"{kind} {value!r} must be 1-128 characters of letters, digits, '_', '.' or '-'"
        )
    return value


class Keys:
    """Key names under one prefix."""

    __slots__ = (
        "audit",
        "breakglass",
        "control",
        "decisions",
        "dlq",
        "events",
        "hooks",
        "modes",
        "prefix",
    )

    #: The member of a replicas set that records the last clean shutdown of a replica, scored
    #: ``-(epoch ms)``: a negative score is never counted live (``ZCOUNT key <now - live> +inf``),
    #: and one member per hook keeps the set bounded. (A replica id is ``HOST-PID-RANDOM``.)
    STOPPED_MEMBER = "stopped"

    def __init__(self, prefix: str = "hookbus") -> None:
        self.prefix = check_name("key prefix", prefix)
        self.events = f"{prefix}:events"
        self.hooks = f"{prefix}:hooks"
        self.modes = f"{prefix}:modes"
        self.decisions = f"{prefix}:decisions"
        self.control = f"{prefix}:control"
        self.dlq = f"{prefix}:dlq"
        #: The audit trail: answers not applied (warn, dryrun, break-glass), break-glass on/off.
        self.audit = f"{prefix}:audit"
        #: Present (with a TTL) while an operator's break-glass bypass is on.
        self.breakglass = f"{prefix}:breakglass"

    def requests(self, hook: str) -> str:
        return f"{self.prefix}:hook:{hook}:requests"

    def replicas(self, hook: str) -> str:
        """Replica id → last heartbeat (epoch ms); plus ``STOPPED_MEMBER`` (see there)."""
        return f"{self.prefix}:hook:{hook}:replicas"

    def clocks(self, hook: str) -> str:
        """Each replica's measured clock offset from Redis's (bus/clock.py), in ms."""
        return f"{self.prefix}:hook:{hook}:clocks"

    def inbox(self, owner: str) -> str:
        return f"{self.prefix}:inbox:{owner}"

    def is_inbox(self, key: str) -> bool:
        """Replies may only be pushed to inbox keys, never to a key a message names at will."""
        return key.startswith(f"{self.prefix}:inbox:") and len(key) <= 300

    def replay(self, hook: str) -> str:
        """Entries re-fed to one async hook (``hookbus replay``); read by its group."""
        return f"{self.prefix}:hook:{hook}:replay"

    def failures(self, hook: str) -> str:
        """Last failure reason per entry id of one async hook (for its dead letters)."""
        return f"{self.prefix}:hook:{hook}:failures"

    def lost(self, hook: str) -> str:
        """Per stream, how many entries the hard cap cut before the hook's group handled them."""
        return f"{self.prefix}:hook:{hook}:lost"

    def metrics(self, hook: str) -> str:
        """Figures an async MetricsHook collected."""
        return f"{self.prefix}:metrics:{hook}"

    def session_hooks(self, session_id: str) -> str:
        return f"{self.prefix}:session:{session_id}:hooks"

    def cancelled(self, session_id: str) -> str:
        return f"{self.prefix}:cancelled:{session_id}"
