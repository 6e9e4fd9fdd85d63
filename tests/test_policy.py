"""The Policy hook (workers/builtins/policy.py) at hook level, through the real dispatcher
(``workers.testing.dispatch``): each decision, the rule named in every reason, path
normalisation against the bypasses it closes, linear-time patterns on hostile input, hot reload
keeping the last good rules, and the starter file deciding like the demo hooks it replaces."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import tomllib
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from bus import HookRegistry, PermissionDecision
from bus.actions import InjectContext, Override
from workers.builtins.demo_hooks import Redactor, SecretGuard, ShellPolicy
from workers.builtins.policy import (
    DECISIONS,
    PATH_KEYS,
    RULE_KEYS,
    TOP_KEYS,
    Policy,
    PolicyError,
    decide,
    norm_path,
    parse_rules,
)
from workers.testing import context, dispatch

ROOT = Path(__file__).resolve().parent.parent
STARTER = ROOT / "examples" / "policy" / "starter.toml"
SCHEMA = ROOT / "docs" / "schema" / "policy" / "policy.schema.json"


def policy(tmp_path: Path, text: str) -> Policy:
    path = tmp_path / "rules.toml"
    path.write_text(text)
    return Policy(str(path))


def run(hook: Policy, event: str, **fields: Any) -> Any:
    return asyncio.run(dispatch(hook, event, **fields))


# -- each decision, named -----------------------------------------------------------------------

EVERY_KIND = """
[[rule]]
name = "no-prod"
decision = "deny"
tools = ["Bash(kubectl delete:*)"]
reason = "not in production"

[[rule]]
name = "push-needs-a-person"
decision = "ask"
events = ["PreToolUse", "PermissionRequest"]
tools = ["Bash(git push:*)"]
reason = "pushing is reviewed"

[[rule]]
name = "tests-are-fine"
decision = "allow"
tools = ["Bash(pytest:*)"]

[[rule]]
name = "say-why"
decision = "context"
tools = ["Bash"]
context = "other commands wait for a person"

[[rule]]
name = "staging-not-prod"
decision = "rewrite"
tools = ["Bash"]
rewrite = { command = ['--env=prod\\b', "--env=staging"] }
context = "production is off limits; the command now targets staging"

[[rule]]
name = "no-tokens"
decision = "redact"
output = '(?P<keep>token=)\\w+'
"""


def test_deny_blocks_and_names_the_rule(tmp_path: Path) -> None:
    hook = policy(tmp_path, EVERY_KIND)
    result = run(hook, "PreToolUse", tool_name="Bash", tool_args={"command": "kubectl delete ns x"})
    assert result.is_blocked
    assert result.action.reason == "policy rule no-prod: not in production"
    assert result.blocking_errors[0].hook_name == "Policy"
    permission = run(
        hook, "PermissionRequest", tool_name="Bash", tool_args={"command": "git push origin"}
    )
    assert permission.action == Override(
        decision=PermissionDecision.ASK,
        reason="policy rule push-needs-a-person: pushing is reviewed",
    )


def test_ask_requires_permission(tmp_path: Path) -> None:
    hook = policy(tmp_path, EVERY_KIND)
    result = run(hook, "PreToolUse", tool_name="Bash", tool_args={"command": "git push -f"})
    assert type(result.action).__name__ == "PermissionRequired"
    assert result.action.permission == "policy rule push-needs-a-person: pushing is reviewed"
    assert result.action.tool_name == "Bash"


def test_allow_and_allow_with_context(tmp_path: Path) -> None:
    hook = policy(tmp_path, EVERY_KIND)
    allowed = run(hook, "PermissionRequest", tool_name="Bash", tool_args={"command": "pytest -q"})
    assert allowed.action.decision == PermissionDecision.ALLOW
    assert allowed.action.reason == "policy rule tests-are-fine: Bash is allowed"
    # allow needs every part of the line to match: a chained command falls to the next rule
    chained = run(
        hook, "PermissionRequest", tool_name="Bash", tool_args={"command": "pytest; curl x | sh"}
    )
    assert chained.overridden_by is None
    assert chained.additional_contexts == ("policy rule say-why: other commands wait for a person",)


def test_rewrite_changes_the_arguments(tmp_path: Path) -> None:
    hook = policy(tmp_path, EVERY_KIND)
    result = run(
        hook, "PreToolUse", tool_name="Bash", tool_args={"command": "deploy --env=prod", "n": 1}
    )
    assert result.final_args == {"command": "deploy --env=staging", "n": 1}
    assert result.additional_contexts == (
        "policy rule staging-not-prod: production is off limits; the command now targets staging",
    )
    unchanged = run(hook, "PreToolUse", tool_name="Bash", tool_args={"command": "deploy --env=dev"})
    assert unchanged.action.__class__.__name__ == "Continue"


def test_deny_outranks_a_rewrite_of_the_same_call(tmp_path: Path) -> None:
    hook = policy(tmp_path, EVERY_KIND)
    result = run(
        hook, "PreToolUse", tool_name="Bash", tool_args={"command": "kubectl delete --env=prod"}
    )
    assert result.is_blocked and "policy rule no-prod" in result.action.reason


def test_redact_text_and_structured_output_keeping_its_shape(tmp_path: Path) -> None:
    hook = policy(tmp_path, EVERY_KIND)
    text = run(hook, "PostToolUse", tool_name="Bash", output_content="a token=abc1 b\nline two")
    assert text.final_content == "a token=[redacted] b\nline two"
    assert text.additional_contexts == ("policy rule no-tokens: redacted from the output of Bash",)
    value = {"type": "text", "file": {"content": "x\ntoken=s3cret\ny", "numLines": 3}}
    structured = run(
        hook, "PostToolUse", tool_name="Read", output_content=json.dumps(value), output_value=value
    )
    assert json.loads(structured.final_content) == {
        "type": "text",
        "file": {"content": "x\ntoken=[redacted]\ny", "numLines": 3},
    }
    failed = run(hook, "PostToolUseFailure", tool_name="Bash", error_message="bad token=zz")
    assert failed.final_content == "bad token=[redacted]"


TENANTS = """
[[rule]]
name = "acme-no-web"
decision = "deny"
tools = ["WebFetch", "mcp__fetch__*"]
tenants = ["acme"]
reason = "acme's agents do not browse"

[[rule]]
name = "plan-mode-reads-only"
decision = "deny"
tools = ["Write", "Edit"]
session = { permission_mode = "plan" }

[[rule]]
name = "subagents-no-shell"
decision = "deny"
tools = ["Bash"]
session = { is_subagent = true }
events = ["PermissionRequest"]
"""


def test_per_tenant_and_per_session_attributes(tmp_path: Path) -> None:
    hook = policy(tmp_path, TENANTS)
    acme = run(hook, "PreToolUse", session_id="acme/s1", tool_name="mcp__fetch__get")
    assert acme.is_blocked and acme.action.reason.startswith("policy rule acme-no-web:")
    other = run(hook, "PreToolUse", session_id="globex/s1", tool_name="WebFetch")
    assert not other.is_blocked
    own = run(hook, "PreToolUse", session_id="s1", tool_name="WebFetch")  # no tenant
    assert not own.is_blocked
    planning = {"permission_mode": "plan", "hook_event_name": "PreToolUse"}
    plan = run(hook, "PreToolUse", tool_name="Write", agent_input=planning)
    assert (
        plan.is_blocked
        and plan.action.reason == "policy rule plan-mode-reads-only: Write is denied"
    )
    assert not run(hook, "PreToolUse", tool_name="Write").is_blocked
    sub = run(hook, "PermissionRequest", tool_name="Bash", is_subagent=True)
    assert sub.action.decision == PermissionDecision.DENY
    assert run(hook, "PermissionRequest", tool_name="Bash").overridden_by is None


# -- paths are normalised: each row is a bypass of a plain comparison ---------------------------

DENY_DOT_ENV = """
[[rule]]
name = "no-env"
decision = "deny"
tools = ["Read(./.env)", "file_read(./.env)"]
"""

BYPASSES = [
    # (the path the agent gives, the session's cwd, what closes it)
    ("./.env", "", "a leading ./"),
    ("a/../.env", "", "a .. resolved"),
    ("a/b/../../.env", "", "several .. resolved"),
    (".//.env", "", "a doubled slash"),
    ("././.env", "", "repeated ./"),
    (".env.", "", "a trailing dot (Windows drops it)"),
    (".env..", "", "trailing dots"),
    (".env ", "", "a trailing space (Windows drops it)"),
    (".ENV", "", "case (folded: macOS's and Windows' file systems fold it)"),
    ("a\\..\\.env", "", "backslashes (Windows separators)"),
    ("/home/u/proj/.env", "/home/u/proj", "an absolute path inside the session's cwd"),
    ("/home/u/proj/x/../.env", "/home/u/proj/", "absolute, with .., cwd with a trailing /"),
    ("/HOME/u/Proj/.env", "/home/u/proj", "absolute, cwd in another case"),
    ("//home/u/proj//.env", "/home/u/proj", "absolute with doubled slashes"),
    ("C:\\Proj\\.env", "c:\\proj", "a Windows path inside the cwd, drive and case"),
    (".env::$DATA", "", "an NTFS stream name (Windows opens the file itself)"),
    (".env:x", "", "an NTFS alternate stream"),
]


@pytest.mark.parametrize(("path", "cwd", "closes"), BYPASSES, ids=[b[2] for b in BYPASSES])
def test_a_normalised_path_cannot_bypass_a_rule(
    tmp_path: Path, path: str, cwd: str, closes: str
) -> None:
    assert path != ".env"  # a rule compared as given would let this through
    hook = policy(tmp_path, DENY_DOT_ENV)
    given = {"cwd": cwd, "hook_event_name": "PreToolUse"} if cwd else None
    fields: dict[str, Any] = {"agent_input": given} if given else {}
    result = run(hook, "PreToolUse", tool_name="file_read", tool_args={"path": path}, **fields)
    assert result.is_blocked, f"{path!r} ({closes}) got through"
    claude = run(hook, "PreToolUse", tool_name="Read", tool_args={"file_path": path}, **fields)
    assert claude.is_blocked, f"{path!r} ({closes}) got through Read's file_path"


@pytest.mark.parametrize(
    "path",
    [".envrc", "x/.env", ".env.example", "../.env", "/elsewhere/.env", "a/.env/../b"],
)
def test_normalisation_does_not_widen_an_anchored_rule(tmp_path: Path, path: str) -> None:
    hook = policy(tmp_path, DENY_DOT_ENV)
    fields = {"agent_input": {"cwd": "/home/u/proj", "hook_event_name": "PreToolUse"}}
    result = run(hook, "PreToolUse", tool_name="file_read", tool_args={"path": path}, **fields)
    assert not result.is_blocked, path


def test_case_exact_is_chosen_in_the_file(tmp_path: Path) -> None:
    hook = policy(tmp_path, '[paths]\ncase = "exact"\n' + DENY_DOT_ENV)
    assert not run(hook, "PreToolUse", tool_args={"path": ".ENV"}).is_blocked
    assert run(hook, "PreToolUse", tool_args={"path": "a/../.env."}).is_blocked


def test_norm_path() -> None:
    assert norm_path("a//b/./c/../.env.", fold=False) == "a/b/.env"
    assert norm_path("/p/q/../../../x", fold=False) == "/x"  # no climbing above /
    assert norm_path("../../x", fold=False) == "../../x"
    assert norm_path("/p/Q", "/p", fold=False) == "Q"
    assert norm_path("/p", "/p") == "."


SHELL = """
[[rule]]
name = "no-rm-rf"
decision = "deny"
tools = ["Bash(rm -rf:*)"]
"""


@pytest.mark.parametrize(
    "command",
    [
        "rm -rf /",
        "rm  -rf   /",  # doubled spaces
        "  rm -rf /",
        "cd / && rm -rf x",
        "true; rm -rf x",
        "ls | rm -rf x",
        "echo $(rm -rf x)",
        "FOO=1 rm -rf x",
        "/bin/rm -rf x",
        "sudo rm -rf x",
        "ls\nrm -rf x",
        "(rm -rf x)",
        "{ rm -rf x; }",
        "if true; then rm -rf x; fi",
        'bash -c "rm -rf x"',
        "sh -c 'cd / && rm -rf x'",
        '"rm" -rf x',
        "\\rm -rf x",
        "env rm -rf x",
        "rm\t-rf x",
    ],
)
def test_a_shell_prefix_is_matched_in_every_simple_command(tmp_path: Path, command: str) -> None:
    hook = policy(tmp_path, SHELL)
    result = run(hook, "PreToolUse", tool_name="Bash", tool_args={"command": command})
    assert result.is_blocked, command


def test_a_shell_prefix_is_a_whole_word(tmp_path: Path) -> None:
    hook = policy(tmp_path, SHELL)
    for command in ("rm -rfx", "rm -r f", "echo rm -rf"):
        assert not run(
            hook, "PreToolUse", tool_name="Bash", tool_args={"command": command}
        ).is_blocked


# -- hostile content cannot stall it ------------------------------------------------------------

PATHOLOGICAL = """
[[rule]]
name = "nested-quantifiers"
decision = "deny"
tools = ["*"]
any_arg = '^(a+)+$'

[[rule]]
name = "redact-as"
decision = "redact"
output = '(a|aa)+b'
"""


@pytest.mark.timeout(60)
def test_a_pathological_pattern_on_a_megabyte_is_answered(tmp_path: Path) -> None:
    """``^(a+)+$`` on a's then one other character backtracks exponentially in Python's re
    (and most engines); RE2 answers in linear time. The context is built directly (a dispatch
    would refuse a 1 MB context first, bus/limits.py): this is the hook's own bound."""
    hook = policy(tmp_path, PATHOLOGICAL)
    hostile = "a" * 1_000_000 + "!"
    answer, _ = decide(hook.rules, "PreToolUse", context("PreToolUse", tool_args={"q": hostile}))
    assert answer.__class__.__name__ == "Continue"
    answer, _ = decide(
        hook.rules, "PreToolUse", context("PreToolUse", tool_args={"q": "a" * 1_000_000})
    )
    assert answer.reason.startswith("policy rule nested-quantifiers:")
    out, _ = decide(hook.rules, "PostToolUse", context("PostToolUse", output_content=hostile))
    assert out.__class__.__name__ == "Continue"


@pytest.mark.parametrize(
    ("pattern", "why"),
    [("(a)\\1", "backreference"), ("a(?=b)", "lookahead"), ("(?<!x)y", "lookbehind")],
)
def test_patterns_re2_cannot_run_in_linear_time_are_refused(pattern: str, why: str) -> None:
    text = f'[[rule]]\nname = "r"\ndecision = "deny"\nany_arg = \'{pattern}\'\n'
    with pytest.raises(PolicyError) as refused:
        parse_rules(tomllib.loads(text))
    assert "is not an RE2 pattern" in str(refused.value), why


# -- hot reload ---------------------------------------------------------------------------------

GOOD = '[[rule]]\nname = "no-env"\ndecision = "deny"\ntools = ["file_*(*.env)"]\n'


def test_a_changed_file_is_used_and_a_bad_one_keeps_the_last_good_rules(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    hook = policy(tmp_path, GOOD)
    path = Path(hook.path)
    assert run(hook, "PreToolUse", tool_args={"path": "a.env"}).is_blocked
    assert not run(hook, "PreToolUse", tool_args={"path": "id.pem"}).is_blocked

    path.write_text(GOOD.replace("*.env", "*.pem"))
    assert run(hook, "PreToolUse", tool_args={"path": "id.pem"}).is_blocked  # reloaded
    assert not run(hook, "PreToolUse", tool_args={"path": "a.env"}).is_blocked

    with caplog.at_level(logging.ERROR, logger="hookbus.policy"):
        path.write_text(GOOD.replace('decision = "deny"', 'decision = "deny"\ntypo = 1'))
        result = run(hook, "PreToolUse", tool_args={"path": "id.pem"})
        run(hook, "PreToolUse", tool_args={"path": "id.pem"})  # the same bad file: said once
    assert result.is_blocked  # the last good rules
    assert result.action.reason == "policy rule no-env: file_read is denied"
    assert hook.reload_failures == 1
    assert "\n" not in hook.last_error
    assert hook.last_error.endswith(
        "refused, keeping the last good rules (1): rule 1 (no-env): unknown key 'typo' "
        "(known: any_arg, args, context, decision, description, events, name, output, "
        "reason, rewrite, session, tenants, tools)"
    )
    assert [r.getMessage() for r in caplog.records] == [hook.last_error]

    path.write_text("not = [toml")
    assert run(hook, "PreToolUse", tool_args={"path": "id.pem"}).is_blocked
    assert hook.reload_failures == 2 and "not TOML" in hook.last_error
    path.unlink()
    assert run(hook, "PreToolUse", tool_args={"path": "id.pem"}).is_blocked
    assert hook.reload_failures == 3 and "cannot be read" in hook.last_error

    path.write_text(GOOD)  # fixed: used again, the error cleared
    assert not run(hook, "PreToolUse", tool_args={"path": "id.pem"}).is_blocked
    assert hook.last_error == ""


def test_a_bad_file_at_start_is_refused_with_every_problem(tmp_path: Path) -> None:
    bad = (
        'colour = "red"\n[[rule]]\nname = "a"\ndecision = "block"\n'
        '[[rule]]\nname = "b"\ndecision = "redact"\nevents = ["PreToolUse"]\n'
    )
    with pytest.raises(PolicyError) as refused:
        policy(tmp_path, bad)
    assert refused.value.problems == [
        "unknown key 'colour' at the top (known: paths, rule, version)",
        "rule 1 (a): decision must be one of deny, ask, allow, context, rewrite, redact, "
        "not 'block'",
        "rule 2 (b): a redact rule cannot answer PreToolUse (it can: PostToolUse, "
        "PostToolUseFailure)",
        "rule 2 (b): a redact rule needs output = '<what to redact>'",
    ]


# -- embedded like any hook, and the starter file ------------------------------------------------


def test_embedded_in_a_registry() -> None:
    registry = HookRegistry()
    registry.add(Policy(str(STARTER)))
    ctx = context("PreToolUse", tool_name="Read", tool_args={"file_path": "app/.env"})
    result = asyncio.run(registry.run_pre_tool_use(ctx))  # type: ignore[arg-type]
    assert result.is_blocked and result.action.reason.startswith("policy rule no-env-files:")


SECRET_GUARD_CASES = [
    ("file_read", {"path": "app/.env"}),
    ("file_write", {"path": ".env"}),
    ("file_read", {"path": "notes/todo.md"}),
    ("Read", {"file_path": "/repo/.env"}),
    ("Write", {"file_path": "/repo/.env.local"}),
    ("Edit", {"file_path": "src/main.py"}),
    ("MultiEdit", {"file_path": "deploy/prod.env"}),
    ("search", {"path": ".env"}),
    ("run_shell", {"command": "ls"}),
]


@pytest.mark.parametrize(("tool", "args"), SECRET_GUARD_CASES)
def test_starter_blocks_like_secret_guard(tool: str, args: dict[str, Any]) -> None:
    demo = asyncio.run(dispatch(SecretGuard(), "PreToolUse", tool_name=tool, tool_args=args))
    rules = asyncio.run(
        dispatch(Policy(str(STARTER)), "PreToolUse", tool_name=tool, tool_args=args)
    )
    assert rules.is_blocked == demo.is_blocked


SHELL_CASES = ["ls -la", "echo hi", "ls", "rm x", "cat /etc/hosts", "git status"]


@pytest.mark.parametrize("tool", ["run_shell", "Bash", "file_read"])
@pytest.mark.parametrize("command", SHELL_CASES)
def test_starter_decides_permissions_like_shell_policy(tool: str, command: str) -> None:
    fields = {"tool_name": tool, "tool_args": {"command": command}}
    demo = asyncio.run(dispatch(ShellPolicy(), "PermissionRequest", **fields))
    rules = asyncio.run(dispatch(Policy(str(STARTER)), "PermissionRequest", **fields))
    assert type(rules.action) is type(demo.action)
    assert getattr(rules.action, "decision", None) == getattr(demo.action, "decision", None)
    assert bool(rules.additional_contexts) == bool(demo.additional_contexts)
    if demo.additional_contexts:  # InjectContext: the same words, named
        assert rules.additional_contexts[0].endswith(demo.additional_contexts[0])
    assert not isinstance(rules.action, InjectContext)


REDACTOR_CASES = [
    "API_KEY=sk_live_123 and more\nline two",
    'config: {"env": "API_KEY=abc\\"x"}',
    "nothing secret here",
    "API_KEY=a API_KEY=b",
]


@pytest.mark.parametrize("output", REDACTOR_CASES)
def test_starter_redacts_like_redactor(output: str) -> None:
    demo = asyncio.run(dispatch(Redactor(), "PostToolUse", output_content=output))
    rules = asyncio.run(dispatch(Policy(str(STARTER)), "PostToolUse", output_content=output))
    assert rules.final_content == demo.final_content


def test_starter_redacts_structured_output_like_redactor() -> None:
    value = {"stdout": "API_KEY=xyz\nok", "stderr": "", "interrupted": False}
    fields = {"tool_name": "Bash", "output_content": json.dumps(value), "output_value": value}
    demo = asyncio.run(dispatch(Redactor(), "PostToolUse", **fields))
    rules = asyncio.run(dispatch(Policy(str(STARTER)), "PostToolUse", **fields))
    assert json.loads(rules.final_content) == json.loads(demo.final_content)


def test_starter_refuses_destructive_shell() -> None:
    hook = Policy(str(STARTER))
    for command in ("rm -rf /", "cd repo && git push --force origin main", "dd if=/dev/zero"):
        result = asyncio.run(
            dispatch(hook, "PreToolUse", tool_name="Bash", tool_args={"command": command})
        )
        assert result.action.reason.startswith("policy rule no-destructive-shell:"), command


# -- the schema -----------------------------------------------------------------------------------


def test_the_starter_file_is_valid_against_the_schema() -> None:
    schema = json.loads(SCHEMA.read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    jsonschema.validate(tomllib.loads(STARTER.read_text()), schema)


def test_the_schema_describes_what_the_code_reads() -> None:
    schema = json.loads(SCHEMA.read_text())
    rule = schema["$defs"]["Rule"]
    assert set(schema["properties"]) == TOP_KEYS
    assert set(schema["properties"]["paths"]["properties"]) == PATH_KEYS
    assert set(rule["properties"]) == RULE_KEYS
    assert tuple(rule["properties"]["decision"]["enum"]) == DECISIONS
    bad = {"rule": [{"name": "x", "decision": "deny", "tool": ["Read"]}]}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, schema)
    assert os.path.basename(SCHEMA) == "policy.schema.json"


ALLOW_LS = """
[[rule]]
name = "ls-is-fine"
decision = "allow"
tools = ["Bash(ls:*)"]
"""


@pytest.mark.parametrize(
    "command",
    [
        "LD_PRELOAD=/tmp/x.so ls",  # an assignment runs other code
        "/tmp/evil/ls",  # another program called ls
        "sudo ls",
        "ls > /etc/motd",  # a redirection writes
        "ls < /dev/tcp/x/1",
        "ls $(rm -rf x)",
        "ls `rm -rf x`",
        "ls; rm x",
        "lsblk",
    ],
)
def test_allow_sees_a_command_as_written(tmp_path: Path, command: str) -> None:
    hook = policy(tmp_path, ALLOW_LS)
    result = run(hook, "PermissionRequest", tool_name="Bash", tool_args={"command": command})
    assert result.overridden_by is None, command
    fine = run(hook, "PermissionRequest", tool_name="Bash", tool_args={"command": "ls  -la src"})
    assert fine.action.decision == PermissionDecision.ALLOW


def test_every_path_a_call_names_is_matched(tmp_path: Path) -> None:
    """MCP's filesystem server takes several paths (read_multiple_files: paths; move_file:
    source and destination): a secret among them is found."""
    hook = policy(
        tmp_path, '[[rule]]\nname = "env"\ndecision = "deny"\ntools = ["mcp__*(*.env)"]\n'
    )
    for args in (
        {"paths": ["README.md", "app/../.env"]},
        {"source": "x/.env", "destination": "y.txt"},
        {"source": "y.txt", "destination": ".env"},
    ):
        result = run(hook, "PreToolUse", tool_name="mcp__filesystem__read", tool_args=args)
        assert result.action.reason == "policy rule env: mcp__filesystem__read is denied", args
    benign = {"paths": ["README.md", "src/env.py"]}
    assert not run(hook, "PreToolUse", tool_name="mcp__fs__read", tool_args=benign).is_blocked


def test_a_rewrite_of_a_nested_argument_is_refused() -> None:
    text = '[[rule]]\nname = "r"\ndecision = "rewrite"\nrewrite = { "a.b" = ["x", "y"] }\n'
    with pytest.raises(PolicyError) as refused:
        parse_rules(tomllib.loads(text))
    assert refused.value.problems == ["rule 1 (r): rewrite.a.b: only top-level arguments"]


def test_a_dryrun_answer_names_its_rule_for_the_audit_log(tmp_path: Path) -> None:
    """What a ``dryrun`` (or ``warn``) policy held back is recorded as its detail, in the
    result's ``shadowed``, the audit trail and the span: the rule is named there too."""
    path = tmp_path / "rules.toml"
    path.write_text(DENY_DOT_ENV)

    class Trial(Policy):
        enforcement = "dryrun"

    result = asyncio.run(dispatch(Trial(str(path)), "PreToolUse", tool_args={"path": ".env"}))
    assert not result.is_blocked
    assert (
        result.shadowed[0].detail == "would have blocked: policy rule no-env: file_read is denied"
    )
