"""The optimizer of a local run and its learning-rate schedule: the one place both are defined.

`make_optimizer` builds AdamW (betas 0.9, 0.99) over the weights that train (`requires_grad`: all,
the top layers, or LoRA adapters, `trainer.trainable`). A run builds two: the warm start's, at
`sft_lr` for every step (`trainer.warm_start.sft`), then a fresh one for RL (`trainer.run_state.begin_rl`),
whose rate for update k is `rl_learning_rate(config, k)`:

    constant: lr_k = lr
    linear:   lr_k = lr * (steps - k + 1) / steps      (k = 1 .. steps: lr down to lr / steps)

The rate is a function of the update number alone, so a resumed run uses the same rates. The trainer
sets it on the optimizer before each update (`set_learning_rate`, as CleanRL's annealing does);
`trainer.loss.ppo_update` takes the optimizer as it is.
"""

from __future__ import annotations

import torch

__all__ = ["BETAS", "make_optimizer", "rl_learning_rate", "set_learning_rate"]

BETAS = (0.9, 0.99)


def make_optimizer(model, *, lr: float, weight_decay: float = 0.0) -> torch.optim.AdamW:
    """AdamW at learning rate `lr` over `model`'s trainable parameters."""
    return torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr, weight_decay=weight_decay,
                             betas=BETAS)


def rl_learning_rate(config, update: int) -> float:
    """The learning rate of RL update number `update` (1-based) under `config.lr_schedule`."""
    if config.lr_schedule == "linear" and config.steps > 0:
        return config.lr * max(0.0, config.steps - update + 1) / config.steps
    return config.lr


def set_learning_rate(optimizer: torch.optim.Optimizer, lr: float) -> None:
    """Every parameter group of `optimizer` at `lr` from its next step on."""
    for group in optimizer.param_groups:
        group["lr"] = lr
