"""ToolNamePattern / ToolMatchFilter matching logic (bus/matcher.py).

The spec (agent-hooks.md, "ToolMatchFilter" and the test table) asks for a group of 12
``test_matcher_*`` tests. It names the group but not the individual tests, so this file maps the
spec's examples onto the tests below:

=========================================================  =======================================
spec                                                       tests here
=========================================================  =======================================
ToolNamePattern table: Exact("search_papers") ✅ / ❌      test_matcher_exact_*
ToolNamePattern table: Prefix("file_") ✅ / ❌             test_matcher_prefix_*
ToolNamePattern table: Wildcard matches anything           test_matcher_wildcard_matches_anything
ToolNamePattern::parse                                     test_matcher_parse_*,
                                                           test_matcher_str_round_trips,
                                                           test_matcher_parse_rejects_*,
                                                           test_matcher_parse_prefix_property
ToolMatchFilter::default() matches every tool              test_matcher_default_filter_*
ToolMatchFilter::exact / ::prefix                          test_matcher_exact_constructor,
                                                           test_matcher_prefix_constructor,
                                                           test_matcher_constructors_reject_*
content_patterns ("path:.env" and the module docstring)    test_matcher_content_*
name_patterns ["file_*"] + content ["path:.env"]           test_matcher_name_and_content_combined
is_match_all                                               test_matcher_is_match_all_*
=========================================================  =======================================
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bus.errors import InvalidInputError, PatternError
from bus.matcher import MATCH_ALL, WILDCARD, ToolMatchFilter, ToolNamePattern, content_matches

# --- ToolNamePattern ---------------------------------------------------------------------------


def test_matcher_exact_matches_same_name() -> None:
    assert ToolNamePattern("exact", "search_papers").matches("search_papers")


def test_matcher_exact_rejects_other_names() -> None:
    pattern = ToolNamePattern("exact", "search_papers")
    assert not pattern.matches("download_paper")
    assert not pattern.matches("search_papers_v2")  # exact is not a prefix
    assert not pattern.matches("Search_papers")  # case-sensitive


def test_matcher_prefix_matches_names_starting_with_it() -> None:
    pattern = ToolNamePattern("prefix", "file_")
    assert pattern.matches("file_write")
    assert pattern.matches("file_")


def test_matcher_prefix_rejects_other_names() -> None:
    pattern = ToolNamePattern("prefix", "file_")
    assert not pattern.matches("search_papers")
    assert not pattern.matches("file")
    assert not pattern.matches("my_file_write")  # prefix, not substring


def test_matcher_wildcard_matches_anything() -> None:
    for name in ("search_papers", "file_write", "", "*"):
        assert WILDCARD.matches(name)


def test_matcher_parse_star_is_wildcard() -> None:
    assert ToolNamePattern.parse("*") == WILDCARD
    assert ToolNamePattern.parse("*").kind == "wildcard"


def test_matcher_parse_trailing_star_is_prefix() -> None:
    assert ToolNamePattern.parse("file_*") == ToolNamePattern("prefix", "file_")


def test_matcher_parse_plain_name_is_exact() -> None:
    assert ToolNamePattern.parse("x") == ToolNamePattern("exact", "x")
    assert ToolNamePattern.parse("run_bash") == ToolNamePattern("exact", "run_bash")


@pytest.mark.parametrize("text", ["*", "file_*", "run_bash", "x"])
def test_matcher_str_round_trips(text: str) -> None:
    pattern = ToolNamePattern.parse(text)
    assert str(pattern) == text
    assert ToolNamePattern.parse(str(pattern)) == pattern


@pytest.mark.parametrize("bad", ["", "   ", "a*b", "*x", "**", "a**", None, 42, ["file_*"]])
def test_matcher_parse_rejects_malformed_name_patterns(bad: object) -> None:
    with pytest.raises(PatternError):
        ToolNamePattern.parse(bad)  # type: ignore[arg-type]


def test_matcher_pattern_error_is_invalid_input() -> None:
    # Callers may catch the broader InvalidInputError / ValueError.
    with pytest.raises(InvalidInputError):
        ToolNamePattern.parse("a*b")
    with pytest.raises(ValueError):
        ToolNamePattern.parse("")


_NAME_CHARS = st.characters(exclude_characters="*", exclude_categories=("Cs",))


@given(name=st.text(_NAME_CHARS), prefix=st.text(_NAME_CHARS, min_size=1))
def test_matcher_parse_prefix_property(name: str, prefix: str) -> None:
    pattern = ToolNamePattern.parse(prefix + "*")
    assert pattern.kind == "prefix"
    assert pattern.matches(name) == name.startswith(prefix)
    assert pattern.matches(prefix + name)


# --- ToolMatchFilter: names ----------------------------------------------------------------------


def test_matcher_default_filter_matches_everything() -> None:
    default = ToolMatchFilter()
    assert default == MATCH_ALL
    assert default.is_match_all()
    assert default.matches("anything")
    assert default.matches("file_read", {"path": "/etc/passwd"})
    assert default.matches("", None)


def test_matcher_exact_constructor() -> None:
    f = ToolMatchFilter.exact("search_papers")
    assert f.name_patterns == (ToolNamePattern("exact", "search_papers"),)
    assert f.matches("search_papers")
    assert not f.matches("search_papers_v2")
    assert not f.is_match_all()


def test_matcher_prefix_constructor() -> None:
    f = ToolMatchFilter.prefix("file_")
    assert f.name_patterns == (ToolNamePattern("prefix", "file_"),)
    assert f.matches("file_write")
    assert not f.matches("search_papers")
    assert not f.is_match_all()


@pytest.mark.parametrize("bad", ["", "a*", "*", "file_*", None])
def test_matcher_constructors_reject_bad_names(bad: str) -> None:
    with pytest.raises(PatternError):
        ToolMatchFilter.exact(bad)
    with pytest.raises(PatternError):
        ToolMatchFilter.prefix(bad)


def test_matcher_filter_rejects_raw_strings_as_name_patterns() -> None:
    with pytest.raises(PatternError):
        ToolMatchFilter(("file_*",))  # type: ignore[arg-type]
    with pytest.raises(PatternError):
        ToolMatchFilter.parse("file_*")
    with pytest.raises(PatternError):
        ToolMatchFilter.parse([], "path:.env")


def test_matcher_several_name_patterns_are_or() -> None:
    f = ToolMatchFilter.parse(["run_bash", "file_*"])
    assert f.matches("run_bash")
    assert f.matches("file_write")
    assert not f.matches("search_papers")


def test_matcher_to_strings_round_trips() -> None:
    names, content = ["*", "file_*", "run_bash"], ["path:.env", "secret"]
    f = ToolMatchFilter.parse(names, content)
    assert f.to_strings() == (names, content)
    assert ToolMatchFilter.parse(*f.to_strings()) == f


# --- ToolMatchFilter: content -------------------------------------------------------------------


def test_matcher_content_key_substring() -> None:
    f = ToolMatchFilter.parse([], ["path:.env"])
    assert f.matches("file_read", {"path": "/app/.env"})
    assert not f.matches("file_read", {"path": "/app/main.py"})
    assert not f.matches("file_read", {"other": "/app/.env"})  # missing key
    assert not f.matches("file_read", {})
    assert not f.matches("file_read", None)
    assert not f.matches("file_read", {"path": "/app/.ENV"})  # case-sensitive


def test_matcher_content_nested_key() -> None:
    f = ToolMatchFilter.parse([], ["a.b:x"])
    assert f.matches("t", {"a": {"b": "yxz"}})
    assert not f.matches("t", {"a": {"b": "y"}})
    assert not f.matches("t", {"a": {"c": "x"}})
    assert not f.matches("t", {"a": "x"})  # "a" is not a dictionary
    assert not f.matches("t", {"b": "x"})
    assert not f.matches("t", {"a.b": "x"})  # the dot is a path, not part of the key


def test_matcher_content_key_presence() -> None:
    f = ToolMatchFilter.parse([], ["path:"])
    assert f.matches("t", {"path": ""})
    assert f.matches("t", {"path": None})
    assert f.matches("t", {"path": {"deep": 1}})
    assert not f.matches("t", {"other": "path"})
    assert content_matches("a.b:", {"a": {"b": 0}})
    assert not content_matches("a.b:", {"a": {}})


def test_matcher_content_bare_substring_searches_nested_strings() -> None:
    f = ToolMatchFilter.parse([], ["secret"])
    assert f.matches("t", {"cmd": "cat secret.txt"})
    assert f.matches("t", {"outer": {"inner": {"x": "my-secret"}}})
    assert f.matches("t", {"files": ["a.txt", "secret.key"]})
    assert f.matches("t", {"batch": [{"args": ("x", "top secret")}]})
    assert not f.matches("t", {"cmd": "ls"})
    assert not f.matches("t", {"secret": "ls"})  # keys are not searched
    assert not f.matches("t", {})


def test_matcher_content_non_string_values_compare_as_json() -> None:
    assert content_matches("n:42", {"n": 42})
    assert content_matches("n:4", {"n": 42})
    assert not content_matches("n:43", {"n": 42})
    assert content_matches("flag:true", {"flag": True})
    assert content_matches("v:null", {"v": None})
    assert content_matches("xs:[1,2]", {"xs": [1, 2]})
    assert content_matches('cfg:"k":1', {"cfg": {"k": 1}})
    # a bare substring only looks at string values, not numbers
    assert not content_matches("42", {"n": 42})


def test_matcher_content_several_patterns_are_or() -> None:
    f = ToolMatchFilter.parse([], ["path:.env", "cmd:rm "])
    assert f.matches("t", {"path": ".env"})
    assert f.matches("t", {"cmd": "rm -rf /"})
    assert not f.matches("t", {"path": "main.py", "cmd": "ls"})


def test_matcher_name_and_content_combined() -> None:
    f = ToolMatchFilter.parse(["file_*"], ["path:.env"])
    assert f.matches("file_read", {"path": "/app/.env"})
    assert not f.matches("file_read", {"path": "/app/main.py"})
    assert not f.matches("search", {"path": ".env"})


@pytest.mark.parametrize("bad", [":x", ":", "", "a..b:x", ".a:x", "a.:x", None, 42])
def test_matcher_content_rejects_malformed_patterns(bad: object) -> None:
    with pytest.raises(PatternError):
        ToolMatchFilter.parse([], [bad])  # type: ignore[list-item]
    with pytest.raises(PatternError):
        ToolMatchFilter(content_patterns=(bad,))  # type: ignore[arg-type]


# --- is_match_all -------------------------------------------------------------------------------


def test_matcher_is_match_all_false_with_content_patterns() -> None:
    assert not ToolMatchFilter.parse([], ["path:.env"]).is_match_all()
    assert not ToolMatchFilter.parse(["*"], ["secret"]).is_match_all()


def test_matcher_is_match_all_with_wildcard_among_names() -> None:
    f = ToolMatchFilter.parse(["run_bash", "*"])
    assert f.is_match_all()
    assert f.matches("anything_else")
    assert ToolMatchFilter.parse(["*"]).is_match_all()
    assert not ToolMatchFilter.parse(["run_bash", "file_*"]).is_match_all()
