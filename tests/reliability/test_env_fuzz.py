"""Every env's parser and step never raise and answer in bounded time on any text (hypothesis).

Each example plays a few turns on one real env; each turn is either the env's expert move (to reach
deeper states: WebShop item pages, Search-QA after a search) or junk: random Unicode with lone
surrogates and control characters, huge strings, soups of nested, unclosed and mismatched tags, and
the env's own action forms with junk arguments. Every step must return a well-formed Gymnasium
5-tuple with a `StepInfo`, within `STEP_SECONDS`.
"""

from __future__ import annotations

import math
import time

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

import agentgym_opsd
from agentgym_opsd.contract import StepInfo
from agentgym_opsd.parsing import ACTION_TAGS, parse_action
from agentgym_opsd.registry import entry, registered_envs
from reliability_fuzz import ANY_TEXT, fuzz_settings

STEP_SECONDS = 5.0  # generous on a loaded 2-core machine; a hang or a backtracking regex takes far longer
FUZZ = fuzz_settings(60)

TAGS = [f"<{t}>" for t in (*ACTION_TAGS, "think")] + [f"</{t}>" for t in (*ACTION_TAGS, "think")]
TOKENS = st.sampled_from(
    TAGS + ["<ACTION>", "</Action>", "< action>", "<action x=1>", "<", ">", "</", "search[", "click[", "[", "]",
            "[[", "]]", "guess ", "guess 7", "go to", "take", "\n", "\x00", "\ud800", "\U0010ffff", "ǅ", "İ", "²",
            "٣", "9" * 5000, "buy now", "< prev", "next >", "back to search", "description", "features",
            "reviews"]  # fmt: skip
) | ANY_TEXT
TAG_SOUP = st.lists(TOKENS, max_size=30).map("".join)
HUGE = st.tuples(st.text(max_size=12),
                 st.integers(1_000, 300_000)).map(lambda t: (t[0] or "x") * (t[1] // max(1, len(t[0] or "x"))))
FORMS = st.sampled_from(["<action>{}</action>", "<action>search[{}]</action>", "<action>click[{}]</action>",
                         "<search>{}</search>",
                         "<answer>{}</answer>", "<action>guess {}</action>", "<think>{}</think><action>{}</action>",
                         "{}"])  # fmt: skip
IN_FORM = st.tuples(FORMS, TAG_SOUP | ANY_TEXT | HUGE).map(lambda t: t[0].replace("{}", t[1]))
JUNK = ANY_TEXT | TAG_SOUP | HUGE | IN_FORM
TURNS = st.lists(st.none() | JUNK, min_size=1, max_size=4)  # None: the expert's move


def _env_ids() -> list[str]:
    """One id per family: the example plug-in, Search-QA, WebShop, ALFWorld where registered."""
    wanted = ["example/GuessNumber-v0", "agentgym/SearchQA-Synthetic-v0", "agentgym/WebShop-v0",
              "agentgym/ALFWorld-All-v0"]
    have = {e.id for e in registered_envs()}
    return [i for i in wanted if i in have]


@pytest.fixture(scope="module")
def envs(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    made: dict[str, object] = {}

    def get(env_id: str):
        if env_id not in made:
            options: dict = {}
            if env_id == "agentgym/WebShop-v0":
                options = {"index_dir": str(tmp_path_factory.mktemp("webshop-fuzz") / "index")}
            elif env_id.startswith(("agentgym/ALFWorld", "agentgym/SearchQA")):  # as the contract suite makes them
                options = request.getfixturevalue(f"contract_options_{entry(env_id).family.lower()}")
                options = dict(options(env_id) if callable(options) else options)
            made[env_id] = agentgym_opsd.make(env_id, **options).unwrapped
        return made[env_id]

    yield get
    for env in made.values():
        env.close()


def _check_step(env, response: str) -> bool:
    t0 = time.perf_counter()
    observation, reward, terminated, truncated, info = env.step(response)
    elapsed = time.perf_counter() - t0
    assert elapsed < STEP_SECONDS, f"step took {elapsed:.1f} s on {response[:200]!r}"
    assert isinstance(observation, str) and len(observation) <= env.max_observation_chars
    assert isinstance(reward, float) and math.isfinite(reward)
    assert isinstance(terminated, bool) and isinstance(truncated, bool)
    step = info["step"]
    assert isinstance(step, StepInfo) and step.turn == env.turn
    if not step.format_ok:
        assert step.action is None and step.format_error and step.admissible is False
    if terminated or truncated:
        assert "hindsight" in info
    return terminated or truncated


@pytest.mark.parametrize("env_id", _env_ids())
@FUZZ
@given(seed=st.integers(0, 2**31 - 1), turns=TURNS)
@example(seed=0, turns=["<action>guess ²</action>"])  # str.isdigit() is true, int() refuses it
@example(seed=1, turns=["<action>guess " + "9" * 5000 + "</action>"])  # past int()'s digit limit
@example(seed=2, turns=["<search>\ud800</search>"])  # a lone surrogate sent to the retrieval server
@example(seed=3, turns=[None, "<action>search[\udfff]</action>"])
@example(seed=4, turns=["<action>search[" + "x" * 30_000 + "]</action>", "<answer>" + "é" * 19_000 + "</answer>"])
@example(seed=6, turns=["<action>search[a\ud800b]</action>"])
@example(seed=5, turns=[None, "<action>click[\ud800]</action>", None, "<action>click[</action>"])
def test_step_never_raises_and_answers_in_bounded_time(envs, env_id: str, seed: int, turns: list[str | None]) -> None:
    env = envs(env_id)
    env.reset(seed=seed)
    for turn in turns:
        response = env.expert_action() if turn is None else turn
        if response is None:  # no expert move left
            break
        if _check_step(env, response):
            break


@FUZZ
@given(text=JUNK, tags=st.lists(st.sampled_from(ACTION_TAGS), min_size=1, max_size=3, unique=True), bare=st.booleans())
def test_the_parser_never_raises_and_its_spans_point_at_its_action(text: str, tags: list[str], bare: bool) -> None:
    t0 = time.perf_counter()
    parsed = parse_action(text, tuple(tags), allow_bare=bare)
    assert time.perf_counter() - t0 < STEP_SECONDS
    if parsed.ok:
        c0, c1 = parsed.content_span
        b0, b1 = parsed.span
        assert text[c0:c1] == parsed.content and b0 <= c0 <= c1 <= b1 and parsed.content.strip() == parsed.content
    else:
        assert parsed.content is None and parsed.error
