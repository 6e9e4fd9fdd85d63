"""Small real tools for the reference runtime, confined to a sandbox folder.

``file_read``, ``file_write``, ``run_shell`` and ``search_corpus`` do real work (files in the
sandbox, a shell command run in it, a search over a small local corpus). Each tool declares its
arguments, so a call with arguments of the wrong shape gets a clear error instead of a crash,
its kind (read, edit, exec) for the permission modes, and optionally a tool-level permission
rule (P1/P6 in the precedence table).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent_adapter.permissions import ToolKind, Verdict
from bus import PermissionDecision

ToolFn = Callable[[dict[str, Any]], Awaitable[str]]
ToolRule = Callable[[Mapping[str, Any]], Verdict | None]


class ToolFailed(Exception):
    """A tool could not do what was asked; its message goes back to the LLM as an error."""


@dataclass(frozen=True)
class Tool:
    """One tool the LLM may call."""

    name: str
    description: str
    kind: ToolKind
    params: dict[str, type]
    run: ToolFn = field(repr=False)
    rule: ToolRule | None = field(default=None, repr=False)

    def validate(self, args: Any) -> str | None:
        """Why ``args`` cannot be passed to this tool, or None if they can."""
        if not isinstance(args, Mapping):
            return f"{self.name} takes an object of arguments, got {type(args).__name__}"
        missing = [p for p in self.params if p not in args]
        if missing:
            return f"{self.name} is missing argument(s): {', '.join(missing)}"
        unknown = [a for a in args if a not in self.params]
        if unknown:
            return f"{self.name} does not take argument(s): {', '.join(map(str, unknown))}"
        for name, typ in self.params.items():
            if not isinstance(args[name], typ):
                return (
                    f"{self.name}: argument {name!r} must be {typ.__name__}, "
                    f"got {type(args[name]).__name__}"
                )
        return None


class Toolbox:
    """The tools of one agent, by name."""

    def __init__(self, tools: list[Tool] | None = None) -> None:
        self._tools: dict[str, Tool] = {}
        for tool in tools or []:
            self.add(tool)

    def add(self, tool: Tool) -> None:
        self._tools[tool.name] = tool

    def get(self, name: str) -> Tool | None:
        return self._tools.get(name)

    @property
    def names(self) -> list[str]:
        return sorted(self._tools)


def _inside(root: Path, path: str) -> Path:
    target = (root / path).resolve()
    if not target.is_relative_to(root.resolve()):
        raise ToolFailed(f"path {path!r} is outside the sandbox")
    return target


def sandbox_tools(root: Path, corpus: Mapping[str, str] | None = None) -> Toolbox:
    """The four reference tools, working inside ``root``."""
    root.mkdir(parents=True, exist_ok=True)
    documents = dict(corpus or {})

    async def file_read(args: dict[str, Any]) -> str:
        path = _inside(root, args["path"])
        if not path.is_file():
            raise ToolFailed(f"no such file: {args['path']}")
        return path.read_text()

    async def file_write(args: dict[str, Any]) -> str:
        path = _inside(root, args["path"])
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(args["content"])
        return f"wrote {len(args['content'])} characters to {args['path']}"

    async def run_shell(args: dict[str, Any]) -> str:
        proc = await asyncio.create_subprocess_shell(
            args["command"],
            cwd=root,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        try:
            out, _ = await asyncio.wait_for(proc.communicate(), 10)
        except TimeoutError:
            proc.kill()
            await proc.wait()
            raise ToolFailed("command ran past 10 s and was killed") from None
        text = out.decode(errors="replace")
        if proc.returncode:
            raise ToolFailed(f"exit status {proc.returncode}: {text.strip()}")
        return text

    async def search_corpus(args: dict[str, Any]) -> str:
        words = args["query"].lower().split()
        hits = [
            f"{title}: {text}"
            for title, text in documents.items()
            if all(w in (title + " " + text).lower() for w in words)
        ]
        return "\n".join(hits) if hits else f"no document matches {args['query']!r}"

    def shell_rule(args: Mapping[str, Any]) -> Verdict | None:
        command = str(args.get("command", ""))
        if "rm -rf" in command:
            return Verdict(PermissionDecision.DENY, "recursive deletion is never allowed")
        return Verdict(PermissionDecision.ASK, "shell commands need confirmation")

    return Toolbox(
        [
            Tool("file_read", "Read a file", ToolKind.READ, {"path": str}, file_read),
            Tool(
                "file_write",
                "Write a file",
                ToolKind.EDIT,
                {"path": str, "content": str},
                file_write,
            ),
            Tool(
                "run_shell", "Run a command", ToolKind.EXEC, {"command": str}, run_shell, shell_rule
            ),
            Tool("search_corpus", "Search documents", ToolKind.READ, {"query": str}, search_corpus),
        ]
    )
