"""The modules that decide outcomes import no transport and no tracing library."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

CORE = [
    "actions",
    "aggregation",
    "breakglass",
    "context_dedup",
    "dispatch",
    "errors",
    "events",
    "hooks",
    "limits",
    "matcher",
    "protocol",
    "ratelog",
    "registry",
    "runner",
    "selection",
    "settings",
]
FORBIDDEN = ("redis", "faststream", "opentelemetry")
BUS = Path(__file__).resolve().parent.parent / "bus"


def imported_modules(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


@pytest.mark.parametrize("module", CORE)
def test_core_module_is_pure(module: str) -> None:
    imports = imported_modules(BUS / f"{module}.py")
    offending = sorted(m for m in imports if m.split(".")[0] in FORBIDDEN)
    assert offending == [], f"bus/{module}.py imports {offending}"
    # and transitively: a core module may only lean on other core modules within bus/
    inner = {m.split(".")[1] for m in imports if m.startswith("bus.")}
    assert inner <= set(CORE), f"bus/{module}.py reaches outside the core: {inner - set(CORE)}"
