"""The layout shows the architecture, and the imports keep to it.

Rooms, from the bottom up: the pure core (``bus``'s top-level modules: what decides an
outcome, with no transport and no tracing library), tracing (``bus.telemetry``), the Redis
transport (``bus.transport``), the hooks HookBus ships (``workers.builtins``), integrations
(``workers.integrations``), the long-running processes (``workers.services``), the operator's
kit (``workers.ops``), this machine's servers and stacks (``workers.local``), the agent side
(``agent_adapter``), the hook author's harness (``workers.testing``) and the command line
(``workers.cli``). A module imports only from its own room or a room below it, lazily or not,
for type checking or not; and no two modules import each other, however far round.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("bus", "workers", "agent_adapter")
#: Each room and its floor; a room may import its own floor and those below.
FLOORS = {
    "bus": 0,
    "bus.telemetry": 1,
    "bus.transport": 2,
    "workers.builtins": 3,
    "workers.integrations": 4,
    "workers.services": 5,
    "workers.ops": 6,
    "workers.local": 7,
    "agent_adapter": 8,
    "agent_adapter.integrations": 8,
    "workers": 9,
    "workers.cli": 10,
}
FORBIDDEN_IN_CORE = ("redis", "faststream", "opentelemetry", "workers", "agent_adapter")
#: A module longer than this says why in its opening comment (docstring).
LONG = 600


def room(module: str) -> str:
    """The deepest room ``module`` is in (``bus.transport.keys`` → ``bus.transport``)."""
    return max((r for r in FLOORS if module == r or module.startswith(r + ".")), key=len)


def module_of(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


SOURCES = sorted(p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py"))
MODULES = {module_of(p) for p in SOURCES}


def imported(path: Path) -> set[str]:
    """Every module ``path`` imports, at any depth of the file, as the module itself when a
    ``from X import Y`` names a submodule Y."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(
                f"{node.module}.{a.name}"
                for a in node.names
                if f"{node.module}.{a.name}" in MODULES
            )
    return names


def test_the_rooms_exist() -> None:
    # a renamed room would make the tests below vacuous
    for name in FLOORS:
        assert (ROOT / name.replace(".", "/") / "__init__.py").exists(), name
    assert len(SOURCES) > 60


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_imports_go_down_or_stay_in_the_room(path: Path) -> None:
    here = room(module_of(path))
    for name in imported(path):
        if name.split(".")[0] not in PACKAGES:
            continue
        there = room(name)
        assert FLOORS[there] <= FLOORS[here], (
            f"{path.relative_to(ROOT)} ({here}) imports {name} ({there}), a room above it"
        )


@pytest.mark.parametrize(
    "path", [p for p in SOURCES if room(module_of(p)) == "bus"], ids=lambda p: p.name
)
def test_the_core_imports_no_transport_tracing_or_service(path: Path) -> None:
    offending = sorted(m for m in imported(path) if m.split(".")[0] in FORBIDDEN_IN_CORE)
    offending += sorted(m for m in imported(path) if m.startswith("bus.") and room(m) != "bus")
    assert offending == [], f"bus/{path.name} imports {offending}"


def test_no_import_circles() -> None:
    """Between modules of the packages, lazy and type-checking imports included."""
    graph = {module_of(p): {m for m in imported(p) if m in MODULES} for p in SOURCES}
    # a package's own __init__ is imported on the way to its modules: not an edge back
    for mod, deps in graph.items():
        deps.discard(mod)
        deps -= {d for d in deps if mod.startswith(d + ".")}
    circles: list[list[str]] = []
    state: dict[str, int] = {}  # 1 on the path, 2 done

    def visit(mod: str, path: list[str]) -> None:
        state[mod] = 1
        for dep in sorted(graph.get(mod, ())):
            if state.get(dep) == 1:
                circles.append([*path[path.index(dep) :], dep])
            elif dep not in state:
                visit(dep, [*path, dep])
        state[mod] = 2

    for mod in sorted(graph):
        if mod not in state:
            visit(mod, [mod])
    assert circles == [], "import circles: " + "; ".join(" → ".join(c) for c in circles)


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_a_long_module_says_why(path: Path) -> None:
    text = path.read_text()
    if text.count("\n") <= LONG:
        return
    doc = ast.get_docstring(ast.parse(text)) or ""
    assert "Why one module" in doc, (
        f"{path.relative_to(ROOT)} has {text.count(chr(10))} lines: split it, or say in its "
        "opening docstring why it is one module (a paragraph starting 'Why one module')"
    )


def test_the_command_line_lives_with_the_services() -> None:
    assert not (ROOT / "bus" / "cli.py").exists() and not (ROOT / "bus" / "testing.py").exists()
    assert (ROOT / "workers" / "cli" / "__init__.py").exists()


def test_readme_lists_the_rooms_in_the_order_imports_may_go() -> None:
    """README's Layout table names every room, in the order of the floors above."""
    readme = (ROOT / "README.md").read_text()
    table = readme[readme.index("## Layout") : readme.index("## Benchmarks")]
    rows = re.findall(r"^\| `([a-z_/.]+?)/?` \|", table, re.M)
    rooms = [r.removesuffix(".py").replace("/", ".") for r in rows]
    named = [r for r in rooms if r in FLOORS or r == "workers.testing"]
    floors = [FLOORS.get(r, FLOORS["workers"]) for r in named]
    assert floors == sorted(floors), named
    assert set(FLOORS) - {"workers", "agent_adapter.integrations"} <= set(named), named
