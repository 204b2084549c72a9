"""The state of a local training run between two updates, and the parts of it made from the config.

`RunState` is everything a run's checkpoint holds (`trainer.checkpoint` saves it and loads it back);
`trainer.local.LocalTrainer` keeps one and the rest of the run (its config, folder, hooks, logs) beside
it. The functions below make the parts of a state from the run's `TrainConfig`, given explicitly, so
that a fresh run and a resumed one make them the same way:

- `trainable_policy`: the weights the run trains (all, the top layers, LoRA adapters);
- `begin_rl`: what the RL phase adds once the warm start is done (the teacher snapshot, the KL
  reference, the RL optimizer);
- `policy_agent` / `rollout_agent`: the policy as an agent that records the ids it samples;
- `compute_context`, `policy_rows`: the context the run's forwards and backwards run in, and the token
  rows of its episodes (the warm start and the updates both use them).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from trainer.config import TrainConfig, TrainError
from trainer.memory import release_freed_memory
from trainer.optim import make_optimizer
from trainer.policy import autocast_context, resolve_autocast
from trainer.rows import build_rows
from trainer.sampling import HFPolicyAgent
from trainer.trainable import TrainableError, select_trainable

__all__ = ["RunState", "begin_rl", "compute_context", "policy_agent", "policy_rows", "rollout_agent",
           "trainable_policy"]


@dataclass
class RunState:
    """A local run between two updates: what its checkpoint saves and loads.

    model, tokenizer: the policy (only the weights `trainable_policy` chose require grad).
    rng: draws each update's task seeds.
    step: RL updates done.
    sft_done: the warm start is over; from then on `optimizer` is the RL one and the frozen copies
        exist (`begin_rl`).
    evaluated_steps: the updates after which the held-out panel was evaluated (0: before the first).
    optimizer: the RL optimizer (None before `begin_rl`: the warm start builds its own).
    teacher_model: the `stale` teacher's snapshot of the policy, refreshed every `teacher_refresh`
        updates; None for a live teacher or a method without one.
    reference_model: the frozen initial policy of the KL term (`kl_coef > 0`), else None.
    rollout_agent: the agent the rollouts sample with (its sampling generator is state); None until
        the first rollout.
    """

    model: Any
    tokenizer: Any
    rng: np.random.Generator
    step: int = 0
    sft_done: bool = False
    evaluated_steps: set[int] = field(default_factory=set)
    optimizer: torch.optim.Optimizer | None = None
    teacher_model: Any = None
    reference_model: Any = None
    rollout_agent: HFPolicyAgent | None = None


def trainable_policy(model, config: TrainConfig):
    """`model` with only the weights `config` trains requiring grad (`trainer.trainable`); a bad choice
    is a `TrainError`."""

    try:
        return select_trainable(model, train_layers=config.train_layers, lora_rank=config.lora_rank,
                                lora_layers=config.lora_layers, lora_alpha=config.lora_alpha)
    except TrainableError as e:
        raise TrainError(str(e)) from None


def _frozen_copy(model):
    twin = copy.deepcopy(model)
    twin.eval()
    twin.requires_grad_(False)
    return twin


def begin_rl(state: RunState, config: TrainConfig) -> None:
    """The warm start is over: frozen copies of the policy as it is now (the `stale` teacher's snapshot,
    the KL reference, as `config` asks) and a fresh RL optimizer (`trainer.optim`)."""
    credit = config.credit_config()
    state.sft_done = True
    if credit.needs_teacher and credit.teacher_mode == "stale":
        state.teacher_model = _frozen_copy(state.model)
    if config.kl_coef > 0:
        state.reference_model = _frozen_copy(state.model)
    state.optimizer = make_optimizer(state.model, lr=config.lr, weight_decay=config.weight_decay)


def policy_agent(model, tokenizer, config: TrainConfig, *, temperature: float, seed: int | None = None,
                 name: str = "policy") -> HFPolicyAgent:
    """The policy as an agent: it builds its contexts in token space and records the ids it samples,
    which the token rows are laid out from."""
    return HFPolicyAgent(
        model, tokenizer, max_new_tokens=config.max_new_tokens, temperature=temperature,
        seed=config.seed if seed is None else seed, chat_template_kwargs=dict(config.chat_template_kwargs), name=name,
    )


def rollout_agent(model, tokenizer, config: TrainConfig) -> HFPolicyAgent:
    """The agent the rollouts sample with (its sampling generator goes into the checkpoint)."""
    return policy_agent(model, tokenizer, config, temperature=config.temperature, seed=config.seed,
                        name=f"{config.method}")


@contextmanager
def compute_context(config: TrainConfig, model):
    """The context a run's forward and backward passes run in (`--autocast`). When it ends, the memory
    the phase freed goes back to the system (`trainer.memory`): a process between phases holds its live
    memory, not its last peak, so runs side by side fit where their peaks would not."""

    try:
        with autocast_context(config.autocast, next(model.parameters()).device):
            yield
    finally:
        release_freed_memory()


@contextmanager
def sampling_context(config: TrainConfig, agent: HFPolicyAgent):
    """The context an agent of the run samples in. Where the run computes in bf16 autocast on a CPU, the
    agent samples with a bfloat16 copy of its model, made once for the block, outside autocast: autocast
    runs with its weight cache off (`trainer.policy.autocast_context`), so it would cast every weight at
    every decoding step. Elsewhere (float32, or CUDA, whose weights are bf16 already) the run's own
    `compute_context`. The updates still train float32 weights and recompute the old log-probs in the
    run's context, so the copy changes what is sampled by rounding only."""
    model = agent.model
    device = next(model.parameters()).device
    if resolve_autocast(config.autocast, device) != "bf16" or device.type != "cpu":
        with compute_context(config, model):
            yield
        return
    copy_ = copy.deepcopy(model).to(torch.bfloat16)
    agent.model = copy_
    try:
        yield
    finally:
        agent.model = model
        del copy_
        release_freed_memory()


def policy_rows(config: TrainConfig, model, tokenizer, episodes: Sequence[Any], *, span_mode: str | None = None):
    """Token rows of finished episodes (`trainer.rows.build_rows`) with the policy's chat template, cut
    at the model's context, scoring the spans of `span_mode` (default: the run's credit's)."""

    mode = span_mode if span_mode is not None else config.credit_config().span_mode
    return build_rows(list(episodes), tokenizer, span_mode=mode, chat_template_kwargs=config.chat_template_kwargs,
                      max_length=getattr(model.config, "max_position_embeddings", None))
