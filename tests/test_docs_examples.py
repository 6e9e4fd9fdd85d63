"""Every ```python block in README.md and docs/*.md runs, and every hookbus command in their
shell blocks parses. docs/writing-hooks.md is followed for real, top to bottom, in a directory
of its own by tests/test_writing_hooks_guide.py."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
GUIDE = ROOT / "docs" / "writing-hooks.md"
DOCS = [ROOT / "README.md", *sorted(p for p in (ROOT / "docs").glob("*.md") if p != GUIDE)]
BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)


def blocks() -> list[tuple[str, str]]:
    found = []
    for doc in DOCS:
        for i, code in enumerate(BLOCK.findall(doc.read_text())):
            found.append((f"{doc.name}#{i}", code))
    return found


@pytest.mark.parametrize(("where", "code"), blocks(), ids=[w for w, _ in blocks()])
def test_doc_example_runs(where: str, code: str) -> None:
    exec(compile(code, where, "exec"), {"__name__": "__doc_example__"})


SH_BLOCK = re.compile(r"^```sh\n(.*?)^```", re.S | re.M)


def hookbus_commands() -> list[tuple[str, list[str]]]:
    """Every ``hookbus ...`` command in the docs' shell blocks (env assignments stripped)."""
    import shlex

    found = []
    for doc in DOCS:
        for block in SH_BLOCK.findall(doc.read_text()):
            for line in block.splitlines():
                if "hookbus " not in line:
                    continue
                try:
                    words = shlex.split(line.split(" #")[0])
                except ValueError:  # not a shell line we can read (a JSON payload, say)
                    continue
                while words and "=" in words[0]:
                    words = words[1:]
                if words[-1:] == ["&"]:  # started in the background
                    words = words[:-1]
                if "|" in words:  # piped on: the hookbus command is what comes before
                    words = words[: words.index("|")]
                if words[:1] == ["hookbus"]:
                    found.append((f"{doc.name}: {line.strip()}", words[1:]))
    return found


@pytest.mark.parametrize(
    ("where", "argv"), hookbus_commands(), ids=[w for w, _ in hookbus_commands()]
)
def test_doc_commands_exist(where: str, argv: list[str]) -> None:
    """Each hookbus command the docs show parses, and the hook classes it names import (some
    are configured by the environment of the shell session shown: they are not made here)."""
    import importlib

    from bus.hooks import AgentHook, AsyncAgentHook
    from workers.cli import build_parser

    args = build_parser().parse_args(argv)
    if getattr(args, "hook", None) and ":" in args.hook:
        module, _, name = args.hook.partition(":")
        hook = getattr(importlib.import_module(module), name)
        assert issubclass(hook, AgentHook | AsyncAgentHook), args.hook


def test_the_guide_shows_the_real_example_hook() -> None:
    guide = (ROOT / "docs" / "writing-hooks.md").read_text()
    first = BLOCK.findall(guide)[0]
    assert first == (ROOT / "examples" / "hooks" / "no_secrets.py").read_text()
    assert len(first.splitlines()) < 30
