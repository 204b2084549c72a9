"""Tag parsing: every rule of agentgym_opsd/parsing.py, spans, and bounded time on any input."""

from __future__ import annotations

import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentgym_opsd.parsing import parse_action


def test_single_action_with_exact_spans() -> None:
    text = "<think>go to the desk</think>\n<action>  go to desk 1 </action> trailing"
    p = parse_action(text)
    assert p.ok and p.kind == "action" and p.content == "go to desk 1"
    assert text[p.span[0] : p.span[1]] == "<action>  go to desk 1 </action>"
    assert text[p.content_span[0] : p.content_span[1]] == "go to desk 1"


def test_spans_count_characters_not_bytes() -> None:
    text = "<think>é中🙂</think><action>prends la pomme é</action>"
    p = parse_action(text)
    assert text[p.content_span[0] : p.content_span[1]] == "prends la pomme é"
    assert p.span == (text.index("<action>"), len(text))


def test_case_insensitive_tags() -> None:
    p = parse_action("<ACTION>look</Action>")
    assert p.ok and p.content == "look"


@pytest.mark.parametrize(
    "text, error",
    [
        ("no tags at all", "missing <action>...</action>"),
        ("<action>look", "unclosed <action>"),
        ("look</action>", "stray </action>"),
        ("<action><action>look</action></action>", "nested <action>"),
        ("<action>a</action> <action>b</action>", "multiple action blocks"),
        ("<action>   </action>", "empty <action>"),
        ("<think>I will <action>look</action>", "unclosed <think>"),
    ],
)
def test_invalid_turns(text: str, error: str) -> None:
    p = parse_action(text)
    assert not p.ok and p.error == error
    assert p.content is None and p.span is None and p.kind is None


def test_actions_inside_think_do_not_count() -> None:
    p = parse_action("<think>maybe <action>open door</action>?</think><action>look</action>")
    assert p.ok and p.content == "look"
    assert not parse_action("<think><action>open door</action></think>").ok


def test_search_and_answer_tags() -> None:
    tags = ("search", "answer")
    p = parse_action("<think>need facts</think><search>capital of France</search>", tags)
    assert (p.kind, p.content) == ("search", "capital of France")
    p = parse_action("<answer>Paris</answer>", tags)
    assert (p.kind, p.content) == ("answer", "Paris")
    both = parse_action("<search>x</search><answer>y</answer>", tags)
    assert both.error == "multiple action blocks"
    mismatched = parse_action("<search>x</answer>", tags)
    assert not mismatched.ok and "mismatched" in mismatched.error


def test_tags_not_accepted_by_the_env_are_text() -> None:
    p = parse_action("<answer>42</answer><action>look</action>", ("action",))
    assert p.ok and p.content == "look"


def test_other_angle_brackets_are_text() -> None:
    p = parse_action("<action>put <b>apple</b> in fridge</action>")
    assert p.content == "put <b>apple</b> in fridge"
    assert not parse_action("< action>look</ action>").ok


def test_bare_commands() -> None:
    assert parse_action("  go to desk 1 \n", allow_bare=True).content == "go to desk 1"
    assert parse_action("go to desk 1").error.startswith("missing")
    assert not parse_action("line one\nline two", allow_bare=True).ok  # a bare command is one line
    assert not parse_action("<action>look", allow_bare=True).ok  # tags present: no bare fallback
    assert not parse_action("   ", allow_bare=True).ok


def test_unknown_tag_set_is_a_programming_error() -> None:
    with pytest.raises(ValueError, match="unknown action tags"):
        parse_action("x", ("act",))


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.sampled_from(list("<>/actionsearchwkd éx\n")), max_size=300), st.booleans())
def test_never_raises_and_spans_are_consistent(text: str, bare: bool) -> None:
    p = parse_action(text, ("action", "search", "answer"), allow_bare=bare)
    if p.ok:
        assert text[p.content_span[0] : p.content_span[1]] == p.content
        assert p.span[0] <= p.content_span[0] <= p.content_span[1] <= p.span[1]
        assert p.content == p.content.strip() and p.content
    else:
        assert p.error and p.content is None


def test_bounded_time_on_huge_and_pathological_input() -> None:
    cases = ["<" * 200_000, "<action>" * 100_000, "<think>" + "x" * 1_000_000,
             "</action>" * 50_000 + "<action>a</action>"]
    for text in cases:
        t0 = time.perf_counter()
        parse_action(text)
        assert time.perf_counter() - t0 < 2.0
