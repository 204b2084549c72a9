"""The slot sampler (trainer/sampling.py on trainer/slot_cache.py) against the sampler it replaced
(sampling_reference.py: a left-padded `DynamicCache` rebuilt every turn and grown by concatenation).

Float order differs between the two (each row attends over its own length instead of a padded one,
rows run in other batch shapes, a group's first prompt runs once), so log-probs agree to float rounding,
compared against their scale, and the ids are the same: a draw lands on another token only if its
uniform number falls within rounding of a boundary of the cumulative distribution (about 1e-6 per
token), which these seeds do not hit. A bug (a key at the wrong position, a row reading another's
slot, a stale prefix) moves log-probs by far more than that and changes ids within a few tokens.
"""

from __future__ import annotations

import pytest
import torch
from sampling_reference import ReferenceSampler
from tolerances import assert_close_to_scale

import agentgym_opsd
from agentgym_opsd import EpisodeRequest, run_episodes
from trainer.policy import end_of_turn_ids, load_policy
from trainer.sampling import HFPolicyAgent
from trainer.slot_cache import SlotCacheError

pytestmark = pytest.mark.float_sensitive  # also run under a second set of CPU kernels (.ci/run)


def make_guess():
    return agentgym_opsd.make("example/GuessNumber-v0")


@pytest.fixture(scope="module")
def tiny_policy():
    """A seeded random tiny Qwen3 on a tokenizer trained on GuessNumber's expert text."""
    from agentgym_opsd import ExpertAgent

    expert = run_episodes(make_guess, ExpertAgent(), [EpisodeRequest(s) for s in range(20)], progress=False)
    corpus = []
    for e in expert:
        corpus += [e.instructions, e.initial_observation] + [t.response + "\n" + t.observation for t in e.turns]
    return load_policy("tiny", tokenizer="trained", corpus=corpus, vocab_size=400, seed=3)


def play(agent_class, model, tok, make_env, requests, *, num_envs, **settings):
    agent = agent_class(model, tok, **settings)
    held = []
    original = agent.act_batch

    def act_batch(messages, infos, envs):  # what the agent holds while it plays
        out = original(messages, infos, envs)
        held.append(agent.cache_bytes())
        return out

    agent.act_batch = act_batch
    episodes = run_episodes(make_env, agent, requests, num_envs=num_envs, context="full", progress=False)
    return episodes, dict(agent.samples), agent.pop_stats(), held, agent.cache_bytes()


def assert_same_turns(new, old, *, rel):
    assert new.keys() == old.keys() and new
    for key, record in old.items():
        other = new[key]
        assert other.sampled_ids == record.sampled_ids, f"turn {key}: ids differ"
        assert (other.prompt_ids, other.extends, other.finish_reason) == (
            record.prompt_ids, record.extends, record.finish_reason), f"turn {key}"
        assert_close_to_scale(torch.tensor(other.logprobs), torch.tensor(record.logprobs), rel=rel,
                              what=f"log-probs of turn {key}")


def test_the_real_model_samples_the_same_turns_as_the_previous_sampler(smollm2, contract_options_alfworld):
    """ALFWorld Pick on the real model at temperature 1: two games x a group of two (identical first
    prompts: run once, copied), three envs for four episodes (the fourth starts on a freed slot, later)."""
    tok, model = smollm2
    options = {**contract_options_alfworld, "max_turns": 2}
    make_env = lambda: agentgym_opsd.make("agentgym/ALFWorld-Pick-v0", **options)  # noqa: E731
    requests = [EpisodeRequest(seed=s, episode_id=f"t{s}-g{g}", group=f"t{s}") for s in (0, 1) for g in (0, 1)]
    settings = dict(max_new_tokens=10, temperature=1.0, seed=7)
    new_eps, new, new_stats, held, after = play(HFPolicyAgent, model, tok, make_env, requests, num_envs=3, **settings)
    old_eps, old, old_stats, _, _ = play(ReferenceSampler, model, tok, make_env, requests, num_envs=3, **settings)
    assert_same_turns(new, old, rel=2e-4)
    assert [e.to_dict() for e in new_eps] == [e.to_dict() for e in old_eps]
    assert new_stats["new_tokens"] == old_stats["new_tokens"] > 0
    # the instructions ran once, the group's first prompt once: far fewer positions prefilled
    assert new_stats["prefill_tokens"] < 0.6 * old_stats["prefill_tokens"]
    assert min(held) > 0 and after == 0  # keys and values were held while playing, and freed at the end


@pytest.mark.parametrize("temperature", [0.0, 0.1])
def test_guessed_tokens_change_the_forwards_not_the_draws(tiny_policy, temperature):
    """Prompt lookup on a full-chat rollout: with guesses the ids, log-probs and the generator's state after
    the rollout are those of one token per forward, in fewer forwards. The tiny random model loops when
    greedy, so at temperature 0 every guess holds and at 0.1 some do and some do not (both paths run)."""
    model, tok = tiny_policy
    runs = {}
    for guesses in (0, 4):
        agent = HFPolicyAgent(model, tok, max_new_tokens=12, temperature=temperature, seed=3, draft_tokens=guesses)
        run_episodes(make_guess, agent, [EpisodeRequest(s, episode_id=f"e{s}") for s in range(5)], num_envs=5,
                     context="full", progress=False)
        runs[guesses] = (dict(agent.samples), agent.pop_stats(), agent.generator.get_state())
    (plain, plain_stats, plain_state), (guessed, guessed_stats, guessed_state) = runs[0], runs[4]
    assert_same_turns(guessed, plain, rel=1e-5)
    assert torch.equal(plain_state, guessed_state)
    assert plain_stats["guessed_tokens"] == 0 < guessed_stats["accepted_guesses"]
    if temperature > 0:
        assert guessed_stats["accepted_guesses"] < guessed_stats["guessed_tokens"]  # some guesses failed
    assert guessed_stats["decode_rows"] < plain_stats["decode_rows"]


def tiny_qwen3_model(tokenizer, **window):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(vocab_size=len(tokenizer), hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, head_dim=16, intermediate_size=128, pad_token_id=tokenizer.pad_token_id,
                         eos_token_id=end_of_turn_ids(tokenizer)[0], bos_token_id=None, **window)
    torch.manual_seed(4)
    return Qwen3ForCausalLM(config).eval()


@pytest.fixture(scope="module")
def windowed(qwen3_tokenizer):
    """A tiny Qwen3 whose every layer attends over a sliding window of 6 positions (far shorter than
    its prompts), so a sampler that ignores the window reads other keys and writes other turns."""
    model = tiny_qwen3_model(qwen3_tokenizer, use_sliding_window=True, sliding_window=6, max_window_layers=0)
    assert set(model.config.layer_types) == {"sliding_attention"}
    return model, qwen3_tokenizer


def test_a_sliding_window_model_samples_what_generate_does(windowed):
    model, tok = windowed
    agent = HFPolicyAgent(model, tok, max_new_tokens=10, temperature=0)
    prompts = [agent.prompt_ids([{"role": "system", "content": f"Rules {k}."}, {"role": "user", "content": text}])
               for k, text in enumerate(("Guess a number.", "Find the apple in the kitchen, then the fridge."))]
    assert min(len(p) for p in prompts) > 3 * model.config.sliding_window
    sampled = agent.sample(prompts)
    for p, (ids, _) in zip(prompts, sampled, strict=True):
        with torch.no_grad():
            ref = model.generate(input_ids=torch.tensor([p]), attention_mask=torch.ones(1, len(p), dtype=torch.long),
                                 max_new_tokens=10, do_sample=False, eos_token_id=agent.stop_ids,
                                 pad_token_id=tok.pad_token_id)
        generated = ref[0, len(p):].tolist()
        stops = [i for i, t in enumerate(generated) if t in agent.stop_ids]
        assert ids == (generated[: stops[0] + 1] if stops else generated)
    # the same weights without the window give other log-probs (the test would catch an ignored window)
    full = tiny_qwen3_model(tok)
    full.load_state_dict(model.state_dict())
    unwindowed = HFPolicyAgent(full, tok, max_new_tokens=10, temperature=0).sample(prompts)
    assert [lp[:1] for _, lp in unwindowed] != [lp[:1] for _, lp in sampled]


def test_a_model_whose_attention_bypasses_the_interface_is_a_clear_error(windowed):
    model, tok = windowed
    layer = model.model.layers[0].self_attn
    layer.forward = lambda hidden_states, *a, **k: (torch.zeros_like(hidden_states), None)
    try:
        agent = HFPolicyAgent(model, tok, max_new_tokens=4, temperature=0)
        with pytest.raises(SlotCacheError, match="1 of its 2 attention layers"):
            agent.sample([[1, 2, 3, 4]])
        assert agent.cache_bytes() == 0  # nothing half-written is kept
    finally:
        del layer.forward
