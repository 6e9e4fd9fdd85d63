"""Policy hooks from a file: the usual guards as rules, not code.

``hookbus worker workers.builtins.policy:Policy --set rules=policy.toml`` serves them (or
``registry.add(Policy("policy.toml"))`` embedded). Each rule names what it matches and what it
decides::

    [[rule]]
    name = "no-env-files"
    tools = ["Read(**/.env)", "file_*(**/.env)"]   # HookBus patterns, or Claude Code's Tool(spec)
    decision = "deny"
    reason = ".env files hold secrets"

Decisions, and what each answers (``bus/actions.py``):

==========  =============================  ==================================================
decision    events (the default first)     answer
==========  =============================  ==================================================
deny        PreToolUse, PermissionRequest  Block(reason) / Override(Deny)
ask         PreToolUse, PermissionRequest  PermissionRequired / Override(Ask)
allow       PermissionRequest              Override(Allow)
context     PermissionRequest              InjectContext(context)
rewrite     PreToolUse                     MutateInput: ``rewrite = {arg = [regex, replacement]}``
redact      PostToolUse(Failure) (both)    MutateOutput: every match of ``output`` → [redacted]
==========  =============================  ==================================================

On one event deny outranks ask, ask outranks allow, allow outranks context (Claude Code's
order); among rules of one decision the first in the file wins. Rewrites, and redactions, all
apply, in file order, after those (a denied call is not rewritten). Every answer names the rule
that made it (``policy rule NAME: …``), which is what the agent sees, the audit log stores and
the span records.

Why TOML: it is in the standard library (``tomllib``), so the hook needs no YAML parser, and it
has none of YAML's implicit typing (``no`` → false, ``1.10`` → 1.1, unquoted ``*`` aliases) that
turns a guard's pattern into something else without an error. Regular expressions go in literal
strings (``'…'``), where a backslash is a backslash.

Hostile content cannot stall it: every pattern is compiled by RE2 (``google-re2``), which
matches in time linear in the input and refuses what it cannot do so (backreferences,
lookaround) when the file is loaded. Paths are normalised before they are matched (``norm_path``:
``./.env``, ``a/../.env``, ``a//.env``, ``.env.``, ``.ENV`` where the platform folds case, an
absolute path inside the session's ``cwd``), and shell commands split into their simple
commands (``a && rm -rf x`` is denied by ``Bash(rm -rf:*)``; ``allow`` needs every part to match).

The file is read again when it changes (checked at each call: one ``stat``). A changed file is
validated whole first; one that is not valid leaves the last good rules in force and says why in
one line: logged as an error, kept in ``Policy.last_error``, and counted
(``Policy.reload_failures``, metric ``hookbus.policy.reload_failures``).
``hookbus policy check FILE`` lints a file; ``hookbus policy test FILE PAYLOAD.json`` shows what
each rule decides for one event, without Redis. The file's JSON Schema is
``docs/schema/policy/policy.schema.json`` (in a folder of its own:
the protocol's schemas beside it are generated, and checked for files they do not make).
"""

from __future__ import annotations

import functools
import logging
import os
import posixpath
import sys
import tomllib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec
import re2  # type: ignore[import-untyped]

from bus import (
    CONTINUE,
    AgentHook,
    Block,
    HookEvent,
    InjectContext,
    MutateInput,
    MutateOutput,
    Override,
    PermissionDecision,
    PermissionRequestAction,
    PermissionRequestContext,
    PermissionRequired,
    PostToolUseAction,
    PostToolUseContext,
    PostToolUseFailureContext,
    PreToolUseAction,
    PreToolUseContext,
)
from bus.errors import ConfigError
from bus.matcher import ToolNamePattern
from workers.builtins.redaction import MARK, within_strings

log = logging.getLogger("hookbus.policy")

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

    def matches(self, tool: str, args: Mapping[str, Any], cwd: str, fold: bool, all_: bool) -> bool:
        if not self.name.matches(tool):
            return False
        if not self.kind:
            return True
        if self.kind == "path":
            paths = [norm_path(p, cwd, fold) for p in path_values(args)]
            hit = [bool(self.compiled.search(p)) for p in paths]
            return bool(hit) and (all(hit) if all_ else any(hit))
        commands = [v for k in COMMAND_ARGS if isinstance(v := args.get(k), str)]
        parts = [c for command in commands for c in simple_commands(command, loose=not all_)]
        if self.kind == "prefix":
            hit = [p == self.spec or p.startswith(self.spec + " ") for p in parts]
        else:
            hit = [p == self.spec for p in parts]
        if all_:  # an allowed command may not redirect its output or input anywhere
            hit = [h and not any(c in p for c in "<>") for h, p in zip(hit, parts, strict=True)]
        return bool(hit) and (all(hit) if all_ else any(hit))


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
                session.append((key, tuple(_text(v) for v in values)))
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


# -- deciding --------------------------------------------------------------------------------


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return value if isinstance(value, str) else msgspec.json.encode(value).decode()


def _lookup(args: Mapping[str, Any], path: str) -> tuple[bool, Any]:
    value: Any = args
    for part in path.split("."):
        if not isinstance(value, Mapping) or part not in value:
            return False, None
        value = value[part]
    return True, value


def _strings_in(value: Any) -> list[str]:
    found: list[str] = []
    within_strings(value, lambda s: found.append(s) or s)  # type: ignore[func-returns-value]
    return found


def tenant_of(session_id: str) -> str:
    """The tenant of a qualified session id ``TENANT/SID``; "" for an agent's own."""
    tenant, sep, _ = session_id.partition("/")
    return tenant if sep and tenant and set(tenant) <= TENANT_CHARS else ""


def attribute(ctx: Any, key: str) -> str | None:
    """A session attribute: the context's field (``permission_mode``, ``agent_name``,
    ``is_subagent``, ``session_id``, ``tenant``) or the agent's own input's (Claude Code's
    ``cwd``, ``permission_mode``, ``agent_type``…)."""
    if key == "tenant":
        return tenant_of(getattr(ctx, "session_id", ""))
    if key in getattr(ctx, "__struct_fields__", ()) and key != "agent_input":
        return _text(getattr(ctx, key))
    given = getattr(ctx, "agent_input", msgspec.UNSET)
    if isinstance(given, dict) and key in given and given[key] is not None:
        return _text(given[key])
    return None


@dataclass
class Event:
    """What rules are matched against, taken from one context."""

    name: str
    tool: str
    args: Mapping[str, Any]
    session_id: str
    ctx: Any
    cwd: str = ""
    output: str = ""
    #: What ``output`` patterns search: the text, or each string of a structured output.
    outputs: list[str] = field(default_factory=list)

    @classmethod
    def of(cls, event: str, ctx: Any) -> Event:
        given = getattr(ctx, "agent_input", msgspec.UNSET)
        cwd = given.get("cwd") if isinstance(given, dict) else None
        output, outputs = "", []
        if isinstance(ctx, PostToolUseContext):
            output = ctx.output_content
            outputs = _strings_in(ctx.output_value) if ctx.structured else [output]
        elif isinstance(ctx, PostToolUseFailureContext):
            output = ctx.error_message
            outputs = [output]
        return cls(
            event, getattr(ctx, "tool_name", ""), getattr(ctx, "tool_args", {}) or {},
            getattr(ctx, "session_id", ""), ctx, cwd if isinstance(cwd, str) else "", output,
            outputs,
        )  # fmt: skip


def why_not(rule: Rule, ev: Event, fold: bool) -> str | None:
    """Why ``rule`` does not match ``ev`` (None: it matches)."""
    if ev.name not in rule.events:
        return f"not for {ev.name} (for {', '.join(rule.events)})"
    if rule.tenants is not None and tenant_of(ev.session_id) not in rule.tenants:
        return f"tenant {tenant_of(ev.session_id) or '(none)'!r} is not one of its tenants"
    for key, want in rule.session:
        have = attribute(ev.ctx, key)
        if have not in want:
            return f"session {key} is {have!r}, not {' or '.join(map(repr, want))}"
    if rule.tools:
        all_ = rule.decision in ("allow", "context")
        if not any(t.matches(ev.tool, ev.args, ev.cwd, fold, all_) for t in rule.tools):
            return f"{ev.tool} {_brief(ev.args)} matches none of its tools"
    for key, pattern in rule.args:
        found, value = _lookup(ev.args, key)
        if not found:
            return f"no argument {key}"
        text = (
            norm_path(value, ev.cwd, fold)
            if key in PATH_ARGS and isinstance(value, str)
            else _text(value)
        )
        if not pattern.search(text):
            return f"argument {key} does not match {pattern.pattern!r}"
    if rule.any_arg is not None and not any(rule.any_arg.search(s) for s in _strings_in(ev.args)):
        return f"no argument matches {rule.any_arg.pattern!r}"
    if rule.output is not None and not any(rule.output.search(s) for s in ev.outputs):
        return f"the output does not match {rule.output.pattern!r}"
    return None


def _brief(args: Mapping[str, Any]) -> str:
    text = _text(dict(args))
    return text if len(text) <= 80 else text[:77] + "…"


def _redact(pattern: Any) -> Callable[[str], str]:
    keep = "keep" in pattern.groupindex

    def change(text: str) -> str:
        if keep:
            return str(pattern.sub(lambda m: (m.group("keep") or "") + MARK, text))
        return str(pattern.sub(MARK, text))

    return change


def decide(rules: Rules, event: str, ctx: Any) -> tuple[Any, list[tuple[Rule, str | None]]]:
    """The answer of the rules to one event, and each rule's verdict (None: matched; else why
    it did not)."""
    ev = Event.of(event, ctx)
    verdicts = [(r, why_not(r, ev, rules.fold)) for r in rules.rules]
    matched = [r for r, why in verdicts if why is None]
    for decision in FIRST_MATCH:
        rule = next((r for r in matched if r.decision == decision), None)
        if rule is not None:
            return _answer(rule, ev), verdicts
    rewrites = [r for r in matched if r.decision == "rewrite"]
    if rewrites and event == "PreToolUse":
        args = dict(ev.args)
        said = []
        for rule in rewrites:
            for key, pattern, with_ in rule.rewrite:
                found, value = _lookup(args, key)
                if found and isinstance(value, str):
                    args[key] = pattern.sub(with_, value)
            said.append(rule.said(rule.context or "the arguments were rewritten"))
        if args != dict(ev.args):
            return MutateInput(updated_args=args, additional_context="\n".join(said)), verdicts
    redactions = [r for r in matched if r.decision == "redact"]
    if redactions and isinstance(ctx, PostToolUseContext | PostToolUseFailureContext):
        changes = [_redact(r.output) for r in redactions]

        def change(text: str) -> str:
            for one in changes:
                text = one(text)
            return text

        why = "; ".join(r.said(f"redacted from the output of {ev.tool}") for r in redactions)
        if isinstance(ctx, PostToolUseContext) and ctx.structured:
            return MutateOutput.of_value(within_strings(ctx.output_value, change), why), verdicts
        return MutateOutput(updated_content=change(ev.output), additional_context=why), verdicts
    return CONTINUE, verdicts


def _answer(rule: Rule, ev: Event) -> Any:
    perm = ev.name == "PermissionRequest"
    if rule.decision == "deny":
        why = rule.said(f"{ev.tool} is denied")
        return Override(decision=PermissionDecision.DENY, reason=why) if perm else Block(reason=why)
    if rule.decision == "ask":
        why = rule.said(f"{ev.tool} needs a person's approval")
        if perm:
            return Override(decision=PermissionDecision.ASK, reason=why)
        return PermissionRequired(permission=why, tool_name=ev.tool)
    if rule.decision == "allow":
        return Override(
            decision=PermissionDecision.ALLOW, reason=rule.said(f"{ev.tool} is allowed")
        )
    return InjectContext(context=rule.said(rule.context))


# -- the hook --------------------------------------------------------------------------------


@functools.cache
def _counter() -> Any:
    from opentelemetry import metrics

    return metrics.get_meter("hookbus").create_counter(
        "hookbus.policy.reload_failures",
        description="changed policy files refused (the last good rules kept)",
    )


class Policy(AgentHook):
    """Decides from a rules file (TOML; the module docstring). ``rules`` is its path; the file
    is read again when it changes, and a bad one leaves the last good rules in force."""

    name = "Policy"
    subscribed_events = (
        HookEvent.PRE_TOOL_USE,
        HookEvent.POST_TOOL_USE,
        HookEvent.POST_TOOL_USE_FAILURE,
        HookEvent.PERMISSION_REQUEST,
    )
    failure_policy = "fail"
    timeout = 2.0

    def __init__(self, rules: str, name: str | None = None) -> None:
        if not isinstance(rules, str) or not rules:
            raise ValueError("rules must be the path of a rules file (TOML)")
        if name is not None:
            self.name = name  # type: ignore[misc]  # one service per policy file
        self.path = os.path.abspath(rules)
        self.reload_failures = 0
        self.last_error = ""
        self._stat: tuple[int, int, int] | None = None
        self._refused: tuple[int, int, int] | None = None
        self.rules = load_rules(self.path)  # a bad file at start: refused, with its problems
        self._stat = self._stat_now()
        log.info("policy %s: %d rules from %s", self.name, len(self.rules.rules), self.path)

    def _stat_now(self) -> tuple[int, int, int] | None:
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return (st.st_mtime_ns, st.st_size, st.st_ino)

    def refresh(self) -> None:
        """Read the file again if it changed; keep the last good rules if it is not valid."""
        now = self._stat_now()
        if now == self._stat or (now is not None and now == self._refused):
            return
        try:
            if now is None:
                raise PolicyError([f"{self.path}: cannot be read (removed?)"])
            rules = load_rules(self.path)
        except PolicyError as exc:
            self._refused = now
            self.reload_failures += 1
            self.last_error = (
                f"policy {self.name}: {self.path} refused, keeping the last good rules "
                f"({len(self.rules.rules)}): " + "; ".join(exc.problems)
            )
            log.error("%s", self.last_error)
            _counter().add(1, {"hook.name": self.name})
            return
        self.rules, self._stat, self._refused, self.last_error = rules, now, None, ""
        log.info("policy %s: reloaded %d rules from %s", self.name, len(rules.rules), self.path)

    def decide(self, event: str, ctx: Any) -> Any:
        self.refresh()
        return decide(self.rules, event, ctx)[0]

    async def pre_tool_use(self, ctx: PreToolUseContext) -> PreToolUseAction:
        answer: PreToolUseAction = self.decide("PreToolUse", ctx)
        return answer

    async def post_tool_use(self, ctx: PostToolUseContext) -> PostToolUseAction:
        answer: PostToolUseAction = self.decide("PostToolUse", ctx)
        return answer

    async def on_post_tool_use_failure(self, ctx: PostToolUseFailureContext) -> PostToolUseAction:
        answer: PostToolUseAction = self.decide("PostToolUseFailure", ctx)
        return answer

    async def on_permission_request(self, ctx: PermissionRequestContext) -> PermissionRequestAction:
        answer: PermissionRequestAction = self.decide("PermissionRequest", ctx)
        return answer


# -- linting ---------------------------------------------------------------------------------

_OPPOSITE = {
    "CATEGORY_SPACE": "CATEGORY_NOT_SPACE",
    "CATEGORY_DIGIT": "CATEGORY_NOT_DIGIT",
    "CATEGORY_WORD": "CATEGORY_NOT_WORD",
}


def _shape(items: Any) -> tuple[bool, int]:
    """(never matches, least width) of a parsed pattern's sequence (``re._parser``'s tree; its
    syntax is a superset of RE2's for what this looks at): an anchor ``^`` after something
    that consumes, ``$`` before it, a class that excludes everything."""
    width, never, after_end = 0, False, False
    for op, arg in items:
        name = str(op)
        least = 0
        if name in ("LITERAL", "NOT_LITERAL", "ANY"):
            least = 1
        elif name == "IN":
            least = 1
            cats = {str(a) for o, a in arg if str(o) == "CATEGORY"}
            negated = any(str(o) == "NEGATE" for o, _ in arg)
            if negated and any(_OPPOSITE.get(c) in cats for c in cats):
                never = True
        elif name == "AT":
            if str(arg) in ("AT_BEGINNING", "AT_BEGINNING_STRING") and width:
                never = True
            if str(arg) in ("AT_END", "AT_END_STRING"):
                after_end = True
        elif name == "SUBPATTERN":
            sub_never, least = _shape(arg[-1])
            never = never or sub_never
        elif name == "BRANCH":
            shapes = [_shape(b) for b in arg[1]]
            live = [w for n, w in shapes if not n]
            never = never or not live
            least = min(live) if live else 0
        elif name in ("MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT"):
            low, _, sub = arg
            sub_never, sub_least = _shape(sub)
            never = never or (low > 0 and sub_never)
            least = low * sub_least
        if after_end and least:
            never = True
        width += least
    return never, width


def never_matches(pattern: str) -> bool:
    """Whether a pattern can match no text at all (``a^b``, ``$x``, ``[^\\s\\S]``): a check for
    ``policy check``, on what it can see (not a proof: False means "not known to")."""
    import re._parser as sre  # type: ignore[import-not-found]

    if "(?m" in pattern or "(?s" in pattern:
        return False
    try:
        return _shape(sre.parse(pattern))[0]
    except Exception:
        return False


def _covers_tool(a: ToolPattern, b: ToolPattern) -> bool:
    """Whether every call ``b`` matches, ``a`` matches too (when it can tell)."""
    if a.name.kind == "wildcard" and not a.kind:
        return True
    if a.kind and (a.kind, a.spec) != (b.kind, b.spec):
        if not (a.kind == "prefix" and b.kind in ("prefix", "command")):
            return False
        if not (b.spec == a.spec or b.spec.startswith(a.spec + " ")):
            return False
    if a.name.kind == "wildcard":
        return True
    if a.name.kind == "exact":
        return b.name.kind == "exact" and b.name.value == a.name.value
    return b.name.kind != "wildcard" and b.name.value.startswith(a.name.value)


def _source(pattern: Any) -> str | None:
    return None if pattern is None else str(pattern.pattern)


def covers(a: Rule, b: Rule) -> bool:
    """Whether ``a`` decides every event ``b`` would match before ``b`` can (so ``b`` never
    decides anything): ``a`` is a first-match rule that ranks before ``b``, on all of ``b``'s
    events, with no condition ``b`` does not have."""
    if a.decision not in FIRST_MATCH:
        return False
    if b.decision in FIRST_MATCH:
        rank_a, rank_b = FIRST_MATCH.index(a.decision), FIRST_MATCH.index(b.decision)
        if rank_a > rank_b or (rank_a == rank_b and a.index > b.index):
            return False
    elif not (b.decision == "rewrite" and a.decision in ("deny", "ask")):
        return False  # a redaction is never pre-empted; a rewrite only by deny and ask
    if not set(b.events) <= set(a.events):
        return False
    if a.tenants is not None and (b.tenants is None or not b.tenants <= a.tenants):
        return False
    if not set(a.session) <= set(b.session):
        return False
    if a.args or a.any_arg is not None or a.output is not None:
        same = [(k, p.pattern) for k, p in a.args] == [(k, p.pattern) for k, p in b.args][
            : len(a.args)
        ]
        if not same or _source(a.any_arg) not in (None, _source(b.any_arg)):
            return False
        if _source(a.output) not in (None, _source(b.output)):
            return False
    if not a.tools:
        return True
    if a.decision in ("allow", "context") and any(t.kind for t in a.tools):
        return False  # "every part of the command" is not containment
    return bool(b.tools) and all(any(_covers_tool(t, u) for t in a.tools) for u in b.tools)


def lint(rules: Rules) -> list[str]:
    """What ``policy check`` reports beyond what loading refuses: rules that can never decide
    (an earlier or stronger rule decides all they match), patterns that can never match."""
    problems = []
    for b in rules.rules:
        where = f"rule {b.index + 1} ({b.name})"
        for a in rules.rules:
            if a is not b and covers(a, b):
                problems.append(
                    f"{where}: unreachable: rule {a.index + 1} ({a.name}, {a.decision}) decides "
                    f"every call it matches first"
                )
                break
        patterns = [(f"args.{k}", p) for k, p in b.args]
        patterns += [("any_arg", b.any_arg), ("output", b.output)]
        patterns += [(f"rewrite.{k}", p) for k, p, _ in b.rewrite]
        for key, pattern in patterns:
            if pattern is not None and never_matches(pattern.pattern):
                problems.append(f"{where}: {key} {pattern.pattern!r} can never match anything")
        if b.output is not None and not set(b.events) & {"PostToolUse", "PostToolUseFailure"}:
            problems.append(
                f"{where}: output can never match: {', '.join(b.events)} carries no output"
            )
        for tenant in sorted(b.tenants or ()):
            if not tenant or not set(tenant) <= TENANT_CHARS:
                problems.append(
                    f"{where}: tenant {tenant!r} can never match (a tenant is letters, digits, "
                    "_ and -)"
                )
        for tool in b.tools:
            if tool.kind == "path" and tool.spec.rstrip("/").endswith("/.."):
                problems.append(f"{where}: {tool.text} can never match (a path ends in a name)")
            if tool.kind in ("prefix", "command") and not tool.spec:
                problems.append(f"{where}: {tool.text} has an empty command")
    return problems


def check_file(path: str) -> list[str]:
    """Every problem of the rules file ``path``, one line each (empty: none)."""
    try:
        rules = load_rules(path)
    except PolicyError as exc:
        return exc.problems
    return lint(rules)
