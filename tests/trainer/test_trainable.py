"""Which weights a run trains (trainer/trainable.py): the top layers or LoRA adapters, the saved model
merged into a plain folder, bad choices refused; and bf16 autocast (trainer.policy.autocast_context)."""

from __future__ import annotations

import pytest
import torch
from test_local_train import config
from tolerances import assert_close_to_scale

from agentgym_opsd.io import read_jsonl
from trainer.local import LocalTrainer, TrainError
import trainer.policy
from trainer.policy import PolicyLoadError, autocast_context, cpu_bf16_unsupported, cpu_has_fast_bf16, load_hf_policy
from trainer.trainable import TrainableError, select_trainable

pytestmark = pytest.mark.float_sensitive  # also run under a second set of CPU kernels (.ci/run)

# bf16 refused in this process (an AMX CPU with torch's kernels capped below AVX-512: the float-sensitive
# pass of .ci/run on such a machine); the refusal itself is tested below either way.
needs_bf16 = pytest.mark.skipif(cpu_bf16_unsupported() is not None,
                                reason=f"bf16 is refused here: {cpu_bf16_unsupported()}")


def initial_state(tmp_path, **changes):
    """The state a run starts its updates from (its model before any update), and the finished run."""
    run = LocalTrainer(config(tmp_path, tiny_layers=2, steps=2, **changes), progress=False)
    run.setup()
    before = {k: v.clone() for k, v in run.state.model.state_dict().items()}
    run = LocalTrainer(config(tmp_path, tiny_layers=2, steps=2, **changes), resume=True, progress=False)
    run.run()
    return before, run


def test_only_the_top_layers_train(tmp_path):
    before, run = initial_state(tmp_path / "top", train_layers=1)
    after = run.state.model.state_dict()
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    assert changed and all(k.startswith(("model.layers.1.", "model.norm.")) for k in changed)
    assert not any(k.startswith("model.layers.0.") or "embed_tokens" in k for k in changed)
    model = run.state.model
    trained = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trained == {n for n, _ in model.named_parameters() if n.startswith(("model.layers.1.", "model.norm."))}


def test_lora_trains_only_adapters_and_saves_a_merged_plain_model(tmp_path):
    before, run = initial_state(tmp_path / "lora", lora_rank=4, lora_layers=1)
    trained = {n for n, p in run.state.model.named_parameters() if p.requires_grad}
    assert trained and all("lora_" in n and ".layers.1." in n for n in trained)
    base_after = {k: v for k, v in run.state.model.state_dict().items() if "lora_" not in k}
    assert all(torch.equal(before[k], v) for k, v in base_after.items())  # the base weights never move
    saved, tok = load_hf_policy(tmp_path / "lora" / "model", device="cpu")
    assert not any("lora" in n for n, _ in saved.named_parameters()) and type(saved).__name__ == "Qwen3ForCausalLM"
    ids = torch.tensor([tok("Task 1: write your first text.", add_special_tokens=False)["input_ids"]])
    with torch.no_grad():
        adapted, merged = run.state.model(input_ids=ids).logits, saved.eval()(input_ids=ids).logits
        plain = run.state.model.get_base_model()
        with run.state.model.disable_adapter():
            base = plain(input_ids=ids).logits
    assert_close_to_scale(merged, adapted, rel=1e-5, what="merged logits")
    assert float((adapted - base).abs().max()) > 1e-4  # the adapters changed the model: the merge carries it


def test_bad_choices_of_trained_weights_are_refused(tmp_path):
    with pytest.raises(TrainError, match="choose one"):
        config(tmp_path, train_layers=1, lora_rank=4).validate()
    with pytest.raises(TrainError, match="--lora-layers needs --lora-rank"):
        config(tmp_path, lora_layers=1).validate()
    with pytest.raises(TrainError, match="autocast"):
        config(tmp_path, autocast="fp8").validate()
    run = LocalTrainer(config(tmp_path / "five", tiny_layers=2, train_layers=5), progress=False)
    with pytest.raises(TrainError, match="train_layers=5: the model has 2 decoder layers"):
        run.setup()
    with pytest.raises(TrainableError, match=">= 0"):
        select_trainable(torch.nn.Linear(2, 2), train_layers=-1)


@needs_bf16
def test_bf16_autocast_scores_near_float32_and_auto_follows_the_cpu(tmp_path):
    from test_local_train import ParityEnv  # noqa: F401  (registers the env)
    from trainer.forward import token_logprobs

    run = LocalTrainer(config(tmp_path / "ac", tiny_layers=2), progress=False)
    run.setup()
    torch.manual_seed(0)
    ids = torch.randint(3, run.state.model.config.vocab_size, (2, 24))
    mask, score = torch.ones_like(ids), torch.ones_like(ids, dtype=torch.bool)
    score[:, 0] = False
    with torch.no_grad():
        full = token_logprobs(run.state.model, ids, mask, score)
        with autocast_context("bf16", "cpu"):
            half = token_logprobs(run.state.model, ids, mask, score)
    assert half.dtype == torch.float32 and not torch.equal(half, full)  # bf16 products, float32 log-probs
    assert_close_to_scale(half, full, rel=2e-2, what="bf16 log-probs")
    auto = autocast_context("auto", "cpu")
    assert isinstance(auto, torch.autocast) == cpu_has_fast_bf16()


@needs_bf16
def test_weights_updated_inside_one_autocast_context_are_seen_by_the_next_forward():
    """An SFT epoch runs many optimizer steps inside one `compute()` context. With autocast's weight
    cache on, every forward after the first reused the first bf16 copy of each weight: the epoch did
    not see its own updates (a warm start that learned nothing in its first epoch)."""
    torch.manual_seed(0)
    layer, x = torch.nn.Linear(8, 8), torch.randn(4, 8)
    optimizer = torch.optim.SGD(layer.parameters(), lr=1.0)
    with autocast_context("bf16", "cpu"):
        first = layer(x)
        (-first.float().sum()).backward()
        optimizer.step()
        second = layer(x)
    assert first.dtype == torch.bfloat16  # the product ran in bf16
    assert float((second - first).abs().max()) > 1.0  # the step moved the weights, and the forward saw it


@needs_bf16
def test_a_bf16_run_samples_with_a_bf16_copy_and_trains_float32_weights(tmp_path, monkeypatch):
    """Under bf16 autocast on a CPU the rollout samples with a bfloat16 copy of the policy (autocast,
    with its weight cache off, would cast every weight at every decoding step): the sampled log-probs
    agree with the old log-probs recomputed under autocast to bf16 rounding, and the policy's own
    weights stay float32."""
    from test_local_train import ParityEnv  # noqa: F401  (registers the env)

    from trainer.sampling import HFPolicyAgent

    seen = []
    sample = HFPolicyAgent._sample

    def spy(agent, *args, **kwargs):
        seen.append((next(agent.model.parameters()).dtype, torch.is_autocast_enabled("cpu")))
        return sample(agent, *args, **kwargs)

    monkeypatch.setattr(HFPolicyAgent, "_sample", spy)
    run = LocalTrainer(config(tmp_path / "bf16", tiny_layers=2, steps=1, autocast="bf16"), progress=False)
    run.run()
    assert seen and set(seen) == {(torch.bfloat16, False)}
    assert all(p.dtype == torch.float32 for p in run.state.model.parameters())
    record = [r for r in read_jsonl(tmp_path / "bf16" / "metrics.jsonl") if r["kind"] == "train"][-1]
    assert 0 < record["rollout/logprob_gap"] < 0.05  # bf16 rounding, not another policy


@pytest.mark.parametrize(("flags", "kernels", "auto", "refused"), [
    ({"amx_bf16", "avx512_bf16"}, "AVX512", "bf16", False),  # a Sapphire Rapids Xeon as torch runs it
    ({"amx_bf16", "avx512_bf16"}, "DEFAULT", "none", True),   # the same under ATEN_CPU_CAPABILITY=default
    ({"amx_bf16", "avx512_bf16"}, "AVX2", "none", True),
    ({"avx2"}, "AVX2", "none", False),                        # no bf16 units: emulated bf16 still runs
])
def test_bf16_follows_the_cpu_and_the_kernels_torch_runs(monkeypatch, flags, kernels, auto, refused):
    monkeypatch.setattr(trainer.policy, "_cpu_flags", lambda: set(flags))
    monkeypatch.setattr(trainer.policy, "_torch_cpu_kernels", lambda: kernels)
    assert trainer.policy.resolve_autocast("auto", "cpu") == auto
    if refused:
        with pytest.raises(PolicyLoadError, match="unset ATEN_CPU_CAPABILITY, or use --autocast none"):
            trainer.policy.resolve_autocast("bf16", "cpu")
    else:
        assert trainer.policy.resolve_autocast("bf16", "cpu") == "bf16"


def test_bf16_is_refused_exactly_where_torchs_bf16_attention_fails():
    """The refusal's premise, checked against torch itself: a bf16 attention over 128 positions (torch
    packs its blocks for AMX from 64 on) fails where, and only where, `cpu_bf16_unsupported` says so."""
    q = torch.randn(1, 2, 128, 32, dtype=torch.bfloat16)
    mask = torch.zeros(1, 1, 128, 128, dtype=torch.bfloat16)
    try:
        torch.nn.functional.scaled_dot_product_attention(q, q, q, attn_mask=mask)
        failed = False
    except RuntimeError:
        failed = True
    assert failed == (cpu_bf16_unsupported() is not None)
