"""The clipped policy-gradient update's math: micro-batches, the PPO surrogate, the k3 KL estimate.

    r_t = exp(lp_new - lp_old)
    L   = -(1 / N) sum_t min(r_t A~_t, clip(r_t, 1 - eps, 1 + eps) A~_t)        token mean over the batch
        + beta (1 / N) sum_t k3(lp_new, lp_ref)                                  KL to the initial policy
    k3  = exp(lp_ref - lp_new) - (lp_ref - lp_new) - 1                          (>= 0, unbiased)
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = ["micro_batches", "clipped_pg_loss", "kl_k3"]


def micro_batches(lengths: Sequence[int], max_tokens: int) -> list[list[int]]:
    """Row indices packed into micro-batches whose padded size (rows x longest row) stays within
    `max_tokens` (a longer row goes alone). Rows of similar length go together."""
    order = sorted(range(len(lengths)), key=lambda i: (lengths[i], i))
    batches: list[list[int]] = []
    current: list[int] = []
    longest = 0
    for i in order:
        width = max(longest, int(lengths[i]))
        if current and width * (len(current) + 1) > max_tokens:
            batches.append(current)
            current, longest = [], 0
            width = int(lengths[i])
        current.append(i)
        longest = width
    if current:
        batches.append(current)
    return batches


def clipped_pg_loss(
    new_logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor, clip_eps: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The PPO clipped surrogate, summed over `mask` (divide by the batch's token count for the mean).

        r_t = exp(lp_new - lp_old);  l_t = -min(r_t A_t, clip(r_t, 1 - eps, 1 + eps) A_t)

    Returns (sum of l_t, number of clipped tokens, sum of r_t) over the masked tokens.
    """
    ratio = torch.exp(new_logp - old_logp)
    unclipped = ratio * advantages
    clipped = torch.clamp(ratio, 1.0 - clip_eps, 1.0 + clip_eps) * advantages
    loss = -torch.minimum(unclipped, clipped)
    m = mask.float()
    was_clipped = ((unclipped - clipped).abs() > 0) & mask
    return (loss * m).sum(), was_clipped.sum(), (ratio.detach() * m).sum()


def kl_k3(new_logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Per-token KL(pi || pi_ref) estimate k3 = exp(ref - new) - (ref - new) - 1 (>= 0, unbiased)."""
    d = ref_logp - new_logp
    return torch.exp(d) - d - 1.0
