"""The papers' settings for OpenRLHF runs: ALFWorld, Search-QA and WebShop with Qwen2.5-3B-Instruct
or Qwen3-1.7B, group size 8, the credit defaults of each env family (docs/credit.md#configuration).

`preset(family, model, method, ...)` returns the bridge config (a dict of the config file's
sections) and the OpenRLHF flags; `agentgym-opsd train-openrlhf --preset FAMILY --model-preset MODEL`
uses it, and flags given after `--` override the preset's.

Per family: the env, its turn limit, the per-turn token cap and the whole-chat budget (the bridge
trains on the full chat: every turn of an episode is one sequence, so `--data.max_len` must hold the
longest episode; an episode that does not fit ends where it is cut and is counted in the
`env/context_full` log), and the prompts per step. Per model: the chat template's options (Qwen3 is
run without its thinking block: the envs' own `<think>` tags carry the reasoning) and its context.
Common: GRPO-style KL loss (0.01, k3), PPO clip 0.2, token-mean loss, lr 1e-6, temperature 1.0.

GPU layout: one node of `gpus` GPUs, everything colocated (vLLM engines sleep while DeepSpeed
trains), ZeRO-3, bf16, flash attention with sample packing. Change any of it with flags after `--`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

__all__ = ["FAMILIES", "MODELS", "preset"]

GROUP_SIZE = 8


@dataclass(frozen=True)
class FamilySetting:
    env_id: str
    max_turns: int
    turn_max_tokens: int
    max_len: int
    prompts_per_step: int
    steps: int
    note: str = ""


@dataclass(frozen=True)
class ModelSetting:
    hub_id: str
    context: int
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)


FAMILIES: dict[str, FamilySetting] = {
    "alfworld": FamilySetting("agentgym/ALFWorld-All-v0", max_turns=50, turn_max_tokens=512, max_len=16384,
                              prompts_per_step=16, steps=150),
    "webshop": FamilySetting("agentgym/WebShop-v0", max_turns=15, turn_max_tokens=512, max_len=16384,
                             prompts_per_step=16, steps=150),
    "searchqa": FamilySetting("agentgym/SearchQA-NQ-v0", max_turns=4, turn_max_tokens=512, max_len=8192,
                              prompts_per_step=64, steps=200,
                              note="needs a retrieval server reachable from every node: env option server_url"),
}

MODELS: dict[str, ModelSetting] = {
    "qwen2.5-3b": ModelSetting("Qwen/Qwen2.5-3B-Instruct", context=32768),
    "qwen3-1.7b": ModelSetting("Qwen/Qwen3-1.7B", context=32768, chat_template_kwargs={"enable_thinking": False}),
}


def preset(
    family: str,
    model: str,
    method: str,
    *,
    model_path: str | None = None,
    prompts: str,
    eval_prompts: str | None = None,
    prompt_rows: int | None = None,
    gpus: int = 8,
    out: str = "runs/openrlhf",
) -> tuple[dict[str, Any], list[str]]:
    """(bridge config sections, OpenRLHF flags) for one paper setting.

    Args:
        family: `alfworld`, `webshop` or `searchqa`.
        model: `qwen2.5-3b` or `qwen3-1.7b` (the settings); `model_path` is the weights to load
            (default: the model's hub id, which OpenRLHF downloads).
        method: `grpo`, `gigpo`, `stepopsd`, `agentopsd` (or `rlsd`).
        prompts, eval_prompts: prompt datasets written by `agentgym-opsd openrlhf-prompts`.
        prompt_rows: rows in `prompts` (to repeat the dataset for `steps` updates).
        gpus: GPUs of the node.
        out: output folder (checkpoints, TensorBoard logs).
    """
    if family not in FAMILIES:
        raise ValueError(f"preset {family!r}: use one of {', '.join(FAMILIES)}")
    if model not in MODELS:
        raise ValueError(f"model preset {model!r}: use one of {', '.join(MODELS)}")
    f, m = FAMILIES[family], MODELS[model]
    if f.max_len > m.context:
        raise ValueError(f"{family}: --data.max_len {f.max_len} exceeds {model}'s context {m.context}")
    bridge = {
        "rollout": {
            "turn_max_tokens": f.turn_max_tokens,
            "max_turns": f.max_turns,
            "chat_template_kwargs": dict(m.chat_template_kwargs),
        },
        "credit": {"method": method, "env": f.env_id},
        "teacher": {"max_len": m.context, "micro_batch_size": 2},
    }
    episodes = 1
    if prompt_rows:
        episodes = max(1, math.ceil(f.steps * f.prompts_per_step / int(prompt_rows)))
    samples = f.prompts_per_step * GROUP_SIZE
    flags = [
        "--actor.model_name_or_path", model_path or m.hub_id,
        "--data.prompt_dataset", prompts,
        "--data.max_len", str(f.max_len),
        "--rollout.max_new_tokens", str(f.turn_max_tokens),
        "--rollout.n_samples_per_prompt", str(GROUP_SIZE),
        "--rollout.batch_size", str(f.prompts_per_step),
        "--rollout.micro_batch_size", "4",
        "--rollout.temperature", "1.0",
        "--train.batch_size", str(samples),
        "--train.micro_batch_size", "1",
        "--train.max_epochs", "1",
        "--train.num_episodes", str(episodes),
        "--actor.adam.lr", "1e-6",
        "--actor.eps_clip", "0.2",
        "--actor.loss_agg_mode", "token-mean",
        "--algo.kl.use_loss", "--algo.kl.init_coef", "0.01", "--algo.kl.estimator", "k3",
        "--actor.num_nodes", "1", "--actor.num_gpus_per_node", str(gpus),
        "--ref.num_nodes", "1", "--ref.num_gpus_per_node", str(gpus),
        "--vllm.num_engines", str(gpus), "--vllm.tensor_parallel_size", "1",
        "--vllm.gpu_memory_utilization", "0.5", "--vllm.enable_sleep",
        "--train.colocate_all", "--ds.enable_sleep",
        "--ds.zero_stage", "3", "--ds.param_dtype", "bf16",
        "--ds.packing_samples", "--ds.attn_implementation", "flash_attention_2",
        "--actor.gradient_checkpointing_enable",
        "--train.seed", "42",
        "--ckpt.path", f"{out}/checkpoints", "--ckpt.output_dir", f"{out}/final",
        "--ckpt.save_steps", "20", "--ckpt.save_hf",
        "--logger.tensorboard_dir", f"{out}/tensorboard",
    ]
    if eval_prompts:
        flags += ["--eval.dataset", eval_prompts, "--eval.steps", "10", "--eval.n_samples_per_prompt", "1",
                  "--eval.temperature", "0.4"]
    return bridge, flags
