"""Token gap and turn evidence (docs/credit.md#token-gap-and-turn-evidence).

    delta_{k,t} = lp_T(y_{k,t}) - lp_S(y_{k,t})   on the scored span T_k, 0 elsewhere
    e_k         = SUM_{t in T_k} delta_{k,t}      (a sum, not a mean)

lp_T is the teacher (privileged context), lp_S the student (rollout policy). Its mean over tokens is
about -KL(student || teacher) on the student's own samples. The gap is clamped to +-max_abs_gap so
that a -inf log-prob cannot turn into NaN downstream (inf - inf, 0 * inf); no finite value of interest
changes, since every use of delta saturates long before.
"""

from __future__ import annotations

import torch

from trainer.credit.batch import TurnLayout

__all__ = ["token_gap", "turn_evidence"]


def token_gap(
    teacher_logprobs: torch.Tensor,
    student_logprobs: torch.Tensor,
    scored: torch.Tensor,
    max_abs_gap: float = 1e4,
) -> torch.Tensor:
    """delta = clamp(lp_T - lp_S, -max_abs_gap, max_abs_gap) where `scored`, 0 elsewhere.

    Elementwise: works on [R, T] tensors or on the flat generated tokens alike (float32 out, or
    float64 for float64 inputs).
    Raises ValueError on NaN log-probs inside the scored span (a broken forward pass, not a gap).
    """
    dtype = torch.promote_types(torch.promote_types(teacher_logprobs.dtype, student_logprobs.dtype), torch.float32)
    lp_T, lp_S = teacher_logprobs.to(dtype), student_logprobs.to(dtype)
    delta = lp_T - lp_S
    bad = torch.isnan(delta).logical_and_(scored)
    if bool(bad.any()):
        if bool((torch.isnan(lp_T) | torch.isnan(lp_S)).logical_and_(scored).any()):
            raise ValueError("teacher or student log-probs hold NaN inside the scored span")
        # The remaining NaN gaps are -inf - -inf: both models gave the token probability 0, which is
        # no gap at all.
        delta = torch.nan_to_num_(delta, nan=0.0)
    # where(), not a product: NaN or inf gaps outside the scored span must become 0, not NaN.
    return torch.where(scored, delta.clamp_(-max_abs_gap, max_abs_gap),
                       torch.zeros((), dtype=delta.dtype, device=delta.device))


def turn_evidence(delta: torch.Tensor, layout: TurnLayout, scored: torch.Tensor) -> torch.Tensor:
    """e_k = sum of delta over the scored tokens of turn k  ->  [E, K] float64 (0 for unscored turns).

    delta and scored are the layout's flat generated tokens ([N]).
    """
    return layout.turn_sum(delta, scored)
