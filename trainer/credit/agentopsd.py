"""AgentOPSD: turn-level credit from a recursive belief in success (docs/credit.md#agentopsd).

The teacher (the policy with a privileged skill note) scores every turn's whole response; the turn
evidence e_k = sum_t (lp_T - lp_S) moves a belief that the episode succeeds. Turns that moved the
belief the way the outcome went get more of the advantage, the others less.

    B_0  = clip(S_g / G, eps0, 1 - eps0)            S_g successes (binary) in the group, eps0 = 1e-3
    c_k  = gamma * c_{k-1} + e_k,   c_0 = 0          gamma = 0.95
    B_k  = clip(sigma(logit(B_0) + c_k), 1e-6, 1 - 1e-6)
    dB_k = B_k - B_{k-1}
    q_k  = sign(A) * dB_k
    z_k  = (q_k - mean_k q) / (popstd_k q + 1e-6)    over the turns of one episode
    w_k  = clip(1 + b * z_k, 1 - b, 1 + b)           b = 0.2
    A~_{k,t} = A * ((1 - lam) + lam * w_k)           every generated token of turn k, lam = 0.5

`release` preset (the public code, docs/credit.md#the-release-preset): gamma 1.0, eps0 1e-4, B_0 from
the group's raw reward mean.
A one-turn episode, or equal dB across turns, gives z = 0, w = 1: GRPO. q is centred on the
episode's first turn before the mean is taken (no change mathematically), so equal dB gives z = 0
exactly, not 1e-11. Belief arithmetic runs in float64 and logit(B_0) is finite (B_0 is clipped), so a
saturated prior with huge negative evidence stays finite.
"""

from __future__ import annotations

import torch

from trainer.credit.batch import TurnLayout
from trainer.credit.gigpo import discount_matrix

__all__ = ["belief_prior", "belief_path", "turn_weights", "agentopsd_advantage"]


def belief_prior(outcome: torch.Tensor, episode_group: torch.Tensor, eps0: float) -> torch.Tensor:
    """B_0 = clip(mean_g outcome, eps0, 1 - eps0) for every episode  ->  [E] float64.

    `outcome` is the binary success flag (S_g / G) or, for the release preset, the raw reward.
    """
    x = outcome.to(torch.float64)
    _, g = torch.unique(episode_group, return_inverse=True)
    n_groups = int(g.max()) + 1 if g.numel() else 0
    total = torch.zeros(n_groups, dtype=torch.float64, device=x.device).index_add_(0, g, x)
    count = torch.bincount(g, minlength=n_groups).to(torch.float64)
    return (total / count)[g].clamp(eps0, 1.0 - eps0)


def belief_path(B0: torch.Tensor, evidence: torch.Tensor, exists: torch.Tensor, gamma: float) -> torch.Tensor:
    """B_k for k = 0..K  ->  [E, K + 1] float64 (column 0 is B_0).

    c_k = sum_{j<=k} gamma^(k-j) e_j as one product with the discount matrix (no loop over turns).
    """
    K = exists.shape[1]
    e = torch.where(exists, evidence.to(torch.float64), torch.zeros((), dtype=torch.float64))
    c = e @ discount_matrix(K, gamma, e.device)                                          # c_k
    logit_B0 = torch.log(B0) - torch.log1p(-B0)                                          # logit(B_0)
    B = torch.sigmoid(logit_B0.unsqueeze(1) + c).clamp(1e-6, 1.0 - 1e-6)                 # B_k
    return torch.cat([B0.unsqueeze(1), B], dim=1)


def turn_weights(
    dB: torch.Tensor, sign_A: torch.Tensor, exists: torch.Tensor, b: float, eps: float = 1e-6
) -> tuple[torch.Tensor, torch.Tensor]:
    """w_k = clip(1 + b z_k, 1 - b, 1 + b) with z the per-episode standardized q = sign(A) dB.

    Returns (w [E, K] float64, z [E, K] float64); turns past the end get w = 1, z = 0.
    """
    zero = torch.zeros((), dtype=torch.float64, device=dB.device)
    q = torch.where(exists, sign_A.to(torch.float64).unsqueeze(1) * dB, zero)            # q_k
    q = torch.where(exists, q - q[:, :1], zero)                                          # centre on turn 1
    n = exists.sum(dim=1, keepdim=True).clamp(min=1).to(torch.float64)
    mean = q.sum(dim=1, keepdim=True) / n                                                # mean_k q
    dev = torch.where(exists, q - mean, zero)
    popstd = torch.sqrt((dev * dev).sum(dim=1, keepdim=True) / n)                        # popstd_k q
    z = dev / (popstd + eps)                                                             # z_k
    w = (1.0 + b * z).clamp(1.0 - b, 1.0 + b)                                            # w_k
    return torch.where(exists, w, torch.ones_like(w)), z


def agentopsd_advantage(
    A: torch.Tensor,
    A_episode: torch.Tensor,
    evidence: torch.Tensor,
    prior_outcome: torch.Tensor,
    episode_group: torch.Tensor,
    layout: TurnLayout,
    *,
    lam: float,
    b: float,
    gamma: float,
    eps0: float,
    eps: float = 1e-6,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """A~ [N] and its intermediates {"B": [E, K+1], "dB": [E, K], "w": [E, K], "z": [E, K]}.

    A: [N] GRPO advantage on the layout's generated tokens. A_episode: [E] (its sign is sign(A)).
    evidence: [E, K] e_k. prior_outcome: [E] success flags (or raw rewards for the release preset).
    """
    if lam == 0.0:
        return A.clone(), {}
    B0 = belief_prior(prior_outcome, episode_group, eps0)                                # B_0
    B = belief_path(B0, evidence, layout.exists, gamma)                                  # B_0..B_K
    dB = B[:, 1:] - B[:, :-1]                                                            # dB_k
    w, z = turn_weights(dB, torch.sign(A_episode), layout.exists, b, eps)                # w_k
    factor = 1.0 + lam * (w - 1.0)                                    # (1 - lam) + lam w_k, exact 1 at w_k = 1
    A_tilde = A * layout.gather(factor.to(A.dtype))                                      # A~_{k,t}
    return A_tilde, {"B": B, "dB": torch.where(layout.exists, dB, torch.zeros_like(dB)), "w": w, "z": z}
