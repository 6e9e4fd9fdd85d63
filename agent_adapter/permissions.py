"""Permission checking for an agent: rules, permission modes and the P0–P8 precedence.

Pure code: no I/O, no clock, no asyncio, no transport or tracing library. The agent loop calls
these functions; the hooks that take part (PreToolUse, PermissionRequest) are dispatched by
``bus``, and their aggregated answers are fed in here.

Rules
=====

A :class:`PermissionRule` pairs a :class:`bus.matcher.ToolMatchFilter` (the same name and content
patterns hooks use: ``"*"``, ``"file_*"``, ``"run_shell"``, ``"command:rm -rf"``, …) with a
:class:`bus.events.PermissionDecision`. A :class:`PermissionChecker` holds rules and a mode;
among the rules that match a call, **Deny beats Ask beats Allow** (ties: the rule added first).
No matching rule means the checker has no opinion (``check`` returns ``None``).

Permission modes
================

=====================  =====================================================================
``default``            Rules only.
``acceptEdits``        As ``default``, but an Ask on an :attr:`ToolKind.EDIT` tool becomes Allow.
``bypassPermissions``  Every Ask becomes Allow. Deny rules still deny.
``plan``               Read-only: every tool that is not :attr:`ToolKind.READ` is denied ("plan
                       mode is read-only") before any rule is consulted; READ tools follow the
                       rules.
=====================  =====================================================================

Precedence (spec: "权限决策优先级")
===================================

:func:`resolve_permission_precedence` merges the sources of one tool call; the first level that
has something to say decides:

======  ==========================================  ==========================================
level   source                                      effect
======  ==========================================  ==========================================
P0      global ``PermissionChecker`` Deny           Deny, locked
P1      tool-level ``PermissionRule`` Deny          Deny, locked
P2      session-level checker Deny                  Deny, locked
P3      PreToolUse hook ``Block``                   Deny (locked only when enforced, below)
P4      PreToolUse hook ``PermissionRequired``      Ask
P5      session-level checker Ask                   Ask (escalates Allow only)
        — or the global checker's Ask               (HookBus: the spec has no level for it)
P6      tool-level ``PermissionRule`` Ask           Ask (escalates Allow only)
P7      global ``PermissionChecker`` Allow          Allow
P8      nothing said anything                       implicit Allow
======  ==========================================  ==========================================

An Allow from a tool rule or a session checker is a no-op: it cannot lift anything above it and
is the same as the implicit Allow below it. The global checker's Ask has no row in the spec's
table; HookBus ranks it with the session checker's Ask at P5 (a checker Ask, like a session Ask,
only escalates Allow to Ask).

PermissionRequest
=================

:func:`apply_permission_request` applies the aggregated PermissionRequest answer (first Override
in hook order wins) to the precedence: Continue keeps it; an Override replaces it (``Allow``
forces, ``Ask`` escalates, ``Deny`` forces a denial) — **unless the precedence is locked**: a
P0–P2 Deny, or a P3 Block from a ``failure_policy="fail"`` hook that could not answer, stays Deny
whatever any hook says, and the ignored Override is recorded in
:attr:`FinalDecision.ignored_override`.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from typing import Any

import msgspec

from bus.actions import Continue, Override, PermissionRequestResult
from bus.errors import InvalidInputError
from bus.events import PermissionDecision, PermissionDenialSource, parse_member
from bus.matcher import ToolMatchFilter

__all__ = [
    "FinalDecision",
    "PermissionChecker",
    "PermissionMode",
    "PermissionRule",
    "Precedence",
    "PrecedenceInputs",
    "ToolKind",
    "Verdict",
    "apply_permission_request",
    "parse_decision",
    "resolve_permission_precedence",
]

_ALLOW = PermissionDecision.ALLOW
_ASK = PermissionDecision.ASK
_DENY = PermissionDecision.DENY

#: Decision rank among matching rules: higher wins.
_RANK: dict[PermissionDecision, int] = {_ALLOW: 0, _ASK: 1, _DENY: 2}


class PermissionMode(enum.StrEnum):
    """How a :class:`PermissionChecker` bends its rules (see the module docstring)."""

    DEFAULT = "default"
    ACCEPT_EDITS = "acceptEdits"
    BYPASS = "bypassPermissions"
    PLAN = "plan"

    @classmethod
    def parse(cls, name: str | PermissionMode) -> PermissionMode:
        """Return the mode called ``name``.

        Args:
            name: A wire value (``"acceptEdits"``), matched case-insensitively, or a member.

        Returns:
            The mode.

        Raises:
            InvalidInputError: ``name`` is not one of the four modes; the message lists them.
        """
        return parse_member(cls, name, "permission mode", fold_case=True)


class ToolKind(enum.StrEnum):
    """What a tool does, as far as permission modes care."""

    READ = "read"
    EDIT = "edit"
    EXEC = "exec"

    @classmethod
    def parse(cls, name: str | ToolKind) -> ToolKind:
        """Return the kind called ``name``.

        Raises:
            InvalidInputError: ``name`` is not ``read``, ``edit`` or ``exec``.
        """
        return parse_member(cls, name, "tool kind")


def parse_decision(decision: PermissionDecision | str) -> PermissionDecision:
    """Return the decision called ``decision`` (``"Allow"``, ``"ask"``, …, case-insensitive).

    Raises:
        InvalidInputError: ``decision`` is not Allow, Ask or Deny.
    """
    return parse_member(PermissionDecision, decision, "permission decision", fold_case=True)


class PermissionRule(msgspec.Struct, frozen=True):
    """One rule: calls that ``match`` get ``decision``.

    Attributes:
        match: Which tool calls the rule applies to (name and content patterns).
        decision: What the rule says about them.
        reason: Why, in words a user can read; shown in verdicts and explanations.
    """

    match: ToolMatchFilter
    decision: PermissionDecision
    reason: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.match, ToolMatchFilter):
            raise InvalidInputError(
                f"PermissionRule.match must be a ToolMatchFilter: {self.match!r}"
            )
        if not isinstance(self.decision, PermissionDecision):
            raise InvalidInputError(
                f"PermissionRule.decision must be a PermissionDecision, got {self.decision!r}"
                " (use PermissionRule.parse to give it as a string)"
            )
        if not isinstance(self.reason, str):
            raise InvalidInputError(f"PermissionRule.reason must be a string: {self.reason!r}")

    @classmethod
    def parse(
        cls,
        pattern: str,
        decision: PermissionDecision | str,
        *,
        content: Sequence[str] = (),
        reason: str = "",
    ) -> PermissionRule:
        """Build a rule from pattern strings.

        Args:
            pattern: A tool name pattern: ``"*"``, ``"file_*"`` (prefix) or ``"run_shell"``.
            decision: ``Allow``, ``Ask`` or ``Deny`` (member or case-insensitive string).
            content: Content patterns (``"command:rm -rf"``, ``"path:"``, ``".env"``); when
                given, at least one must match as well as the name.
            reason: Why the rule exists.

        Returns:
            The rule.

        Raises:
            PatternError: A malformed name or content pattern (also if ``content`` is a single
                string rather than a list).
            InvalidInputError: An unknown decision.
        """
        return cls(ToolMatchFilter.parse([pattern], content), parse_decision(decision), reason)

    def matches(self, tool_name: str, tool_args: Mapping[str, Any] | None = None) -> bool:
        """Whether the rule applies to this call."""
        return self.match.matches(tool_name, tool_args)

    def __str__(self) -> str:
        names, content = self.match.to_strings()
        text = f"{self.decision.value} {','.join(names) or '*'}"
        if content:
            text += " [" + ", ".join(content) + "]"
        return text


class Verdict(msgspec.Struct, frozen=True):
    """A checker's opinion on one call.

    Attributes:
        decision: Allow, Ask or Deny.
        reason: Why, readable by a user.
        rule: The rule that decided, or None when the mode decided alone (plan mode).
    """

    decision: PermissionDecision
    reason: str
    rule: PermissionRule | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.decision, PermissionDecision):
            raise InvalidInputError(
                f"Verdict.decision must be a PermissionDecision, got {self.decision!r}"
            )


class PermissionChecker:
    """Rules plus a permission mode.

    Args:
        rules: The initial rules, in order (order only breaks ties between equal decisions).
        mode: A :class:`PermissionMode` or its wire name.

    Raises:
        InvalidInputError: An unknown mode, or a rule that is not a :class:`PermissionRule`.
    """

    def __init__(
        self,
        rules: Sequence[PermissionRule] = (),
        mode: PermissionMode | str = PermissionMode.DEFAULT,
    ) -> None:
        self._rules: list[PermissionRule] = []
        self._mode = PermissionMode.parse(mode)
        for rule in rules:
            self.add_rule(rule)

    @property
    def mode(self) -> PermissionMode:
        """The current mode; assign a mode or its wire name to change it."""
        return self._mode

    @mode.setter
    def mode(self, mode: PermissionMode | str) -> None:
        self._mode = PermissionMode.parse(mode)

    @property
    def rules(self) -> tuple[PermissionRule, ...]:
        """The rules, in the order they were added."""
        return tuple(self._rules)

    def add_rule(self, rule: PermissionRule) -> None:
        """Add a rule after the existing ones.

        Raises:
            InvalidInputError: ``rule`` is not a :class:`PermissionRule`.
        """
        if not isinstance(rule, PermissionRule):
            raise InvalidInputError(f"expected a PermissionRule, got {rule!r}")
        self._rules.append(rule)

    def check(
        self, tool_name: str, tool_args: Mapping[str, Any], kind: ToolKind = ToolKind.EXEC
    ) -> Verdict | None:
        """Decide on one call.

        Args:
            tool_name: The tool being called.
            tool_args: Its arguments (read only, for content patterns).
            kind: Whether the tool reads, edits or executes; only modes look at it.

        Returns:
            The verdict, or None when no rule matches and the mode has nothing to say.

        Raises:
            InvalidInputError: An empty or non-string tool name, or an unknown kind.
        """
        return self._decide(tool_name, tool_args, kind)[0]

    def explain(
        self, tool_name: str, tool_args: Mapping[str, Any], kind: ToolKind = ToolKind.EXEC
    ) -> str:
        """One line saying which rule or mode decided a call, and why.

        Args:
            tool_name: The tool being called.
            tool_args: Its arguments.
            kind: Whether the tool reads, edits or executes.

        Returns:
            For example ``"rule Deny run_shell [command:rm -rf] → Deny for 'run_shell' (mode
            default): destructive"``, or a line containing ``"no rule matches"``.
        """
        return self._decide(tool_name, tool_args, kind)[1]

    def _decide(
        self, tool_name: str, tool_args: Mapping[str, Any], kind: ToolKind
    ) -> tuple[Verdict | None, str]:
        if not isinstance(tool_name, str) or not tool_name:
            raise InvalidInputError(f"tool name must be a non-empty string, got {tool_name!r}")
        if not isinstance(tool_args, Mapping):
            raise InvalidInputError(f"tool arguments must be a mapping, got {tool_args!r}")
        kind = ToolKind.parse(kind)
        mode = self._mode
        call = f"{tool_name!r} ({kind.value} tool, mode {mode.value})"

        if mode is PermissionMode.PLAN and kind is not ToolKind.READ:
            reason = "plan mode is read-only"
            return Verdict(_DENY, reason), f"plan mode → Deny for {call}: {reason}"

        best: PermissionRule | None = None
        for rule in self._rules:
            if rule.matches(tool_name, tool_args) and (
                best is None or _RANK[rule.decision] > _RANK[best.decision]
            ):
                best = rule
        if best is None:
            return None, f"no rule matches {call}: no opinion"

        why = best.reason or f"rule {best}"
        if best.decision is _ASK and (
            mode is PermissionMode.BYPASS
            or (mode is PermissionMode.ACCEPT_EDITS and kind is ToolKind.EDIT)
        ):
            what = "every Ask" if mode is PermissionMode.BYPASS else "an Ask on an edit tool"
            reason = f"{mode.value} mode turns {what} into Allow (rule asked: {why})"
            line = f"rule {best} asked, {mode.value} mode → Allow for {call}: {reason}"
            return Verdict(_ALLOW, reason, best), line
        return Verdict(best.decision, why, best), f"rule {best} → {best.decision} for {call}: {why}"


# --- precedence ---------------------------------------------------------------------------------

#: Default source label of each level, used by ``explain``.
_LEVEL_SOURCE: dict[int, str] = {
    0: "checker",
    1: "tool rule",
    2: "session",
    3: "hook block",
    4: "hook permission required",
    5: "session",
    6: "tool rule",
    7: "checker",
    8: "implicit",
}


def _level_decision(level: int) -> PermissionDecision:
    return _DENY if level <= 3 else _ASK if level <= 6 else _ALLOW


def _check_verdict(name: str, value: object) -> None:
    if value is not None and not isinstance(value, Verdict):
        raise InvalidInputError(f"PrecedenceInputs.{name} must be a Verdict or None: {value!r}")


class PrecedenceInputs(msgspec.Struct, frozen=True, kw_only=True):
    """Everything that has a say on one tool call before PermissionRequest hooks.

    Attributes:
        checker: The global :class:`PermissionChecker`'s verdict: Deny is P0, Ask is P5 (ranked
            with a session Ask), Allow is P7.
        tool_rule: The tool-level rule's verdict: Deny is P1, Ask is P6, Allow is a no-op.
        session: The session-level checker's verdict: Deny is P2, Ask is P5, Allow is a no-op.
        hook_block: The reason of the PreToolUse Block, if a hook blocked (P3).
        hook_block_enforced: That Block came from a ``failure_policy="fail"`` hook that could
            not answer, so no PermissionRequest Override may lift it.
        hook_permission_required: The permission a PreToolUse hook asked for with
            ``PermissionRequired`` (P4: Ask).

    Raises:
        InvalidInputError: A verdict that is not a :class:`Verdict`, or ``hook_block_enforced``
            without ``hook_block``.
    """

    checker: Verdict | None = None
    tool_rule: Verdict | None = None
    session: Verdict | None = None
    hook_block: str | None = None
    hook_block_enforced: bool = False
    hook_permission_required: str | None = None

    def __post_init__(self) -> None:
        _check_verdict("checker", self.checker)
        _check_verdict("tool_rule", self.tool_rule)
        _check_verdict("session", self.session)
        if self.hook_block_enforced and self.hook_block is None:
            raise InvalidInputError("hook_block_enforced=True needs a hook_block reason")


class Precedence(msgspec.Struct, frozen=True):
    """The decision :func:`resolve_permission_precedence` reached, and the level that decided.

    Attributes:
        decision: Deny for P0–P3, Ask for P4–P6, Allow for P7–P8.
        level: 0 to 8, for P0 to P8.
        reason: Why, readable by a user.
        enforced: A P3 Block that came from a failed ``failure_policy="fail"`` hook.
        source: Who decided (``"checker"``, ``"tool rule"``, …); empty means the level's default.

    Raises:
        InvalidInputError: A level outside 0–8, a decision that does not belong to the level, or
            ``enforced`` on a level other than 3.
    """

    decision: PermissionDecision
    level: int
    reason: str
    enforced: bool = False
    source: str = ""

    def __post_init__(self) -> None:
        if isinstance(self.level, bool) or not isinstance(self.level, int):
            raise InvalidInputError(f"Precedence.level must be an int, got {self.level!r}")
        if not 0 <= self.level <= 8:
            raise InvalidInputError(f"Precedence.level must be 0..8, got {self.level}")
        expected = _level_decision(self.level)
        if self.decision is not expected:
            raise InvalidInputError(
                f"P{self.level} decides {expected.value}, not {self.decision!r}"
            )
        if self.enforced and self.level != 3:
            raise InvalidInputError(f"only a P3 hook block can be enforced, not P{self.level}")

    @property
    def locked(self) -> bool:
        """True when no hook may change the decision: a P0–P2 Deny or an enforced P3 Deny."""
        return self.decision is _DENY and (self.level <= 2 or (self.level == 3 and self.enforced))

    @property
    def label(self) -> str:
        """``"P1 tool rule"``: the level and who decided."""
        return f"P{self.level} {self.source or _LEVEL_SOURCE[self.level]}"

    def explain(self) -> str:
        """One line, e.g. ``"P1 tool rule: Deny — dangerous command"``."""
        text = f"{self.label}: {self.decision.value} — {self.reason}"
        if self.enforced:
            text += " (enforced: failure_policy=fail)"
        return text


def resolve_permission_precedence(inputs: PrecedenceInputs) -> Precedence:
    """Merge every permission source of one call by the P0–P8 table.

    Args:
        inputs: What the checkers, the tool rule and the PreToolUse hooks said.

    Returns:
        The decision of the highest level that has something to say (P8 implicit Allow if none).

    Raises:
        InvalidInputError: ``inputs`` is not a :class:`PrecedenceInputs`.
    """
    if not isinstance(inputs, PrecedenceInputs):
        raise InvalidInputError(f"expected PrecedenceInputs, got {inputs!r}")
    checker, tool, session = inputs.checker, inputs.tool_rule, inputs.session

    if checker is not None and checker.decision is _DENY:
        return Precedence(_DENY, 0, checker.reason)
    if tool is not None and tool.decision is _DENY:
        return Precedence(_DENY, 1, tool.reason)
    if session is not None and session.decision is _DENY:
        return Precedence(_DENY, 2, session.reason)
    if inputs.hook_block is not None:
        return Precedence(_DENY, 3, inputs.hook_block, enforced=inputs.hook_block_enforced)
    if inputs.hook_permission_required is not None:
        return Precedence(_ASK, 4, inputs.hook_permission_required)
    if session is not None and session.decision is _ASK:
        return Precedence(_ASK, 5, session.reason)
    if checker is not None and checker.decision is _ASK:
        return Precedence(_ASK, 5, checker.reason, source="checker")
    if tool is not None and tool.decision is _ASK:
        return Precedence(_ASK, 6, tool.reason)
    if checker is not None and checker.decision is _ALLOW:
        return Precedence(_ALLOW, 7, checker.reason)
    return Precedence(_ALLOW, 8, "no permission source objected; allowed by default")


# --- PermissionRequest --------------------------------------------------------------------------

_UNNAMED_HOOK = "(unnamed hook)"


class FinalDecision(msgspec.Struct, frozen=True):
    """What finally happens to the call, after the PermissionRequest hooks.

    Attributes:
        decision: Allow, Ask or Deny.
        level: The precedence level that was resolved (kept even when a hook overrode it).
        reason: Why: the precedence's reason, or the Override's.
        overridden_by: The hook whose Override replaced the precedence, if one did.
        ignored_override: Why a hook's Override was not applied (the precedence was locked).
    """

    decision: PermissionDecision
    level: int
    reason: str
    overridden_by: str | None = None
    ignored_override: str | None = None

    @property
    def denial_source(self) -> PermissionDenialSource | None:
        """The PermissionDenied source for this decision: ``Rule`` for any Deny, else None.

        Every Deny reached here comes from a rule, a checker, a mode or a hook's policy;
        ``User`` and ``Timeout`` denials happen later, at the interactive prompt.
        """
        return PermissionDenialSource.RULE if self.decision is _DENY else None

    def explain(self) -> str:
        """One line: the decision, the level or the hook that decided, and why."""
        if self.overridden_by is not None:
            text = f"P{self.level} overridden by hook {self.overridden_by!r}"
        else:
            text = f"P{self.level}"
        text += f": {self.decision.value} — {self.reason}"
        if self.ignored_override is not None:
            text += f" ({self.ignored_override})"
        return text


def apply_permission_request(
    precedence: Precedence, result: PermissionRequestResult
) -> FinalDecision:
    """Apply the aggregated PermissionRequest answer to the precedence.

    Args:
        precedence: What :func:`resolve_permission_precedence` decided.
        result: The PermissionRequest hooks' answer: Continue, or the first Override in hook
            order (``result.overridden_by`` names its hook).

    Returns:
        The precedence unchanged on Continue; the Override's decision otherwise, unless the
        precedence is :attr:`Precedence.locked`, in which case it stays Deny and
        ``ignored_override`` says which Override was dropped and why.

    Raises:
        InvalidInputError: Arguments of the wrong type.
    """
    if not isinstance(precedence, Precedence):
        raise InvalidInputError(f"expected a Precedence, got {precedence!r}")
    if not isinstance(result, PermissionRequestResult):
        raise InvalidInputError(f"expected a PermissionRequestResult, got {result!r}")
    action = result.action
    kept = FinalDecision(precedence.decision, precedence.level, precedence.reason)
    if isinstance(action, Continue):
        return kept
    if not isinstance(action, Override):
        raise InvalidInputError(
            f"PermissionRequestResult.action must be Continue or Override: {action!r}"
        )
    decision = parse_decision(action.decision)
    hook = result.overridden_by or _UNNAMED_HOOK
    if precedence.locked:
        why = "failure_policy=fail" if precedence.level == 3 else "P0–P2 cannot be overridden"
        ignored = (
            f"Override({decision.value}) from hook {hook!r} ignored: "
            f"{precedence.label} Deny is locked ({why})"
        )
        return FinalDecision(_DENY, precedence.level, precedence.reason, ignored_override=ignored)
    reason = action.reason or f"hook {hook!r} overrode {precedence.label} {precedence.decision}"
    return FinalDecision(decision, precedence.level, reason, overridden_by=hook)
