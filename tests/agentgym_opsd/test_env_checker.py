"""Each check of the env checker (agentgym_opsd/env_checker.py) fails on an env that breaks its rule, and its
message names the rule and the fix. One small broken env per rule, each a subclass of `Counter`, which
passes them all."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import gymnasium as gym
import pytest

from agentgym_opsd import env_checker
from agentgym_opsd.contract import Hindsight, TextEnv, Transition, hash_state
from agentgym_opsd.env_checker import check_junk_turns, check_text_env


class Counter(TextEnv):
    """Say tick until max_turns: every tick is admissible, nothing ends a task early."""

    instructions = "Write <action>tick</action> each turn."
    max_turns = 3

    @property
    def num_tasks(self) -> int:
        return 2

    def _load_task(self, index, options):
        self.index, self.ticks = index, 0
        self.task_id, self.task_type = f"count-{index}", "count"
        return f"Task {index}: tick."

    def admissible_actions(self):
        return ["tick"]

    def _apply(self, action):
        if action.content != "tick":
            return Transition("Nothing happens.", admissible=False)
        self.ticks += 1
        return Transition(f"{self.ticks} ticks.", admissible=True)

    def state_key(self):
        return hash_state(self.index, self.ticks)

    def hindsight(self):
        return Hindsight(False, 0.0, "Tick until the end.", {"ticks": self.ticks})


def replace_step(info, **changes):
    """The info dict with its StepInfo changed (what a broken override of step() returns)."""
    info["step"] = dataclasses.replace(info["step"], **changes)
    return info


class NotText(gym.Env):
    """A Gymnasium env, but not a TextEnv."""


class NoInstructions(Counter):
    instructions = ""


class ResetWithoutStepInfo(Counter):
    def reset(self, *, seed=None, options=None):
        observation, _ = super().reset(seed=seed, options=options)
        return observation, {}


class CountsItsOwnTurns(Counter):
    def step(self, action):
        observation, reward, terminated, truncated, info = super().step(action)
        return observation, reward, terminated, truncated, replace_step(info, turn=info["step"].turn + 1)


class NoStateKey(Counter):
    def state_key(self):
        return ""


class NoTaskId(Counter):
    def _load_task(self, index, options):
        observation = super()._load_task(index, options)
        self.task_id = ""
        return observation


class NoEpisodeId(Counter):
    def reset(self, *, seed=None, options=None):
        observation, info = super().reset(seed=seed, options=options)
        return observation, replace_step(info, episode_id="")


class BackwardSpan(Counter):
    def step(self, action):
        observation, reward, terminated, truncated, info = super().step(action)
        return observation, reward, terminated, truncated, replace_step(info, action_span=(3, 1))


class SilentFormatError(Counter):
    def step(self, action):
        observation, reward, terminated, truncated, info = super().step(action)
        if not info["step"].format_ok:
            info = replace_step(info, format_error=None)
        return observation, reward, terminated, truncated, info


class BytesObservation(Counter):
    def _load_task(self, index, options):
        return super()._load_task(index, options).encode()


class RaisesOnce(Counter):
    """Raises in its first turn only: the replay that looks for the env's exception finds none."""

    raised = False

    def _apply(self, action):
        if not self.raised:
            self.raised = True
            raise RuntimeError("only the first time")
        return super()._apply(action)


class GlobalDraws(Counter):
    """Observations depend on how many episodes the class has started: not on the seed."""

    draws = 0

    def _load_task(self, index, options):
        GlobalDraws.draws += 1
        return super()._load_task(index, options)

    def _apply(self, action):
        transition = super()._apply(action)
        return dataclasses.replace(transition, observation=f"{transition.observation} (draw {GlobalDraws.draws})")


class NoHindsight(Counter):
    def hindsight(self):
        return None


class RunsPastMaxTurns(Counter):
    def step(self, action):
        self.max_turns += 1
        try:
            return super().step(action)
        finally:
            self.max_turns -= 1


class TupleDetails(Counter):
    def hindsight(self):
        return Hindsight(False, 0.0, "Tick until the end.", {"ticks": (self.ticks,)})


class ActionOnMalformedTurns(Counter):
    def step(self, action):
        observation, reward, terminated, truncated, info = super().step(action)
        if not info["step"].format_ok:
            info = replace_step(info, action="tick")
        return observation, reward, terminated, truncated, info


class HindsightKeptBack(Counter):
    def step(self, action):
        observation, reward, terminated, truncated, info = super().step(action)
        info.pop("hindsight", None)
        return observation, reward, terminated, truncated, info


class EndsAtTheFirstInvalidTurn(Counter):
    def step(self, action):
        observation, reward, terminated, truncated, info = super().step(action)
        if not info["step"].format_ok and not (terminated or truncated):
            self.done, truncated = True, True
            info["hindsight"] = self.hindsight()
        return observation, reward, terminated, truncated, info


def check_all(env_class):
    check_text_env(env_class, run_gymnasium_checker=False)


def check_junk(env_class):
    check_junk_turns(env_class(), 0, 30.0)


# (broken env, the check to run, the rule its message names, the fix its message names)
CASES = [
    (NotText, check_all, "is not a TextEnv", "subclass agentgym_opsd.TextEnv"),
    (NoInstructions, check_all, "env.instructions is empty", "set the class attribute `instructions`"),
    (ResetWithoutStepInfo, check_junk, "reset: info has no 'step'", "must call super() and return its info"),
    (CountsItsOwnTurns, check_all, "StepInfo.turn is 2, expected 1", "let TextEnv count the turns"),
    (NoStateKey, check_all, "reset: empty state_key", "agentgym_opsd.hash_state"),
    (NoTaskId, check_all, "reset: empty task_id", "set self.task_id in _load_task"),
    (NoEpisodeId, check_all, "reset: empty episode_id", "let TextEnv.reset name the episode"),
    (BackwardSpan, check_all, "bad action_span (3, 1)", "read the action with TextEnv.parse_action"),
    (SilentFormatError, check_all, "format_error is empty", "a malformed turn's ParsedAction must say why"),
    (BytesObservation, check_junk, "reset observation is not a str", "give the observation as text"),
    (RaisesOnce, check_all, "but not when the episode was played again", "from self.np_random"),
    (GlobalDraws, check_all, "the same seed and turns gave different episodes", "never from `random`, the clock"),
    (NoHindsight, check_all, "seed 0: no hindsight at the end", "hindsight() must return an agentgym_opsd.Hindsight"),
    (RunsPastMaxTurns, check_all, "seed 0: ran past max_turns", "let TextEnv.step truncate at max_turns"),
    (TupleDetails, check_all, "JSONL round trip is lossy", "no tuples, sets or objects"),
    (ActionOnMalformedTurns, check_all, "a malformed turn must not carry an action", "answer it with an invalid step"),
    (HindsightKeptBack, check_all, "final step has no Hindsight", "must call super() and return its info"),
    (EndsAtTheFirstInvalidTurn, check_all, "truncated at turn 1, max_turns is 3", "ends by terminating"),
]


def test_the_base_env_passes_every_check():
    check_text_env(Counter)  # gymnasium's checker included


@pytest.mark.parametrize("env_class,check,rule,fix", CASES, ids=[case[0].__name__ for case in CASES])
def test_a_broken_env_fails_with_the_rule_and_its_fix(env_class, check, rule, fix):
    with pytest.raises(AssertionError) as failed:
        check(env_class)
    assert rule in str(failed.value) and fix in str(failed.value), str(failed.value)


class Clock:
    """A clock for the checker that only moves when an env spends its seconds (no timed test)."""

    def __init__(self):
        self.now = 0.0

    def perf_counter(self):
        return self.now


@pytest.mark.parametrize("seconds_per_junk_turn,rule", [(6.0, "junk turn '' took 6.0 s"),
                                                        (1.0, "junk turns took too long (over 10 s for 17)")])
def test_slow_junk_turns_fail_with_the_fix(monkeypatch, seconds_per_junk_turn, rule):
    clock = Clock()
    monkeypatch.setattr(env_checker, "time", SimpleNamespace(perf_counter=clock.perf_counter))

    class SlowOnJunk(Counter):
        def _invalid(self, parsed):
            clock.now += seconds_per_junk_turn
            return super()._invalid(parsed)

    with pytest.raises(AssertionError) as failed:
        check_text_env(SlowOnJunk, junk_seconds=10, run_gymnasium_checker=False)
    assert rule in str(failed.value) and "keep _invalid cheap" in str(failed.value), str(failed.value)
