"""StepOPSD: step-aware, local, sign-preserving token weights (docs/credit.md#stepopsd).

Inputs: A (GRPO's sequence advantage on every generated token), delta (the teacher-student token gap
on each turn's scored span T_k: the action block for `action_only`, the whole response for
`clean_step`), the step number.

    lam_t = lam_mix * max(0, 1 - step / decay_steps)                 (decay_steps <= 0: constant)
    w_t   = clip(2 * sigma(sign(A) * delta_t), 1 - alpha, 1 + alpha)  on T_k;  w_t = 1 off-span
    A~_t  = A * ((1 - lam_t) + lam_t * w_t)

Because w_t > 0 and the mix is convex, sign(A~) == sign(A) and |A~| / |A| is in
[1 - lam_t alpha, 1 + lam_t alpha]. Tokens the teacher agrees with more than the student (delta > 0)
get more weight when A > 0 and less blame when A < 0.

Normalized per-step credit budget (on by default), per episode with >= 2 non-empty spans, so that
no single step hoards the episode's credit:

    m_k    = mean_{t in T_k} |A~_t|
    target = mean_k m_k
    c_k    = clip(target / (m_k + 1e-6), 1/C, C)          C = 2
    A~_t  <- c_k * A~_t    for t in T_k

With lam_t = 0 there is nothing to reshape: A is returned exactly (the budget is skipped), as
"lam = 0 gives GRPO exactly" (docs/credit.md#properties) requires.

RLSD (optional baseline, docs/credit.md#rlsd) shares the mixing:
    w_t = clip(exp(sign(A) * delta_t), 1 - 0.2, 1 + 0.2) on every generated token, no budget.
"""

from __future__ import annotations

import torch

from trainer.credit.batch import TurnLayout

__all__ = ["lam_schedule", "token_weights", "rlsd_token_weights", "mix", "budget_normalize", "stepopsd_advantage"]


def lam_schedule(lam_mix: float, step: int, decay_steps: int) -> float:
    """lam_t = lam_mix * max(0, 1 - step / decay_steps); decay_steps <= 0 keeps lam_mix."""
    if decay_steps <= 0:
        return float(lam_mix)
    return float(lam_mix) * max(0.0, 1.0 - float(step) / float(decay_steps))


def token_weights(A: torch.Tensor, delta: torch.Tensor, span: torch.Tensor, alpha: float) -> torch.Tensor:
    """w_t = clip(2 sigma(sign(A) delta_t), 1 - alpha, 1 + alpha) on the span, 1 off it (elementwise)."""
    w = (2.0 * torch.sigmoid(torch.sign(A) * delta)).clamp_(1.0 - alpha, 1.0 + alpha)
    return torch.where(span, w, torch.ones((), dtype=w.dtype, device=w.device))


def rlsd_token_weights(A: torch.Tensor, delta: torch.Tensor, span: torch.Tensor, clip: float) -> torch.Tensor:
    """RLSD: w_t = clip(exp(sign(A) delta_t), 1 - clip, 1 + clip) on the span, 1 off it (elementwise)."""
    w = torch.exp((torch.sign(A) * delta).clamp(max=10.0)).clamp_(1.0 - clip, 1.0 + clip)
    return torch.where(span, w, torch.ones((), dtype=w.dtype, device=w.device))


def mix(A: torch.Tensor, w: torch.Tensor, lam: float) -> torch.Tensor:
    """A~ = A * ((1 - lam) + lam * w), computed as A * (1 + lam * (w - 1)) so that w == 1 gives A exactly."""
    return A * (1.0 + lam * (w - 1.0))


def budget_normalize(
    A_tilde: torch.Tensor, span: torch.Tensor, layout: TurnLayout, cap: float, eps: float = 1e-6
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Rescale each turn's span so that every step of an episode gets about the same mean |A~|.

    A_tilde and span are the layout's flat generated tokens ([N]).
    Returns (A~ after the budget [N], c [E, K] (1 where not applied), applied [E, K] bool).
    """
    n_k = layout.turn_count(span)                                                        # |T_k|
    nonempty = n_k > 0
    m_k = layout.turn_sum(A_tilde.abs(), span) / n_k.clamp(min=1)                       # m_k
    spans_per_episode = nonempty.sum(dim=1, keepdim=True)
    eligible = spans_per_episode >= 2                                                   # >= 2 non-empty spans
    target = (m_k * nonempty).sum(dim=1, keepdim=True) / spans_per_episode.clamp(min=1)  # mean_k m_k
    c_k = (target / (m_k + eps)).clamp(1.0 / cap, cap)                                  # c_k
    applied = nonempty & eligible & (target > 0)                                         # A = 0: nothing to move
    c_k = torch.where(applied, c_k, torch.ones_like(c_k))
    c_tok = layout.gather(c_k.to(A_tilde.dtype))
    out = torch.where(span, A_tilde * c_tok, A_tilde)                                   # A~_t <- c_k A~_t on T_k
    return out, c_k, applied


def stepopsd_advantage(
    A: torch.Tensor,
    delta: torch.Tensor,
    span: torch.Tensor,
    layout: TurnLayout,
    *,
    lam: float,
    alpha: float,
    budget: bool,
    cap: float,
    eps: float = 1e-6,
    weights: str = "stepopsd",
    rlsd_clip: float = 0.2,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """A~ for StepOPSD (or RLSD with weights='rlsd') and its intermediate tensors for the diagnostics.

    A, delta, span: the layout's flat generated tokens ([N]): GRPO's advantage, the gap (0 off-span),
    the scored span. Returns (A~ [N], {"w": weights [N], "c": budget coefficients [E, K],
    "budget_applied": [E, K]}).
    """
    if lam == 0.0:
        return A.clone(), {}
    if weights == "rlsd":
        w = rlsd_token_weights(A, delta, span, rlsd_clip)
    else:
        w = token_weights(A, delta, span, alpha)
    A_tilde = mix(A, w, lam)
    parts: dict[str, torch.Tensor] = {"w": w}
    if budget and weights != "rlsd":
        A_tilde, c_k, applied = budget_normalize(A_tilde, span, layout, cap, eps)
        parts["c"], parts["budget_applied"] = c_k, applied
    return A_tilde, parts
