"""The WebShop env on the real 100-product sample (../shared/data/webshop) and the built-in catalog:
pages and navigation, invalid steps, the reward at Buy Now, hindsight, splits, the shared world,
the expert and the random agent, and the contract suite."""

from __future__ import annotations

import json

import itertools
import re

import gymnasium as gym
import numpy as np
import pytest

import agentgym_opsd
from agentgym_opsd.agents import RandomAgent
from agentgym_opsd.env_checker import check_text_env
from agentgym_opsd.contract import EnvUnavailable
from agentgym_opsd.rollout import play_episode
from environments.webshop.env import WebShopEnv
from environments.webshop.goals import split_ranges
from environments.webshop.search import SEARCH_RETURN_N

ENV_ID = "agentgym/WebShop-v0"


@pytest.fixture(scope="module")
def real_dir(shared_data):
    return shared_data("webshop")


@pytest.fixture(scope="module")
def real_index(tmp_path_factory):
    return str(tmp_path_factory.mktemp("webshop") / "real-index")


@pytest.fixture(scope="module")
def builtin_index(tmp_path_factory):
    return str(tmp_path_factory.mktemp("webshop") / "builtin-index")


@pytest.fixture(scope="module")
def make_real(real_dir, real_index):
    def make(**options) -> WebShopEnv:
        return agentgym_opsd.make(ENV_ID, catalog=str(real_dir), index_dir=real_index, **options).unwrapped

    return make


def act(env: WebShopEnv, action: str):
    return env.step(env.format_action(action))


def fields(observation: str) -> list[str]:
    return observation.split(" [SEP] ")


# ------------------------------------------------------------------------------------------------
# Contract.


def test_contract_suite_on_the_real_catalog(real_dir, real_index):
    check_text_env(lambda: agentgym_opsd.make(ENV_ID, catalog=str(real_dir), index_dir=real_index, max_turns=8))


def test_registered_with_splits():
    entry = agentgym_opsd.registry.entry(ENV_ID)
    assert entry.family == "WebShop" and set(entry.splits) == {"test", "eval", "train", "all"}


# ------------------------------------------------------------------------------------------------
# Pages and navigation.


def test_search_results_item_subpages_and_buy(make_real):
    env = make_real(split="all")
    obs, info = env.reset(seed=0)
    goal = env.goal
    assert fields(obs) == ["WebShop", "Instruction:", goal.instruction_text, "Search"]
    assert info["available_actions"] == {"has_search_bar": True, "clickables": ["search"]}
    assert info["step"].admissible_actions[0].startswith("search[")

    # Search for a broad query: 50 results at most, 10 per page, Next > / < Prev.
    obs, reward, terminated, _, info = act(env, "search[Women Men Shoes Hair Dress]")
    results = env.session.results
    assert 10 < len(results) <= SEARCH_RETURN_N and reward == 0 and not terminated
    page = fields(obs)
    assert page[:5] == ["Instruction:", goal.instruction_text, "Back to Search",
                        f"Page 1 (Total results: {len(results)})", "Next >"]
    assert page[5::3] == list(results[:10])  # ASIN, title, price for each product
    assert page[6] == env.world.catalog.by_asin[results[0]].title
    assert info["available_actions"]["clickables"] == ["back to search", "next >", *[a.lower() for a in results[:10]]]
    obs, *_ = act(env, "click[Next >]")
    assert fields(obs)[3:6] == [f"Page 2 (Total results: {len(results)})", "< Prev", "Next >"]
    assert fields(obs)[6] == results[10]
    obs, *_ = act(env, "click[< Prev]")
    assert fields(obs)[3] == f"Page 1 (Total results: {len(results)})"

    # The item page of a product with options.
    asin = next(a for a in results[:10] if len(env.world.catalog.by_asin[a].options) >= 1)
    product = env.world.catalog.by_asin[asin]
    obs, *_ = act(env, f"click[{asin.lower()}]")  # links are matched case-insensitively
    page = fields(obs)
    assert page[:4] == ["Instruction:", goal.instruction_text, "Back to Search", "< Prev"]
    expected_options = [t for group, values in product.options.items() for t in (group, *values)]
    assert page[4 : 4 + len(expected_options)] == expected_options
    assert page[4 + len(expected_options) :] == [
        product.title, f"Price: {product.price_tag}", f"Rating: {product.rating}", "Description", "Features", "Reviews",
        "Buy Now",
    ]
    group, values = next(iter(product.options.items()))
    act(env, f"click[{values[-1]}]")
    assert env.session.options == {group: values[-1]}

    # Sub-pages keep the chosen options; < Prev returns to the item page.
    obs, *_ = act(env, "click[Features]")
    assert fields(obs)[:4] == ["Instruction:", goal.instruction_text, "Back to Search", "< Prev"]
    assert [b.strip() for b in product.bullet_points if b.strip()] == fields(obs)[4:]
    obs, *_ = act(env, "click[< Prev]")
    assert env.session.page == "item" and env.session.options == {group: values[-1]}
    obs, *_ = act(env, "click[Description]")
    assert fields(obs)[4:] == ([product.description.strip()] if product.description.strip() else [])
    act(env, "click[< Prev]")
    obs, *_ = act(env, "click[Reviews]")
    assert env.session.page == "sub" and fields(obs)[3] == "< Prev"
    act(env, "click[< Prev]")

    # Buy Now ends the episode with WebShop's reward of this purchase.
    obs, reward, terminated, truncated, info = act(env, "click[Buy Now]")
    expected = env.world.reward(goal, asin, {group: values[-1]})
    assert terminated and not truncated
    assert reward == pytest.approx(expected.reward) and info["reward_info"] == expected.to_dict()
    assert info["purchased"] == {"asin": asin, "options": {group: values[-1]}}
    # The done page: what WebShop's shows (minus the MTurk code): the purchase, the score, the reward details.
    shown = fields(obs)
    assert shown[:5] == ["Thank you for shopping with us!", "Purchased", "asin", asin, "options"]
    assert json.loads(shown[5]) == {group: values[-1]}
    assert shown[6:8] == ["attrs", str(list(product.attributes))]
    assert shown[shown.index("Your score (min 0.0, max 1.0)") + 1] == f"{expected.reward}"
    assert shown[-2] == "Reward Details"
    details = json.loads(shown[-1])
    assert list(details)[:6] == ["r_type", "r_att", "w_att", "query_match", "category_match", "title_score"]
    assert details["r_type"] == expected.r_type and details["title_score"] == pytest.approx(expected.title_score)
    assert ("r_price" in details) == (expected.r_price is not None)
    assert goal.instruction_text not in obs and "Your code" not in obs  # no goal fields, no MTurk code
    hindsight = info["hindsight"]
    assert hindsight.score == pytest.approx(expected.reward) and hindsight.success == (expected.reward == 1.0)
    assert hindsight.details["purchased"]["asin"] == asin and hindsight.details["reward_info"] == expected.to_dict()
    assert "Reward " in hindsight.reference and goal.instruction_text in hindsight.reference


def test_prev_from_item_forgets_options_and_back_to_search_resets(make_real):
    env = make_real(split="all")
    env.reset(seed=1)
    act(env, "search[dress]")
    asin = env.session.results[0]
    act(env, f"click[{asin}]")
    product = env.world.catalog.by_asin[asin]
    if product.options:
        act(env, f"click[{next(iter(product.options.values()))[0]}]")
    act(env, "click[< Prev]")
    assert env.session.page == "results" and env.session.asin is None and env.session.options == {}
    act(env, "click[Back to Search]")
    assert env.session.page == "search" and env.session.keywords is None and env.session.results == ()


def test_invalid_actions_change_nothing(make_real):
    env = make_real(split="all")
    env.reset(seed=2)
    act(env, "search[hair]")
    key = env.state_key()
    page = env._render()
    for turn in [
        "<action>search[more hair]</action>",  # no search bar on a results page
        "<action>click[Buy Now]</action>",  # not on this page
        "<action>click[B000000000]</action>",
        "<action>click[]</action>",
        "<action>jump[high]</action>",
        "<action>search</action>",
        "no tags at all",
        "<action>click[search]</action>",
    ]:
        obs, reward, terminated, truncated, info = env.step(turn)
        assert env.state_key() == key and reward == 0.0 and not terminated
        assert info["step"].admissible is False
        assert info["available_actions"] == env.available_actions()
        assert obs.startswith("Invalid action") and obs.endswith(page)


def test_search_is_case_insensitive_and_cleaned(make_real):
    env = make_real(split="all")
    env.reset(seed=0)
    act(env, "search[  Hair   GROWTH ]")
    assert env.session.keywords == "hair growth"
    first = env.session.results
    env.reset(seed=0)
    act(env, "search[hair growth]")
    assert env.session.results == first and len(first) > 0


def test_search_finds_products_by_title(make_real):
    env = make_real(split="all")
    search = env.world.search
    ranks = []
    for product in env.world.catalog.products:
        found = search.search(product.title)
        assert len(found) <= SEARCH_RETURN_N and set(found) <= set(env.world.catalog.by_asin)
        ranks.append(found.index(product.asin) if product.asin in found else None)
    assert all(r is not None for r in ranks)
    assert sum(r == 0 for r in ranks) >= 95  # BM25 ranks a product first for its own title


# ------------------------------------------------------------------------------------------------
# Tasks, splits, sharing.


def test_splits_tasks_and_ids(make_real):
    envs = {s: make_real(split=s) for s in ("test", "eval", "train", "all")}
    n = len(envs["all"].world.goals)
    ranges = split_ranges(n)
    ids = {}
    for split, env in envs.items():
        assert env.num_tasks == len(ranges[split])
        ids[split] = set()
        for i in range(env.num_tasks):
            env.reset(seed=i)
            ids[split].add(env.task_id)
            assert env.goal is env.world.goals[ranges[split][i]]
    assert not (ids["test"] & ids["eval"]) and not (ids["eval"] & ids["train"]) and not (ids["test"] & ids["train"])
    assert ids["test"] | ids["eval"] | ids["train"] == ids["all"]
    env = envs["eval"]
    some = sorted(ids["eval"])[3]
    env.reset(seed=999, options={"task_id": some})
    assert env.task_id == some
    with pytest.raises(KeyError):
        env.task_index(sorted(ids["test"])[0])


def test_envs_share_one_world(make_real, real_dir, real_index):
    a, b = make_real(split="test"), make_real(split="train")
    assert a.world is b.world and a.world.search is b.world.search
    c = WebShopEnv(catalog=real_dir / "items_shuffle_100.json", attributes=real_dir / "items_ins_v2_1000.json",
                   index_dir=real_index)
    assert c.world.catalog.products == a.world.catalog.products  # another spelling of the same files


def test_bad_options_are_clear_errors(tmp_path):
    with pytest.raises(ValueError, match="split must be one of"):
        WebShopEnv(split="dev")
    with pytest.raises(EnvUnavailable, match="no such file"):
        WebShopEnv(catalog=tmp_path / "nothing.json")
    with pytest.raises(EnvUnavailable, match="no WebShop product file"):
        WebShopEnv(catalog=tmp_path)
    with pytest.raises(ValueError, match="goals must be"):
        WebShopEnv(goals="some")


# ------------------------------------------------------------------------------------------------
# The expert and the random agent.


def _best_reward_for_target(env: WebShopEnv) -> float:
    """The best reward any choice of the target's options can get (brute force)."""
    goal, product = env.goal, env.world.catalog.by_asin[env.goal.asin]
    groups = list(product.options)
    best = 0.0
    for values in itertools.product(*(product.options[g] for g in groups)):
        best = max(best, env.world.reward(goal, product.asin, dict(zip(groups, values))).reward)
    return best


def _run_expert(env: WebShopEnv, seed: int):
    env.reset(seed=seed)
    while True:
        obs, reward, terminated, truncated, info = env.step(env.expert_action())
        assert info["step"].admissible, f"the expert took an invalid step: {obs[:200]}"
        if terminated or truncated:
            return info


def test_expert_reaches_the_best_reward_of_every_real_goal(make_real):
    env = make_real(split="all")
    unattainable = 0
    for seed in range(env.num_tasks):
        info = _run_expert(env, seed)
        assert info["purchased"]["asin"] == env.goal.asin, env.task_id
        if info["hindsight"].success:
            continue  # 1.0 is the best there is
        # A miss must be the best any choice of the target's options can do.
        assert info["hindsight"].score == pytest.approx(_best_reward_for_target(env)), env.task_id
        unattainable += 1
    # WebShop's option reward cannot match some synthetic goal options even on the target (e.g. a
    # value "green2" normalises to "green" but the goal pair stays "color green2"): a minority.
    assert unattainable < env.num_tasks * 0.1


def test_expert_solves_every_builtin_goal(builtin_index):
    env = agentgym_opsd.make(ENV_ID, split="all", index_dir=builtin_index).unwrapped
    assert env.world.catalog.synthetic
    for seed in range(env.num_tasks):
        info = _run_expert(env, seed)
        assert info["hindsight"].success and info["hindsight"].score == 1.0, env.task_id


def test_expert_recovers_from_a_wrong_path(make_real):
    env = make_real(split="all")
    env.reset(seed=5)
    act(env, "search[zzz unrelated words]")
    act(env, "click[Next >]")
    for _ in range(12):
        _, reward, terminated, _, info = env.step(env.expert_action())
        if terminated:
            break
    assert terminated and reward == pytest.approx(_best_reward_for_target(env))


def test_random_agent_only_takes_available_actions(make_real):
    env = make_real(split="test", max_turns=12)
    for seed in range(4):
        episode = play_episode(env, RandomAgent(seed), seed)
        assert episode.turns and all(t.step.admissible for t in episode.turns)
        assert episode.hindsight is not None


def test_admissible_actions_match_available_actions(make_real):
    env = make_real(split="all")
    rng = np.random.default_rng(0)
    env.reset(seed=7)
    for _ in range(30):
        available = env.available_actions()
        admissible = env.admissible_actions()
        if available["has_search_bar"]:
            assert len(admissible) == 1 and re.fullmatch(r"search\[.+\]", admissible[0])
        else:
            assert admissible == [f"click[{c}]" for c in available["clickables"]]
        _, _, terminated, truncated, _ = act(env, admissible[int(rng.integers(len(admissible)))])
        if terminated or truncated:
            env.reset(seed=8)


def test_gymnasium_make_with_options(real_dir, real_index):
    env = gym.make(ENV_ID, catalog=str(real_dir), index_dir=real_index, split="eval", max_turns=5)
    obs, info = env.reset(seed=0)
    assert obs.startswith("WebShop [SEP] Instruction:") and env.unwrapped.max_turns == 5
    env.close()
