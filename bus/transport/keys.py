"""Every Redis key and channel HookBus uses, under one configurable prefix (default ``hookbus``).

Key layout 3 (protocol version 3: dead letters per unit, the partition count in
``{p}:config``). ``{…}`` in the names below are literal Redis Cluster hash
tags: keys that must live on one slot share a tag (a hook's keys, a partition's stream), and keys
that must not, do not (session keys carry none, so sessions spread over the whole cluster). A
Redis ACL user's key patterns follow the same tags: a hook's own user gets ``{p}:hook:{NAME}:*``.

===========================================  ======  ==============================================
key                                          type    holds
===========================================  ======  ==============================================
``{p}:events:{TAG}``                         stream  lifecycle events of the sessions of one
                                                     partition (``HOOKBUS_PARTITIONS``, default 1)
``{p}:decisions:{TAG}``                      stream  decision requests of trusted foreign agents,
                                                     one per partition; group ``coordinators``
``{p}:hooks``                                set     names of the registered hooks
``{p}:hook:{NAME}:manifest``                 string  the hook's manifest (JSON)
``{p}:modes``                                hash    hook name → enforcement mode set by an operator
``{p}:hook:{NAME}:requests``                 stream  requests for one sync hook; group ``workers``
                                                     (shard k > 0: ``{p}:hook:{NAME#k.j}:requests``)
``{p}:hook:{NAME}:replicas``                 zset    replica id → last heartbeat (ms, Redis's clock)
``{p}:hook:{NAME}:clocks``                   hash    replica id → its clock minus Redis's (ms)
``{p}:hook:{NAME}:replay``                   stream  entries re-fed to one async hook (same group)
``{p}:hook:{NAME}:failures``                 hash    entry id → last failure of an async hook (TTL)
``{p}:hook:{NAME}:lost``                     hash    stream → entries the hard cap cut before the
                                                     hook's group handled them
                                                     (bus/transport/retention.py)
``{p}:hook:{NAME}:metrics``                  hash    figures collected by an async MetricsHook
``{p}:hook:{NAME}:dlq``                      stream  the hook's dead letters (written by its own
                                                     processes and the operator only)
``{p}:inbox:{id}``                           list    replies for one coordinator or one client
``{p}:session:{sid}:hooks``                  set     names of hooks attached to one session (TTL)
``{p}:cancelled:{sid}``                      string  present while a session is cancelled (TTL)
``{p}:tenants``                              set     tenants the coordinator service serves
``{p}:t:{TENANT}:decisions``                 stream  an untrusted agent's decision requests
``{p}:t:{TENANT}:inbox:{id}``                list    replies to an untrusted agent
``{p}:t:{TENANT}:dlq``                       stream  dead letters about the tenant's requests
                                                     (written by the coordinator service)
``{p}:control``                              pubsub  announcements: manifests, replicas, sessions
``{p}:config``                               hash    the bus's shared configuration:
                                                     ``partitions`` (written once, if absent)
``{p}:dlq``                                  stream  the coordinators' dead letters (agents'
                                                     coordinators, the coordinator service about
                                                     trusted requests, the gateway, the operator)
``{p}:dlq:purged``                           hash    dead-letter stream → letters the operator
                                                     deleted (operator only): what a cap cut is
                                                     entries-added − length − this
``{p}:audit``                                stream  answers not applied, break-glass switches
``{p}:breakglass``                           string  present while break-glass is on (TTL)
===========================================  ======  ==============================================

A partition's tag is chosen so that N partitions spread evenly over the cluster's 16384 slots:
``TAG`` of partition i is the first ``e<i>.<k>`` (``d<i>.<k>`` for decisions), k = 0, 1, …, whose
slot lies in the i-th of N equal slot ranges (:func:`partition_tag`). A session's partition is
``crc32(session id, UTF-8) mod N`` (:meth:`Keys.partition`). A hook's request shards spread the
same way: shard 0 keeps the hook's tag, and shard k of S takes the first ``NAME#k.j`` whose slot
lies in the k-th of S equal slot ranges after shard 0's (:func:`shard_tag`). A session's requests
go to the shard whose slot range holds its events partition's slot, when the partitions are a
multiple of S (on a cluster whose masters own equal slot ranges, the event and the requests of
one dispatch go to one master, in one write), else to shard ``crc32(session id, UTF-8) mod S``
(:meth:`Keys.shard`).

Dead letters live in one stream per unit (a hook, a tenant, the coordinators), under the unit's
hash tag, so a leaked credential can write, trim or exhaust only its own unit's; each is capped at
``MAXLEN ~ DLQ_MAXLEN`` and each letter keeps at most ``DLQ_DATA_BYTES`` of a message (plus its
size and SHA-256), so the bytes of one unit are bounded (docs/reliability.md).
"""

from __future__ import annotations

import hashlib
import re
import zlib
from functools import cache
from typing import Any

from redis.crc import REDIS_CLUSTER_HASH_SLOTS, key_slot

from bus.errors import ConfigError

WORKERS_GROUP = "workers"
COORDINATORS_GROUP = "coordinators"
_NAME = re.compile(r"^[A-Za-z0-9_.\-]{1,128}$")
#: Tenant names: no '.', so that a qualified session id ``TENANT/SID`` splits unambiguously.
_TENANT = re.compile(r"^[A-Za-z0-9_\-]{1,64}$")
#: Most request streams one hook may be sharded over.
MAX_SHARDS = 64
#: Most partitions a bus may have (each is a stream every async hook group reads).
MAX_PARTITIONS = 1024
#: Cap of each dead-letter stream (``XADD … MAXLEN ~``): one unit's letters, not the bus's.
DLQ_MAXLEN = 10_000
#: Most bytes of a message a dead letter keeps (a prefix; its size and SHA-256 are kept too).
DLQ_DATA_BYTES = 4096


def check_name(kind: str, value: str) -> str:
    """Hook names, prefixes and ids become parts of keys: letters, digits, ``_ . -`` only."""
    if not isinstance(value, str) or not _NAME.match(value):
        raise ConfigError(
            f"{kind} {value!r} must be 1-128 characters of letters, digits, '_', '.' or '-'"
        )
    return value


def session_digest(session_id: str) -> str:
    """How a session is named on the control channel (``ControlMessage.session_id``): the first
    32 hex digits of its SHA-256, so that a subscriber learns no session id from it."""
    return hashlib.sha256(session_id.encode("utf-8", "surrogatepass")).hexdigest()[:32]


def check_tenant(value: str) -> str:
    """Tenant names become parts of keys and of qualified session ids."""
    if not isinstance(value, str) or not _TENANT.match(value):
        raise ConfigError(
            f"tenant {value!r} must be 1-64 characters of letters, digits, '_' or '-'"
        )
    return value


def spread(session_id: str, ways: int) -> int:
    """Which of ``ways`` streams (partitions, request shards) a session's messages go to:
    ``crc32(session id, UTF-8) mod ways``, so that one session's stay in order in one. One
    stream (the default) costs nothing on the dispatch path."""
    if ways <= 1:
        return 0
    return zlib.crc32(session_id.encode("utf-8", "surrogatepass")) % ways


@cache
def partition_tag(kind: str, index: int, partitions: int) -> str:
    """The hash tag of partition ``index`` of ``partitions``: the first ``<kind><index>.<k>``
    whose cluster slot lies in the index-th of ``partitions`` equal slot ranges."""
    low = index * REDIS_CLUSTER_HASH_SLOTS // partitions
    high = (index + 1) * REDIS_CLUSTER_HASH_SLOTS // partitions
    for k in range(1_000_000):
        tag = f"{kind}{index}.{k}"
        if low <= key_slot(tag.encode()) < high:
            return tag
    raise ConfigError(f"no hash tag found for partition {index} of {partitions}")


def _slot_range(index: int, parts: int) -> tuple[int, int]:
    """The index-th of ``parts`` equal ranges of the cluster's slots: [low, high)."""
    return (index * REDIS_CLUSTER_HASH_SLOTS // parts,
            (index + 1) * REDIS_CLUSTER_HASH_SLOTS // parts)  # fmt: skip


def _range_of(slot: int, parts: int) -> int:
    """Which of ``parts`` equal slot ranges holds ``slot``."""
    return next(i for i in range(parts) if _slot_range(i, parts)[1] > slot)


@cache
def _shard_beside(hook: str, partition: int, partitions: int, shards: int) -> int:
    """The shard of a hook's ``shards`` whose slot range holds events partition
    ``partition``'s slot (:func:`shard_tag` puts shard k in the k-th range after shard 0's)."""
    here = _range_of(key_slot(partition_tag("e", partition, partitions).encode()), shards)
    return (here - _range_of(key_slot(hook.encode()), shards)) % shards


@cache
def shard_tag(hook: str, shard: int, shards: int) -> str:
    """The hash tag of request shard ``shard`` of a hook's ``shards``. Shard 0 is the hook's own
    tag; its slot lies in one of ``shards`` equal slot ranges, and shard k > 0 takes the k-th
    range after that one: the first ``<hook>#<k>.<j>``, j = 0, 1, …, whose slot lies in it. So
    a hook's shards spread over the slots as partitions do (:func:`partition_tag`)."""
    if shard == 0:
        return hook
    home = _range_of(key_slot(hook.encode()), shards)
    low, high = _slot_range((home + shard) % shards, shards)
    for j in range(1_000_000):
        tag = f"{hook}#{shard}.{j}"
        if low <= key_slot(tag.encode()) < high:
            return tag
    raise ConfigError(f"no hash tag found for shard {shard} of {shards} of hook {hook}")


class Keys:
    """Key names under one prefix."""

    __slots__ = (
        "audit",
        "breakglass",
        "config",
        "control",
        "coordinators",
        "decision_partitions",
        "dlq",
        "dlq_purged",
        "event_partitions",
        "hooks",
        "modes",
        "partitions",
        "prefix",
        "tenants",
    )

    #: The member of a replicas set that records the last clean shutdown of a replica, scored
    #: ``-(epoch ms)``: a negative score is never counted live (``ZCOUNT key <now - live> +inf``),
    #: and one member per hook keeps the set bounded. (A replica id is ``HOST-PID-RANDOM``.)
    STOPPED_MEMBER = "stopped"

    def __init__(self, prefix: str = "hookbus", partitions: int = 1) -> None:
        self.prefix = check_name("key prefix", prefix)
        if not isinstance(partitions, int) or not 1 <= partitions <= MAX_PARTITIONS:
            raise ConfigError(f"partitions must be 1-{MAX_PARTITIONS}, not {partitions!r}")
        self.partitions = partitions
        #: ``{p}:events:{TAG}`` of each partition, in partition order.
        self.event_partitions = tuple(
            f"{prefix}:events:{{{partition_tag('e', i, partitions)}}}" for i in range(partitions)
        )
        #: ``{p}:decisions:{TAG}`` of each partition (trusted foreign agents' requests).
        self.decision_partitions = tuple(
            f"{prefix}:decisions:{{{partition_tag('d', i, partitions)}}}" for i in range(partitions)
        )
        self.hooks = f"{prefix}:hooks"
        self.modes = f"{prefix}:modes"
        self.tenants = f"{prefix}:tenants"
        self.control = f"{prefix}:control"
        #: The coordinators' dead letters (hooks' and tenants' have their own: hook_dlq,
        #: tenant_dlq).
        self.dlq = f"{prefix}:dlq"
        #: Dead-letter stream → how many letters the operator deleted (to tell them from a cut).
        self.dlq_purged = f"{prefix}:dlq:purged"
        #: The bus's shared configuration (``partitions``), written once (HSETNX).
        self.config = f"{prefix}:config"
        #: The audit trail: answers not applied (warn, dryrun, break-glass), break-glass on/off.
        self.audit = f"{prefix}:audit"
        #: Present (with a TTL) while an operator's break-glass bypass is on.
        self.breakglass = f"{prefix}:breakglass"
        #: Coordinator service replica id → last heartbeat (epoch ms), like a hook's replicas.
        self.coordinators = f"{prefix}:coordinators"

    @classmethod
    def of(cls, settings: Any) -> Keys:
        """The keys of a bus's settings (its prefix and number of partitions)."""
        return cls(settings.prefix, settings.partitions)

    def partition(self, session_id: str) -> int:
        """The partition of a session: its events and decisions stay in order in one stream."""
        return spread(session_id, self.partitions)

    def shard(self, hook: str, session_id: str, shards: int) -> int:
        """Which of a hook's ``shards`` request streams a session's requests go to, always the
        same one, so that they stay in order. When the partitions are a multiple of the shards,
        the shard beside the session's events partition: its tag's slot in the same of
        ``shards`` equal slot ranges, so that on a cluster whose masters own equal ranges (what
        ``redis-cli --cluster create`` makes) a dispatch's event and its requests go to one
        master in one write (docs/performance.md: a write more per decision cost the masters a
        third more CPU), and each shard takes the sessions of as many partitions; else
        ``crc32(session id) mod shards`` (even shares either way)."""
        if shards <= 1:
            return 0
        if self.partitions % shards:
            return spread(session_id, shards)
        return _shard_beside(hook, self.partition(session_id), self.partitions, shards)

    def events(self, session_id: str) -> str:
        """The events stream of a session's partition."""
        return self.event_partitions[self.partition(session_id)]

    def decisions(self, session_id: str) -> str:
        """The decisions stream of a session's partition (trusted foreign agents)."""
        return self.decision_partitions[self.partition(session_id)]

    def _hook(self, hook: str) -> str:
        return f"{self.prefix}:hook:{{{hook}}}"

    def manifest(self, hook: str) -> str:
        """The hook's manifest (JSON); its name is also a member of ``{p}:hooks``."""
        return f"{self._hook(hook)}:manifest"

    def requests(self, hook: str, shard: int = 0, shards: int = 1) -> str:
        """Shard ``shard`` of a hook's ``shards`` request streams. Shard 0 shares the hook's
        tag; shard k > 0 has its own, chosen so that the shards spread (:func:`shard_tag`)."""
        if shard == 0:
            return f"{self._hook(hook)}:requests"
        if not 0 < shard < shards <= MAX_SHARDS:
            raise ConfigError(f"shard {shard} of {shards}: shards must be 1-{MAX_SHARDS}")
        return f"{self.prefix}:hook:{{{shard_tag(hook, shard, shards)}}}:requests"

    def tenant_decisions(self, tenant: str) -> str:
        """An untrusted agent's decision requests (its tenant's only writable stream)."""
        return f"{self.prefix}:t:{{{check_tenant(tenant)}}}:decisions"

    def tenant_dlq(self, tenant: str) -> str:
        """Dead letters about a tenant's requests (the coordinator service writes them; the
        tenant's own user cannot)."""
        return f"{self.prefix}:t:{{{check_tenant(tenant)}}}:dlq"

    def hook_dlq(self, hook: str) -> str:
        """A hook's dead letters: only its own processes (its user) and the operator write
        them, so replaying them to it re-feeds nothing another unit wrote."""
        return f"{self._hook(check_name('hook name', hook))}:dlq"

    def dlq_of(self, stream: str) -> str:
        """The dead-letter stream of the unit ``stream`` belongs to: a hook's keys (and its
        shards') → the hook's, a tenant's → the tenant's, any other → the coordinators'."""
        p = re.escape(self.prefix)
        hook = re.fullmatch(rf"{p}:hook:\{{([A-Za-z0-9_.\-]{{1,128}})(?:#\d+\.\d+)?\}}:\w+", stream)
        if hook:
            return self.hook_dlq(hook[1])
        tenant = re.fullmatch(rf"{p}:t:\{{([A-Za-z0-9_\-]{{1,64}})\}}:\w+", stream)
        return self.tenant_dlq(tenant[1]) if tenant else self.dlq

    def tenant_inbox(self, tenant: str, owner: str) -> str:
        """Replies to one client of a tenant."""
        return f"{self.prefix}:t:{{{check_tenant(tenant)}}}:inbox:{owner}"

    def is_tenant_inbox(self, tenant: str, key: str) -> bool:
        """Replies to a tenant's request may only go to that tenant's inboxes."""
        head = f"{self.prefix}:t:{{{tenant}}}:inbox:"
        return key.startswith(head) and len(key) <= 300

    def replicas(self, hook: str) -> str:
        """Replica id → last heartbeat (epoch ms); plus ``STOPPED_MEMBER`` (see there)."""
        return f"{self._hook(hook)}:replicas"

    def clocks(self, hook: str) -> str:
        """Each replica's measured clock offset from Redis's (bus/transport/clock.py), in ms."""
        return f"{self._hook(hook)}:clocks"

    def problems(self, hook: str) -> str:
        """Replica id → what its hook says is wrong with it (``hook_problem``), while it says
        something; published with its heartbeat, shown by ``hookbus hooks list``."""
        return f"{self._hook(hook)}:problems"

    def inbox(self, owner: str) -> str:
        return f"{self.prefix}:inbox:{owner}"

    def is_inbox(self, key: str) -> bool:
        """Replies may only be pushed to inbox keys, never to a key a message names at will."""
        return key.startswith(f"{self.prefix}:inbox:") and len(key) <= 300

    def replay(self, hook: str) -> str:
        """Entries re-fed to one async hook (``hookbus replay``); read by its group."""
        return f"{self._hook(hook)}:replay"

    def failures(self, hook: str) -> str:
        """Last failure reason per entry id of one async hook (for its dead letters)."""
        return f"{self._hook(hook)}:failures"

    def cut_recorded(self, hook: str, stream: str, entry_id: bytes | str) -> str:
        """Present (a day) once a replica of the async hook has recorded a pending entry of
        ``stream`` that the hard cap cut: the others, which may have seen it gone too, do not."""
        text = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
        return f"{self._hook(hook)}:cut:{stream}:{text}"

    def lost(self, hook: str) -> str:
        """Per stream, how many entries the hard cap cut before the hook's group handled them."""
        return f"{self._hook(hook)}:lost"

    def metrics(self, hook: str) -> str:
        """Figures an async MetricsHook collected."""
        return f"{self._hook(hook)}:metrics"

    def session_hooks(self, session_id: str) -> str:
        return f"{self.prefix}:session:{session_id}:hooks"

    def cancelled(self, session_id: str) -> str:
        return f"{self.prefix}:cancelled:{session_id}"
