"""The `hf:` agent as an evaluator uses it: the turn ends at the env's closing action tag, the per-turn
token cap is the env's own unless given, and torch's CPU threads are pinned for tiny models."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

import agentgym_opsd
from agentgym_opsd import EpisodeRequest, ExpertAgent, run_episodes
from agentgym_opsd.agents import AgentError, make_agent
from agentgym_app.cli_agents import build_agent
from trainer.policy import pin_cpu_threads
from trainer.sampling import HFPolicyAgent


@pytest.fixture(scope="module")
def tiny():
    from trainer.policy import load_policy

    episodes = run_episodes(lambda: agentgym_opsd.make("example/GuessNumber-v0"), ExpertAgent(),
                            [EpisodeRequest(s) for s in range(12)], progress=False)
    corpus = []
    for e in episodes:
        corpus += [e.instructions, e.initial_observation] + [t.response + "\n" + t.observation for t in e.turns]
    return load_policy("tiny", tokenizer="trained", corpus=corpus, vocab_size=400, seed=3)


@pytest.fixture()
def threads():
    """Restore torch's thread count after a test that pins it (it is process-wide)."""
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def _prompt(agent: HFPolicyAgent) -> list[int]:
    return agent.prompt_ids([{"role": "system", "content": "Guess."},
                             {"role": "user", "content": "A number from 1 to 20."}])


def test_a_turn_ends_where_its_closing_text_is_written(tiny) -> None:
    model, tok = tiny
    agent = HFPolicyAgent(model, tok, max_new_tokens=24, temperature=1.0, seed=7)
    prompt = _prompt(agent)
    [(free, _)] = agent.sample([prompt])  # no closing text: it runs to the cap or the end-of-turn token
    pieces = [tok.decode([t], skip_special_tokens=False) for t in free]
    # A closing text that is complete only once token k is written.
    k, closer = next((k, "".join(pieces[: k + 1])[-3:]) for k in range(3, len(pieces))
                     if len("".join(pieces[: k + 1])) >= 3 and "".join(pieces[: k + 1])[-3:] not in "".join(pieces[:k]))
    again = HFPolicyAgent(model, tok, max_new_tokens=24, temperature=1.0, seed=7)  # the same draws
    [(ids, logps, finish)] = again._sample([prompt], None, [24], [(closer,)])
    assert ids == free[: k + 1] and len(logps) == k + 1
    assert finish == "action" and again.stats["closed_turns"] == 1  # ended at the closing text, no stop id


def test_the_turn_cap_is_the_envs_own_unless_the_agent_has_one(tiny) -> None:
    model, tok = tiny
    envs = [SimpleNamespace(max_turn_tokens=3, action_tags=("action",)),
            SimpleNamespace(max_turn_tokens=7, action_tags=("action",))]
    infos = [{"step": SimpleNamespace(episode_id=f"e{i}", turn=0)} for i in range(2)]
    chat = [{"role": "system", "content": "Guess."}, {"role": "user", "content": "A number from 1 to 20."}]
    agent = HFPolicyAgent(model, tok, max_new_tokens=None, temperature=1.0, seed=0)
    agent.act_batch([chat, chat], infos, envs)
    lengths = {key: len(record.sampled_ids) for key, record in agent.samples.items()}
    # a random tiny model rarely ends early
    assert lengths[("e0", 0)] <= 3 and lengths[("e1", 0)] <= 7 and lengths[("e1", 0)] > 3
    assert agent.turn_cap(SimpleNamespace()) == 256  # an env without a cap: the contract's default
    assert HFPolicyAgent(model, tok, max_new_tokens=5).turn_cap(envs[1]) == 5  # the agent's own cap wins
    assert agentgym_opsd.make("example/GuessNumber-v0").unwrapped.max_turn_tokens == 256


def test_hf_spec_options_threads_stop_and_the_models_own_cap(tiny, tmp_path, threads) -> None:
    model, tok = tiny
    folder = tmp_path / "m"
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    torch.set_num_threads(2)
    agent = make_agent(f"hf:{folder}?temperature=0")
    assert torch.get_num_threads() == 1  # auto: a tiny model runs on one thread
    assert agent.stop_at_action_close and agent.max_new_tokens is None  # the env's cap
    assert agent.closing_tags(SimpleNamespace(action_tags=("search", "answer"))) == ("</search>", "</answer>")
    torch.set_num_threads(2)
    agent = make_agent(f"hf:{folder}?cpu_threads=0&stop=eot")
    assert torch.get_num_threads() == 2 and not agent.stop_at_action_close and agent.closing_tags(
        SimpleNamespace(action_tags=("action",))) == ()
    build_agent(f"hf:{folder}", cpu_threads=3)  # what `eval/bench --cpu-threads 3` do
    assert torch.get_num_threads() == 3
    assert pin_cpu_threads(model, 0) == 3
    with pytest.raises(AgentError, match="stop='x'"):
        make_agent(f"hf:{folder}?stop=x")
    with pytest.raises(AgentError, match="bad option value"):
        make_agent(f"hf:{folder}?cpu_threads=many")
    # A model folder that names its own cap (generation_config.json) is played at that cap.
    model.generation_config.max_new_tokens = 7
    model.save_pretrained(tmp_path / "capped")
    tok.save_pretrained(tmp_path / "capped")
    model.generation_config.max_new_tokens = None
    assert make_agent(f"hf:{tmp_path / 'capped'}").max_new_tokens == 7
    assert make_agent(f"hf:{tmp_path / 'capped'}?max_new_tokens=4").max_new_tokens == 4
