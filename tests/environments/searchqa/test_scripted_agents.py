"""The oracle and the retrieval baseline, through make_agent and the rollout loop, on the synthetic set."""

from __future__ import annotations

import pytest

import agentgym_opsd
from agentgym_opsd.agents import AgentError, make_agent
from agentgym_opsd.rollout import EpisodeRequest, run_episodes
from environments.searchqa.scripted_agents import OracleAgent, RetrievalBaselineAgent, candidate_answer
from environments.searchqa.synthetic import ensure_synthetic_index


@pytest.mark.parametrize(
    "question,title,passage,expected",
    [
        ("When was Apollo 17 launched?", "Apollo 17",
         "Apollo 17 was the final mission. It launched on December 7, 1972 from Florida.", "1972"),
        ("Who wrote Hamlet?", "Hamlet", "Hamlet is a tragedy. It was written by William Shakespeare around 1600.",
         "William Shakespeare"),
        ("How many moons does Mars have?", "Mars",
         "Mars is the fourth planet. Mars has 2 small moons, Phobos and Deimos.", "2"),
        ("What is the currency of Kelka?", "Kelka",
         "Kelka is a fictional country. Its capital is Yeleth. The currency of Kelka is the kelyel.", "kelyel"),
        ("Which river flows through Ethush?", "Ethush", "Ethush is a city. The Quaushdun River flows through Ethush.",
         "Quaushdun River"),
    ],
)
def test_candidate_answer(question: str, title: str, passage: str, expected: str) -> None:
    assert candidate_answer(question, title, passage) == expected


def test_agents_are_registered_by_name() -> None:
    assert isinstance(make_agent("searchqa-baseline"), RetrievalBaselineAgent)
    assert isinstance(make_agent("searchqa-oracle"), OracleAgent)
    with pytest.raises(AgentError, match="searchqa-baseline"):
        make_agent("searchqa-wizard")


@pytest.fixture(scope="module")
def synthetic_factory(tmp_path_factory: pytest.TempPathFactory):
    index = ensure_synthetic_index(tmp_path_factory.mktemp("synthetic-agents"))
    return lambda: agentgym_opsd.make("agentgym/SearchQA-Synthetic-v0", index_dir=str(index))


def test_oracle_solves_everything_in_two_turns(synthetic_factory) -> None:
    n = synthetic_factory().unwrapped.num_tasks
    episodes = run_episodes(synthetic_factory, make_agent("searchqa-oracle"),
                            [EpisodeRequest(seed=s) for s in range(n)], num_envs=4)
    assert len(episodes) == n and not any(e.error for e in episodes)
    assert all(e.hindsight.success and e.num_turns == 2 and e.turns[-1].reward == 1.0 for e in episodes)
    assert all(e.turns[0].step.action_kind == "search" for e in episodes)


def test_baseline_answers_single_hop_from_the_top_passage(synthetic_factory) -> None:
    env = synthetic_factory()
    types = [e.question_type for e in env.unwrapped.examples]
    episodes = run_episodes(synthetic_factory, make_agent("searchqa-baseline"),
                            [EpisodeRequest(seed=s) for s in range(len(types))], num_envs=4)
    assert not any(e.error for e in episodes)
    single = [e.hindsight.success for e, t in zip(episodes, types, strict=True) if t == "single-hop"]
    two = [e.hindsight.success for e, t in zip(episodes, types, strict=True) if t == "two-hop"]
    # One search and a span of the top passage: most single-hop questions, few two-hop ones.
    assert sum(single) / len(single) > 0.5
    assert sum(two) / len(two) < sum(single) / len(single)
    assert all(e.num_turns == 2 and e.turns[-1].step.action_kind == "answer" for e in episodes)
