"""The env checker: the contract (`agentgym_opsd.contract`) every registered env must pass, as a reusable
check (Gymnasium's `env_checker` and its `check_env`, for text envs).

`check_text_env(make_env)` runs the checks below in order and raises `AssertionError` with a message
naming the broken rule and how to fix it, or the env's own exception where the env raised (with its
traceback). Each rule is a `check_*` function of its own, which a plug-in author can also run alone.
The test suite runs `check_text_env` on every registered id; a plug-in author can run it on their own
env in one line.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import gymnasium as gym
from gymnasium.utils.env_checker import check_env

from agentgym_opsd.agents import RandomAgent
from agentgym_opsd.contract import Hindsight, StepInfo, TextEnv
from agentgym_opsd.episode import Episode, load_episodes, save_episodes
from agentgym_opsd.rollout import play_episode

__all__ = [
    "JUNK_TURNS",
    "check_episode_played",
    "check_final_step_hindsight",
    "check_hindsight_at_the_end",
    "check_instructions",
    "check_is_text_env",
    "check_jsonl_round_trip",
    "check_junk_turns",
    "check_malformed_turn_has_no_action",
    "check_observation",
    "check_same_seed_same_episode",
    "check_step_info",
    "check_text_env",
    "check_truncation_at_max_turns",
    "check_within_max_turns",
]

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

# What most fixes come down to: the base class does the bookkeeping when a subclass lets it.
CALL_SUPER = "an override of reset() or step() must call super() and return its info"


def check_is_text_env(raw: gym.Env) -> TextEnv:
    """The unwrapped env is a `TextEnv` (what gives it the rest of the contract)."""
    assert isinstance(raw, TextEnv), (
        f"{type(raw).__name__} is not a TextEnv: subclass agentgym_opsd.TextEnv and implement num_tasks, "
        "_load_task, _apply, state_key and hindsight"
    )
    return raw


def check_instructions(raw: TextEnv) -> None:
    """`env.instructions`, the system prompt that tells the agent the task rules and the action format,
    is a non-empty string."""
    assert isinstance(raw.instructions, str) and raw.instructions.strip(), (
        "env.instructions is empty: set the class attribute `instructions` to the system prompt "
        "(the task rules and the action format)"
    )


def check_step_info(info: dict, turn: int, where: str) -> StepInfo:
    """`info["step"]` is a StepInfo with the right turn index, a state key, a task id and an episode
    id, a valid action span, and a reason for every malformed turn; returns it."""
    assert "step" in info, f"{where}: info has no 'step': {CALL_SUPER}"
    step = info["step"]
    assert isinstance(step, StepInfo), (
        f"{where}: info['step'] is {type(step).__name__}, not StepInfo: leave info['step'] to TextEnv ({CALL_SUPER})"
    )
    assert step.turn == turn, (
        f"{where}: StepInfo.turn is {step.turn}, expected {turn}: let TextEnv count the turns "
        f"(do not set self.turn; {CALL_SUPER})"
    )
    assert isinstance(step.state_key, str) and step.state_key, (
        f"{where}: empty state_key: state_key() must return a hash of the env's true state "
        "(agentgym_opsd.hash_state(...) of what decides the next observations)"
    )
    assert step.task_id, f"{where}: empty task_id: set self.task_id in _load_task (the same id for a task on every run)"
    assert step.episode_id, f"{where}: empty episode_id: let TextEnv.reset name the episode ({CALL_SUPER})"
    if step.action_span is not None:
        a, b = step.action_span
        assert 0 <= a <= b, (
            f"{where}: bad action_span {step.action_span}: read the action with TextEnv.parse_action "
            "(agentgym_opsd.parse_action), whose spans are (start, end) character offsets into the turn"
        )
    if not step.format_ok:
        assert step.format_error, (
            f"{where}: format_ok is False but format_error is empty: a malformed turn's ParsedAction must "
            "say why (agentgym_opsd.parse_action does)"
        )
    return step


def check_observation(observation: object, where: str) -> None:
    """An observation (from reset or step) is a str: the user turn the agent reads."""
    assert isinstance(observation, str), (
        f"{where} observation is not a str: _load_task and each Transition must give the observation as text"
    )


def check_episode_played(env: gym.Env, episode: Episode, seed: int) -> None:
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
                         "but not when the episode was played again: is it deterministic? Draw its "
                         "randomness from self.np_random, which reset(seed=...) seeds")  # fmt: skip


def check_same_seed_same_episode(env: gym.Env, seed: int) -> tuple[Episode, Episode]:
    """A random agent seeded alike plays the same seed twice: the same first observation, the same
    turns (observations, rewards, StepInfo). Returns the two episodes."""
    first = play_episode(env, RandomAgent(seed), seed)
    check_episode_played(env, first, seed)
    second = play_episode(env, RandomAgent(seed), seed)
    check_episode_played(env, second, seed)
    assert first.initial_observation == second.initial_observation, (
        f"seed {seed}: reset differs: the same seed must give the same task and first observation (let "
        "TextEnv.reset pick the task from the seed; draw any randomness from self.np_random)"
    )
    assert [t.to_dict() for t in first.turns] == [t.to_dict() for t in second.turns], (
        f"seed {seed}: the same seed and turns gave different episodes: draw randomness from self.np_random "
        "(seeded by reset), never from `random`, the clock or state left over from an earlier episode"
    )
    return first, second


def check_hindsight_at_the_end(episode: Episode, seed: int) -> None:
    """A finished episode has its `Hindsight` (the trainer's teacher and the reports read it)."""
    assert episode.hindsight is not None and isinstance(episode.hindsight, Hindsight), (
        f"seed {seed}: no hindsight at the end: hindsight() must return an agentgym_opsd.Hindsight "
        "(TextEnv.step puts it in the final step's info)"
    )


def check_within_max_turns(episode: Episode, max_turns: int, seed: int) -> None:
    """An episode ends by `max_turns` at the latest."""
    assert episode.num_turns <= max_turns, (
        f"seed {seed}: ran past max_turns: let TextEnv.step truncate at max_turns (do not change "
        f"self.max_turns during an episode; {CALL_SUPER})"
    )


def check_jsonl_round_trip(episodes: Sequence[Episode]) -> None:
    """Episodes saved as JSONL read back exactly."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "episodes.jsonl"
        save_episodes(path, episodes)
        back = load_episodes(path)
    assert [e.to_dict() for e in back] == [e.to_dict() for e in episodes], (
        "JSONL round trip is lossy: a Transition's info and Hindsight.details must hold JSON values only "
        "(str keys; str, int, float, bool, None, lists and dicts of them; no tuples, sets or objects)"
    )


def check_final_step_hindsight(info: dict, terminated: bool, truncated: bool) -> None:
    """The final step's info holds the episode's `Hindsight` under "hindsight"."""
    assert not terminated or "hindsight" in info, f"terminated without hindsight: {CALL_SUPER}"
    if terminated or truncated:
        assert isinstance(info.get("hindsight"), Hindsight), (
            f"final step has no Hindsight: hindsight() must return an agentgym_opsd.Hindsight ({CALL_SUPER})"
        )


def check_malformed_turn_has_no_action(step: StepInfo) -> None:
    """A turn the env could not parse carries no action (nothing was played)."""
    if not step.format_ok:
        assert step.action is None, (
            "a malformed turn must not carry an action: answer it with an invalid step that plays nothing "
            "(TextEnv.step does; override _invalid for its observation)"
        )


def check_junk_turns(env: gym.Env, seed: int, junk_seconds: float) -> None:
    """Junk turns (`JUNK_TURNS`: empty, unicode, huge, nested or unclosed tags) never raise, are
    answered within 5 s each and `junk_seconds` in all, are invalid steps without an action, and keep
    StepInfo on every step and hindsight on the final one."""
    observation, info = env.reset(seed=seed)
    check_step_info(info, 0, "reset")
    check_observation(observation, "reset")
    turn = 0
    started = time.perf_counter()
    for junk in JUNK_TURNS:
        turn += 1
        t0 = time.perf_counter()
        observation, _, terminated, truncated, info = env.step(junk)
        elapsed = time.perf_counter() - t0
        assert elapsed < 5.0, (
            f"junk turn {junk[:30]!r} took {elapsed:.1f} s: answer a malformed turn before any costly work "
            "(TextEnv.step parses it in bounded time and calls _invalid; keep _invalid cheap)"
        )
        step = check_step_info(info, turn, f"junk turn {junk[:30]!r}")
        check_observation(observation, "step")
        check_malformed_turn_has_no_action(step)
        check_final_step_hindsight(info, terminated, truncated)
        if terminated or truncated:
            observation, info = env.reset(seed=seed)
            turn = 0
    assert time.perf_counter() - started < junk_seconds, (
        f"junk turns took too long (over {junk_seconds} s for {len(JUNK_TURNS)}): answer malformed turns "
        "without costly work (keep _invalid cheap)"
    )


def check_truncation_at_max_turns(env: gym.Env, seed: int) -> None:
    """Invalid turns alone end the episode by truncation at `max_turns` (or by termination), with
    hindsight on the last step."""
    raw = env.unwrapped
    env.reset(seed=seed)
    for k in range(1, raw.max_turns + 1):
        _, _, terminated, truncated, info = env.step("")
        check_step_info(info, k, f"turn {k}")
        if terminated or truncated:
            assert "hindsight" in info, f"turn {k}: final step without hindsight: {CALL_SUPER}"
            break
    else:
        raise AssertionError(f"no termination or truncation after max_turns={raw.max_turns} invalid turns: "
                             f"let TextEnv.step truncate at max_turns ({CALL_SUPER})")  # fmt: skip
    assert truncated or terminated, "episode did not end"
    if truncated:
        assert k == raw.max_turns, (
            f"truncated at turn {k}, max_turns is {raw.max_turns}: truncate only at max_turns (TextEnv.step "
            "does); an episode that ends early ends by terminating"
        )


def check_text_env(
    make_env: Callable[[], gym.Env],
    *,
    seeds: tuple[int, ...] = (0, 1),
    junk_seconds: float = 30.0,
    run_gymnasium_checker: bool = True,
) -> None:
    """Check one env against the suite's contract.

    - the unwrapped env is a TextEnv with instructions (`check_is_text_env`, `check_instructions`);
    - gymnasium's `check_env` passes on the unwrapped env;
    - the same seed and the same turns give the same episode (`check_same_seed_same_episode`), which
      ends with hindsight (`check_hindsight_at_the_end`) by `max_turns` (`check_within_max_turns`)
      and round-trips through JSONL exactly (`check_jsonl_round_trip`);
    - junk turns (empty, unicode, huge, nested or unclosed tags) never raise, are answered quickly,
      and are invalid steps with a reason (`check_junk_turns`);
    - `info["step"]` is a StepInfo after reset and after every step, with the right turn index
      (`check_step_info`);
    - invalid turns end the episode by `max_turns` at the latest, with `info["hindsight"]` on its final
      step (`check_truncation_at_max_turns`).
    """
    env = make_env()
    try:
        raw = check_is_text_env(env.unwrapped)
        check_instructions(raw)
        if run_gymnasium_checker:
            check_env(raw, skip_close_check=raw.spec is None)
        for seed in seeds:
            first, second = check_same_seed_same_episode(env, seed)
            check_hindsight_at_the_end(first, seed)
            check_within_max_turns(first, raw.max_turns, seed)
            check_jsonl_round_trip([first, second])
        check_junk_turns(env, seeds[0], junk_seconds)
        check_truncation_at_max_turns(env, seeds[-1])
    finally:
        env.close()
