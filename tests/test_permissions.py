"""Permission rules, modes, P0–P8 precedence and PermissionRequest (agent_adapter/permissions.py).

The spec's test table (agent-hooks.md) names a group of five ``test_precedence_*`` tests
("多源权限优先级裁决") without naming them one by one, plus two PermissionRequest tests. This
file maps them as follows:

* ``test_precedence_*`` #1 — each level beats every level below it (P0 > P1 > … > P8):
  ``test_precedence_each_level_wins_over_lower`` (P0..P8, parametrized) and
  ``test_precedence_p0_p2_deny_order``
* ``test_precedence_*`` #2 — P5/P6 (session / tool Ask) only escalate Allow → Ask:
  ``test_precedence_session_and_tool_ask_only_escalate``
* ``test_precedence_*`` #3 — a hook's PermissionRequired escalates Allow → Ask (P4):
  ``test_precedence_hook_permission_required_escalates``
* ``test_precedence_*`` #4 — a P3 hook Block beats Ask and Allow:
  ``test_precedence_hook_block_beats_ask_and_allow``
* ``test_precedence_*`` #5 — implicit Allow when nothing speaks (P8):
  ``test_precedence_implicit_allow``
* ``test_permission_request_override`` (Override escalates Allow → Ask):
  ``test_permission_request_override_escalates_allow_to_ask``
* ``test_permission_request_continue``: ``test_permission_request_continue_keeps_precedence``
* P0–P2 "不可覆盖" (no hook can lift them), as a property:
  ``test_property_p0_p2_deny_is_final``

Also here: permission modes, rule matching with content patterns, ``explain()`` lines, and the
other ``apply_permission_request`` cases (P3 Block downgraded to Ask, enforced P3 locked).
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent_adapter.permissions import (
    FinalDecision,
    PermissionChecker,
    PermissionMode,
    PermissionRule,
    Precedence,
    PrecedenceInputs,
    ToolKind,
    Verdict,
    apply_permission_request,
    resolve_permission_precedence,
)
from bus.actions import CONTINUE, Override, PermissionRequestResult
from bus.errors import InvalidInputError, PatternError
from bus.events import PermissionDecision, PermissionDenialSource
from bus.matcher import ToolMatchFilter

ALLOW = PermissionDecision.ALLOW
ASK = PermissionDecision.ASK
DENY = PermissionDecision.DENY

# --- PermissionMode / ToolKind ----------------------------------------------------------------


def test_mode_wire_names() -> None:
    assert [m.value for m in PermissionMode] == [
        "default",
        "acceptEdits",
        "bypassPermissions",
        "plan",
    ]
    assert [k.value for k in ToolKind] == ["read", "edit", "exec"]


@pytest.mark.parametrize(
    ("name", "mode"),
    [
        ("default", PermissionMode.DEFAULT),
        ("acceptEdits", PermissionMode.ACCEPT_EDITS),
        ("acceptedits", PermissionMode.ACCEPT_EDITS),
        ("bypassPermissions", PermissionMode.BYPASS),
        ("plan", PermissionMode.PLAN),
        (PermissionMode.PLAN, PermissionMode.PLAN),
    ],
)
def test_mode_parse(name: str, mode: PermissionMode) -> None:
    assert PermissionMode.parse(name) is mode


@pytest.mark.parametrize("bad", ["yolo", "", "bypass", None, 3])
def test_mode_parse_rejects_unknown_names(bad: Any) -> None:
    with pytest.raises(InvalidInputError) as err:
        PermissionMode.parse(bad)
    for valid in ("default", "acceptEdits", "bypassPermissions", "plan"):
        assert valid in str(err.value)


def test_checker_rejects_bad_mode() -> None:
    with pytest.raises(InvalidInputError, match="bypassPermissions"):
        PermissionChecker(mode="sudo")
    checker = PermissionChecker()
    with pytest.raises(InvalidInputError):
        checker.mode = "sudo"
    assert checker.mode is PermissionMode.DEFAULT
    checker.mode = "plan"
    assert checker.mode is PermissionMode.PLAN


def test_checker_rejects_bad_kind_and_tool_name() -> None:
    checker = PermissionChecker()
    with pytest.raises(InvalidInputError):
        checker.check("x", {}, "write")  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError):
        checker.check("", {})
    assert checker.check("x", {}, "read") is None  # type: ignore[arg-type]


# --- PermissionRule ---------------------------------------------------------------------------


def test_rule_parse_builds_matcher_filter() -> None:
    rule = PermissionRule.parse("file_*", "Deny", content=["path:.env"], reason="secrets")
    assert rule.match == ToolMatchFilter.parse(["file_*"], ["path:.env"])
    assert rule.decision is DENY
    assert rule.reason == "secrets"
    assert str(rule) == "Deny file_* [path:.env]"


def test_rule_parse_accepts_decision_case_insensitively() -> None:
    assert PermissionRule.parse("*", "allow").decision is ALLOW
    assert PermissionRule.parse("*", ASK).decision is ASK


@pytest.mark.parametrize(
    ("pattern", "content"),
    [("", ()), ("a*b", ()), ("x", (":oops",)), ("x", ("",))],
)
def test_rule_parse_rejects_bad_patterns(pattern: str, content: tuple[str, ...]) -> None:
    with pytest.raises(PatternError):
        PermissionRule.parse(pattern, "Allow", content=content)


def test_rule_parse_rejects_single_content_string_and_bad_decision() -> None:
    with pytest.raises(PatternError):
        PermissionRule.parse("x", "Allow", content="path:.env")
    with pytest.raises(InvalidInputError, match="Allow, Ask, Deny"):
        PermissionRule.parse("x", "Maybe")
    with pytest.raises(InvalidInputError):
        PermissionRule(ToolMatchFilter(), "Deny")  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError):
        PermissionChecker([object()])  # type: ignore[list-item]


def test_rule_matching_with_content_patterns() -> None:
    checker = PermissionChecker(
        [
            PermissionRule.parse("run_shell", "Allow"),
            PermissionRule.parse("run_shell", "Deny", content=["command:rm -rf"], reason="rm"),
            PermissionRule.parse("file_*", "Ask", content=["path:.env", "secret"]),
        ]
    )
    assert checker.check("run_shell", {"command": "ls"}) == Verdict(
        ALLOW, "rule Allow run_shell", checker.rules[0]
    )
    deny = checker.check("run_shell", {"command": "rm -rf /"})
    assert deny is not None and deny.decision is DENY and deny.reason == "rm"
    assert deny.rule is checker.rules[1]
    # content patterns: "key:text" on the named argument, bare text anywhere in the arguments
    assert checker.check("file_read", {"path": "/app/.env"}) is not None
    nested = checker.check("file_read", {"opts": {"note": "top secret"}})
    assert nested is not None and nested.decision is ASK
    assert checker.check("file_read", {"path": "/app/main.py"}) is None
    assert checker.check("search", {"q": "rm -rf"}) is None


def test_checker_deny_beats_ask_beats_allow_regardless_of_order() -> None:
    rules = [
        PermissionRule.parse("*", "Allow"),
        PermissionRule.parse("x*", "Ask"),
        PermissionRule.parse("xy", "Deny", reason="no"),
    ]
    for ordering in (rules, rules[::-1], [rules[1], rules[2], rules[0]]):
        checker = PermissionChecker(ordering)
        assert checker.check("xy", {}) == Verdict(DENY, "no", rules[2])
        ask = checker.check("xz", {})
        assert ask is not None and ask.decision is ASK
        allow = checker.check("a", {})
        assert allow is not None and allow.decision is ALLOW


def test_checker_ties_go_to_the_first_rule_added() -> None:
    first = PermissionRule.parse("*", "Deny", reason="first")
    second = PermissionRule.parse("x", "Deny", reason="second")
    checker = PermissionChecker([first])
    checker.add_rule(second)
    assert checker.check("x", {}) == Verdict(DENY, "first", first)


# --- modes ------------------------------------------------------------------------------------

RULES = [
    PermissionRule.parse("read_*", "Allow", reason="reads are fine"),
    PermissionRule.parse("file_write", "Ask", reason="confirm writes"),
    PermissionRule.parse("run_shell", "Ask", reason="confirm commands"),
    PermissionRule.parse("run_shell", "Deny", content=["command:rm -rf"], reason="destructive"),
    PermissionRule.parse("secret_read", "Deny", reason="no secrets"),
]


def decide(mode: str, tool: str, kind: ToolKind, **args: Any) -> PermissionDecision | None:
    verdict = PermissionChecker(RULES, mode).check(tool, args, kind)
    return None if verdict is None else verdict.decision


def test_mode_default_follows_rules_only() -> None:
    assert decide("default", "read_file", ToolKind.READ) is ALLOW
    assert decide("default", "file_write", ToolKind.EDIT) is ASK
    assert decide("default", "run_shell", ToolKind.EXEC, command="ls") is ASK
    assert decide("default", "run_shell", ToolKind.EXEC, command="rm -rf /") is DENY
    assert decide("default", "unknown", ToolKind.EDIT) is None


def test_mode_accept_edits_allows_asks_on_edit_tools_only() -> None:
    checker = PermissionChecker(RULES, PermissionMode.ACCEPT_EDITS)
    verdict = checker.check("file_write", {}, ToolKind.EDIT)
    assert verdict is not None and verdict.decision is ALLOW
    assert verdict.rule is RULES[1]
    assert "acceptEdits" in verdict.reason and "confirm writes" in verdict.reason
    # an Ask on an exec tool stays Ask; Deny stays Deny even on an edit tool
    assert decide("acceptEdits", "run_shell", ToolKind.EXEC, command="ls") is ASK
    assert decide("acceptEdits", "run_shell", ToolKind.EDIT, command="rm -rf") is DENY
    assert decide("acceptEdits", "unknown", ToolKind.EDIT) is None


def test_mode_bypass_allows_every_ask_but_deny_still_denies() -> None:
    assert decide("bypassPermissions", "file_write", ToolKind.EDIT) is ALLOW
    assert decide("bypassPermissions", "run_shell", ToolKind.EXEC, command="ls") is ALLOW
    assert decide("bypassPermissions", "run_shell", ToolKind.EXEC, command="rm -rf /") is DENY
    assert decide("bypassPermissions", "secret_read", ToolKind.READ) is DENY
    assert decide("bypassPermissions", "unknown", ToolKind.EXEC) is None


def test_mode_plan_is_read_only() -> None:
    checker = PermissionChecker(RULES, "plan")
    for tool, kind in [("file_write", ToolKind.EDIT), ("run_shell", ToolKind.EXEC)]:
        assert checker.check(tool, {}, kind) == Verdict(DENY, "plan mode is read-only")
    # even an Allow rule, or no rule at all, cannot let a non-read tool run in plan mode
    assert checker.check("read_file", {}, ToolKind.EXEC) == Verdict(DENY, "plan mode is read-only")
    assert checker.check("unknown", {}, ToolKind.EDIT) == Verdict(DENY, "plan mode is read-only")
    # READ tools follow the rules
    assert decide("plan", "read_file", ToolKind.READ) is ALLOW
    assert decide("plan", "secret_read", ToolKind.READ) is DENY
    assert decide("plan", "unknown", ToolKind.READ) is None


def test_default_kind_is_exec() -> None:
    assert PermissionChecker(RULES, "plan").check("read_file", {}) == Verdict(
        DENY, "plan mode is read-only"
    )


# --- explain ----------------------------------------------------------------------------------


def test_checker_explain_names_rule_mode_and_reason() -> None:
    checker = PermissionChecker(RULES)
    line = checker.explain("run_shell", {"command": "rm -rf /"})
    assert "Deny run_shell [command:rm -rf]" in line
    assert "destructive" in line and "'run_shell'" in line and "default" in line
    assert "\n" not in line

    assert "no rule matches" in checker.explain("unknown", {})

    checker.mode = PermissionMode.PLAN
    line = checker.explain("file_write", {}, ToolKind.EDIT)
    assert "plan mode" in line and "read-only" in line and "Deny" in line

    checker.mode = PermissionMode.ACCEPT_EDITS
    line = checker.explain("file_write", {}, ToolKind.EDIT)
    assert "Ask file_write" in line and "acceptEdits" in line and "Allow" in line


def test_precedence_explain_mentions_level_source_and_reason() -> None:
    assert Precedence(DENY, 1, "dangerous command").explain() == (
        "P1 tool rule: Deny — dangerous command"
    )
    p3 = Precedence(DENY, 3, "hook 'guard' failed", enforced=True)
    assert p3.explain().startswith("P3 hook block: Deny — hook 'guard' failed")
    assert "enforced" in p3.explain()
    checker_ask = resolve_permission_precedence(PrecedenceInputs(checker=Verdict(ASK, "confirm")))
    assert checker_ask.explain() == "P5 checker: Ask — confirm"
    assert resolve_permission_precedence(PrecedenceInputs()).explain().startswith("P8 implicit")


# --- precedence -------------------------------------------------------------------------------


def everything() -> dict[str, Any]:
    """Every source, each saying its strongest thing; each level is removed in turn below."""
    return {
        "checker": Verdict(DENY, "checker deny"),
        "tool_rule": Verdict(DENY, "tool deny"),
        "session": Verdict(DENY, "session deny"),
        "hook_block": "hook block",
        "hook_permission_required": "hook wants permission",
    }


def inputs_for_level(level: int) -> PrecedenceInputs:
    """Inputs where P``level`` is the highest level that speaks and all lower levels speak too."""
    lower_ask_allow: dict[str, Any] = {
        "checker": Verdict(ALLOW, "checker allow"),
        "tool_rule": Verdict(ASK, "tool ask"),
        "session": Verdict(ASK, "session ask"),
    }
    fields = everything()
    if level >= 1:
        fields["checker"] = lower_ask_allow["checker"]
    if level >= 2:
        fields["tool_rule"] = lower_ask_allow["tool_rule"]
    if level >= 3:
        fields["session"] = lower_ask_allow["session"]
    if level >= 4:
        del fields["hook_block"]
    if level >= 5:
        del fields["hook_permission_required"]
    if level >= 6:
        fields["session"] = Verdict(ALLOW, "session allow")
    if level >= 7:
        fields["tool_rule"] = Verdict(ALLOW, "tool allow")
    if level >= 8:
        del fields["checker"]
    return PrecedenceInputs(**fields)


EXPECTED = {
    0: (DENY, "checker deny"),
    1: (DENY, "tool deny"),
    2: (DENY, "session deny"),
    3: (DENY, "hook block"),
    4: (ASK, "hook wants permission"),
    5: (ASK, "session ask"),
    6: (ASK, "tool ask"),
    7: (ALLOW, "checker allow"),
}


@pytest.mark.parametrize("level", range(9))
def test_precedence_each_level_wins_over_lower(level: int) -> None:
    p = resolve_permission_precedence(inputs_for_level(level))
    assert p.level == level
    if level < 8:
        assert (p.decision, p.reason) == EXPECTED[level]
    else:
        assert p.decision is ALLOW
    assert p.locked == (level <= 2)


def test_precedence_p0_p2_deny_order() -> None:
    """P0 beats P1 beats P2, whatever else is said, and all three are locked."""
    p = resolve_permission_precedence(PrecedenceInputs(**everything()))
    assert (p.level, p.decision, p.locked) == (0, DENY, True)
    tool_only = resolve_permission_precedence(
        PrecedenceInputs(
            checker=Verdict(ALLOW, "ok"),
            tool_rule=Verdict(DENY, "tool deny"),
            session=Verdict(DENY, "session deny"),
        )
    )
    assert (tool_only.level, tool_only.reason, tool_only.locked) == (1, "tool deny", True)
    session_only = resolve_permission_precedence(
        PrecedenceInputs(checker=Verdict(ASK, "a"), session=Verdict(DENY, "session deny"))
    )
    assert (session_only.level, session_only.locked) == (2, True)


def test_precedence_session_and_tool_ask_only_escalate() -> None:
    # Allow (P7) escalated to Ask by a session Ask (P5) or a tool Ask (P6)
    allow = Verdict(ALLOW, "checker allow")
    p5 = resolve_permission_precedence(
        PrecedenceInputs(checker=allow, session=Verdict(ASK, "session ask"))
    )
    assert (p5.decision, p5.level) == (ASK, 5)
    p6 = resolve_permission_precedence(
        PrecedenceInputs(checker=allow, tool_rule=Verdict(ASK, "tool ask"))
    )
    assert (p6.decision, p6.level) == (ASK, 6)
    # … but never lift a Deny above them
    for deny in (
        PrecedenceInputs(checker=Verdict(DENY, "d"), session=Verdict(ASK, "a")),
        PrecedenceInputs(tool_rule=Verdict(DENY, "d"), session=Verdict(ASK, "a")),
        PrecedenceInputs(session=Verdict(DENY, "d"), tool_rule=Verdict(ASK, "a")),
        PrecedenceInputs(hook_block="b", session=Verdict(ASK, "a"), tool_rule=Verdict(ASK, "a")),
    ):
        assert resolve_permission_precedence(deny).decision is DENY
    # a session Ask outranks a tool Ask; the global checker's Ask ranks with the session's (P5)
    both = resolve_permission_precedence(
        PrecedenceInputs(session=Verdict(ASK, "s"), tool_rule=Verdict(ASK, "t"))
    )
    assert (both.level, both.reason) == (5, "s")
    checker_ask = resolve_permission_precedence(
        PrecedenceInputs(checker=Verdict(ASK, "c"), tool_rule=Verdict(ASK, "t"))
    )
    assert (checker_ask.level, checker_ask.reason, checker_ask.source) == (5, "c", "checker")
    # tool-level and session-level Allow are no-ops: they do not turn a checker Ask into Allow
    no_op = resolve_permission_precedence(
        PrecedenceInputs(
            checker=Verdict(ASK, "c"),
            tool_rule=Verdict(ALLOW, "t"),
            session=Verdict(ALLOW, "s"),
        )
    )
    assert (no_op.decision, no_op.level) == (ASK, 5)
    assert (
        resolve_permission_precedence(
            PrecedenceInputs(tool_rule=Verdict(ALLOW, "t"), session=Verdict(ALLOW, "s"))
        ).level
        == 8
    )


def test_precedence_hook_permission_required_escalates() -> None:
    p = resolve_permission_precedence(
        PrecedenceInputs(checker=Verdict(ALLOW, "fine"), hook_permission_required="network")
    )
    assert (p.decision, p.level, p.reason) == (ASK, 4, "network")
    # it outranks the Asks below it, but not a Deny or a Block
    p = resolve_permission_precedence(
        PrecedenceInputs(session=Verdict(ASK, "s"), hook_permission_required="network")
    )
    assert p.level == 4
    p = resolve_permission_precedence(
        PrecedenceInputs(hook_block="stop", hook_permission_required="network")
    )
    assert (p.decision, p.level) == (DENY, 3)
    p = resolve_permission_precedence(
        PrecedenceInputs(session=Verdict(DENY, "no"), hook_permission_required="network")
    )
    assert (p.decision, p.level) == (DENY, 2)


def test_precedence_hook_block_beats_ask_and_allow() -> None:
    p = resolve_permission_precedence(
        PrecedenceInputs(
            checker=Verdict(ALLOW, "fine"),
            tool_rule=Verdict(ASK, "t"),
            session=Verdict(ASK, "s"),
            hook_block="blocked by guard",
        )
    )
    assert (p.decision, p.level, p.reason, p.locked) == (DENY, 3, "blocked by guard", False)
    enforced = resolve_permission_precedence(
        PrecedenceInputs(hook_block="guard timed out", hook_block_enforced=True)
    )
    assert (enforced.level, enforced.enforced, enforced.locked) == (3, True, True)


def test_precedence_implicit_allow() -> None:
    p = resolve_permission_precedence(PrecedenceInputs())
    assert (p.decision, p.level, p.locked) == (ALLOW, 8, False)
    p7 = resolve_permission_precedence(PrecedenceInputs(checker=Verdict(ALLOW, "listed")))
    assert (p7.decision, p7.level, p7.reason) == (ALLOW, 7, "listed")


def test_precedence_rejects_inconsistent_input() -> None:
    with pytest.raises(InvalidInputError):
        PrecedenceInputs(hook_block_enforced=True)
    with pytest.raises(InvalidInputError):
        PrecedenceInputs(checker="Deny")  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError):
        Precedence(ALLOW, 1, "P1 is always a Deny")
    with pytest.raises(InvalidInputError):
        Precedence(DENY, 9, "no P9")
    with pytest.raises(InvalidInputError):
        Precedence(DENY, 0, "only P3 can be enforced", enforced=True)
    with pytest.raises(InvalidInputError):
        resolve_permission_precedence({})  # type: ignore[arg-type]


# --- PermissionRequest ------------------------------------------------------------------------


def override(decision: PermissionDecision, hook: str = "h", reason: str = "") -> Any:
    return PermissionRequestResult(
        action=Override(decision=decision, reason=reason), overridden_by=hook
    )


def test_permission_request_continue_keeps_precedence() -> None:
    for p in (
        Precedence(ALLOW, 8, "default"),
        Precedence(ASK, 5, "s"),
        Precedence(DENY, 0, "c"),
    ):
        final = apply_permission_request(p, PermissionRequestResult(action=CONTINUE))
        assert final == FinalDecision(p.decision, p.level, p.reason)


def test_permission_request_override_escalates_allow_to_ask() -> None:
    final = apply_permission_request(
        Precedence(ALLOW, 7, "checker allow"), override(ASK, "auditor", "confirm prod writes")
    )
    assert final == FinalDecision(ASK, 7, "confirm prod writes", overridden_by="auditor")
    assert "auditor" in final.explain() and "Ask" in final.explain()


def test_permission_request_override_downgrades_p3_block_to_ask() -> None:
    p = resolve_permission_precedence(PrecedenceInputs(hook_block="looks risky"))
    final = apply_permission_request(p, override(ASK, "reviewer"))
    assert (final.decision, final.level, final.overridden_by) == (ASK, 3, "reviewer")
    assert final.ignored_override is None
    assert "reviewer" in final.reason  # no reason given: one is made up naming the hook


def test_permission_request_override_can_force_allow_or_deny() -> None:
    final = apply_permission_request(Precedence(ASK, 6, "tool ask"), override(ALLOW))
    assert final.decision is ALLOW and final.denial_source is None
    final = apply_permission_request(Precedence(ALLOW, 8, "default"), override(DENY, "fw", "no"))
    assert (final.decision, final.reason) == (DENY, "no")
    assert final.denial_source is PermissionDenialSource.RULE


@pytest.mark.parametrize("level", [0, 1, 2])
@pytest.mark.parametrize("decision", list(PermissionDecision))
def test_permission_request_locked_deny_ignores_override(
    level: int, decision: PermissionDecision
) -> None:
    p = Precedence(DENY, level, "locked reason")
    assert p.locked
    final = apply_permission_request(p, override(decision, "sneaky", "let me"))
    assert (final.decision, final.level, final.reason) == (DENY, level, "locked reason")
    assert final.overridden_by is None
    assert final.ignored_override is not None
    assert "sneaky" in final.ignored_override and f"P{level}" in final.ignored_override
    assert f"Override({decision.value})" in final.ignored_override


def test_permission_request_enforced_p3_is_locked() -> None:
    p = resolve_permission_precedence(
        PrecedenceInputs(hook_block="guard timed out", hook_block_enforced=True)
    )
    final = apply_permission_request(p, override(ALLOW, "sneaky"))
    assert final.decision is DENY
    assert final.ignored_override is not None and "failure_policy=fail" in final.ignored_override


def test_permission_request_override_without_hook_name() -> None:
    result = PermissionRequestResult(action=Override(decision=ASK))
    final = apply_permission_request(Precedence(ALLOW, 8, "d"), result)
    assert final.decision is ASK and final.overridden_by == "(unnamed hook)"


def test_apply_permission_request_rejects_bad_arguments() -> None:
    with pytest.raises(InvalidInputError):
        apply_permission_request("Allow", PermissionRequestResult(action=CONTINUE))  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError):
        apply_permission_request(Precedence(ALLOW, 8, "d"), CONTINUE)  # type: ignore[arg-type]


# --- property: P0–P2 Deny is final ------------------------------------------------------------

verdicts = st.one_of(
    st.none(),
    st.builds(Verdict, st.sampled_from(list(PermissionDecision)), st.sampled_from(["r1", "r2"])),
)


@st.composite
def precedence_inputs(draw: st.DrawFn) -> PrecedenceInputs:
    block = draw(st.one_of(st.none(), st.sampled_from(["", "blocked"])))
    return PrecedenceInputs(
        checker=draw(verdicts),
        tool_rule=draw(verdicts),
        session=draw(verdicts),
        hook_block=block,
        hook_block_enforced=block is not None and draw(st.booleans()),
        hook_permission_required=draw(st.one_of(st.none(), st.sampled_from(["", "net"]))),
    )


request_results = st.one_of(
    st.builds(
        PermissionRequestResult,
        action=st.just(CONTINUE),
        overridden_by=st.none(),
    ),
    st.builds(
        PermissionRequestResult,
        action=st.builds(
            Override,
            decision=st.sampled_from(list(PermissionDecision)),
            reason=st.sampled_from(["", "because"]),
        ),
        overridden_by=st.one_of(st.none(), st.sampled_from(["h1", "h2"])),
    ),
)


@settings(max_examples=300, deadline=None)
@given(inputs=precedence_inputs(), result=request_results)
def test_property_p0_p2_deny_is_final(inputs: PrecedenceInputs, result: Any) -> None:
    p = resolve_permission_precedence(inputs)
    final = apply_permission_request(p, result)
    if p.decision is DENY and p.level <= 2:
        assert final.decision is DENY
        assert final.overridden_by is None
    if p.locked:
        assert final.decision is DENY
    # any Deny from a checker or rule is resolved at P0–P2
    denies = [inputs.checker, inputs.tool_rule, inputs.session]
    if any(v is not None and v.decision is DENY for v in denies):
        assert p.level <= 2 and final.decision is DENY
    # Continue never changes anything; an unlocked Override always applies
    if isinstance(result.action, Override) and not p.locked:
        assert final.decision is result.action.decision
    elif not isinstance(result.action, Override):
        assert (final.decision, final.level) == (p.decision, p.level)
