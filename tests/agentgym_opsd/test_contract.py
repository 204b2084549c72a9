"""The TextEnv base class, spaces and records, on the example plug-in env."""

from __future__ import annotations

import gymnasium as gym
import pytest

import agentgym_opsd
from agentgym_opsd import FreeText, Hindsight, StepInfo


@pytest.fixture
def env():
    e = agentgym_opsd.make("example/GuessNumber-v0")
    yield e
    e.close()


def test_free_text_accepts_any_unicode_up_to_max_length() -> None:
    space = FreeText(max_length=10)
    assert "a b\nc é中" in space
    assert "x" * 11 not in space
    assert 3 not in space
    space.seed(0)
    samples = [space.sample() for _ in range(20)]
    assert all(s in space for s in samples)
    assert FreeText(10) == FreeText(10) != FreeText(11)


def test_reset_gives_turn_zero_step_info_and_seed_picks_task(env) -> None:
    obs, info = env.reset(seed=3)
    step = info["step"]
    assert isinstance(step, StepInfo) and step.turn == 0 and step.action is None
    assert step.task_id == "guess-4" and step.episode_id == "guess-4@3"
    assert step.admissible_actions == [f"guess {k}" for k in range(1, 21)]
    _, info = env.reset(seed=23)  # 23 % 20 == 3: the same task
    assert info["step"].task_id == "guess-4"
    _, info = env.reset(seed=0, options={"task_index": 7, "episode_id": "mine"})
    assert info["step"].task_id == "guess-8" and info["step"].episode_id == "mine"
    with pytest.raises(ValueError, match="out of range"):
        env.reset(options={"task_index": 99})


def test_steps_count_turns_and_mark_invalid_turns(env) -> None:
    env.reset(seed=9)  # secret 10
    text = "<think>middle</think><action>guess 5</action>"
    obs, reward, term, trunc, info = env.step(text)
    step = info["step"]
    assert (obs, reward, term, trunc) == ("Higher.", 0.0, False, False)
    assert step.turn == 1 and step.action == "guess 5" and step.format_ok and step.admissible
    assert text[step.action_span[0] : step.action_span[1]] == "<action>guess 5</action>"
    assert step.admissible_actions == [f"guess {k}" for k in range(6, 21)]

    obs, reward, term, trunc, info = env.step("guess 7 please")
    assert info["step"].turn == 2 and not info["step"].format_ok and info["step"].admissible is False
    assert "missing <action>" in info["step"].format_error and "Invalid action" in obs

    obs, reward, term, trunc, info = env.step("<action>guess 10</action>")
    assert term and reward == 1.0 and not trunc
    hs = info["hindsight"]
    assert isinstance(hs, Hindsight) and hs.success and hs.details == {"secret": 10}


def test_truncation_at_max_turns_with_hindsight() -> None:
    env = agentgym_opsd.make("example/GuessNumber-v0", max_turns=3)
    env.reset(seed=0)
    results = [env.step("<action>guess 20</action>") for _ in range(3)]
    assert [r[3] for r in results] == [False, False, True]
    assert "hindsight" in results[-1][4] and not results[-1][4]["hindsight"].success
    with pytest.raises(gym.error.ResetNeeded):
        env.step("<action>guess 1</action>")


def test_non_string_action_is_a_type_error(env) -> None:
    env.reset(seed=0)
    with pytest.raises(TypeError, match="as a str"):
        env.step(3)


def test_state_key_tracks_true_state(env) -> None:
    _, a = env.reset(seed=1)
    _, b = env.reset(seed=21)
    assert a["step"].state_key == b["step"].state_key  # same state, different episodes
    *_, after = env.step("<action>guess 15</action>")
    assert after["step"].state_key != a["step"].state_key


def test_records_round_trip_through_dicts() -> None:
    s = StepInfo(3, "go", "action", (4, 20), True, None, True, ["go", "look"], "k", "t", "pick", "e")
    assert StepInfo.from_dict(s.to_dict()) == s
    with pytest.raises(ValueError, match="unknown fields"):
        StepInfo.from_dict({**s.to_dict(), "bogus": 1})
    h = Hindsight(True, 0.5, "plan: go", {"plan": ["go"]})
    assert Hindsight.from_dict(h.to_dict()) == h
