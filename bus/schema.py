"""JSON Schema and AsyncAPI documents generated from the wire types (``hookbus schema export``).

The committed copies in ``docs/schema/`` are what clients in other languages build against; a
test fails when the code and the committed files disagree.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec

from bus.actions import (
    HookAction,
    NotifyResult,
    PermissionRequestResult,
    PostToolUseResult,
    PreToolUseResult,
)
from bus.events import CONTEXT_TYPES
from bus.limits import (
    MAX_CONTAINERS,
    MAX_CONTEXT_BYTES,
    MAX_CONTEXT_DEPTH,
    MAX_DEPTH,
)
from bus.protocol import (
    DATA_FIELD,
    MAX_MESSAGE_BYTES,
    PROTOCOL_VERSION,
    AuditRecord,
    BreakGlass,
    CancelRequest,
    ControlMessage,
    DecisionReply,
    DecisionRequest,
    EventMessage,
    HookManifest,
    HookReply,
    HookRequest,
)

MESSAGES: dict[str, type] = {
    "EventMessage": EventMessage,
    "HookRequest": HookRequest,
    "HookReply": HookReply,
    "HookManifest": HookManifest,
    "DecisionRequest": DecisionRequest,
    "DecisionReply": DecisionReply,
    "CancelRequest": CancelRequest,
    "ControlMessage": ControlMessage,
    "AuditRecord": AuditRecord,
    "BreakGlass": BreakGlass,
    **{kind.__name__: kind for kind in CONTEXT_TYPES.values()},
    # DecisionReply.result, by event: PreToolUse, PostToolUse(Failure), PermissionRequest, others
    "PreToolUseResult": PreToolUseResult,
    "PostToolUseResult": PostToolUseResult,
    "PermissionRequestResult": PermissionRequestResult,
    "NotifyResult": NotifyResult,
}


_CONTEXTS = frozenset(CONTEXT_TYPES.values())
# JSON Schema can bound a string's length or an array's items, but not a document's total size,
# its nesting depth or its number of containers: the bounds of bus/limits.py are stated here.
LIMITS = (
    "Limits JSON Schema cannot express (docs/protocol.md 1.2): receivers reject a message of "
    f"more than {MAX_MESSAGE_BYTES} bytes (MAX_MESSAGE_BYTES), nested more than {MAX_DEPTH} "
    f"levels deep counting the message itself as level 1 (MAX_DEPTH), or holding more than "
    f"{MAX_CONTAINERS} arrays and objects (MAX_CONTAINERS)."
)
CONTEXT_LIMITS = (
    "Limits JSON Schema cannot express (docs/protocol.md 1.2): a context of more than "
    f"{MAX_CONTEXT_BYTES} bytes (MAX_CONTEXT_BYTES) or nested more than {MAX_CONTEXT_DEPTH} "
    "levels deep counting the context itself as level 1 (MAX_CONTEXT_DEPTH) is refused: no "
    "hook is shown it, PreToolUse is Blocked, PermissionRequest Denied, tool output withheld."
)


def _schema(kind: type) -> dict[str, Any]:
    schema: dict[str, Any] = msgspec.json.schema(kind)
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["$id"] = f"https://hookbus.dev/schema/v{PROTOCOL_VERSION}/{kind.__name__}.json"
    schema["description"] = CONTEXT_LIMITS if kind in _CONTEXTS else LIMITS
    return schema


def json_schemas() -> dict[str, dict[str, Any]]:
    """File name → JSON Schema, one per message, event context and result, plus the actions."""
    schemas = {f"{name}.json": _schema(kind) for name, kind in MESSAGES.items()}
    actions: dict[str, Any] = msgspec.json.schema(HookAction)
    actions["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    actions["$id"] = f"https://hookbus.dev/schema/v{PROTOCOL_VERSION}/HookAction.json"
    actions["description"] = LIMITS
    schemas["HookAction.json"] = actions
    return schemas


def asyncapi() -> dict[str, Any]:
    """An AsyncAPI 3.0 document of the channels (Redis keys under the default prefix).

    Key layout 2 puts literal Redis Cluster hash tags in key names (``hookbus:events:{e0.0}``):
    a parameter that stands for one is documented as including its braces."""

    def ref(name: str) -> dict[str, str]:
        return {"$ref": f"#/components/messages/{name}"}

    partition = (
        "The partition's hash tag, braces included: `{e0.0}` for events and `{d0.0}` "
        "for decisions on a bus of one partition (HOOKBUS_PARTITIONS); a session's "
        "partition is crc32(session id) mod N (docs/protocol.md 2)"
    )
    hook = (
        "The hook's name as a hash tag, braces included: `{SecretGuard}`; shard k > 0 of "
        "its requests: `{SecretGuard#k.j}` (docs/protocol.md 2)"
    )
    tenant = "The tenant's name as a hash tag, braces included: `{acme}`"
    owner = "The client's own id (a coordinator's, an agent's)"
    channels = {
        "events": ("hookbus:events:{partition}",
                   "The lifecycle events of one partition's sessions (stream; one consumer "
                   "group per async hook)", ["EventMessage"], {"partition": partition}),
        "hookRequests": ("hookbus:hook:{hook}:requests",
                         "Requests for one sync hook (stream; group `workers`)", ["HookRequest"],
                         {"hook": hook}),
        "inbox": ("hookbus:inbox:{owner}",
                  "Replies for one coordinator or trusted agent (list)",
                  ["HookReply", "DecisionReply"], {"owner": owner}),
        "decisions": ("hookbus:decisions:{partition}",
                      "Trusted agents' requests to the coordinator service, one stream per "
                      "partition (group `coordinators`)", ["DecisionRequest", "CancelRequest"],
                      {"partition": partition}),
        "tenantDecisions": ("hookbus:t:{tenant}:decisions",
                            "An untrusted agent's requests to the coordinator service: the only "
                            "key its tenant's credential may write (stream; group "
                            "`coordinators`)", ["DecisionRequest", "CancelRequest"],
                            {"tenant": tenant}),
        "tenantInbox": ("hookbus:t:{tenant}:inbox:{owner}",
                        "Replies to one untrusted agent of a tenant (list)", ["DecisionReply"],
                        {"tenant": tenant, "owner": owner}),
        "manifests": ("hookbus:hook:{hook}:manifest",
                      "A hook's manifest (string); its name is a member of the set "
                      "`hookbus:hooks`", ["HookManifest"], {"hook": hook}),
        "control": ("hookbus:control", "Announcements (pub/sub)", ["ControlMessage"], {}),
        "audit": ("hookbus:audit",
                  "The audit trail: answers not applied (warn, dryrun, break-glass) and "
                  "break-glass switches (stream; followed by the audit log hook)",
                  ["AuditRecord"], {}),
        "breakglass": ("hookbus:breakglass",
                       "The break-glass switch (string with a TTL, set by operators)",
                       ["BreakGlass"], {}),
    }  # fmt: skip
    operations = {
        "publishEvent": ("send", "events"),
        "consumeEvents": ("receive", "events"),
        "requestHook": ("send", "hookRequests"),
        "serveHook": ("receive", "hookRequests"),
        "readReplies": ("receive", "inbox"),
        "askCoordinator": ("send", "decisions"),
        "askCoordinatorAsTenant": ("send", "tenantDecisions"),
        "readTenantReplies": ("receive", "tenantInbox"),
        "registerHook": ("send", "manifests"),
        "announce": ("send", "control"),
        "recordAudit": ("send", "audit"),
        "followAudit": ("receive", "audit"),
        "breakGlass": ("send", "breakglass"),
    }
    components = {
        name: {"name": name, "contentType": "application/json",
               "payload": {"$ref": f"https://hookbus.dev/schema/v{PROTOCOL_VERSION}/{name}.json"}}
        for name in ("EventMessage", "HookRequest", "HookReply", "HookManifest",
                     "DecisionRequest", "DecisionReply", "CancelRequest", "ControlMessage",
                     "AuditRecord", "BreakGlass")
    }  # fmt: skip
    return {
        "asyncapi": "3.0.0",
        "info": {
            "title": "HookBus",
            "version": str(PROTOCOL_VERSION),
            "description": (
                "Lifecycle-hook events and decisions for AI agents over Redis. On streams each "
                f"entry has one field `{DATA_FIELD}` holding the JSON message; messages are at "
                f"most {MAX_MESSAGE_BYTES} bytes, {MAX_DEPTH} levels deep and "
                f"{MAX_CONTAINERS} arrays and objects; a context at most {MAX_CONTEXT_BYTES} "
                f"bytes and {MAX_CONTEXT_DEPTH} levels deep. See docs/protocol.md 1.2."
            ),
        },
        "defaultContentType": "application/json",
        "servers": {"redis": {"host": "localhost:6379", "protocol": "redis"}},
        "channels": {
            key: {
                "address": address,
                "description": text,
                "messages": {m: ref(m) for m in messages},
                **(
                    {"parameters": {n: {"description": d} for n, d in params.items()}}
                    if params
                    else {}
                ),
            }
            for key, (address, text, messages, params) in channels.items()
        },
        "operations": {
            op: {"action": action, "channel": {"$ref": f"#/channels/{channel}"}}
            for op, (action, channel) in operations.items()
        },
        "components": {"messages": components},
    }


def render() -> dict[str, str]:
    """Every generated file: relative path → text."""
    files = {
        name: json.dumps(s, indent=2, sort_keys=True) + "\n" for name, s in json_schemas().items()
    }
    files["asyncapi.json"] = json.dumps(asyncapi(), indent=2, sort_keys=True) + "\n"
    return files


def export(directory: Path) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in render().items():
        path = directory / name
        path.write_text(text)
        written.append(path)
    return written


def drift(directory: Path) -> list[str]:
    """Files that differ from what the code generates (missing, changed or extra)."""
    expected = render()
    problems = []
    for name, text in expected.items():
        path = directory / name
        if not path.exists():
            problems.append(f"{name}: missing")
        elif path.read_text() != text:
            problems.append(f"{name}: differs from the code")
    for path in directory.glob("*.json"):
        if path.name not in expected:
            problems.append(f"{path.name}: no longer generated")
    return problems
