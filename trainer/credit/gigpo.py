"""GiGPO: episode advantage plus a step advantage from turns that acted in the same state (docs/credit.md#gigpo).

    A_episode = GRPO's A_i (mean/std normalized within the task group)
    R_t = r_t + gamma * R_{t+1}                       discounted step return, per episode (gamma 0.95)
    cluster: within one task group, the turns whose env state_key (the state they acted in) is equal
    A_step(t) = (R_t - mean_cluster R) / (std_cluster R + 1e-6);   a singleton cluster gives 0
    A_{k,t} = A_episode + omega * A_step(k)           for every generated token of turn k (omega 1)
"""

from __future__ import annotations

import torch

from trainer.credit.batch import TurnLayout
from trainer.credit.grpo import group_normalize

__all__ = ["discount_matrix", "discounted_returns", "step_advantage", "gigpo_token_advantage"]


def discount_matrix(K: int, gamma: float, device: torch.device | None = None) -> torch.Tensor:
    """D[j, k] = gamma^(k - j) for j <= k, else 0   ([K, K] float64).

    `x @ D` is the discounted running sum c_k = sum_{j<=k} gamma^(k-j) x_j, and `x @ D.T` is the
    discounted return R_j = sum_{k>=j} gamma^(k-j) x_k: one matrix product instead of a loop over turns.
    """
    idx = torch.arange(K, device=device, dtype=torch.float64)
    power = idx.unsqueeze(0) - idx.unsqueeze(1)                                          # k - j
    D = torch.where(power >= 0, torch.tensor(float(gamma), dtype=torch.float64, device=device) ** power.clamp(min=0),
                    torch.zeros((), dtype=torch.float64, device=device))
    return D


def discounted_returns(step_reward: torch.Tensor, exists: torch.Tensor, gamma: float) -> torch.Tensor:
    """R_t = r_t + gamma * R_{t+1} within each episode (turns past the end hold 0)  ->  [E, K] float64."""
    K = exists.shape[1]
    r = torch.where(exists, step_reward[:, :K].to(torch.float64), torch.zeros((), dtype=torch.float64))
    return r @ discount_matrix(K, gamma, r.device).T


def step_advantage(
    returns: torch.Tensor, exists: torch.Tensor, episode_group: torch.Tensor, state_id: torch.Tensor, eps: float
) -> torch.Tensor:
    """A_step = (R_t - mean_cluster) / (std_cluster + eps) over clusters (group, state)  ->  [E, K] float64.

    Turns with an unknown state (state_id < 0) and singleton clusters get 0.
    """
    E, K = exists.shape
    state = state_id[:, :K]
    clustered = exists & (state >= 0)
    A_step = torch.zeros(E, K, dtype=torch.float64, device=returns.device)
    if not bool(clustered.any()):
        return A_step
    _, group = torch.unique(episode_group, return_inverse=True)                          # dense group ids
    states = state[clustered]
    key = group.unsqueeze(1).expand(E, K)[clustered] * (int(states.max()) + 1) + states   # cluster = (g, s)
    _, cluster = torch.unique(key, return_inverse=True)
    A_step[clustered] = group_normalize(returns[clustered], cluster, eps)
    return A_step


def gigpo_token_advantage(
    A_episode: torch.Tensor,
    A_step: torch.Tensor,
    layout: TurnLayout,
    omega: float,
) -> torch.Tensor:
    """A_{k,t} = A_episode + omega * A_step(k) on the generated tokens of turn k  ->  [N] float32."""
    A_turn = A_episode.unsqueeze(1) + omega * A_step                                      # [E, K]
    return layout.gather(A_turn.to(torch.float32))
