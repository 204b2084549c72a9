"""ALFWorld's turn labels (`turn_labels=True`): the change in the expert's remaining plan length per turn,
privileged (only in hindsight), and nothing else about the env changes when they are on."""

from __future__ import annotations

import json

import numpy as np
import pytest

import agentgym_opsd
from environments.alfworld.expert import World, plan


@pytest.fixture(scope="module")
def labelled(make_env):
    e = make_env(task_types="all", turn_labels=True)
    yield e
    e.close()


def planner_length(env) -> int:
    """The expert's plan length from the env's current state, computed afresh (not through the env's cache)."""
    world = World.from_facts(env.engine.facts.facts, env.engine.game.names)
    return len(plan(world, env.task_spec))


def test_expert_turns_are_progress_of_one_step_each_down_to_zero(labelled) -> None:
    for seed in range(labelled.num_tasks):
        labelled.reset(seed=seed)
        start = planner_length(labelled)
        played = []
        terminated = False
        while not terminated:
            turn = labelled.expert_action()
            played.append(turn.removeprefix("<action>").removesuffix("</action>"))
            _, _, terminated, truncated, info = labelled.step(turn)
            assert not truncated, labelled.task_id
        labels = info["hindsight"].details["turn_labels"]
        assert [lab["turn"] for lab in labels] == list(range(1, len(played) + 1))
        assert all(lab["progress"] and lab["delta"] == -1 for lab in labels), (labelled.task_id, labels)
        assert [lab["expert_action"] for lab in labels] == played
        assert [lab["plan_length_before"] for lab in labels] == list(range(start, 0, -1))
        assert labels[-1]["plan_length_after"] == 0 and info["hindsight"].success


def test_wasted_invalid_and_regress_turns(labelled) -> None:
    regressed = 0
    for seed in range(labelled.num_tasks):
        labelled.reset(seed=seed)
        # Walk the expert's plan up to the turn that takes the first object: we stand where it lies.
        while not labelled.expert_action().startswith("<action>take "):
            labelled.step(labelled.expert_action())
        before = planner_length(labelled)
        expert = labelled.expert_action().removeprefix("<action>").removesuffix("</action>")
        labelled.step("look")  # admissible, changes nothing
        labelled.step("<action>fly to the moon</action>")  # well formed, not admissible
        labelled.step("<think>no action block")  # malformed
        away = next(a for a in labelled.admissible_actions() if a.startswith("go to "))
        labelled.step(away)
        after = planner_length(labelled)
        look, fly, malformed, walk = labelled.hindsight().details["turn_labels"][-4:]
        for label in (look, fly, malformed):
            assert label == {**label, "progress": False, "delta": 0, "expert_action": expert,
                             "plan_length_before": before, "plan_length_after": before}  # fmt: skip
        assert walk["delta"] == after - before >= 0 and walk["progress"] is False and walk["expert_action"] == expert
        regressed += walk["delta"] > 0
    assert regressed >= labelled.num_tasks // 2  # leaving the object behind usually costs the walk back


def test_labels_so_far_at_any_time_json_and_reset(labelled) -> None:
    rng = np.random.default_rng(3)
    labelled.reset(seed=5)
    assert labelled.hindsight().details["turn_labels"] == []
    for k in range(1, 7):
        before = planner_length(labelled)
        labelled.step(labelled.random_action(rng))
        labels = labelled.hindsight().details["turn_labels"]
        assert len(labels) == k and labels[-1]["delta"] == planner_length(labelled) - before
        assert labels[-1]["progress"] == (labels[-1]["delta"] < 0)
    json.loads(json.dumps(labelled.hindsight().to_dict()))
    labelled.reset(seed=5)
    assert labelled.hindsight().details["turn_labels"] == []


def test_labels_change_nothing_the_agent_sees(make_env) -> None:
    rng = np.random.default_rng(11)
    for seed in (0, 4, 9):
        plain = make_env(task_types="all", max_turns=25)
        labelled = make_env(task_types="all", max_turns=25, turn_labels=True)
        try:
            plain_obs, plain_info = plain.reset(seed=seed)
            obs, info = labelled.reset(seed=seed)
            assert obs == plain_obs and info["step"] == plain_info["step"]
            for k in range(1, 26):
                roll = rng.random()
                turn = (plain.expert_action() if roll < 0.4 else "look" if roll < 0.5
                        else "<action>" if roll < 0.6 else plain.random_action(rng))  # fmt: skip
                plain_out, out = plain.step(turn), labelled.step(turn)
                assert out[:4] == plain_out[:4], (seed, k, turn)
                assert out[4]["step"] == plain_out[4]["step"]
                assert set(out[4]) == set(plain_out[4])  # no extra info keys
                if out[2] or out[3]:
                    break
            hs, plain_hs = out[4]["hindsight"], plain_out[4]["hindsight"]
            assert "turn_labels" not in plain_hs.details and len(hs.details.pop("turn_labels")) == k
            assert hs == plain_hs
        finally:
            plain.close()
            labelled.close()


def test_gym_id_takes_the_option(panel_options: dict) -> None:
    env = agentgym_opsd.make("agentgym/ALFWorld-Pick-v0", turn_labels=True, **panel_options)
    try:
        env.reset(seed=0)
        env.step(env.unwrapped.expert_action())
        (label,) = env.unwrapped.hindsight().details["turn_labels"]
        assert label["progress"] and label["delta"] == -1
    finally:
        env.close()


def test_off_by_default_the_hooks_never_run(make_env, monkeypatch) -> None:
    env = make_env()
    assert env.turn_labels is None

    def fail(*args, **kwargs):
        raise AssertionError("a label hook ran with turn labels off")

    monkeypatch.setattr(type(env), "_label_context", fail)
    monkeypatch.setattr(type(env), "_label_turn", fail)
    try:
        env.reset(seed=1)
        for _ in range(4):
            env.step(env.expert_action())
        assert "turn_labels" not in env.hindsight().details
    finally:
        env.close()
