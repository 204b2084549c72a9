"""The contract every registered env must pass, as a reusable check (like gymnasium's `check_env`).

`check_text_env(make_env)` raises `AssertionError` with a message naming the broken rule, or the
env's own exception where the env raised (with its traceback). The test
suite runs it on every registered id; a plug-in author can run it on their own env in one line.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import gymnasium as gym
from gymnasium.utils.env_checker import check_env

from agentgym_opsd.agents import RandomAgent
from agentgym_opsd.core import Hindsight, StepInfo, TextEnv
from agentgym_opsd.episode import Episode, load_episodes, save_episodes
from agentgym_opsd.rollout import play_episode

__all__ = ["check_text_env", "JUNK_TURNS"]

JUNK_TURNS: tuple[str, ...] = (
    "",
    " ",
    "\n\n\t",
    "\x00\x01\x7f",
    "<action>",
    "</action>",
    "<action></action>",
    "<action><action>look</action></action>",
    "<action>look</action><action>look</action>",
    "<think>unclosed reasoning <action>look</action>",
    "<search>a</search><answer>b</answer>",
    "<answer>",
    "<ACTION>  </ACTION>",
    "🙂 中文 \u202e ̈ \ud7ff",
    "<" * 5000 + ">" * 5000,
    "<action>" + "x" * 200_000 + "</action>",
    "word " * 100_000,
)


def _assert_step_info(info: dict, turn: int, where: str) -> StepInfo:
    assert "step" in info, f"{where}: info has no 'step'"
    step = info["step"]
    assert isinstance(step, StepInfo), f"{where}: info['step'] is {type(step).__name__}, not StepInfo"
    assert step.turn == turn, f"{where}: StepInfo.turn is {step.turn}, expected {turn}"
    assert isinstance(step.state_key, str) and step.state_key, f"{where}: empty state_key"
    assert step.task_id, f"{where}: empty task_id"
    assert step.episode_id, f"{where}: empty episode_id"
    if step.action_span is not None:
        a, b = step.action_span
        assert 0 <= a <= b, f"{where}: bad action_span {step.action_span}"
    if not step.format_ok:
        assert step.format_error, f"{where}: format_ok is False but format_error is empty"
    return step


def _raise_env_error(env: gym.Env, episode: Episode, seed: int) -> None:
    """An episode the rollout ended as errored means the env raised: raise the env's own exception
    (the episode replayed here, so its traceback points into the env), not what is missing after it."""
    if episode.error is None:
        return
    agent = RandomAgent(seed)
    try:
        _, info = env.reset(seed=seed)
        for _ in range(env.unwrapped.max_turns):
            _, _, terminated, truncated, info = env.step(agent.act([], info, env.unwrapped))
            if terminated or truncated:
                break
    except Exception as e:
        e.add_note(f"check_text_env: raised by the env in a random agent's episode (seed {seed})")
        raise
    raise AssertionError(f"seed {seed}: the env raised during an episode ({episode.error}), "
                         "but not when the episode was played again: is it deterministic?")


def check_text_env(
    make_env: Callable[[], gym.Env],
    *,
    seeds: tuple[int, ...] = (0, 1),
    junk_seconds: float = 30.0,
    run_gymnasium_checker: bool = True,
) -> None:
    """Check one env against the suite's contract.

    - gymnasium's `check_env` passes on the unwrapped env;
    - the same seed and the same turns give the same episode (observations, rewards, StepInfo);
    - junk turns (empty, unicode, huge, nested or unclosed tags) never raise, are answered quickly,
      and are invalid steps with a reason;
    - `info["step"]` is a StepInfo after reset and after every step, with the right turn index;
    - the episode ends by `max_turns` at the latest, with `info["hindsight"]` on its final step;
    - Episodes round-trip through JSONL exactly.
    """
    env = make_env()
    try:
        raw = env.unwrapped
        assert isinstance(raw, TextEnv), f"{type(raw).__name__} is not a TextEnv"
        assert isinstance(raw.instructions, str) and raw.instructions.strip(), "env.instructions is empty"
        if run_gymnasium_checker:
            check_env(raw, skip_close_check=raw.spec is None)

        # Same seed, same turns -> same episode.
        for seed in seeds:
            first = play_episode(env, RandomAgent(seed), seed)
            _raise_env_error(env, first, seed)
            second = play_episode(env, RandomAgent(seed), seed)
            _raise_env_error(env, second, seed)
            assert first.initial_observation == second.initial_observation, f"seed {seed}: reset differs"
            assert [t.to_dict() for t in first.turns] == [t.to_dict() for t in second.turns], (
                f"seed {seed}: the same seed and turns gave different episodes"
            )
            assert first.hindsight is not None and isinstance(first.hindsight, Hindsight), (
                f"seed {seed}: no hindsight at the end"
            )
            assert first.num_turns <= raw.max_turns, f"seed {seed}: ran past max_turns"

            # JSONL round trip.
            with tempfile.TemporaryDirectory() as tmp:
                path = Path(tmp) / "episodes.jsonl"
                save_episodes(path, [first, second])
                back = load_episodes(path)
            assert [e.to_dict() for e in back] == [first.to_dict(), second.to_dict()], "JSONL round trip is lossy"

        # Junk never raises, each junk turn is an invalid step, StepInfo on every step, hindsight at the end.
        observation, info = env.reset(seed=seeds[0])
        _assert_step_info(info, 0, "reset")
        assert isinstance(observation, str), "reset observation is not a str"
        turn = 0
        started = time.perf_counter()
        for junk in JUNK_TURNS:
            turn += 1
            t0 = time.perf_counter()
            observation, reward, terminated, truncated, info = env.step(junk)
            elapsed = time.perf_counter() - t0
            assert elapsed < 5.0, f"junk turn {junk[:30]!r} took {elapsed:.1f} s"
            step = _assert_step_info(info, turn, f"junk turn {junk[:30]!r}")
            assert isinstance(observation, str), "step observation is not a str"
            assert not terminated or "hindsight" in info, "terminated without hindsight"
            if not step.format_ok:
                assert step.action is None, "a malformed turn must not carry an action"
            if terminated or truncated:
                assert isinstance(info.get("hindsight"), Hindsight), "final step has no Hindsight"
                observation, info = env.reset(seed=seeds[0])
                turn = 0
        assert time.perf_counter() - started < junk_seconds, "junk turns took too long"

        # Truncation at max_turns, with hindsight on the last step.
        env.reset(seed=seeds[-1])
        for k in range(1, raw.max_turns + 1):
            _, _, terminated, truncated, info = env.step("")
            _assert_step_info(info, k, f"turn {k}")
            if terminated or truncated:
                assert "hindsight" in info, f"turn {k}: final step without hindsight"
                break
        else:
            raise AssertionError(f"no termination or truncation after max_turns={raw.max_turns} invalid turns")
        assert truncated or terminated, "episode did not end"
        if truncated:
            assert k == raw.max_turns, f"truncated at turn {k}, max_turns is {raw.max_turns}"
    finally:
        env.close()
