"""GRPO: one advantage per episode from its group's outcomes (docs/credit.md#outcome-reward and
docs/credit.md#sequence-advantage).

    R_i = success_scale * success_i + score_coef * score_i - invalid_coef * n_invalid_i
    A_i = (R_i - mean_g R) / (std_g R + 1e-6)        std unbiased; a group of one gives A_i = 0
    A_{i,t} = A_i for every generated token t of episode i (observation tokens get 0)

Token-level functions here and in the other method files take the batch's N generated tokens as
one flat vector (see `TurnLayout`); `compute_advantages` puts the result back into [R, T].
"""

from __future__ import annotations

import torch

from trainer.credit.batch import TurnLayout

__all__ = ["outcome_reward", "group_normalize", "grpo_episode_advantage", "broadcast_to_tokens"]


def outcome_reward(
    success: torch.Tensor,
    score: torch.Tensor | None = None,
    invalid_turns: torch.Tensor | None = None,
    *,
    success_scale: float = 1.0,
    score_coef: float = 0.0,
    invalid_coef: float = 0.1,
) -> torch.Tensor:
    """R_i = success_scale * success_i + score_coef * score_i - invalid_coef * n_invalid_i  ->  [E] float64."""
    R = success_scale * success.to(torch.float64)
    if score is not None and score_coef:
        R = R + score_coef * score.to(torch.float64)
    if invalid_turns is not None and invalid_coef:
        R = R - invalid_coef * invalid_turns.to(torch.float64)
    return R


def group_normalize(x: torch.Tensor, group: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """(x - mean_g x) / (std_g x + eps) per group, std unbiased; members of singleton groups get 0.

    x and group are 1-D of one length. Values are shifted by their group's first member before the
    mean is taken (this changes nothing mathematically), so a group of equal values gives exactly 0.
    """
    x = x.to(torch.float64)
    if x.numel() == 0:
        return x
    _, g = torch.unique(group, return_inverse=True)  # g: dense group index 0..n_groups-1
    n_groups = int(g.max()) + 1
    n = torch.bincount(g, minlength=n_groups).to(torch.float64)                     # |g|
    first = torch.full((n_groups,), x.numel(), dtype=torch.long, device=x.device)
    first.scatter_reduce_(0, g, torch.arange(x.numel(), device=x.device), reduce="amin")
    xs = x - x[first][g]                                                              # shift by x_first(g)
    mean = torch.zeros(n_groups, dtype=torch.float64, device=x.device).index_add_(0, g, xs) / n
    dev = xs - mean[g]
    ss = torch.zeros(n_groups, dtype=torch.float64, device=x.device).index_add_(0, g, dev * dev)
    std = torch.sqrt(ss / (n - 1).clamp(min=1))                                        # unbiased std_g
    A = dev / (std[g] + eps)
    return torch.where(n[g] > 1, A, torch.zeros_like(A))


def grpo_episode_advantage(reward: torch.Tensor, group: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """A_i = (R_i - mean_g R) / (std_g R + eps)  ->  [E] float64."""
    return group_normalize(reward, group, eps)


def broadcast_to_tokens(A_episode: torch.Tensor, layout: TurnLayout) -> torch.Tensor:
    """A_{i,t} = A_i on every generated token t of episode i  ->  [N] float32 (the layout's tokens)."""
    return A_episode.to(torch.float32)[layout.episode]
