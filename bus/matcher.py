"""Tool-level filtering: which tool calls a hook wants to see.

Name patterns (``ToolNamePattern.parse``):

=============  ==========================================
``"*"``        wildcard: every tool
``"file_*"``   prefix: every tool whose name starts with ``file_``
``"run_bash"`` exact name
=============  ==========================================

A ``*`` anywhere but at the end, or an empty pattern, is a PatternError.

Content patterns (strings in ``ToolMatchFilter.content_patterns``):

=================  ==========================================================================
``"key:text"``     the argument ``key`` contains ``text`` (non-string values are compared as JSON)
``"a.b:text"``     the same, for a nested argument (dotted path through dictionaries)
``"key:"``         the argument ``key`` is present
``"text"``         any string value in the arguments, at any depth, contains ``text``
=================  ==========================================================================

A filter matches when at least one name pattern matches (or there are none) **and** at least one
content pattern matches (or there are none). Matching is case-sensitive.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Literal

import msgspec

from bus.errors import PatternError

_json = msgspec.json.Encoder()


class ToolNamePattern(msgspec.Struct, frozen=True):
    """Exact, prefix or wildcard match on a tool name."""

    kind: Literal["exact", "prefix", "wildcard"]
    value: str = ""

    @classmethod
    def parse(cls, pattern: str) -> ToolNamePattern:
        """``"*"`` is a wildcard, ``"x*"`` a prefix, anything else exact."""
        if not isinstance(pattern, str) or not pattern.strip():
            raise PatternError(f"tool name pattern must be a non-empty string, got {pattern!r}")
        if pattern == "*":
            return WILDCARD
        if "*" in pattern[:-1]:
            raise PatternError(
                f"tool name pattern {pattern!r}: '*' is only allowed at the end (a prefix)"
            )
        if pattern.endswith("*"):
            return cls("prefix", pattern[:-1])
        return cls("exact", pattern)

    def matches(self, tool_name: str) -> bool:
        if self.kind == "exact":
            return tool_name == self.value
        if self.kind == "prefix":
            return tool_name.startswith(self.value)
        return True

    def __str__(self) -> str:
        return {"exact": self.value, "prefix": self.value + "*", "wildcard": "*"}[self.kind]


WILDCARD = ToolNamePattern("wildcard")


def _check_content_pattern(pattern: str) -> str:
    if not isinstance(pattern, str) or not pattern:
        raise PatternError(f"content pattern must be a non-empty string, got {pattern!r}")
    key, sep, _ = pattern.partition(":")
    if sep and (not key or any(not part for part in key.split("."))):
        raise PatternError(f"content pattern {pattern!r}: the argument name before ':' is empty")
    return pattern


def _lookup(args: Mapping[str, Any], path: str) -> tuple[bool, Any]:
    value: Any = args
    for part in path.split("."):
        if not isinstance(value, Mapping) or part not in value:
            return False, None
        value = value[part]
    return True, value


def _as_text(value: Any) -> str:
    return value if isinstance(value, str) else _json.encode(value).decode()


def _any_string_contains(value: Any, text: str) -> bool:
    if isinstance(value, str):
        return text in value
    if isinstance(value, Mapping):
        return any(_any_string_contains(v, text) for v in value.values())
    if isinstance(value, list | tuple):
        return any(_any_string_contains(v, text) for v in value)
    return False


def content_matches(pattern: str, tool_args: Mapping[str, Any]) -> bool:
    """Whether one content pattern matches the arguments (see the module docstring)."""
    key, sep, text = pattern.partition(":")
    if not sep:
        return _any_string_contains(tool_args, pattern)
    found, value = _lookup(tool_args, key)
    return found and text in _as_text(value)


class ToolMatchFilter(msgspec.Struct, frozen=True):
    """Name and content filter; the default matches every tool."""

    name_patterns: tuple[ToolNamePattern, ...] = ()
    content_patterns: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for p in self.name_patterns:
            if not isinstance(p, ToolNamePattern):
                raise PatternError(f"name_patterns must hold ToolNamePattern, got {p!r}")
        for c in self.content_patterns:
            _check_content_pattern(c)

    @classmethod
    def exact(cls, name: str) -> ToolMatchFilter:
        if not isinstance(name, str) or not name.strip() or "*" in name:
            raise PatternError(f"exact tool name must be non-empty and without '*': {name!r}")
        return cls((ToolNamePattern("exact", name),))

    @classmethod
    def prefix(cls, prefix: str) -> ToolMatchFilter:
        if not isinstance(prefix, str) or not prefix.strip() or "*" in prefix:
            raise PatternError(f"tool prefix must be non-empty and without '*': {prefix!r}")
        return cls((ToolNamePattern("prefix", prefix),))

    @classmethod
    def parse(cls, names: Iterable[str] = (), content: Iterable[str] = ()) -> ToolMatchFilter:
        """Build a filter from pattern strings, e.g. ``parse(["file_*"], ["path:.env"])``."""
        if isinstance(names, str) or isinstance(content, str):
            raise PatternError("parse() takes lists of patterns, not a single string")
        return cls(tuple(ToolNamePattern.parse(n) for n in names), tuple(content))

    def is_match_all(self) -> bool:
        """True when the filter lets every tool call through."""
        names_all = not self.name_patterns or any(p.kind == "wildcard" for p in self.name_patterns)
        return names_all and not self.content_patterns

    def matches(self, tool_name: str, tool_args: Mapping[str, Any] | None = None) -> bool:
        if self.name_patterns and not any(p.matches(tool_name) for p in self.name_patterns):
            return False
        if self.content_patterns:
            args = tool_args or {}
            return any(content_matches(c, args) for c in self.content_patterns)
        return True

    def to_strings(self) -> tuple[list[str], list[str]]:
        """The pattern strings this filter was parsed from (the manifest form)."""
        return [str(p) for p in self.name_patterns], list(self.content_patterns)


MATCH_ALL = ToolMatchFilter()
