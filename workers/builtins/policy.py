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
``./.env``, ``a/../.env``, ``a//.env``, ``.env.``, ``.env::$DATA``, ``C:\\proj\\.env``, ``.ENV``
(case is folded unless the file says ``[paths] case = "exact"``), an absolute path inside the
session's ``cwd``), and shell commands split into their simple
commands (``a && rm -rf x`` is denied by ``Bash(rm -rf:*)``; ``allow`` needs every part to match).

The file is read again when it changes (checked at each call, and at each heartbeat of its
service: one ``stat``). A changed file is validated whole first; one that is not valid leaves the
last good rules in force and says why in one line: logged as an error, kept in
``Policy.last_error``, shown by ``hookbus hooks list`` (``problem()``, which its service
publishes with each heartbeat, until a good file is read), and counted
(``Policy.reload_failures``, metric ``hookbus.policy.reload_failures``).
The file's format, and how paths and shell commands are read, are in
``workers/builtins/policy_rules.py``; deciding, the hook and the lint here.
``hookbus policy check FILE`` lints a file; ``hookbus policy test FILE PAYLOAD.json`` shows what
each rule decides for one event, without Redis. The file's JSON Schema is
``docs/schema/policy/policy.schema.json`` (in a folder of its own:
the protocol's schemas beside it are generated, and checked for files they do not make).
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import msgspec

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
from workers.builtins.policy_rules import (
    DECISIONS,
    EVENTS,
    FIRST_MATCH,
    PATH_ARGS,
    PATH_KEYS,
    RULE_KEYS,
    TENANT_CHARS,
    TOP_KEYS,
    Call,
    PolicyError,
    Rule,
    Rules,
    ToolPattern,
    as_text,
    load_rules,
    norm_path,
    parse_rules,
)
from workers.builtins.redaction import MARK, within_strings

__all__ = [
    "DECISIONS",
    "EVENTS",
    "PATH_KEYS",
    "RULE_KEYS",
    "TOP_KEYS",
    "Policy",
    "PolicyError",
    "Rules",
    "check_file",
    "decide",
    "lint",
    "load_rules",
    "norm_path",
    "parse_rules",
]

log = logging.getLogger("hookbus.policy")


# -- deciding --------------------------------------------------------------------------------


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
        return as_text(getattr(ctx, key))
    given = getattr(ctx, "agent_input", msgspec.UNSET)
    if isinstance(given, dict) and key in given and given[key] is not None:
        return as_text(given[key])
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
    _calls: dict[bool, Call] = field(default_factory=dict)

    def call(self, fold: bool) -> Call:
        """The call as tool patterns see it (read once for every rule)."""
        if fold not in self._calls:
            self._calls[fold] = Call(self.tool, self.args, self.cwd, fold)
        return self._calls[fold]

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
        call = ev.call(fold)
        if not any(t.matches(call, all_) for t in rule.tools):
            return f"{ev.tool} {_brief(ev.args)} matches none of its tools"
    for key, pattern in rule.args:
        found, value = _lookup(ev.args, key)
        if not found:
            return f"no argument {key}"
        text = (
            norm_path(value, ev.cwd, fold)
            if key in PATH_ARGS and isinstance(value, str)
            else as_text(value)
        )
        if not pattern.search(text):
            return f"argument {key} does not match {pattern.pattern!r}"
    if rule.any_arg is not None and not any(rule.any_arg.search(s) for s in _strings_in(ev.args)):
        return f"no argument matches {rule.any_arg.pattern!r}"
    if rule.output is not None and not any(rule.output.search(s) for s in ev.outputs):
        return f"the output does not match {rule.output.pattern!r}"
    return None


def _brief(args: Mapping[str, Any]) -> str:
    text = as_text(dict(args))
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
        if now == self._stat:  # the file in force (again: a refused change undone)
            if self.last_error:
                log.info("policy %s: %s is the file in force again", self.name, self.path)
            self._refused, self.last_error = None, ""
            return
        if now is not None and now == self._refused:
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

    def problem(self) -> str:
        """Why the file in force is not the file on disk ("" when it is): its service publishes
        this with each heartbeat, and ``hookbus hooks list`` shows it."""
        self.refresh()
        return self.last_error

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
