"""The clipped policy-gradient update: micro-batches, the PPO surrogate, the k3 KL estimate, and the
optimizer loop that applies them (`ppo_update`).

    r_t = exp(lp_new - lp_old)
    L   = -(1 / N) sum_t min(r_t A~_t, clip(r_t, 1 - eps, 1 + eps) A~_t)        token mean over the batch
        + beta (1 / N) sum_t k3(lp_new, lp_ref)                                  KL to the initial policy
    k3  = exp(lp_ref - lp_new) - (lp_ref - lp_new) - 1                          (>= 0, unbiased)
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch

from trainer.forward import token_logprobs

__all__ = ["clipped_pg_loss", "kl_k3", "micro_batches", "ppo_update", "row_batch"]


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


def row_batch(rows, index: list[int], device) -> dict[str, torch.Tensor]:
    """Rows `index` of `rows` on `device`, cut at their longest length: input_ids, attention_mask and
    `generated` (the tokens the model generated, the ones the loss reads)."""
    idx = torch.tensor(index, dtype=torch.long)
    width = int(rows.attention_mask[idx].sum(-1).max())
    return {
        "input_ids": rows.input_ids[idx, :width].to(device),
        "attention_mask": rows.attention_mask[idx, :width].to(device),
        "generated": rows.generated_mask()[idx, :width].to(device),
    }


def ppo_update(model, optimizer, rows, old_logp: torch.Tensor, advantages: torch.Tensor, ref_logp: torch.Tensor | None,
               *, config, step: int, temperature: float) -> dict[str, float]:
    """`config.ppo_epochs` passes over the batch, each split into `config.mini_batches` random
    mini-batches of rows (drawn with a generator seeded by `config.seed` and `step`, the updates done
    before); each mini-batch is one optimizer step (its micro-batches of `config.micro_batch_tokens`
    accumulate gradients; the loss is the token mean over the mini-batch), at the rate the caller set
    on `optimizer` (`trainer.optim.set_learning_rate`; the metrics' `lr`). The first mini-batch of the
    first pass is on-policy (ratio 1); later ones are off-policy by the steps before them, which the
    ratio clip bounds. Returns the update's metrics."""
    cfg = config
    mask_all = rows.generated_mask()
    if int(mask_all.sum()) == 0:
        return {"loss": 0.0, "pg_loss": 0.0, "kl_ref": 0.0, "clip_frac": 0.0, "grad_norm": 0.0, "ratio_mean": 1.0,
                "entropy": 0.0, "optimizer_steps": 0, "update/tokens": 0, "update/tokens_per_s": 0.0}
    started = time.perf_counter()
    totals = dict.fromkeys(("pg", "kl", "clipped", "ratio", "entropy", "tokens", "grad_norm", "floor", "floor_tokens"),
                           0.0)
    steps = 0
    shuffle = torch.Generator().manual_seed(cfg.seed * 1_000_003 + step)
    for _ in range(cfg.ppo_epochs):
        order = torch.randperm(rows.num_rows, generator=shuffle).tolist()
        parts = max(1, min(cfg.mini_batches, rows.num_rows))
        for part in range(parts):
            members = sorted(order[part::parts])
            n_tokens = int(mask_all[members].sum())
            if n_tokens == 0:
                continue
            optimizer.zero_grad(set_to_none=True)
            lengths = rows.attention_mask[members].sum(-1).tolist()
            for local in micro_batches(lengths, cfg.micro_batch_tokens):
                index = [members[i] for i in local]
                mb = row_batch(rows, index, model.device)
                width = mb["input_ids"].shape[1]
                idx = torch.tensor(index)
                old = old_logp[idx, :width].to(model.device)
                adv = advantages[idx, :width].to(model.device, torch.float32)
                mask = mb["generated"]
                new, entropy = token_logprobs(model, mb["input_ids"], mb["attention_mask"], mask,
                                              temperature=temperature, with_entropy=True, share_prefix=True)
                pg, clipped, ratio = clipped_pg_loss(new, old, adv, mask, cfg.clip_eps)
                if steps == 0:  # no step taken yet: new and old are the same policy through two code paths
                    totals["floor"] += float((kl_k3(old, new.detach()) * mask).sum())
                    totals["floor_tokens"] += int(mask.sum())
                loss = pg / n_tokens
                if ref_logp is not None:
                    kl = (kl_k3(new, ref_logp[idx, :width].to(model.device)) * mask).sum()
                    loss = loss + cfg.kl_coef * kl / n_tokens
                    totals["kl"] += float(kl.detach())
                loss.backward()
                totals["pg"] += float(pg.detach())
                totals["clipped"] += float(clipped)
                totals["ratio"] += float(ratio)
                totals["entropy"] += float((entropy * mask).sum())
                totals["tokens"] += int(mask.sum())
            totals["grad_norm"] += float(torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.max_grad_norm))
            optimizer.step()
            steps += 1
    n = max(1.0, totals["tokens"])
    stats = {
        "loss": (totals["pg"] + cfg.kl_coef * totals["kl"]) / n,
        "pg_loss": totals["pg"] / n,
        "kl_ref": totals["kl"] / n,
        "clip_frac": totals["clipped"] / n,
        "ratio_mean": totals["ratio"] / n,
        "entropy": totals["entropy"] / n,
        "grad_norm": totals["grad_norm"] / max(1, steps),
        "optimizer_steps": steps,
        "lr": optimizer.param_groups[0]["lr"],
    }
    processed = int(totals["tokens"])
    stats["kl_old_new"] = _kl_old_new(model, rows, old_logp, micro_batch_tokens=cfg.micro_batch_tokens,
                                      temperature=temperature)
    # the KL that rounding alone shows: the old log-probs against the training forward's before any step
    stats["kl_floor"] = totals["floor"] / max(1.0, totals["floor_tokens"])
    stats["update/tokens"] = int(mask_all.sum())
    stats["update/tokens_per_s"] = processed / max(1e-9, time.perf_counter() - started)
    return stats


def _kl_old_new(model, rows, old_logp: torch.Tensor, *, micro_batch_tokens: int, temperature: float) -> float:
    """How far the update moved the policy: KL(old || new) on the batch, k3 estimator (>= 0), over
    the tokens of every 4th micro-batch (a quarter of the cost of a full extra forward pass)."""
    kl_num = kl_den = 0.0
    with torch.no_grad():
        for index in micro_batches(rows.attention_mask.sum(-1).tolist(), micro_batch_tokens)[::4]:
            mb = row_batch(rows, index, model.device)
            width = mb["input_ids"].shape[1]
            new = token_logprobs(model, mb["input_ids"], mb["attention_mask"], mb["generated"],
                                 temperature=temperature, share_prefix=True)
            old = old_logp[torch.tensor(index), :width].to(new.device)
            kl_num += float((kl_k3(old, new) * mb["generated"]).sum())  # samples come from old
            kl_den += float(mb["generated"].sum())
    return kl_num / max(1.0, kl_den)
