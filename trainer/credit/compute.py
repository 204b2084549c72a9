"""`compute_advantages`: the one entry point from a `CreditBatch` to per-token advantages.

One code path for every method (docs/credit.md#shared-pipeline): outcome reward -> GRPO sequence advantage A ->
reshaped by the chosen method -> [R, T] advantages that are 0 on every token the model did not
generate. The diagnostics are docs/credit.md#logged-per-update, as plain floats (and one histogram) ready to log.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from trainer.credit.agentopsd import agentopsd_advantage
from trainer.credit.batch import CreditBatch, TurnLayout
from trainer.credit.config import RELEASE_SUCCESS_REWARD, CreditConfig
from trainer.credit.evidence import token_gap, turn_evidence
from trainer.credit.gigpo import discounted_returns, gigpo_token_advantage, step_advantage
from trainer.credit.grpo import broadcast_to_tokens, grpo_episode_advantage, outcome_reward
from trainer.credit.stepopsd import lam_schedule, stepopsd_advantage

__all__ = ["compute_advantages", "episode_rewards", "CreditParts"]

B0_BINS = 10


def _episode_name(batch: CreditBatch, i: int) -> str:
    ids = batch.meta.get("episode_ids") if batch.meta else None
    return repr(ids[i]) if ids is not None and i < len(ids) else f"#{i}"


def check_finite_rewards(batch: CreditBatch) -> None:
    """docs/credit.md#outcome-reward: a non-finite score or step reward is an error naming the episode (it would
    turn every advantage of its group into NaN)."""
    for name, values in (("score", batch.score), ("step reward", batch.step_reward)):
        if values is None or values.numel() == 0:
            continue
        bad = ~torch.isfinite(values.to(torch.float64))
        if values.dim() == 2:
            bad = bad.any(dim=1)
        if bool(bad.any()):
            i = int(bad.nonzero()[0, 0])
            raise ValueError(
                f"episode {_episode_name(batch, i)} has a non-finite {name} ({values[i].tolist()}); "
                "the env reported NaN or inf: fix the env or drop the episode before computing credit"
            )


def episode_rewards(batch: CreditBatch, config: CreditConfig) -> torch.Tensor:
    """R_i of every episode (docs/credit.md#outcome-reward)  ->  [E] float64."""
    check_finite_rewards(batch)
    return outcome_reward(
        batch.success,
        batch.score,
        batch.invalid_turns,
        success_scale=config.success_scale,
        score_coef=config.score_coef,
        invalid_coef=config.invalid_coef,
    )


def _masked_mean_std(x: torch.Tensor, mask: torch.Tensor) -> tuple[float, float, int]:
    """Mean, population std and count of x where mask holds, from sums (no boolean selection)."""
    n = int(mask.sum())
    if n == 0:
        return 0.0, 0.0, 0
    x = torch.where(mask, x, torch.zeros((), dtype=x.dtype, device=x.device))
    s1 = float(x.sum())
    s2 = float((x * x).sum())
    mean = s1 / n
    return mean, max(s2 / n - mean * mean, 0.0) ** 0.5, n


def _mean_std(x: torch.Tensor) -> tuple[float, float]:
    """Mean and population std (token-level float32 vectors stay float32: these are for logging)."""
    if x.numel() == 0:
        return 0.0, 0.0
    mean = float(x.mean())
    std = float(x.std(unbiased=False)) if x.numel() > 1 else 0.0
    return mean, std


@dataclass
class CreditParts:
    """What `compute_advantages` computed on the way to the advantages (`return_parts=True`): the
    numbers a report shows, exactly those the update used. Token tensors are [R, T] like the batch,
    turn tensors [E, K]; None where the method does not define the quantity.

    R: [E] outcome rewards R_i. A_episode: [E] GRPO advantages A_i. advantages: [R, T] A~.
    A_step: GiGPO's step advantages. delta: the token gap lp_T - lp_S (0 off the scored span);
    scored: where the teacher scored. evidence: e_k. token_weight: StepOPSD/RLSD w_t (1 off the
    span); budget: StepOPSD's c_k (1 where not applied). belief: AgentOPSD's B_0..B_K [E, K + 1];
    belief_delta: dB_k; turn_weight: w_k. lam: the mixing strength used.
    """

    R: torch.Tensor
    A_episode: torch.Tensor
    advantages: torch.Tensor
    lam: float | None = None
    A_step: torch.Tensor | None = None
    delta: torch.Tensor | None = None
    scored: torch.Tensor | None = None
    evidence: torch.Tensor | None = None
    token_weight: torch.Tensor | None = None
    budget: torch.Tensor | None = None
    belief: torch.Tensor | None = None
    belief_delta: torch.Tensor | None = None
    turn_weight: torch.Tensor | None = None


def compute_advantages(
    batch: CreditBatch, config: CreditConfig, step: int = 0, *, diagnostics: bool = True, return_parts: bool = False
) -> tuple[torch.Tensor, dict[str, Any]] | tuple[torch.Tensor, dict[str, Any], CreditParts]:
    """Per-token advantages for one update.

    Args:
        batch: the rows, their turn ids and spans, the episodes' outcomes and groups, and (for the
            teacher methods) student and teacher log-probs; GiGPO also reads step rewards and state ids.
        config: the method and its knobs.
        step: the update number (StepOPSD's lam_t schedule).
        diagnostics: compute the diagnostics of docs/credit.md#logged-per-update (cheap; off only for
            benchmarks of the math).
        return_parts: also return the `CreditParts` (intermediates) of this computation.

    Returns:
        (advantages [R, T] float32, 0 on tokens the model did not generate;
         diagnostics: dict of floats, keys prefixed "credit/", plus "credit/b0_hist" a list of counts)
        [, CreditParts with return_parts].
    """
    method = config.method
    batch.validate(needs_teacher=config.needs_teacher, needs_steps=(method == "gigpo"))
    layout = TurnLayout.of(batch)  # the N generated tokens, flat; all token math runs on them
    eps = config.adv_eps

    # -- docs/credit.md#outcome-reward and #sequence-advantage: R_i and GRPO's A_i, broadcast to tokens
    R = episode_rewards(batch, config)                                                 # R_i
    A_episode = grpo_episode_advantage(R, batch.episode_group, eps)                   # A_i
    A = broadcast_to_tokens(A_episode, layout)                                        # A_{i,t}, [N]
    diag: dict[str, Any] = {}
    parts: dict[str, torch.Tensor] = {}
    delta = evidence = scored = None

    if method == "grpo":
        A_out = A
    elif method == "gigpo":
        returns = discounted_returns(batch.step_reward, layout.exists, config.gigpo_gamma)   # R_t
        A_step = step_advantage(returns, layout.exists, batch.episode_group, batch.state_id, eps)
        A_out = gigpo_token_advantage(A_episode, A_step, layout, config.gigpo_omega)
        parts["A_step"] = A_step
    else:
        # -- docs/credit.md#token-gap-and-turn-evidence: token gap on the scored span, turn evidence
        span = layout.span
        scored = span if batch.teacher_scored is None else span & layout.take(batch.teacher_scored)
        delta = token_gap(
            layout.take(batch.teacher_logprobs), layout.take(batch.student_logprobs), scored, config.max_abs_gap
        )
        if method in ("stepopsd", "rlsd"):
            lam_t = lam_schedule(config.lam_mix, step, config.decay_steps)
            A_out, parts = stepopsd_advantage(
                A, delta, span, layout, lam=lam_t, alpha=config.alpha_clip, budget=config.budget,
                cap=config.budget_cap, eps=eps, weights=method, rlsd_clip=config.rlsd_clip,
            )
            diag["credit/lam_t"] = lam_t
        elif method == "agentopsd":
            evidence = turn_evidence(delta, layout, scored)                            # e_k
            # B_0's outcome: binary success, or the release's raw 0/10 reward (docs/credit.md#the-release-preset)
            prior = batch.success if config.prior == "success" else RELEASE_SUCCESS_REWARD * batch.success.to(
                torch.float64)
            A_out, parts = agentopsd_advantage(
                A, A_episode, evidence, prior, batch.episode_group, layout,
                lam=config.lam, b=config.b, gamma=config.belief_gamma, eps0=config.eps0, eps=eps,
            )
            diag["credit/lam_t"] = float(config.lam)
        else:  # pragma: no cover - CreditConfig validates the method
            raise ValueError(method)

    if diagnostics:
        diag.update(_diagnostics(batch, config, layout, R, A_episode, A, A_out, delta, scored, evidence, parts))
    advantages = layout.to_rows(A_out)
    if not return_parts:
        return advantages, diag
    result = CreditParts(R=R, A_episode=A_episode, advantages=advantages, lam=diag.get("credit/lam_t"),
                         A_step=parts.get("A_step"))
    if delta is not None:
        result.delta = layout.to_rows(delta)
        result.scored = layout.to_rows(scored, dtype=torch.bool)
        result.evidence = evidence if evidence is not None else turn_evidence(delta, layout, scored)
    if "w" in parts and method in ("stepopsd", "rlsd"):
        # 1 off the generated tokens
        result.token_weight = layout.to_rows(parts["w"]) + (batch.turn_id < 0).to(torch.float32)
        result.budget = parts.get("c")
    if method == "agentopsd" and "B" in parts:
        result.belief, result.belief_delta, result.turn_weight = parts["B"], parts["dB"], parts["w"]
    return advantages, diag, result


def _diagnostics(
    batch: CreditBatch,
    config: CreditConfig,
    layout: TurnLayout,
    R: torch.Tensor,
    A_episode: torch.Tensor,
    A: torch.Tensor,
    A_out: torch.Tensor,
    delta: torch.Tensor | None,
    scored: torch.Tensor | None,
    evidence: torch.Tensor | None,
    parts: dict[str, torch.Tensor],
) -> dict[str, Any]:
    """docs/credit.md#logged-per-update: what to log per update (token tensors are the layout's flat [N] vectors)."""
    d: dict[str, Any] = {}
    d["credit/reward_mean"], d["credit/reward_std"] = _mean_std(R)
    d["credit/success_rate"] = float(batch.success.to(torch.float64).mean()) if batch.num_episodes else 0.0
    d["credit/generated_tokens"] = float(layout.num_generated)
    d["credit/zero_adv_episodes"] = float((A_episode == 0).to(torch.float64).mean()) if A_episode.numel() else 0.0
    std_A = float(A.std(unbiased=False)) if A.numel() > 1 else 0.0
    std_At = float(A_out.std(unbiased=False)) if A_out.numel() > 1 else 0.0
    d["credit/adv_mean"] = float(A_out.mean()) if A_out.numel() else 0.0
    d["credit/adv_std_ratio"] = std_At / std_A if std_A > 0 else 1.0                  # std(A~) / std(A)
    if "A_step" in parts:
        d["credit/step_adv_mean"], d["credit/step_adv_std"] = _mean_std(parts["A_step"][layout.exists])
    if delta is not None and scored is not None:
        d["credit/delta_mean"], d["credit/delta_std"], n_scored = _masked_mean_std(delta, scored)  # mean(delta) ~ -KL
        d["credit/scored_tokens"] = float(n_scored)
        d["credit/teacher_truncated"] = float(batch.teacher_truncated)
        has_span = layout.turn_count(scored) > 0
        ev = evidence if evidence is not None else turn_evidence(delta, layout, scored)
        d["credit/evidence_mean"], d["credit/evidence_std"] = _mean_std(ev[has_span])  # mean e_k
    if config.method in ("stepopsd", "rlsd") and "w" in parts:
        w, span = parts["w"], layout.span
        bound = config.alpha_clip if config.method == "stepopsd" else config.rlsd_clip
        mean_w, _, n_span = _masked_mean_std(w, span)
        d["credit/weight_mean"] = mean_w if n_span else 1.0
        at_bound = ((w - 1.0).abs() >= bound - 1e-6).logical_and_(span)
        d["credit/weight_clip_frac"] = float(at_bound.sum()) / n_span if n_span and bound > 0 else 0.0
        if "c" in parts:
            c = parts["c"][parts["budget_applied"]]
            d["credit/budget_episodes"] = float(parts["budget_applied"].any(dim=1).sum())
            d["credit/budget_coef_mean"], d["credit/budget_coef_std"] = _mean_std(c)
            d["credit/budget_coef_min"] = float(c.min()) if c.numel() else 1.0
            d["credit/budget_coef_max"] = float(c.max()) if c.numel() else 1.0
    if config.method == "agentopsd" and "B" in parts:
        B0 = parts["B"][:, 0]
        d["credit/b0_mean"] = float(B0.mean()) if B0.numel() else 0.0
        d["credit/b0_hist"] = torch.histc(B0, bins=B0_BINS, min=0.0, max=1.0).to(torch.long).tolist()
        d["credit/dB_mean"], d["credit/dB_std"] = _mean_std(parts["dB"][layout.exists])
        w = parts["w"][layout.exists]
        d["credit/weight_mean"] = float(w.mean()) if w.numel() else 1.0
        d["credit/weight_clip_frac"] = (
            float(((w - 1.0).abs() >= config.b - 1e-9).to(torch.float64).mean()) if w.numel() and config.b > 0 else 0.0
        )
    return d
