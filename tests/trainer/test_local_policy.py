"""Policies for the local trainer: tiny Qwen3 models, log-probs, and the batched sampling agent."""

from __future__ import annotations

import pytest
import torch
from tolerances import assert_close_to_scale

import agentgym_opsd
from agentgym_opsd import EpisodeRequest, ExpertAgent, run_episodes
from agentgym_opsd.agents import AgentError, make_agent
from trainer.forward import shared_prefix_length, token_logprobs
from trainer.policy import (
    CHATML_TEMPLATE,
    TinyModelSpec,
    build_tiny_model,
    load_hf_policy,
    load_policy,
    parameter_count,
    train_tokenizer,
)
from trainer.sampling import HFPolicyAgent

pytestmark = pytest.mark.float_sensitive  # also run under a second set of CPU kernels (.ci/run)


def make_guess():
    return agentgym_opsd.make("example/GuessNumber-v0")


@pytest.fixture(scope="module")
def expert_episodes():
    return run_episodes(make_guess, ExpertAgent(), [EpisodeRequest(s) for s in range(20)], progress=False)


@pytest.fixture(scope="module")
def corpus(expert_episodes):
    texts = []
    for e in expert_episodes:
        texts += [e.instructions, e.initial_observation] + [t.response + "\n" + t.observation for t in e.turns]
    return texts


@pytest.fixture(scope="module")
def tiny(corpus):
    model, tokenizer = load_policy("tiny", tokenizer="trained", corpus=corpus, vocab_size=400, seed=3)
    return model, tokenizer


def test_trained_tokenizer_round_trips_and_has_chatml(corpus) -> None:
    tok = train_tokenizer(corpus, vocab_size=400)
    text = "<action>guess 12</action> é 中 \n\t odd   spacing"
    assert tok.decode(tok(text, add_special_tokens=False)["input_ids"]) == text  # byte-level: lossless
    chat = tok.apply_chat_template([{"role": "system", "content": "S"}, {"role": "user", "content": "U"}],
                                   tokenize=False, add_generation_prompt=True)
    assert chat == "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n<|im_start|>assistant\n"
    assert tok.chat_template == CHATML_TEMPLATE
    assert tok.convert_ids_to_tokens(tok("<|im_end|>", add_special_tokens=False)["input_ids"]) == ["<|im_end|>"]
    # frequent env words became single tokens: the corpus was learned, not just bytes
    assert len(tok("guess", add_special_tokens=False)["input_ids"]) == 1
    assert len(tok) <= 400


def test_tiny_model_is_seeded(tiny) -> None:
    _, tok = tiny
    a, b, c = (build_tiny_model(tok, seed=s) for s in (1, 1, 2))
    sa, sb, sc = a.state_dict(), b.state_dict(), c.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert not all(torch.equal(sa[k], sc[k]) for k in sa)
    assert a.config.vocab_size == len(tok)
    assert a.generation_config.eos_token_id == [tok.convert_tokens_to_ids("<|im_end|>")]


def test_tiny_on_the_real_qwen3_tokenizer(qwen3_tokenizer_dir) -> None:
    path = qwen3_tokenizer_dir
    model, tok = load_policy("tiny", tokenizer=str(path), seed=0, tiny=TinyModelSpec(hidden_size=32))
    assert len(tok) == 151669 and model.config.vocab_size == 151669
    # the embedding dominates: 151669 x 32 tied weights, plus about 0.05M in the two layers
    assert 4.8e6 < parameter_count(model) < 5.0e6
    prompt = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    assert prompt.endswith("<|im_start|>assistant\n")
    agent = HFPolicyAgent(model, tok, max_new_tokens=4, temperature=1.0, seed=0)
    ids, lps = agent.sample([agent.prompt_ids([{"role": "user", "content": "hi"}])])[0]
    assert 0 < len(ids) <= 4 and len(lps) == len(ids)


def test_token_logprobs_match_full_logits(tiny) -> None:
    model, _ = tiny
    torch.manual_seed(0)
    ids = torch.randint(3, model.config.vocab_size, (3, 12))
    mask = torch.ones_like(ids)
    mask[1, 9:] = 0  # right padding
    mask[2, 5:] = 0
    score = torch.zeros_like(ids, dtype=torch.bool)
    score[:, 4:] = True
    score &= mask.bool()
    got = token_logprobs(model, ids, mask, score)
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=ids, attention_mask=mask).logits.float(), -1)
    want = torch.zeros_like(got)
    want[:, 1:] = logp[:, :-1].gather(-1, ids[:, 1:, None]).squeeze(-1)
    want = torch.where(score, want, torch.zeros_like(want))
    assert_close_to_scale(got, want)
    assert (got[~score] == 0).all() and (got[score] < 0).all()
    assert token_logprobs(model, ids, mask, score).requires_grad


def test_a_shared_prefix_runs_once_with_the_same_logprobs_and_gradients(tiny, expert_episodes, grad_rel=1e-5) -> None:
    """grad_rel: the gradients' tolerance against their scale (a norm weight's gradient sums every
    position of every row: on the 30-layer real model the two summation orders differ by ~1e-5 of it)."""
    from trainer.rows import build_rows

    model, tok = tiny
    rows = build_rows(expert_episodes[:6], tok, context="window:1")  # one row per turn: a long common start
    ids, mask, score = rows.input_ids, rows.attention_mask, rows.turn_id >= 0
    C = shared_prefix_length(ids, mask.bool(), score)
    first_scored = int(score.nonzero()[:, 1].min())
    assert C >= 16 and (ids[:, :C] == ids[:1, :C]).all()
    assert C == first_scored - 1 or not (ids[:, C] == ids[0, C]).all()  # as long as it can be
    seen = []
    hook = model.get_decoder().layers[0].register_forward_hook(
        lambda m, a, k, out: seen.append((a[0] if a else k["hidden_states"]).shape[:2]), with_kwargs=True)
    try:
        grads = []
        for share in (False, True):
            model.zero_grad()
            lp = token_logprobs(model, ids, mask, score, with_entropy=True, share_prefix=share)
            (lp[0].sum() - 0.5 * lp[0][:, ::2].sum()).backward()  # a loss that weighs tokens unevenly
            grads.append(([p.grad.clone() for p in model.parameters()], lp))
    finally:
        hook.remove()
    (g0, (lp0, ent0)), (g1, (lp1, ent1)) = grads
    assert_close_to_scale(lp1, lp0, what="log-probs")
    assert_close_to_scale(ent1, ent0, what="entropies")
    assert ((lp1 != 0) == score).all()
    # each gradient against its own scale: float32 sums in another order move small entries that sit
    # next to large ones by more than a per-element tolerance allows (ATEN_CPU_CAPABILITY=default)
    for (name, _), a, b in zip(model.named_parameters(), g0, g1, strict=True):
        assert_close_to_scale(b, a, rel=grad_rel, floor=1e-6, what=f"gradient of {name}")
    R, T = ids.shape
    # without sharing: one forward of every row whole; with: the prefix once, then the rows after it
    assert seen == [torch.Size([R, T]), torch.Size([1, C]), torch.Size([R, T - C])]
    # rows with nothing in common run as before
    other = ids.clone()
    other[1, 0] = (int(ids[0, 0]) + 1) % model.config.vocab_size
    assert shared_prefix_length(other, mask.bool(), score) == 0


def test_greedy_sampling_matches_generate_and_ignores_padding(tiny, expert_episodes) -> None:
    model, tok = tiny
    agent = HFPolicyAgent(model, tok, max_new_tokens=10, temperature=0)
    prompts = [agent.prompt_ids(expert_episodes[0].messages(k)) for k in (0, 2)]
    assert len(prompts[0]) != len(prompts[1])  # the batch needs left padding
    batched = agent.sample(prompts)
    for p, (ids, _) in zip(prompts, batched):
        with torch.no_grad():
            ref = model.generate(input_ids=torch.tensor([p]), attention_mask=torch.ones(1, len(p), dtype=torch.long),
                                 max_new_tokens=10, do_sample=False, eos_token_id=agent.stop_ids,
                                 pad_token_id=tok.pad_token_id)
        generated = ref[0, len(p):].tolist()
        stops = [i for i, t in enumerate(generated) if t in agent.stop_ids]
        ref_ids = generated[: stops[0] + 1] if stops else generated  # up to and with the stop id
        assert ids == ref_ids
        assert agent.sample([p])[0][0] == ids  # alone or in a padded batch: the same turn


def test_sampled_logprobs_are_the_policy_logprobs(tiny, expert_episodes) -> None:
    model, tok = tiny
    agent = HFPolicyAgent(model, tok, max_new_tokens=12, temperature=0.7, seed=5)
    prompt = agent.prompt_ids(expert_episodes[1].messages(1))
    ids, lps = agent.sample([prompt])[0]
    full = torch.tensor([prompt + ids])
    score = torch.arange(full.shape[1])[None] >= len(prompt)
    with torch.no_grad():
        recomputed = token_logprobs(model, full, torch.ones_like(full), score, temperature=0.7)[0, len(prompt):]
    assert_close_to_scale(recomputed, torch.tensor(lps), rel=1e-5)
    # the same seed draws the same turn; another seed another one
    again = HFPolicyAgent(model, tok, max_new_tokens=12, temperature=0.7, seed=5).sample([prompt])[0][0]
    other = HFPolicyAgent(model, tok, max_new_tokens=12, temperature=0.7, seed=6).sample([prompt])[0][0]
    assert again == ids and other != ids


def test_turns_stop_at_end_of_turn_or_the_cap(corpus) -> None:
    tok = train_tokenizer(corpus, vocab_size=400)
    model = build_tiny_model(tok, seed=0)
    eot = tok.convert_tokens_to_ids("<|im_end|>")
    bias = torch.zeros(model.config.vocab_size)  # added to the logits: end of turn certain, then impossible
    bias[eot] = 1e4
    prompt = [tok.convert_tokens_to_ids("<|im_start|>")]
    agent = HFPolicyAgent(model, tok, max_new_tokens=5, temperature=1.0, seed=0)
    handle = model.lm_head.register_forward_hook(lambda m, i, out: out + bias)
    try:
        assert agent.sample([prompt, prompt])[0] == ([eot], [0.0])  # stopped at once: the stop id is recorded
        stats = agent.pop_stats()
        assert stats["capped_turns"] == 0 and stats["new_tokens"] == 2
    finally:
        handle.remove()
    handle = model.lm_head.register_forward_hook(lambda m, i, out: out - bias)
    try:
        ids, _ = agent.sample([prompt])[0]
        assert len(ids) == 5 and agent.pop_stats()["capped_turns"] == 1
    finally:
        handle.remove()


class CountingAgent(HFPolicyAgent):
    def act_batch(self, messages, infos, envs):
        self.batches = getattr(self, "batches", []) + [len(messages)]
        return super().act_batch(messages, infos, envs)


def test_rollout_samples_all_live_episodes_in_one_call(tiny) -> None:
    model, tok = tiny
    agent = CountingAgent(model, tok, max_new_tokens=6, temperature=1.0, seed=0)
    requests = [EpisodeRequest(s, group=f"g{s % 3}") for s in range(6)]
    eps = run_episodes(make_guess, agent, requests, num_envs=6, progress=False)
    assert len(eps) == 6 and all(e.finished for e in eps)
    assert agent.batches[0] == 6 and len(agent.batches) == max(e.num_turns for e in eps)
    assert agent.stats["calls"] == len(agent.batches)  # one decoding loop per tick


def test_hf_agent_from_a_saved_folder(tiny, tmp_path) -> None:
    model, tok = tiny
    model.save_pretrained(tmp_path / "m")
    tok.save_pretrained(tmp_path / "m")
    agent = make_agent(f"hf:{tmp_path / 'm'}?temperature=0&max_new_tokens=6", seed=1)
    assert agent.name == "hf:m" and agent.temperature == 0 and agent.max_new_tokens == 6
    eps = run_episodes(make_guess, agent, [EpisodeRequest(s) for s in range(3)], progress=False)
    assert all(e.finished and e.agent == "hf:m" for e in eps)
    # greedy from the saved copy equals greedy from the original
    live = HFPolicyAgent(model, tok, max_new_tokens=6, temperature=0)
    prompt = live.prompt_ids(eps[0].messages(0))
    assert agent.sample([prompt])[0][0] == live.sample([prompt])[0][0]
    with pytest.raises(AgentError, match="unknown option"):
        make_agent(f"hf:{tmp_path / 'm'}?temp=1")
    with pytest.raises(AgentError, match="no such folder"):
        make_agent(f"hf:{tmp_path / 'nothing'}")


def test_a_loaded_model_computes_what_the_same_weights_in_memory_do(tiny, tmp_path) -> None:
    """Weights read from a safetensors file get their own aligned memory: one row through the head (a
    matrix-vector product, whose rounding follows the operands' alignment) gives the same bits as the
    model the file was written from."""
    model, tok = tiny
    model.save_pretrained(tmp_path / "m")
    tok.save_pretrained(tmp_path / "m")
    loaded, _ = load_hf_policy(tmp_path / "m", device="cpu", dtype="float32")
    assert all(p.data_ptr() % 64 == 0 for p in loaded.parameters())
    row = torch.randn(1, model.config.hidden_size, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(loaded.lm_head(row), model.lm_head(row))


def test_reusing_each_episodes_prefix_changes_nothing_but_the_cost(tiny) -> None:
    """Full-chat prompts extend the previous turn's prompt and response: the agent keeps their keys and
    values and computes only the new tokens. Same turns, same log-probs, far fewer prefilled tokens."""
    model, tok = tiny
    runs = {}
    for reuse in (False, True):
        agent = HFPolicyAgent(model, tok, max_new_tokens=6, temperature=0, reuse_prefix=reuse)
        eps = run_episodes(make_guess, agent, [EpisodeRequest(s, episode_id=f"e{s}") for s in range(6)],
                           num_envs=4, context="full", progress=False)  # 4 slots: episodes start at different ticks
        runs[reuse] = (eps, dict(agent.samples), agent.pop_stats())
    (plain, plain_samples, plain_stats), (reused, reused_samples, reused_stats) = runs[False], runs[True]
    assert [e.to_dict() for e in plain] == [e.to_dict() for e in reused]
    assert plain_samples.keys() == reused_samples.keys()
    for key, record in plain_samples.items():
        other = reused_samples[key]
        assert (record.prompt_ids, record.extends, record.sampled_ids, record.finish_reason) == (
            other.prompt_ids, other.extends, other.sampled_ids, other.finish_reason)
        assert torch.allclose(torch.tensor(record.logprobs), torch.tensor(other.logprobs), atol=1e-4)
    assert reused_stats["prompt_tokens"] == plain_stats["prompt_tokens"]
    assert reused_stats["prefill_tokens"] < 0.5 * plain_stats["prefill_tokens"]
