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


#: What decides an outcome, in any transport: these never see the wire (messages, keys, Redis).
SEMANTIC = ["actions", "aggregation", "events", "hooks", "matcher", "registry", "runner"]
#: The wire layer: message types, key names, Redis I/O and the distributed roles built on them.
WIRE = [
    "transport.coordinator",
    "transport.directory",
    "transport.keys",
    "protocol",
    "transport.redis_io",
    "transport.retention",
    "schema",
]
ROOT = BUS.parent


def test_the_wire_modules_exist() -> None:
    # a renamed wire module would make the test below vacuous
    assert all((BUS / f"{m.replace('.', '/')}.py").exists() for m in WIRE + SEMANTIC)


@pytest.mark.parametrize("module", SEMANTIC)
def test_semantic_core_never_imports_the_wire_layer(module: str) -> None:
    """Not even for type checking (``if TYPE_CHECKING:`` imports are seen by ast.walk too):
    the cycle hooks → protocol → breakglass → hooks is what this keeps out."""
    imports = imported_modules(BUS / f"{module}.py")
    wire = sorted(m for m in imports if m.startswith("bus.") and m[4:] in WIRE)
    assert wire == [], f"bus/{module}.py imports the wire layer: {wire}"
    from_bus = {
        alias.name
        for node in ast.walk(ast.parse((BUS / f"{module}.py").read_text()))
        if isinstance(node, ast.ImportFrom) and node.module == "bus"
        for alias in node.names
    }
    assert from_bus.isdisjoint(WIRE), f"bus/{module}.py imports {sorted(from_bus & set(WIRE))}"


@pytest.mark.parametrize("path", sorted(BUS.rglob("*.py")), ids=lambda p: p.name)
def test_bus_never_imports_the_services(path: Path) -> None:
    """``bus`` is the core: the services (workers/, with the command line) and the agent side
    (agent_adapter/) build on it, never the other way round."""
    imports = imported_modules(path)
    outside = sorted(m for m in imports if m.split(".")[0] in ("workers", "agent_adapter"))
    assert outside == [], f"bus/{path.name} imports {outside}"


def test_the_command_line_lives_with_the_services() -> None:
    assert not (BUS / "cli.py").exists() and not (BUS / "testing.py").exists()
    assert (ROOT / "workers" / "cli" / "__init__.py").exists()
