"""WebShop's turn labels (`turn_labels=True`): did the turn move toward the target product, privileged
(only in hindsight), and nothing the agent sees changes when they are on."""

from __future__ import annotations

import json

import numpy as np
import pytest

import agentgym_opsd
from environments.webshop.env import WebShopEnv
from environments.webshop.reward import option_reward
from environments.webshop.search import PRODUCTS_PER_PAGE

ENV_ID = "agentgym/WebShop-v0"


@pytest.fixture(scope="module")
def builtin_index(tmp_path_factory):
    return str(tmp_path_factory.mktemp("webshop") / "builtin-index")


@pytest.fixture(scope="module")
def env(builtin_index) -> WebShopEnv:
    e = agentgym_opsd.make(ENV_ID, split="all", index_dir=builtin_index, turn_labels=True, max_turns=40).unwrapped
    yield e
    e.close()


def act(env: WebShopEnv, action: str, *, raw: bool = False) -> dict:
    """Play `action`; its label, which names the expert's action in the state it was played in."""
    expert = env.expert_action()
    env.step(action if raw else env.format_action(action))
    label = env.hindsight().details["turn_labels"][-1]
    assert label["expert_action"] == (None if expert is None else bare(expert))
    assert label["progress"] == (label["delta"] < 0) and label["turn"] == env.turn
    return {k: label[k] for k in ("event", "delta")}


def bare(turn: str) -> str:
    return turn.removeprefix("<action>").removesuffix("</action>")


def test_expert_turns_move_toward_the_target(env) -> None:
    for seed in range(0, env.num_tasks, 7):
        env.reset(seed=seed)
        played = []
        while True:
            turn = env.expert_action()
            played.append(bare(turn))
            _, _, terminated, truncated, info = env.step(turn)
            if terminated or truncated:
                break
        labels = info["hindsight"].details["turn_labels"]
        assert [lab["expert_action"] for lab in labels] == played
        assert [lab["turn"] for lab in labels] == list(range(1, len(played) + 1))
        assert labels[0]["event"] == "search_found_target" and labels[-1]["event"] == "bought_target"
        assert all(lab["progress"] == (lab["delta"] == -1) for lab in labels)
        chose = sum(lab["event"] == "chose_goal_option" for lab in labels)
        assert chose == info["reward_info"]["num_option_matches"], env.task_id
        for label, action in zip(labels[1:-1], played[1:-1], strict=True):
            if action.lower() == f"click[{env.goal.asin.lower()}]":
                assert label["event"] == "clicked_target"
            elif action == "click[Next >]":
                assert label["event"] == "page_toward_target"
            else:  # an option the expert sets: progress only when it matches one more goal option
                assert label["event"] in ("chose_goal_option", None) and label["delta"] in (-1, 0)


def _goal_with_two_values(env: WebShopEnv) -> tuple[int, str, str, str]:
    """A task whose target has a group with a goal-matching value and a non-matching one."""
    for seed in range(env.num_tasks):
        env.reset(seed=seed)
        target = env.world.catalog.by_asin[env.goal.asin]
        for group, values in target.options.items():
            good = [v for v in values if option_reward([v], env.goal.goal_options)[1] == 1]
            bad = [v for v in values if option_reward([v], env.goal.goal_options)[1] == 0]
            if good and bad:
                return seed, group, good[0], bad[0]
    raise AssertionError("no builtin goal has an option group with a matching and a non-matching value")


def test_wasted_and_regress_turns_on_the_target(env) -> None:
    seed, _, good, bad = _goal_with_two_values(env)
    env.reset(seed=seed)
    target = env.goal.asin
    assert act(env, "search[zzzz qqqq]") == {"event": None, "delta": 0}
    assert act(env, "click[Back to Search]") == {"event": None, "delta": 0}  # those results did not list the target
    query = bare(env.expert_action())
    assert act(env, query) == {"event": "search_found_target", "delta": -1}
    assert act(env, "click[Back to Search]") == {"event": "left_target", "delta": 1}
    assert act(env, query) == {"event": "search_found_target", "delta": -1}
    assert env.session.results.index(target) < PRODUCTS_PER_PAGE  # the expert's query lists it on page 1
    other = next(a for a in env.session.page_products() if a != target)
    assert act(env, f"click[{other}]") == {"event": None, "delta": 0}
    assert act(env, "click[Description]") == {"event": None, "delta": 0}  # another product's page
    assert act(env, "click[< Prev]") == {"event": None, "delta": 0}
    assert act(env, "click[< Prev]") == {"event": None, "delta": 0}  # back to the results that list it
    assert act(env, f"click[{target}]") == {"event": "clicked_target", "delta": -1}
    assert act(env, "click[Description]") == {"event": None, "delta": 0}
    assert act(env, "click[< Prev]") == {"event": None, "delta": 0}
    assert act(env, f"click[{good}]") == {"event": "chose_goal_option", "delta": -1}
    assert act(env, f"click[{good}]") == {"event": None, "delta": 0}  # chosen already
    assert act(env, f"click[{bad}]") == {"event": "unchose_goal_option", "delta": 1}
    assert act(env, f"click[{good}]") == {"event": "chose_goal_option", "delta": -1}
    assert act(env, "click[< Prev]") == {"event": "left_target", "delta": 1}  # the options are lost
    assert act(env, f"click[{target}]") == {"event": "clicked_target", "delta": -1}
    _, reward, terminated, _, info = env.step(env.format_action("click[Buy Now]"))
    assert terminated and info["hindsight"].details["turn_labels"][-1]["event"] == "bought_target"
    assert len(info["hindsight"].details["turn_labels"]) == env.turn == 19


def test_invalid_turns_and_buying_another_product(env) -> None:
    env.reset(seed=3)
    assert act(env, "<think>no action</think>", raw=True) == {"event": None, "delta": 0}
    assert act(env, "click[Buy Now]") == {"event": None, "delta": 0}  # not on this page
    query = bare(env.expert_action())
    assert act(env, query) == {"event": "search_found_target", "delta": -1}
    assert act(env, query) == {"event": None, "delta": 0}  # refused: no search bar on the results page
    assert act(env, "click[nothing like this]") == {"event": None, "delta": 0}
    other = next(a for a in env.session.page_products() if a != env.goal.asin)
    assert act(env, f"click[{other}]") == {"event": None, "delta": 0}
    assert act(env, "click[Buy Now]") == {"event": "bought_other", "delta": 0}
    assert env.done and [lab["turn"] for lab in env.hindsight().details["turn_labels"]] == list(range(1, 8))


def test_paging_toward_and_away_from_the_target(env) -> None:
    """Find a query whose results list the target past page 1 (the builtin catalog's titles are the source)."""
    words = sorted({w for p in env.world.catalog.by_asin.values() for w in p.title.split() if w.isalpha()})
    for seed in range(env.num_tasks):
        env.reset(seed=seed)
        target = env.goal.asin
        for word in words:
            results = env.world.search.search(word.lower())
            if target in results[PRODUCTS_PER_PAGE:] and len(results) > 2 * PRODUCTS_PER_PAGE:
                break
        else:
            continue
        page = results.index(target) // PRODUCTS_PER_PAGE + 1
        assert act(env, f"search[{word.lower()}]") == {"event": "search_found_target", "delta": -1}
        for _ in range(page - 1):
            assert act(env, "click[Next >]") == {"event": "page_toward_target", "delta": -1}
        assert target in env.session.page_products()
        if page * PRODUCTS_PER_PAGE < len(results):
            assert act(env, "click[Next >]") == {"event": "page_away_from_target", "delta": 1}
            assert act(env, "click[< Prev]") == {"event": "page_toward_target", "delta": -1}
        assert act(env, "click[< Prev]") == {"event": "page_away_from_target", "delta": 1}
        assert act(env, "click[Back to Search]") == {"event": "left_target", "delta": 1}
        return
    raise AssertionError("no query lists a target past the first results page")


def _labels_change_nothing(plain: WebShopEnv, labelled: WebShopEnv, seeds, rng) -> None:
    for seed in seeds:
        plain_obs, plain_info = plain.reset(seed=seed)
        obs, info = labelled.reset(seed=seed)
        assert obs == plain_obs and info == plain_info
        for k in range(1, plain.max_turns + 1):
            turn = plain.expert_action() if rng.random() < 0.5 else plain.random_action(rng)
            plain_out, out = plain.step(turn), labelled.step(turn)
            assert out[:4] == plain_out[:4], (seed, k, turn)
            hs, plain_hs = out[4].pop("hindsight", None), plain_out[4].pop("hindsight", None)
            assert out[4] == plain_out[4]  # StepInfo, available actions, reward info: no extra keys
            if out[2] or out[3]:
                break
        assert "turn_labels" not in plain_hs.details and len(hs.details.pop("turn_labels")) == k
        assert hs == plain_hs
        json.dumps(labelled.hindsight().to_dict())


def test_labels_change_nothing_the_agent_sees(builtin_index) -> None:
    plain = agentgym_opsd.make(ENV_ID, split="all", index_dir=builtin_index, max_turns=10).unwrapped
    labelled = agentgym_opsd.make(
        ENV_ID, split="all", index_dir=builtin_index, max_turns=10, turn_labels=True
    ).unwrapped
    _labels_change_nothing(plain, labelled, range(0, 40, 4), np.random.default_rng(2))


def test_real_catalog_labels_change_nothing_and_the_expert_buys_the_target(shared_data, tmp_path_factory) -> None:
    real_dir, index = shared_data("webshop"), str(tmp_path_factory.mktemp("webshop") / "real-index")
    plain = agentgym_opsd.make(ENV_ID, catalog=str(real_dir), index_dir=index, split="all").unwrapped
    labelled = agentgym_opsd.make(
        ENV_ID, catalog=str(real_dir), index_dir=index, split="all", turn_labels=True
    ).unwrapped
    _labels_change_nothing(plain, labelled, range(0, 30, 3), np.random.default_rng(5))
    labelled.reset(seed=1)
    while not labelled.done:
        labelled.step(labelled.expert_action())
    labels = labelled.hindsight().details["turn_labels"]
    assert labels[-1]["event"] == "bought_target" and all(lab["delta"] <= 0 for lab in labels)
