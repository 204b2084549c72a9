"""AlfWorldEnv: observations, action format, rewards, state keys, expert, hindsight, ids, data sources."""

from __future__ import annotations

import json
import re
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

import agentgym_opsd
from agentgym_opsd.agents import ExpertAgent, RandomAgent
from agentgym_opsd.contract import EnvUnavailable
from agentgym_opsd.registry import entry
from agentgym_opsd.rollout import EpisodeRequest, run_episodes
from environments.alfworld.env import SUBSETS, AlfWorldEnv

IDS = ["Pick", "Look", "Clean", "Heat", "Cool", "PickTwo", "All"]


@pytest.fixture(scope="module")
def env(make_env):
    e = make_env()
    yield e
    e.close()


def action(turn: str) -> str:
    return re.search(r"<action>(.*)</action>", turn).group(1)


def test_intro_and_instructions(env) -> None:
    obs, info = env.reset(seed=0)
    assert obs.startswith(
        "-= Welcome to TextWorld, ALFRED! =-\n\nYou are in the middle of a room. Looking quickly around you, you see ")
    assert re.search(r"\n\nYour task is to: [a-z].*\.$", obs)
    assert env.goal and env.goal in obs
    assert "<think>" in env.instructions and "<action>" in env.instructions and "50 turns" in env.instructions
    step = info["step"]
    assert step.turn == 0 and step.task_id == env.games[0].task_id and step.task_type in SUBSETS
    assert step.admissible_actions == sorted(step.admissible_actions) and "look" in step.admissible_actions
    assert all(a.startswith("go to ") for a in step.admissible_actions if a not in ("help", "inventory", "look"))


def test_action_format_invalid_turns_and_nothing_happens(env) -> None:
    env.reset(seed=1)
    key = env.state_key()
    for turn, format_ok in [
        ("<think>hmm</think><action>fly to the moon</action>", True),  # well formed, not admissible
        ("go to the moon", True),  # a bare command (accepted by default), not admissible
        ("<action>look</action><action>look</action>", False),
        ("<think>unclosed", False),
        ("", False),
    ]:
        obs, reward, terminated, truncated, info = env.step(turn)
        assert obs == "Nothing happens." and reward == 0.0 and not terminated
        assert info["step"].format_ok is format_ok and info["step"].admissible is False
        assert env.state_key() == key
    target = env.admissible_actions()[-1]
    obs, _, _, _, info = env.step(f"<think>Let me try.</think>\n<action>  {target.upper()} </action>")
    assert obs != "Nothing happens." and info["step"].admissible and info["step"].action == f"{target.upper()}"


def test_bare_commands_can_be_refused(make_env) -> None:
    strict = make_env(allow_bare_action=False)
    try:
        strict.reset(seed=0)
        command = strict.admissible_actions()[0]
        obs, _, _, _, info = strict.step(command)
        assert obs == "Nothing happens." and not info["step"].format_ok
        obs, _, _, _, info = strict.step(f"<action>{command}</action>")
        assert obs != "Nothing happens." and info["step"].format_ok and info["step"].admissible
    finally:
        strict.close()


def test_expert_solves_every_game_with_scaled_reward(make_env) -> None:
    env = make_env(task_types="all", reward_scale=2.5)
    try:
        for seed in range(env.num_tasks):
            env.reset(seed=seed)
            for _ in range(env.max_turns):
                obs, reward, terminated, truncated, info = env.step(env.expert_action())
                if terminated or truncated:
                    break
            assert terminated and not truncated and reward == 2.5 and info["won"], env.task_id
            hs = info["hindsight"]
            assert hs.success and hs.score == 1.0 and hs.details["expert_plan"] == []
            assert env.expert_action() is None  # nothing left to do
    finally:
        env.close()


def test_the_searching_expert_takes_only_what_it_has_seen_and_wins(make_env) -> None:
    """`expert_searches=True`: the expert goes only to receptacles the room lists, takes an object only
    after an observation showed one of its kind, and still solves every small-room game of every
    type; the planner's expert goes straight to the object, so it never needs more turns."""
    import re

    named = re.compile(r"\b(?:an?|some) ([a-z]+) \d+")
    # small rooms (at most 6 receptacles): in a full kitchen a search in the listed order can
    # outlast the turn limit
    searching = make_env(task_types="all", room="small", expert_searches=True)
    planner = make_env(task_types="all", room="small")
    searched_longer = 0
    try:
        for seed in range(searching.num_tasks):
            turns = {}
            for name, env in (("search", searching), ("plan", planner)):
                obs, _ = env.reset(seed=seed)
                listed = set(re.findall(r"\b(?:an?) ([a-z]+ \d+)", obs.split("Your task")[0]))
                seen: set[str] = set()
                for turn in range(1, env.max_turns + 1):
                    command = env.expert_action()
                    if name == "search":
                        if command.startswith("take "):
                            assert command.split()[1] in seen, (env.task_id, command, seen)
                        if command.startswith("go to "):
                            assert command[len("go to "):] in listed, (env.task_id, command)
                    obs, reward, terminated, truncated, info = env.step(command)
                    seen.update(named.findall(obs))
                    if terminated or truncated:
                        break
                assert terminated and info["won"], (name, env.task_id)
                turns[name] = turn
            assert turns["search"] >= turns["plan"], env.task_id  # the planner knows where things are
            searched_longer += turns["search"] > turns["plan"]
    finally:
        searching.close()
        planner.close()
    assert searched_longer > 0  # the option changes what the expert does


def test_expert_recovers_from_someone_elses_mess(env) -> None:
    rng = np.random.default_rng(4)
    for seed in range(4):
        env.reset(seed=seed)
        for _ in range(12):  # a random agent picks things up, opens, moves them around
            _, _, terminated, _, _ = env.step(env.random_action(rng))
            if terminated:
                break
        plan = env.hindsight().details["expert_plan"]
        for k, command in enumerate(plan):
            _, reward, terminated, _, _ = env.step(command)
            assert terminated == (k == len(plan) - 1), (env.task_id, command)
        assert reward == 1.0


def test_truncation_at_max_turns_with_hindsight(make_env) -> None:
    env = make_env()
    try:
        assert env.max_turns == 50
        env.reset(seed=2)
        for k in range(1, 51):
            _, _, terminated, truncated, info = env.step("look")
            assert not terminated and truncated == (k == 50)
        hs = info["hindsight"]
        assert not hs.success and hs.score == 0.0
        assert hs.details["goal"] == env.goal and hs.details["task_type"] == env.games[2].task_type
        assert hs.details["expert_plan"] and hs.details["expert_plan"] == hs.details["expert_plan_from_start"]
        assert f"Goal: {env.goal}" in hs.reference and "Expert plan from the current state: " in hs.reference
        json.dumps(hs.to_dict())
        with pytest.raises(gym.error.ResetNeeded):
            env.step("look")
    finally:
        env.close()


def test_state_keys_match_across_episodes_and_differ_by_state(env) -> None:
    env.reset(seed=0)
    first = [env.state_key()]
    plan = env.hindsight().details["expert_plan"]
    for command in plan[:3]:
        env.step(command)
        first.append(env.state_key())
    env.reset(seed=0, options={"episode_id": "again"})
    second = [env.state_key()]
    env.step("look")
    assert env.state_key() == second[0]
    for command in plan[:3]:
        env.step(command)
        second.append(env.state_key())
    assert first == second and len(set(first)) == len(first)
    env.reset(seed=1)
    assert env.state_key() not in first  # another game


def test_admissible_actions_in_observation(make_env) -> None:
    env = make_env(admissible_in_observation=True)
    try:
        obs, info = env.reset(seed=0)
        assert obs.endswith("Admissible actions: " + ", ".join(info["step"].admissible_actions))
        obs, *_ , info = env.step("take the moon")
        assert obs.startswith("Nothing happens.\n\nAdmissible actions: ")
    finally:
        env.close()


def test_seeds_pick_games_deterministically(make_env) -> None:
    a, b = make_env(task_types="all", split="valid_seen"), make_env(task_types="all", split="valid_seen")
    try:
        n = a.num_tasks
        assert n == 6
        for seed in (0, 4, 5, 6, 11, 12345):
            assert a.reset(seed=seed) == b.reset(seed=seed)
            assert a.task_id == b.task_id == a.games[seed % n].task_id
        a.reset(options={"task_id": a.games[3].task_id})
        assert a.task_id == a.games[3].task_id
        with pytest.raises(KeyError, match="no ALFWorld game"):
            a.reset(options={"task_id": "train/nope"})
    finally:
        a.close()
        b.close()


@pytest.mark.parametrize("name", IDS)
def test_gym_ids_play_their_subset_in_every_split(name: str, panel_options: dict) -> None:
    env_id = f"agentgym/ALFWorld-{name}-v0"
    e = entry(env_id)
    assert e.family == "ALFWorld" and e.splits == ("train", "valid_seen", "valid_unseen")
    types = 6 if name == "All" else 1
    assert [e.sizes(s) for s in e.splits] == [20 * types, 10 * types, 10 * types]
    for split, per_type in (("train", 2), ("valid_unseen", 1)):
        env = agentgym_opsd.make(env_id, split=split, **panel_options)
        try:
            raw = env.unwrapped
            assert raw.num_tasks == per_type * types
            _, info = env.reset(seed=0)
            subset = info["step"].task_type
            assert subset == e.subset or (name == "All" and subset in SUBSETS)
            assert all(g.task_id.startswith(f"{split}/") for g in raw.games)
        finally:
            env.close()


def test_random_and_expert_agents_through_the_rollout(make_env) -> None:
    episodes = run_episodes(lambda: make_env(task_types="all"), ExpertAgent(),
                            [EpisodeRequest(seed=s) for s in range(6)], num_envs=3)
    assert all(e.success for e in episodes) and len({e.task_type for e in episodes}) == 6
    episodes = run_episodes(lambda: make_env(task_types="heat", max_turns=8), RandomAgent(0),
                            [EpisodeRequest(seed=s) for s in range(2)], num_envs=2)
    assert all(e.num_turns == 8 or e.success for e in episodes)


def test_real_data_from_data_dir_and_alfworld_data(real_data: Path, monkeypatch) -> None:
    env = AlfWorldEnv(source="alfworld", data_dir=str(real_data))
    try:
        assert env.num_tasks == 1 and env.games[0].task_type == "pick_heat_then_place_in_recep"
        obs, info = env.reset(seed=7)
        assert "Your task is to: heat some potato and put it in sinkbasin." in obs and info["step"].task_type == "heat"
        assert env.hindsight().details["walkthrough"][-1] == "move potato 2 to sinkbasin 1"
    finally:
        env.close()
    monkeypatch.setenv("ALFWORLD_DATA", str(real_data))
    env = AlfWorldEnv(source="alfworld", task_types="heat")
    assert env.data_root == real_data / "json_2.1.1"
    env.close()
    with pytest.raises(EnvUnavailable, match="no playable look_at_obj_in_light games"):
        AlfWorldEnv(source="alfworld", task_types="look")
    with pytest.raises(EnvUnavailable, match="point data_dir"):
        AlfWorldEnv(data_dir=str(real_data / "json_2.1.1" / "train"))
    monkeypatch.delenv("ALFWORLD_DATA")
    with pytest.raises(EnvUnavailable, match="pass data_dir=PATH"):
        AlfWorldEnv(source="alfworld")


def test_bad_options_are_clear_errors(make_env) -> None:
    with pytest.raises(ValueError, match="split='test'"):
        make_env(split="test")
    with pytest.raises(ValueError, match="unknown ALFWorld task type 'dance'"):
        make_env(task_types="dance")
    with pytest.raises(ValueError, match="room='huge'"):
        make_env(room="huge")
    with pytest.raises(ValueError, match="source='web'"):
        make_env(source="web")
    with pytest.raises(ValueError, match="data_dir is read with source='alfworld'"):
        make_env(source="embedded", data_dir="/tmp")
