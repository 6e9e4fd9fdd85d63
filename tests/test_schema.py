"""The committed JSON Schema and AsyncAPI documents match the code."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

from bus.schema import drift, render
from bus.transport.keys import Keys
from tests.harness import ROOT

SCHEMA_DIR = ROOT / "docs" / "schema"


def test_committed_schema_matches_the_code() -> None:
    assert drift(SCHEMA_DIR) == [], "run `hookbus schema export` and commit docs/schema/"


def test_drift_is_detected(tmp_path: Path) -> None:
    for name, text in render().items():
        (tmp_path / name).write_text(text)
    doc = json.loads((tmp_path / "HookRequest.json").read_text())
    doc["$defs"]["HookRequest"]["properties"].pop("deadline")
    (tmp_path / "HookRequest.json").write_text(json.dumps(doc))
    (tmp_path / "Stale.json").write_text("{}")
    assert sorted(drift(tmp_path)) == [
        "HookRequest.json: differs from the code",
        "Stale.json: no longer generated",
    ]
    out = subprocess.run(
        [sys.executable, "-m", "workers.cli", "schema", "export", "--check",
         "--out", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert out.returncode == 1 and "schema drift" in out.stderr


def test_asyncapi_names_every_channel_and_message() -> None:
    doc = json.loads((SCHEMA_DIR / "asyncapi.json").read_text())
    assert doc["asyncapi"] == "3.0.0"
    addresses = {c["address"] for c in doc["channels"].values()}
    assert {
        "hookbus:events:{partition}",
        "hookbus:decisions:{partition}",
        "hookbus:inbox:{owner}",
        "hookbus:t:{tenant}:decisions",
        "hookbus:t:{tenant}:inbox:{owner}",
    } <= addresses
    for op in doc["operations"].values():
        assert op["channel"]["$ref"].removeprefix("#/channels/") in doc["channels"]
    # Every parameter of an address is described, hash tags' braces included (key layout 2).
    for channel in doc["channels"].values():
        named = set(re.findall(r"\{(\w+)\}", channel["address"]))
        assert named == set(channel.get("parameters", {})), channel
    assert "CancelRequest" in doc["channels"]["tenantDecisions"]["messages"]
    # The tenant's channels and the hooks' are what bus/transport/keys.py names, once a parameter is
    # filled.
    keys = Keys("hookbus")
    assert keys.tenant_decisions("acme") == "hookbus:t:{tenant}:decisions".replace(
        "{tenant}", "{acme}"
    )
    assert keys.requests("Guard", 2, 3) == "hookbus:hook:{hook}:requests".replace(
        "{hook}", "{Guard#2.1}"
    )
    assert keys.event_partitions[0] == "hookbus:events:{partition}".replace("{partition}", "{e0.0}")
    assert keys.decision_partitions[0] == "hookbus:decisions:{partition}".replace(
        "{partition}", "{d0.0}"
    )
