"""The rollout loop: batching, order, and errors that stay inside their episode."""

from __future__ import annotations

import gymnasium as gym
import pytest

import agentgym_opsd
from agentgym_opsd import EpisodeRequest, ExpertAgent, RandomAgent, run_episodes
from agentgym_opsd.agents import AgentError, make_agent


def make_guess():
    return agentgym_opsd.make("example/GuessNumber-v0")


class BatchingExpert(ExpertAgent):
    def __init__(self):
        super().__init__()
        self.batch_sizes = []

    def act_batch(self, messages, infos, envs):
        self.batch_sizes.append(len(messages))
        return [self.act(m, i, e) for m, i, e in zip(messages, infos, envs)]


def test_results_in_request_order_and_batched() -> None:
    agent = BatchingExpert()
    requests = [EpisodeRequest(seed, episode_id=f"ep{seed}", group=f"g{seed % 2}") for seed in (5, 1, 17, 3, 8)]
    eps = run_episodes(make_guess, agent, requests, num_envs=4, progress=False)
    assert [e.episode_id for e in eps] == [r.episode_id for r in requests]
    assert [e.seed for e in eps] == [5, 1, 17, 3, 8] and [e.group for e in eps] == ["g1", "g1", "g1", "g1", "g0"]
    assert max(agent.batch_sizes) == 4 and all(e.success for e in eps)


def test_random_agent_is_seeded() -> None:
    a = run_episodes(make_guess, RandomAgent(7), [EpisodeRequest(s) for s in range(4)], progress=False)
    b = run_episodes(make_guess, RandomAgent(7), [EpisodeRequest(s) for s in range(4)], progress=False)
    c = run_episodes(make_guess, RandomAgent(8), [EpisodeRequest(s) for s in range(4)], progress=False)
    assert [e.to_dict() for e in a] == [e.to_dict() for e in b]
    assert [e.to_dict() for e in a] != [e.to_dict() for e in c]


class CrashOnSeven(gym.Wrapper):
    """Raises inside step when the guess is 7: a bug in an env."""

    def step(self, action):
        if "guess 7" in action:
            raise RuntimeError("env exploded")
        return self.env.step(action)


def test_an_env_crash_errors_only_its_episode() -> None:
    made = []

    def factory():
        made.append(1)
        return CrashOnSeven(make_guess())

    requests = [EpisodeRequest(s) for s in range(8)]  # the expert guesses 10, 5, 7, ... : some hit 7
    eps = run_episodes(factory, ExpertAgent(), requests, num_envs=2, progress=False)
    errored = [e for e in eps if e.error]
    assert errored and all("env exploded" in e.error for e in errored)
    assert all(e.success for e in eps if not e.error)
    assert len(eps) == 8 and len(made) == 2 + len(errored)  # a fresh env replaced each broken one


def test_make_agent_names() -> None:
    assert make_agent("random").name == "random" and make_agent("expert").name == "expert"
    with pytest.raises(AgentError, match="unknown agent"):
        make_agent("gpt-7")
