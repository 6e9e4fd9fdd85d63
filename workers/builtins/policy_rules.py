"""The policy rules file (workers/builtins/policy.py): its format, read and checked into
``Rules``, and how paths and shell commands are read before they are matched. Pure: no I/O but
``load_rules``'s read of the file, no hook, no Redis.

Every pattern is compiled by RE2 (``google-re2``), which matches in time linear in the input
and refuses what it cannot do so (backreferences, lookaround).
"""

from __future__ import annotations

import posixpath
import sys
import tomllib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec
import re2  # type: ignore[import-untyped]

from bus.errors import ConfigError
from bus.matcher import ToolNamePattern

DECISIONS = ("deny", "ask", "allow", "context", "rewrite", "redact")
#: Where each decision can be answered, the default first.
EVENTS: dict[str, tuple[str, ...]] = {
    "deny": ("PreToolUse", "PermissionRequest"),
    "ask": ("PreToolUse", "PermissionRequest"),
    "allow": ("PermissionRequest",),
    "context": ("PermissionRequest",),
    "rewrite": ("PreToolUse",),
    "redact": ("PostToolUse", "PostToolUseFailure"),
}
DEFAULT_EVENTS = {d: e if d == "redact" else (e[0],) for d, e in EVENTS.items()}
#: Decisions where the first matching rule decides (in this order of precedence).
FIRST_MATCH = ("deny", "ask", "allow", "context")
RULE_KEYS = frozenset(
    {"name", "description", "decision", "events", "tools", "args", "any_arg", "output",
     "tenants", "session", "reason", "context", "rewrite"}
)  # fmt: skip
TOP_KEYS = frozenset({"version", "paths", "rule"})
PATH_KEYS = frozenset({"case"})
#: Arguments holding a path (Claude Code's Read/Write/Edit: file_path; NotebookEdit:
#: notebook_path; the reference runtime's file_* and MCP's filesystem server: path, paths,
#: source, destination), and a shell command.
PATH_ARGS = ("file_path", "path", "notebook_path", "paths", "source", "destination")
COMMAND_ARGS = ("command", "cmd")
#: Tools whose ``Tool(spec)`` is a command (a prefix with ``:*``); any other tool's is a path glob.
SHELL_TOOLS = ("Bash", "run_shell", "shell", "PowerShell")
TENANT_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-")
#: Whether "platform" folds case here. The default is to fold everywhere: a policy service often
#: runs on another platform than its agents (a Linux service for macOS laptops, whose file
#: systems fold case), and a deny that also matches ``.ENV`` on Linux errs on the safe side.
FOLDS_CASE = sys.platform in ("win32", "darwin")

_OPTIONS = re2.Options()
_OPTIONS.max_mem = 64 << 20  # a big pattern's automaton; refused past it, never slow


class PolicyError(ConfigError):
    """A rules file that cannot be used: one line per problem."""

    def __init__(self, problems: Sequence[str]) -> None:
        self.problems = list(problems)
        super().__init__("; ".join(self.problems))


def regex(pattern: str, where: str) -> Any:
    """``pattern`` compiled by RE2, or a ValueError saying where and why not."""
    if not isinstance(pattern, str) or not pattern:
        raise ValueError(f"{where}: a pattern must be a non-empty string")
    try:
        return re2.compile(pattern, _OPTIONS)
    except re2.error as exc:
        raise ValueError(
            f"{where}: {pattern!r} is not an RE2 pattern ({exc}); RE2 has no backreferences "
            "or lookaround, which is what keeps matching linear"
        ) from None


def as_text(value: Any) -> str:
    """A value as patterns see it: a string as is, true/false, else compact JSON."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return value if isinstance(value, str) else msgspec.json.encode(value).decode()


# -- paths and commands ----------------------------------------------------------------------


def norm_path(path: str, cwd: str = "", fold: bool = True) -> str:
    """``path`` as rules see it: backslashes as slashes, doubled slashes, ``.`` and ``..``
    resolved lexically, trailing dots and spaces of each name dropped and an NTFS stream
    (``.env::$DATA``) cut off (Windows opens the same file), a drive letter's case folded,
    case folded where ``fold``, and made relative to ``cwd`` when it lies inside it
    (``/proj/.env`` with cwd ``/proj`` is ``.env``)."""
    path = path.strip().replace("\\", "/")
    if not path:
        return ""
    root = ""
    if len(path) >= 2 and path[1] == ":" and path[0].isascii() and path[0].isalpha():
        root, path = path[:2].lower(), path[2:]
    absolute = path.startswith("/")
    parts: list[str] = []
    for name in path.split("/"):
        if ":" in name:
            name = name.split(":", 1)[0] or name
        if name not in (".", ".."):
            name = name.rstrip(". ") or name
        if name in ("", "."):
            continue
        if name == "..":
            if parts and parts[-1] != "..":
                parts.pop()
            elif not absolute:
                parts.append("..")
            continue
        parts.append(name)
    out = root + ("/" if absolute else "") + "/".join(parts)
    if absolute and cwd:
        base = norm_path(cwd, "", fold)
        seen = out.casefold() if fold else out
        inside = seen == base or seen.startswith(base.rstrip("/") + "/")
        if (base.startswith("/") or base[1:3] == ":/") and inside:
            out = seen[len(base) :].lstrip("/") or "."
    out = out or "."
    return out.casefold() if fold else out


_SEPARATORS = re2.compile(r"\|\||&&|[;|&\n(){}]|`")
_ASSIGNMENT = re2.compile(r"^[A-Za-z_][A-Za-z0-9_]*=\S*$")
#: Words before a command that run it (or are shell syntax around it): skipped in loose mode.
_WRAPPERS = frozenset(
    {"sudo", "exec", "command", "builtin", "nohup", "time", "env", "nice", "!", "if", "then",
     "else", "elif", "do", "while", "until"}
)  # fmt: skip
_SHELLS = frozenset({"sh", "bash", "zsh", "dash", "ksh"})


def simple_commands(command: str, loose: bool = True, depth: int = 0) -> list[str]:
    """A shell line's simple commands (split at ``;``, ``&&``, ``||``, ``|``, ``&``, newlines,
    parentheses, braces, backticks), each with whitespace collapsed: what ``Bash(prefix:*)``
    is matched against. ``loose`` (for deny and ask, where matching more is safe) also drops
    leading ``VAR=value`` assignments, wrappers and keywords (``sudo``, ``env``, ``then``…),
    quotes and backslashes in the program's name and its directory (``/bin/rm``, ``"rm"``,
    ``\\rm`` → ``rm``), and looks into ``bash -c '…'``. Allow and context rules see each
    command as written, since ``LD_PRELOAD=x ls`` or ``/tmp/ls`` is not ``ls``.
    Over-splitting (a ``;`` inside quotes) only makes a deny match more, and an allow less."""
    found = []
    for part in _SEPARATORS.split(command):
        words = part.split()
        while loose and words and (_ASSIGNMENT.match(words[0]) or words[0] in _WRAPPERS):
            words.pop(0)
        if loose and words:
            words[0] = posixpath.basename(
                words[0].replace('"', "").replace("'", "").replace("\\", "")
            )
            if words[0] in _SHELLS and "-c" in words and depth < 3:
                inner = " ".join(words[words.index("-c") + 1 :]).strip("'\"")
                found.extend(simple_commands(inner, loose, depth + 1))
        if words and words[0]:
            found.append(" ".join(words))
    return found


def glob_regex(glob: str, fold: bool) -> str:
    """A path glob as an RE2 pattern over a normalised path: ``**`` any number of names, ``*``
    and ``?`` within one name; anchored at the session's directory when it starts with ``./``
    or ``/`` (``//`` for an absolute path), else matched at any depth when it has no ``/``
    (``.env``), as in ``.gitignore`` and Claude Code's rules."""
    if glob.startswith("//"):
        anchored, body = "^/", glob[2:]
    elif glob.startswith("./"):
        anchored, body = "^", glob[2:]
    elif glob.startswith("/"):
        anchored, body = "^", glob[1:]
    elif "/" not in glob.rstrip("/"):
        anchored, body = "^(?:.*/)?", glob
    else:
        anchored, body = "^", glob
    body = norm_path(body, fold=fold)
    out, i = [], 0
    while i < len(body):
        c = body[i]
        if body.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
        elif body.startswith("**", i):
            out.append(".*")
            i += 2
        elif c == "*":
            out.append("[^/]*")
            i += 1
        elif c == "?":
            out.append("[^/]")
            i += 1
        else:
            out.append(re2.escape(c))
            i += 1
    return anchored + "".join(out) + "(?:/.*)?$"


# -- rules -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class ToolPattern:
    """One entry of a rule's ``tools``: a HookBus name pattern, optionally with Claude Code's
    specifier: ``Bash(rm -rf:*)`` (a command prefix), ``Bash(git status)`` (a whole command),
    ``Read(./.env)`` (a path glob)."""

    text: str
    name: ToolNamePattern
    kind: str = ""  # "" (name only) | "prefix" | "command" | "path"
    spec: str = ""
    compiled: Any = None

    @classmethod
    def parse(cls, text: str, fold: bool, where: str) -> ToolPattern:
        if not isinstance(text, str) or not text.strip():
            raise ValueError(f"{where}: a tool pattern must be a non-empty string")
        name, paren, spec = text.partition("(")
        try:
            pattern = ToolNamePattern.parse(name.strip())
        except Exception as exc:
            raise ValueError(f"{where}: {exc}") from None
        if not paren:
            return cls(text, pattern)
        if not spec.endswith(")") or not spec[:-1].strip():
            raise ValueError(f"{where}: {text!r} must look like Tool(specifier)")
        spec = spec[:-1].strip()
        if name.strip() in SHELL_TOOLS:
            if spec.endswith(":*"):
                return cls(text, pattern, "prefix", " ".join(spec[:-2].split()))
            return cls(text, pattern, "command", " ".join(spec.split()))
        return cls(text, pattern, "path", spec, regex(glob_regex(spec, fold), where))

    def matches(self, call: Call, all_: bool) -> bool:
        """Whether this pattern matches ``call``; with ``all_`` (allow and context rules) every
        path it names, and every simple command of its line, must match."""
        if not self.name.matches(call.tool):
            return False
        if not self.kind:
            return True
        if self.kind == "path":
            hit = [bool(self.compiled.search(p)) for p in call.paths]
            return bool(hit) and (all(hit) if all_ else any(hit))
        parts = call.commands(loose=not all_)
        if self.kind == "prefix":
            hit = [p == self.spec or p.startswith(self.spec + " ") for p in parts]
        else:
            hit = [p == self.spec for p in parts]
        if all_:  # an allowed command may not redirect its output or input anywhere
            hit = [h and not any(c in p for c in "<>") for h, p in zip(hit, parts, strict=True)]
        return bool(hit) and (all(hit) if all_ else any(hit))


class Call:
    """One tool call as tool patterns see it: its paths normalised and its shell line split,
    each once however many patterns look."""

    def __init__(self, tool: str, args: Mapping[str, Any], cwd: str, fold: bool) -> None:
        self.tool, self.args, self.cwd, self.fold = tool, args, cwd, fold
        self._paths: list[str] | None = None
        self._commands: dict[bool, list[str]] = {}

    @property
    def paths(self) -> list[str]:
        if self._paths is None:
            self._paths = [norm_path(p, self.cwd, self.fold) for p in path_values(self.args)]
        return self._paths

    def commands(self, loose: bool) -> list[str]:
        if loose not in self._commands:
            lines = [v for k in COMMAND_ARGS if isinstance(v := self.args.get(k), str)]
            self._commands[loose] = [c for line in lines for c in simple_commands(line, loose)]
        return self._commands[loose]


def path_values(args: Mapping[str, Any]) -> list[str]:
    """The paths a tool call names: each of ``PATH_ARGS``, a string or a list of strings."""
    found = []
    for key in PATH_ARGS:
        value = args.get(key)
        if isinstance(value, str):
            found.append(value)
        elif isinstance(value, list):
            found.extend(v for v in value if isinstance(v, str))
    return found


@dataclass(frozen=True)
class Rule:
    name: str
    decision: str
    events: tuple[str, ...]
    index: int
    tools: tuple[ToolPattern, ...] = ()
    args: tuple[tuple[str, Any], ...] = ()
    any_arg: Any = None
    output: Any = None
    tenants: frozenset[str] | None = None
    session: tuple[tuple[str, tuple[str, ...]], ...] = ()
    reason: str = ""
    context: str = ""
    rewrite: tuple[tuple[str, Any, str], ...] = ()
    raw: Mapping[str, Any] = field(default_factory=dict, compare=False)

    def said(self, default: str) -> str:
        return f"policy rule {self.name}: {self.reason or default}"


@dataclass(frozen=True)
class Rules:
    rules: tuple[Rule, ...]
    fold: bool = True
    source: str = ""

    def for_event(self, event: str) -> list[Rule]:
        return [r for r in self.rules if event in r.events]


def _strings(value: Any, where: str) -> list[str]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
        raise ValueError(f"{where}: must be a string or a non-empty list of strings")
    return value


def parse_rules(data: Mapping[str, Any], source: str = "") -> Rules:
    """The rules of a parsed file, or a PolicyError listing every problem (one per line)."""
    problems: list[str] = []
    for key in sorted(set(data) - TOP_KEYS):
        problems.append(f"unknown key {key!r} at the top (known: {', '.join(sorted(TOP_KEYS))})")
    if data.get("version", 1) != 1:
        problems.append(f"version {data.get('version')!r}: this HookBus reads version 1")
    paths = data.get("paths", {})
    fold = True
    if not isinstance(paths, dict):
        problems.append("paths: must be a table")
        paths = {}
    for key in sorted(set(paths) - PATH_KEYS):
        problems.append(f"unknown key {key!r} in [paths] (known: {', '.join(sorted(PATH_KEYS))})")
    if "case" in paths:
        if paths["case"] not in ("fold", "exact", "platform"):
            problems.append("paths.case: must be 'fold', 'exact' or 'platform'")
        else:
            fold = {"fold": True, "exact": False, "platform": FOLDS_CASE}[paths["case"]]
    raw_rules = data.get("rule", [])
    if not isinstance(raw_rules, list):
        problems.append("rule: must be an array of tables ([[rule]])")
        raw_rules = []
    rules, names = [], set()
    for i, raw in enumerate(raw_rules):
        where = f"rule {i + 1}"
        if isinstance(raw, dict) and isinstance(raw.get("name"), str):
            where = f"rule {i + 1} ({raw['name']})"
        try:
            rule = _rule(raw, i, where, fold)
        except ValueError as exc:
            problems.extend(str(exc).split("\n"))
            continue
        if rule.name in names:
            problems.append(f"{where}: the name {rule.name!r} is used twice")
        names.add(rule.name)
        rules.append(rule)
    if problems:
        raise PolicyError(problems)
    return Rules(tuple(rules), fold, source)


def _rule(raw: Any, index: int, where: str, fold: bool) -> Rule:
    if not isinstance(raw, dict):
        raise ValueError(f"{where}: must be a table")
    problems = [
        f"{where}: unknown key {k!r} (known: {', '.join(sorted(RULE_KEYS))})"
        for k in sorted(set(raw) - RULE_KEYS)
    ]

    def check(step: Callable[..., Any], *given: Any, default: Any = None) -> Any:
        try:
            return step(*given)
        except ValueError as exc:
            problems.append(str(exc))
            return default

    name = raw.get("name")
    if not isinstance(name, str) or not name.strip():
        problems.append(f"{where}: needs a name (a non-empty string)")
        name = f"#{index + 1}"
    decision = raw.get("decision")
    if decision not in DECISIONS:
        problems.append(
            f"{where}: decision must be one of {', '.join(DECISIONS)}, not {decision!r}"
        )
        decision = "deny"
    events = tuple(DEFAULT_EVENTS[decision])
    if "events" in raw:
        events = tuple(check(_strings, raw["events"], f"{where}: events", default=[]))
        for event in events:
            if event not in EVENTS[decision]:
                problems.append(
                    f"{where}: a {decision} rule cannot answer {event} "
                    f"(it can: {', '.join(EVENTS[decision])})"
                )
    given_tools = (
        check(_strings, raw["tools"], f"{where}: tools", default=[]) if "tools" in raw else []
    )
    tools = tuple(
        check(ToolPattern.parse, t, fold, f"{where}: tools[{n}]") for n, t in enumerate(given_tools)
    )
    args: list[tuple[str, Any]] = []
    if "args" in raw:
        if not isinstance(raw["args"], dict) or not raw["args"]:
            problems.append(f"{where}: args must be a table of argument = pattern")
        else:
            for key, pattern in raw["args"].items():
                args.append((key, check(regex, pattern, f"{where}: args.{key}")))
    any_arg = check(regex, raw["any_arg"], f"{where}: any_arg") if "any_arg" in raw else None
    output = check(regex, raw["output"], f"{where}: output") if "output" in raw else None
    tenants = None
    if "tenants" in raw:
        tenants = frozenset(check(_strings, raw["tenants"], f"{where}: tenants", default=[]))
    session: list[tuple[str, tuple[str, ...]]] = []
    if "session" in raw:
        if not isinstance(raw["session"], dict) or not raw["session"]:
            problems.append(f"{where}: session must be a table of attribute = value(s)")
        else:
            for key, want in raw["session"].items():
                values = want if isinstance(want, list) else [want]
                if not values or not all(isinstance(v, str | bool | int) for v in values):
                    problems.append(f"{where}: session.{key} must be a value or a list of values")
                    continue
                session.append((key, tuple(as_text(v) for v in values)))
    for key in ("reason", "context", "description"):
        if key in raw and not isinstance(raw[key], str):
            problems.append(f"{where}: {key} must be a string")
    if decision == "context" and not raw.get("context"):
        problems.append(f'{where}: a context rule needs context = "what the agent is told"')
    if decision != "context" and decision != "rewrite" and "context" in raw:
        problems.append(f"{where}: context is for context and rewrite rules; use reason")
    rewrite: list[tuple[str, Any, str]] = []
    if decision == "rewrite":
        spec = raw.get("rewrite")
        if not isinstance(spec, dict) or not spec:
            problems.append(f"{where}: a rewrite rule needs rewrite = {{ arg = [regex, with] }}")
        else:
            for key, pair in spec.items():
                ok = (
                    isinstance(pair, list)
                    and len(pair) == 2
                    and all(isinstance(p, str) for p in pair)
                )
                if not ok:
                    problems.append(f"{where}: rewrite.{key} must be [regex, replacement]")
                    continue
                if "." in key:
                    problems.append(f"{where}: rewrite.{key}: only top-level arguments")
                    continue
                compiled = check(regex, pair[0], f"{where}: rewrite.{key}")
                rewrite.append((key, compiled, pair[1]))
    elif "rewrite" in raw:
        problems.append(f"{where}: rewrite is for rewrite rules")
    if decision == "redact" and "output" not in raw:
        problems.append(f"{where}: a redact rule needs output = '<what to redact>'")
    if problems:
        raise ValueError("\n".join(problems))
    return Rule(
        name=name, decision=decision, events=events, index=index, tools=tools,
        args=tuple(args), any_arg=any_arg, output=output, tenants=tenants,
        session=tuple(session), reason=raw.get("reason", ""), context=raw.get("context", ""),
        rewrite=tuple(rewrite), raw=raw,
    )  # fmt: skip


def load_rules(path: str) -> Rules:
    """The rules in the TOML file ``path``, or a PolicyError saying why not."""
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except OSError as exc:
        raise PolicyError([f"{path}: {exc.strerror or exc}"]) from None
    except tomllib.TOMLDecodeError as exc:
        raise PolicyError([f"{path}: not TOML: {exc}"]) from None
    return parse_rules(data, path)
