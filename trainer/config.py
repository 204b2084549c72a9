"""`TrainConfig`: everything a local training run depends on (saved as config.json in the run folder)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import agentgym_opsd
from trainer.credit.config import METHODS, CreditConfig
from trainer.env_knowledge import credit_config

__all__ = ["TrainConfig", "TrainError", "RESUMABLE_CHANGES", "AUTOCAST", "PRIVILEGED_CONTEXTS"]

AUTOCAST = ("none", "bf16", "auto")
# The teacher contexts a literate warm start teaches in (`sft_privileged_context`, trainer.warm_start).
PRIVILEGED_CONTEXTS = ("both", "hindsight", "skills")


class TrainError(ValueError):
    """A training run cannot start or go on; the message says how to fix it."""


@dataclass
class TrainConfig:
    """Everything a run depends on (saved as config.json in the run directory).

    Attributes (groups):
        env_id, env_options: the training env and its `gymnasium.make` keywords.
        eval_env_options: keywords overriding `env_options` for the held-out panel (e.g. a split).
        method: grpo, gigpo, stepopsd or agentopsd; credit: overrides of `CreditConfig` fields.
        model: a local transformers model folder, a named model (`smollm2-135m`, trainer/models.py),
            or `tiny`; tokenizer/vocab_size/tiny_*: the tiny model's tokenizer (folder, `trained`,
            `auto`) and sizes.
        train_layers, lora_rank, lora_layers, lora_alpha: which weights train (`trainer.trainable`):
            all (0, 0), the top `train_layers` decoder layers, or LoRA adapters of rank `lora_rank`
            on every layer or the top `lora_layers`.
        autocast: `none`, `bf16` (matrix products in bfloat16, weights and optimizer in float32:
            about twice the tokens/s on a CPU with AMX or AVX512-BF16 units), or `auto` (bf16 where
            the CPU has such units, none elsewhere).
        context: the context policy (`full` or `window:k`).
        sft_*: supervised warm start on expert episodes (0 episodes: none); sft_noise: the chance
            that a turn of an expert episode is a random admissible action instead (a detour the
            expert then recovers from; only the expert's own turns are trained on);
            sft_privileged: the share of warm-start episodes (both outcomes) also taught in the
            teacher's privileged contexts (a literate teacher, `trainer.warm_start`), which
            `sft_privileged_context` picks: `both`, `hindsight` (StepOPSD) or `skills` (AgentOPSD).
        steps, tasks_per_step, group_size: updates, and T tasks x G episodes per update.
        train_seeds: the reset seeds of the tasks the updates play, T per update in this order (cycling);
            empty: T seeds drawn at random for each update (a fixed list trains on a fixed set of tasks).
        lr, weight_decay, max_grad_norm, clip_eps, kl_coef, ppo_epochs, mini_batches, micro_batch_tokens:
            the update (ppo_epochs x mini_batches optimizer steps per batch of rollouts).
        lr_schedule: "constant", or "linear": update k of `steps` uses lr x (steps - k + 1) / steps
            (a function of the update number alone, so a resumed run uses the same rates).
        temperature, max_new_tokens: sampling during rollouts.
        (the teacher, `live` policy or `stale` snapshot refreshed every N updates, is set in `credit`:
        teacher_mode, teacher_refresh)
        eval_every, eval_episodes, eval_seed, eval_temperature: the held-out panel; eval_seeds: its
            reset seeds (default: eval_seed .. eval_seed + eval_episodes - 1); eval_before: evaluate
            before the first update too (off when a shared warm start was evaluated already).
        save_every: checkpoint every N updates (and at the end); 0: never (the run cannot be resumed).
        credit_records: write what each update's credit gave each turn to credit.jsonl (for the report).
        cpu_threads: torch threads on CPU (0: torch's default). One by default: a tiny model's ops are
            so small that OpenMP synchronisation dominates (docs/trainer-performance.md).
    """

    env_id: str
    out: str
    method: str = "grpo"
    model: str = "tiny"
    env_options: dict[str, Any] = field(default_factory=dict)
    eval_env_options: dict[str, Any] = field(default_factory=dict)
    credit: dict[str, Any] = field(default_factory=dict)
    tokenizer: str = "auto"
    vocab_size: int = 2048
    tiny_hidden: int = 64
    tiny_layers: int = 2
    context: str = "full"
    seed: int = 0
    device: str = "auto"
    dtype: str = "auto"
    sft_episodes: int = 0
    sft_epochs: int = 3
    sft_lr: float = 2e-3
    sft_batch_tokens: int = 4096
    sft_noise: float = 0.0
    sft_seed: int = 1_000_000
    sft_privileged: float = 0.0
    sft_privileged_context: str = "both"
    steps: int = 10
    tasks_per_step: int = 4
    group_size: int = 4
    lr: float = 3e-4
    lr_schedule: str = "constant"
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    clip_eps: float = 0.2
    kl_coef: float = 0.0
    ppo_epochs: int = 1
    mini_batches: int = 1
    micro_batch_tokens: int = 16384
    temperature: float = 1.0
    max_new_tokens: int = 48
    eval_every: int = 5
    eval_episodes: int = 32
    eval_seed: int = 0
    eval_temperature: float = 0.0
    eval_seeds: list[int] = field(default_factory=list)
    train_seeds: list[int] = field(default_factory=list)
    eval_before: bool = True
    save_every: int = 1
    num_envs: int = 0
    cpu_threads: int = 1
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    train_layers: int = 0
    lora_rank: int = 0
    lora_layers: int = 0
    lora_alpha: float = 0.0
    autocast: str = "none"
    credit_records: bool = True

    def validate(self) -> None:
        if self.method not in METHODS:
            raise TrainError(f"--method {self.method!r}: use one of {', '.join(METHODS)}")
        if self.lr_schedule not in ("constant", "linear"):
            raise TrainError(f"--lr-schedule {self.lr_schedule!r}: use constant or linear")
        for name in ("steps", "sft_episodes", "eval_episodes"):
            if getattr(self, name) < 0:
                raise TrainError(f"--{name.replace('_', '-')} must be >= 0")
        for name in ("tasks_per_step", "group_size", "max_new_tokens", "ppo_epochs", "mini_batches",
                     "micro_batch_tokens", "sft_batch_tokens", "sft_epochs"):
            if getattr(self, name) < 1:
                raise TrainError(f"--{name.replace('_', '-')} must be >= 1")
        if any(not isinstance(seed, int) or isinstance(seed, bool) or seed < 0 for seed in self.train_seeds):
            raise TrainError(f"train_seeds must be non-negative integers, got {self.train_seeds!r}")
        if self.save_every < 0:
            raise TrainError("--save-every must be >= 0 (0: no checkpoints, so no --resume)")
        if self.eval_every < 0:
            raise TrainError("--eval-every must be >= 0 (0: evaluate only before and after training)")
        if not 0.0 <= self.sft_noise < 1.0:
            raise TrainError("--sft-noise must be in [0, 1)")
        if not 0.0 <= self.sft_privileged <= 1.0:
            raise TrainError(
                "--sft-privileged must be in [0, 1] (the share of warm-start episodes taught with privileged context)"
            )
        if self.sft_privileged_context not in PRIVILEGED_CONTEXTS:
            raise TrainError(f"--sft-privileged-context {self.sft_privileged_context!r}: "
                             f"use one of {', '.join(PRIVILEGED_CONTEXTS)}")
        agentgym_opsd.ContextPolicy.parse(self.context)
        if self.autocast not in AUTOCAST:
            raise TrainError(f"--autocast {self.autocast!r}: use one of {', '.join(AUTOCAST)}")
        for name in ("train_layers", "lora_rank", "lora_layers"):
            if getattr(self, name) < 0:
                raise TrainError(f"--{name.replace('_', '-')} must be >= 0")
        if self.train_layers and self.lora_rank:
            raise TrainError("choose one: --train-layers K (the top K layers) or --lora-rank R (adapters)")
        if self.lora_layers and not self.lora_rank:
            raise TrainError("--lora-layers needs --lora-rank > 0")
        self.credit_config()

    def credit_config(self):
        """The credit core's settings: the defaults for this env family and method
        (docs/credit.md#configuration), with
        `credit` overrides (unknown keys and bad values are a TrainError)."""
        known = {f.name for f in dataclasses.fields(CreditConfig)}
        unknown = set(self.credit) - known
        if unknown:
            raise TrainError(f"--credit {', '.join(sorted(unknown))}: unknown setting(s); "
                             f"CreditConfig has {', '.join(sorted(known))}")
        try:
            return credit_config(self.env_id, self.method, **self.credit)
        except (TypeError, ValueError) as e:
            raise TrainError(f"--credit: {e}") from None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TrainConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in known})


# Settings a resumed run may change (the rest must match the checkpoint's run).
RESUMABLE_CHANGES = {"steps", "eval_every", "save_every", "out", "device", "num_envs", "cpu_threads", "credit_records",
                     "autocast"}
