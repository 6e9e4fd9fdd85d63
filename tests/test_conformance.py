"""Conformance vectors: the same hooks, one event, one expected result, in every mode.

Each ``tests/conformance/*.json`` file holds:

* ``description``: what the vector shows;
* ``hooks``: a list of ``HookConfig`` objects (``tests/remote_hooks.py``) in wire form — name,
  priority, events, ``answers`` (event name → tagged action), ``names``/``content`` match
  patterns, ``raises``, ``delay``, ``timeout``, ``failure_policy``;
* ``event`` and ``context``: one event, the context as it travels on the wire (section 4 of
  ``docs/protocol.md``);
* ``expect``: fields of the aggregated result in wire form (section 5.3). Each listed field must
  equal the result's, except ``skipped`` and ``tagged_contexts``: their entries are compared on
  the keys the vector gives (so a vector may leave out ``detail`` or ``timestamp``), and the
  lists must have the same length.

Here every vector runs through the Python API, embedded and distributed; the foreign clients'
test (``tests/test_foreign_clients.py``) runs the same vectors through the coordinator service.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec
import pytest

import bus
from bus import HookEvent
from bus.runner import RUN_METHODS
from tests.remote_hooks import HookConfig

VECTORS_DIR = Path(__file__).resolve().parent / "conformance"
VECTOR_FILES = sorted(VECTORS_DIR.glob("*.json"))
# Lists whose entries are compared on the keys the vector gives.
PARTIAL_LISTS = frozenset({"skipped", "tagged_contexts"})


def load_vector(path: Path) -> dict[str, Any]:
    vector: dict[str, Any] = json.loads(path.read_text())
    vector["name"] = path.stem
    return vector


def vector_hooks(vector: dict[str, Any]) -> list[HookConfig]:
    return [msgspec.convert(entry, HookConfig) for entry in vector["hooks"]]


def mismatches(expect: dict[str, Any], result: dict[str, Any]) -> list[str]:
    """What differs between a vector's ``expect`` and a wire-form result (empty: it conforms)."""
    problems = []
    for key, want in expect.items():
        if key not in result:
            problems.append(f"{key}: missing from the result")
            continue
        got = result[key]
        if key in PARTIAL_LISTS and isinstance(want, list) and isinstance(got, list):
            seen = [{k: g.get(k) for k in w} for g, w in zip(got, want, strict=False)]
            if len(got) != len(want) or seen != want:
                problems.append(f"{key}: expected {want}, got {got}")
        elif got != want:
            problems.append(f"{key}: expected {want!r}, got {got!r}")
    return problems


def test_there_are_enough_vectors() -> None:
    assert len(VECTOR_FILES) >= 6, VECTOR_FILES
    for path in VECTOR_FILES:
        vector = load_vector(path)
        assert {"description", "hooks", "event", "context", "expect"} <= vector.keys(), path
        assert HookEvent(vector["event"]) in RUN_METHODS, path
        names = [h.name for h in vector_hooks(vector)]
        assert len(names) == len(set(names)), f"{path.name}: hook names must be unique"


@pytest.mark.parametrize("path", VECTOR_FILES, ids=lambda p: p.stem)
async def test_vector(harness: Any, path: Path) -> None:
    vector = load_vector(path)
    event = HookEvent(vector["event"])
    ctx = msgspec.convert(vector["context"], bus.CONTEXT_TYPES[event])
    runner = await harness.start(*vector_hooks(vector))
    result = await runner.run(event, ctx)
    wire = json.loads(msgspec.json.encode(result))  # the result as it travels on the wire
    assert not mismatches(vector["expect"], wire), (vector["description"], wire)
