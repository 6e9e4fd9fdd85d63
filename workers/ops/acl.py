"""The Redis ACL users of a HookBus deployment, generated from the list of hooks and tenants.

``hookbus acl --hooks A,B --tenants t1,t2 [--prefix P]`` writes an ACL file that redis-server
loads as it is (``--aclfile``, ``ACL LOAD``: one ``user`` line per user, no comment or blank
line, which Redis 7.0 refuses; ``--explain`` prints what each user is for). Its passwords:
``--password-dir DIR`` reads each user's from ``DIR/<user>`` (one per line: two while rotating)
and writes their SHA-256 hashes (``#…``); without it, none (deploy/redis/start.sh adds them from
secret files). ``--redis-version 7.2`` adds ``+client|setinfo`` (7.0 does not know it),
``--cluster`` the commands a cluster client needs (``CLUSTER``). ``--apply`` sets the users on a
running Redis with ``ACL SETUSER`` (as the admin user), which, unlike ``ACL LOAD``, keeps every
connection: the way to rotate a password without a restart (docs/security.md). The users:

* the shared roles — ``coordinator`` (the coordinator service and the gateway), ``agent``
  (trusted agents that embed ``HookClient``), ``operator`` (people and monitors), ``scaler``
  (an autoscaler: reads the lag of groups, nothing else) and ``admin`` (Redis's administrator:
  no HookBus process uses it);
* one user ``hook-NAME`` per hook service, whose keys are only the hook's own
  (``{p}:hook:{NAME}:*`` and its shards' ``{p}:hook:{NAME#k.j}:*``, key layout 3 of
  bus/transport/keys.py), plus what every hook needs to answer (RPUSH into ``{p}:inbox:*``),
  register (SADD its name to ``{p}:hooks``), dead-letter (XADD to its own
  ``{p}:hook:{NAME}:dlq`` only: no other unit's), read the bus's partition count (HGET
  ``{p}:config``, HSETNX if it is the first process) and announce itself on ``{p}:control``;
* one user ``tenant-NAME`` per untrusted tenant: XADD to ``{p}:t:{NAME}:decisions`` and
  BLPOP/BLMPOP its replies from ``{p}:t:{NAME}:inbox:*``, PING — nothing else (no pub/sub, no
  session or cancellation key, no stream id but into its own stream).

A hook is named by ``MODULE:CLASS`` (its class is imported, not instantiated: its name, whether it
is async, whether it follows the audit trail, and the capabilities it declares in
``acl_capabilities`` — see ``CAPABILITIES``) or by its bare name (a sync hook, possibly written in
another language, that needs only its own keys); ``NAME=async`` names an async hook.

What an ACL cannot narrow (docs/security.md, "Residual risks"): an async hook must read the
events partitions as a consumer group named after itself, but Redis ACLs restrict keys, not group
names, so a leaked async hook credential can read every event (as any group, including another
async hook's) and reset or trim those streams. Sync hooks have no such reach.

The rules are written for the prefix ``hookbus``; another prefix replaces ``hookbus:`` in them.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from bus.errors import ConfigError
from bus.hooks import AgentHook, AsyncAgentHook
from bus.transport.keys import check_name, check_tenant
from workers.services.loading import import_target

#: The prefix the rules below are written for.
P = "hookbus"

#: Shared roles: (user, what it is, its rules). Each user's root rules hold what needs no key
#: (PING, TIME, pub/sub on the control channel) and what it only reads; every (…) selector pairs
#: the commands that write with the only keys they may touch. %R~ is read-only, %W~ write-only.
ROLES: tuple[tuple[str, str, str], ...] = (
    (
        "coordinator",
        "`hookbus coordinator` (workers/services/coordinator_service.py, "
        "bus/transport/coordinator.py, "
        "bus/transport/directory.py): reads the hook directory (manifests, live replicas and their "
        "clock "
        "offsets), the tenants it serves and session hooks, follows hookbus:control; reads "
        "Redis's clock (TIME); XADDs events and hook requests (and audit records of answers not "
        "applied), pops replies from its own inbox, reads the break-glass switch; answers the "
        "decisions partitions and every tenant's decisions stream as the `coordinators` group "
        "(takes over those a silent replica left; replies RPUSHed to the asker's inbox; unusable "
        "requests dead-lettered: a tenant's in hookbus:t:{T}:dlq, trusted ones in hookbus:dlq); "
        "reads the partition count (hookbus:config, HSETNX if the first); beats in "
        "hookbus:coordinators; at shutdown hands what it has "
        "not answered over (XPENDING, XCLAIM … IDLE) and deletes its consumer; adds a tenant's "
        "cancellation of its own session (SADD, never removes). --check: ZRANGE "
        "hookbus:coordinators.",
        "on resetchannels &hookbus:control -@all +ping +time +subscribe "
        "+unsubscribe %R~hookbus:hooks %R~hookbus:tenants %R~hookbus:hook:*:manifest "
        "%R~hookbus:modes %R~hookbus:hook:*:replicas %R~hookbus:hook:*:clocks "
        "%R~hookbus:session:*:hooks %R~hookbus:breakglass +hgetall +zcount +zrange +smembers "
        "+get (%W~hookbus:events:* %W~hookbus:hook:*:requests %W~hookbus:dlq %W~hookbus:t:*:dlq "
        "%W~hookbus:audit +xadd) (~hookbus:config +hget +hsetnx) "
        "(%R~hookbus:dlq %R~hookbus:t:*:dlq %R~hookbus:dlq:purged +xinfo|stream +hmget) "
        "(~hookbus:decisions:* ~hookbus:t:*:decisions +xgroup|create +xgroup|delconsumer "
        "+xreadgroup +xack +xclaim +xautoclaim +xpending) (~hookbus:coordinators +zadd +zrem "
        "+zrange) (~hookbus:inbox:* +blmpop +rpush +pexpire) "
        "(%W~hookbus:t:*:inbox:* +rpush +pexpire) (~hookbus:cancelled:* +sadd +expire)",
    ),
    (
        "agent",
        "A trusted agent (the platform's own runtime, docs/security.md): HookClient "
        "(agent_adapter/client.py, a coordinator in the agent's process: `hookbus demo "
        "--attach`), or a trusted agent in another language that XADDs decision requests to a "
        "decisions partition and BLPOPs its inbox. Attaches hooks to its sessions, cancels "
        "sessions (SADD only: no agent lifts a cancellation). Reads Redis's clock and the "
        "replicas' clock offsets, as a coordinator does. Untrusted agents get a tenant user.",
        "on resetchannels &hookbus:control -@all +ping +time +subscribe "
        "+unsubscribe +publish %R~hookbus:hooks %R~hookbus:hook:*:manifest %R~hookbus:modes "
        "%R~hookbus:hook:*:replicas %R~hookbus:hook:*:clocks %R~hookbus:breakglass +hgetall "
        "+smembers +zcount +zrange +get (%W~hookbus:events:* %W~hookbus:hook:*:requests "
        "%W~hookbus:decisions:* %W~hookbus:audit +xadd) (%W~hookbus:dlq +xadd) "
        "(~hookbus:config +hget +hsetnx) (~hookbus:inbox:* +blmpop +blpop +pexpire) "
        "(~hookbus:session:*:hooks +smembers +sadd +srem +del +expire) "
        "(%W~hookbus:cancelled:* +sadd)",
    ),
    (
        "operator",
        "A person or a monitor (workers/ops/operator.py, workers/ops/replay.py: `hookbus hooks "
        "list`, "
        "`lag`, `events tail`, `dlq …`, `metrics`, `replay`, `cancel`, `tenants`, `repair`, "
        "every --check): reads everything under the prefix; "
        "writes only re-fed entries, dead letters (deletions, and the entries a repair takes "
        "out), cancellations (and lifts them: the only role that may), modes, tenants, the "
        "break-glass switch and the audit trail; `hookbus hooks remove`/`restore` (SET a "
        "tombstone over the hook's manifest, DEL it again; XGROUP DESTROY the removed async "
        "hook's group on each events partition); repairs a stream poisoned with an id beyond "
        "Redis's clock (XDEL and XACK those entries, XSETID, XGROUP SETID, in MULTI/EXEC under "
        "WATCH); "
        "TIME: `worker --check` compares this host's clock with Redis's.",
        "on resetchannels -@all +ping +time +multi +exec +discard +unwatch "
        "%R~hookbus:* +hgetall +hget +hexists +smembers +sismember +get +zrange +xrange "
        "+xrevrange +xread +xlen +xpending +xinfo|groups +xinfo|consumers +xinfo|stream "
        "(~hookbus:dlq ~hookbus:hook:*:dlq ~hookbus:t:*:dlq +xdel) (~hookbus:dlq:purged +hincrby) "
        "(~hookbus:config +hsetnx +hset) (~hookbus:hook:*:manifest +set +del) "
        "(~hookbus:events:* +xgroup|destroy) "
        "(%W~hookbus:dlq %W~hookbus:hook:*:dlq %W~hookbus:t:*:dlq %W~hookbus:hook:*:replay "
        "%W~hookbus:audit +xadd) "
        "(~hookbus:breakglass +get +set +del) (~hookbus:cancelled:* +sadd +expire +del) "
        "(~hookbus:modes +hset +hdel) (~hookbus:tenants +sadd +srem) "
        "(~hookbus:events:* ~hookbus:decisions:* ~hookbus:t:*:decisions "
        "~hookbus:hook:*:requests ~hookbus:hook:*:replay ~hookbus:dlq ~hookbus:hook:*:dlq "
        "~hookbus:t:*:dlq ~hookbus:audit +watch +xack "
        "+xdel +xsetid +xgroup|setid) (&hookbus:control +publish)",
    ),
    (
        "scaler",
        "An autoscaler (KEDA's redis-streams and redis-cluster-streams scalers, "
        "deploy/k8s/keda.yaml): reads how far each group is behind on the streams services "
        "read (XINFO GROUPS for lagCount, XPENDING for pendingEntriesCount, XLEN for "
        "streamLength) and nothing else: no entry, no key of another type, no write.",
        "on resetchannels -@all +ping %R~hookbus:events:* %R~hookbus:decisions:* "
        "%R~hookbus:t:*:decisions %R~hookbus:hook:*:requests %R~hookbus:audit "
        "+xinfo|groups +xpending +xlen",
    ),
    (
        "admin",
        "The Redis administrator (the default user is off): ACL LOAD/SETUSER/LOG, CONFIG, INFO, "
        "backups. Kept out of every HookBus process: a person uses it with redis-cli "
        '(docs/security.md, "Administering Redis"), or `hookbus acl --apply` to change '
        "passwords without a restart.",
        "on resetchannels ~* &* +@all",
    ),
)

#: Added to every user but ``default`` and ``admin`` by ``hookbus acl --redis-version 7.2``
#: (the command exists from Redis 7.2; 7.0 refuses a file that names it): client libraries
#: send it on connecting, and ignore its refusal, which ACL LOG would still record.
SETINFO = "+client|setinfo"
#: Added by ``hookbus acl --cluster``: what a cluster client sends besides the role's commands
#: (redis-py: COMMAND, CLUSTER SLOTS; redis-py and go-redis newer: CLUSTER SHARDS; redis-rb:
#: CLUSTER NODES; every client: ASKING while a slot migrates). Without them a client cannot
#: find the cluster's nodes and fails with NOPERM.
CLUSTER = "+command +cluster|slots +cluster|shards +cluster|nodes +asking"

#: What a hook class may ask for beyond its own keys (``acl_capabilities = ("...",)``): a name
#: the project vetted, never a raw rule. (what it is for, its rules)
CAPABILITIES: dict[str, tuple[str, str]] = {
    "read-cancellations": (
        "reads whether a session is cancelled, and starts the cancellation's TTL "
        "(workers/builtins/cancellation.py)",
        "(~hookbus:cancelled:* +exists +expire)",
    ),
}

_HOOK_ROOT = "on resetchannels &hookbus:control -@all +ping +time +publish"
#: Every command a hook service runs on its own keys (workers/services/worker.py,
#: workers/services/async_worker.py, bus/transport/retention.py, bus/transport/directory.py,
#: workers/builtins/metrics.py): manifest, heartbeats, clock offsets, its request streams (sync) or
#: replay stream (async), failures, losses, metrics.
_OWN = (
    "+get +set +zadd +zrem +zrange +hset +hdel +hgetall +hmget +hincrby +hincrbyfloat +expire "
    "+xgroup|create +xgroup|setid +xgroup|delconsumer +xreadgroup +xread +xack +xclaim "
    "+xautoclaim +xpending +xrange +xlen +xinfo|groups +xinfo|stream +xtrim +evalsha"
)
#: What an async hook runs on the events partitions (and the audit trail if it follows it):
#: reads as its group, through bus/transport/retention.py's scripts (EVALSHA; inside them XINFO,
#: XGROUP CREATE/SETID, XREADGROUP — checked against this user's ACL), waits with XREAD BLOCK,
#: claims (XRANGE: whether a pending entry that XCLAIM did not return was cut by the hard cap),
#: acknowledges, trims what every group has read.
_FOLLOW = (
    "+evalsha +xgroup|create +xgroup|setid +xreadgroup +xread +xack +xclaim +xautoclaim "
    "+xpending +xrange +xlen +xinfo|groups +xinfo|stream +xtrim"
)


@dataclass(frozen=True)
class HookUser:
    """What one hook service's user may reach."""

    name: str
    kind: str = "sync"  # or "async"
    follows_audit_trail: bool = False
    capabilities: tuple[str, ...] = ()

    @property
    def user(self) -> str:
        return f"hook-{self.name}"


def hook_user_of(item: str, app_dir: str | None = None) -> HookUser:
    """``MODULE:CLASS`` (read from the class, imported with ``app_dir`` first on the path, as
    ``hookbus worker --app-dir`` does), ``NAME`` (a sync hook) or ``NAME=async``."""
    item = item.strip()
    if ":" in item:
        return _from_class(item, app_dir)
    name, _, kind = item.partition("=")
    if kind not in ("", "sync", "async"):
        raise ConfigError(f"hook {item!r}: the kind after '=' must be sync or async")
    return HookUser(check_name("hook name", name), kind or "sync")


def _from_class(target: str, app_dir: str | None) -> HookUser:
    # The same import as `hookbus worker`'s, so that a class it serves is one this can name.
    obj = import_target(target, app_dir)
    cls = obj if isinstance(obj, type) else type(obj)
    if obj is None or not issubclass(cls, AgentHook | AsyncAgentHook):
        raise ConfigError(f"{target} is not an AgentHook or AsyncAgentHook")
    wanted = tuple(getattr(obj, "acl_capabilities", ()))
    if unknown := [c for c in wanted if c not in CAPABILITIES]:
        raise ConfigError(
            f"{target} asks for unknown ACL capabilities {', '.join(map(repr, unknown))} "
            f"(known: {', '.join(CAPABILITIES)})"
        )
    is_async = issubclass(cls, AsyncAgentHook)
    return HookUser(
        name=check_name("hook name", str(getattr(obj, "name", ""))),
        kind="async" if is_async else "sync",
        follows_audit_trail=is_async and bool(getattr(obj, "follows_audit_trail", False)),
        capabilities=wanted,
    )


def hook_rules(hook: HookUser) -> str:
    """The rules of one hook service's user (for the prefix ``hookbus``)."""
    own = f"~hookbus:hook:{{{hook.name}}}:* ~hookbus:hook:{{{hook.name}#*}}:*"
    root = _HOOK_ROOT + (" +script|load" if hook.kind == "async" else "")
    parts = [
        root,
        "(~hookbus:hooks +sadd +sismember)",
        f"({own} {_OWN})",
        f"(%W~hookbus:hook:{{{hook.name}}}:dlq +xadd)",
        "(~hookbus:config +hget +hsetnx)",
        "(%R~hookbus:dlq:purged +hmget)",
        # RPUSH only: an inbox's TTL is its owner's (PEXPIRE 0 would delete other hooks'
        # replies waiting in it)
        "(%W~hookbus:inbox:* +rpush)",
    ]
    if hook.kind == "async":
        streams = "~hookbus:events:*" + (" ~hookbus:audit" if hook.follows_audit_trail else "")
        parts.append(f"({streams} {_FOLLOW})")
    parts += [CAPABILITIES[c][1] for c in hook.capabilities]
    return " ".join(parts)


def tenant_rules(tenant: str) -> str:
    """The rules of one untrusted tenant's user (for the prefix ``hookbus``)."""
    t = check_tenant(tenant)
    return (
        "on resetchannels -@all +ping "
        f"(%W~hookbus:t:{{{t}}}:decisions +xadd) (~hookbus:t:{{{t}}}:inbox:* +blpop +blmpop)"
    )


def _hook_comment(hook: HookUser) -> str:
    what = (
        f"Hook service {hook.name} ({hook.kind}): only its own keys (hookbus:hook:{{{hook.name}}}:*"
        f" and its shards'), SADD its name to hookbus:hooks, replies RPUSHed into "
        f"hookbus:inbox:*, its own dead letters (hookbus:hook:{{{hook.name}}}:dlq), "
        "the partition count (hookbus:config), announcements on hookbus:control."
    )
    if hook.kind == "async":
        what += (
            " Reads the events partitions"
            + (" and the audit trail" if hook.follows_audit_trail else "")
            + " as its consumer group (an ACL cannot restrict group names: docs/security.md)."
        )
    for c in hook.capabilities:
        what += f" Capability {c}: {CAPABILITIES[c][0]}."
    return what


def _wrap(text: str, width: int = 98) -> list[str]:
    import textwrap

    return [f"# {line}" for line in textwrap.wrap(text, width - 2, break_on_hyphens=False)]


def _prefixed(rules: str, prefix: str) -> str:
    return rules if prefix == P else rules.replace(f"{P}:", f"{prefix}:")


def users(
    hooks: Iterable[HookUser], tenants: Iterable[str], prefix: str = P
) -> list[tuple[str, str, str]]:
    """(user, comment, rules) of every user, ``default`` (off) first. No passwords."""
    check_name("key prefix", prefix)
    out = [("default", "No anonymous access.", "off resetchannels -@all")]
    out += [(u, _prefixed(c, prefix), _prefixed(r, prefix)) for u, c, r in ROLES]
    seen: set[str] = set()
    for hook in hooks:
        if hook.name in seen:
            raise ConfigError(f"hook {hook.name} is listed twice")
        seen.add(hook.name)
        comment = _prefixed(_hook_comment(hook), prefix)
        out.append((hook.user, comment, _prefixed(hook_rules(hook), prefix)))
    for tenant in dict.fromkeys(tenants):
        comment = (
            f"Untrusted tenant {tenant}: XADD its decision requests to hookbus:t:{{{tenant}}}:"
            "decisions, BLPOP/BLMPOP its replies; nothing else."
        )
        rules = _prefixed(tenant_rules(tenant), prefix)
        out.append((f"tenant-{tenant}", _prefixed(comment, prefix), rules))
    return out


@dataclass(frozen=True)
class Options:
    """How the rules are written for one server: ``setinfo`` (Redis >= 7.2), ``cluster`` (a
    Redis Cluster), and each user's passwords (``passwords[user]``: every one valid, so that a
    rotation can hold the old and the new at once), stored as SHA-256 hashes."""

    setinfo: bool = False
    cluster: bool = False
    passwords: dict[str, tuple[str, ...]] | None = None


def full_rules(user: str, rules: str, options: Options) -> str:
    """``rules`` for this server, with the user's passwords as ``#<sha256>``."""
    if user not in ("default", "admin"):
        rules += f" {SETINFO}" if options.setinfo else ""
        rules += f" {CLUSTER}" if options.cluster else ""
    if options.passwords is not None and user != "default":
        hashes = (hashlib.sha256(p.encode()).hexdigest() for p in options.passwords[user])
        rules += "".join(f" #{h}" for h in hashes)
    return rules


def read_passwords(directory: str | Path, names: Iterable[str]) -> dict[str, tuple[str, ...]]:
    """Each user's passwords from ``directory/<user>``: one per line (two while rotating)."""
    out = {}
    for user in names:
        if user == "default":
            continue
        path = Path(directory) / user
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except OSError as exc:
            raise ConfigError(
                f"--password-dir: no password for Redis user {user}: {path}: {exc.strerror or exc}"
            ) from None
        passwords = tuple(line for line in lines if line)
        if not passwords:
            raise ConfigError(f"--password-dir: {path} is empty: write the user's password in it")
        if any(c.isspace() for p in passwords for c in p):
            raise ConfigError(f"--password-dir: a password in {path} contains white space")
        out[user] = passwords
    return out


def render(
    hooks: Sequence[HookUser], tenants: Sequence[str], prefix: str = P,
    options: Options = Options(),
) -> str:  # fmt: skip
    """The ACL file: one ``user`` line per user and nothing else (no comment, no blank line:
    Redis's ``aclfile`` and ``ACL LOAD`` refuse both). ``explain`` says what each user is."""
    lines = [
        f"user {user} {full_rules(user, rules, options)}"
        for user, _, rules in users(hooks, tenants, prefix)
    ]
    return "\n".join(lines) + "\n"


def explain(hooks: Sequence[HookUser], tenants: Sequence[str], prefix: str = P) -> str:
    """What each user of ``render`` is for, as comments (for people: not a file Redis loads)."""
    lines = [
        "# Redis ACL users of a HookBus deployment (key layout 3, bus/transport/keys.py); who "
        "holds which",
        "# credential, and what it can and cannot do: docs/security.md.",
    ]
    for user, comment, rules in users(hooks, tenants, prefix):
        lines += ["", *_wrap(comment), f"# user {user} {rules}"]
    return "\n".join(lines) + "\n"


def split_list(value: str | None) -> list[str]:
    return [v.strip() for v in (value or "").split(",") if v.strip()]
