"""A slow, loop-by-loop transcription of docs/credit.md, independent of trainer/credit.

Plain Python floats and `math`, one token at a time, written straight from the document's formulas, so
that the vectorized code can be checked against it on random batches. Also builds `CreditBatch`es
from a layout-free description of episodes, as whole-episode rows or one row per turn, shuffled.

An episode description is a dict:
    {"group": int, "success": bool, "score": float, "invalid": int,
     "turns": [{"reward": float, "state": int, "tokens": [(in_span, lp_S, lp_T), ...]}, ...]}
"""

from __future__ import annotations

import math
import random

import torch

from trainer.credit import CreditBatch, CreditConfig


def sigma(x: float) -> float:
    if x >= 0:
        return 1.0 / (1.0 + math.exp(-x))
    e = math.exp(x)
    return e / (1.0 + e)


def sign(x: float) -> float:
    return (x > 0) - (x < 0)


def clip(x: float, lo: float, hi: float) -> float:
    return min(max(x, lo), hi)


def mean(xs):
    return sum(xs) / len(xs)


def unbiased_std(xs):
    m = mean(xs)
    return math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1))


def pop_std(xs):
    m = mean(xs)
    return math.sqrt(sum((x - m) ** 2 for x in xs) / len(xs))


def rewards(episodes, cfg: CreditConfig):
    return [
        cfg.success_scale * float(ep["success"]) + cfg.score_coef * ep["score"] - cfg.invalid_coef * ep["invalid"]
        for ep in episodes
    ]


def grpo(episodes, cfg: CreditConfig):
    """A_i per episode."""
    R = rewards(episodes, cfg)
    out = []
    for i, ep in enumerate(episodes):
        members = [R[j] for j, other in enumerate(episodes) if other["group"] == ep["group"]]
        if len(members) < 2:
            out.append(0.0)
            continue
        out.append((R[i] - mean(members)) / (unbiased_std(members) + cfg.adv_eps))
    return out


def reference(episodes, cfg: CreditConfig, step: int = 0):
    """adv[i][k][t] for every generated token, straight from docs/credit.md's formulas."""
    A = grpo(episodes, cfg)
    out = [[[A[i]] * len(turn["tokens"]) for turn in ep["turns"]] for i, ep in enumerate(episodes)]
    if cfg.method == "grpo":
        return out
    if cfg.method == "gigpo":
        returns = []
        for ep in episodes:
            Rt, acc = [], 0.0
            for turn in reversed(ep["turns"]):
                acc = turn["reward"] + cfg.gigpo_gamma * acc
                Rt.append(acc)
            returns.append(list(reversed(Rt)))
        for i, ep in enumerate(episodes):
            for k, turn in enumerate(ep["turns"]):
                cluster = [
                    returns[j][m]
                    for j, other in enumerate(episodes)
                    if other["group"] == ep["group"]
                    for m, t2 in enumerate(other["turns"])
                    if t2["state"] == turn["state"] and turn["state"] >= 0
                ]
                a_step = 0.0
                if len(cluster) >= 2:
                    a_step = (returns[i][k] - mean(cluster)) / (unbiased_std(cluster) + cfg.adv_eps)
                out[i][k] = [A[i] + cfg.gigpo_omega * a_step] * len(turn["tokens"])
        return out

    def delta(tok):
        in_span, lp_s, lp_t = tok
        return (lp_t - lp_s) if in_span else 0.0

    if cfg.method in ("stepopsd", "rlsd"):
        lam = cfg.lam_mix if cfg.decay_steps <= 0 else cfg.lam_mix * max(0.0, 1.0 - step / cfg.decay_steps)
        if lam == 0:
            return out
        for i, ep in enumerate(episodes):
            for k, turn in enumerate(ep["turns"]):
                row = []
                for tok in turn["tokens"]:
                    if not tok[0]:
                        w = 1.0
                    elif cfg.method == "rlsd":
                        w = clip(math.exp(sign(A[i]) * delta(tok)), 1 - cfg.rlsd_clip, 1 + cfg.rlsd_clip)
                    else:
                        w = clip(2 * sigma(sign(A[i]) * delta(tok)), 1 - cfg.alpha_clip, 1 + cfg.alpha_clip)
                    row.append(A[i] * ((1 - lam) + lam * w))
                out[i][k] = row
            if cfg.method == "stepopsd" and cfg.budget:
                spans = [
                    k for k, turn in enumerate(ep["turns"]) if any(tok[0] for tok in turn["tokens"])
                ]
                if len(spans) >= 2:
                    m = {
                        k: mean([abs(a) for a, tok in zip(out[i][k], ep["turns"][k]["tokens"]) if tok[0]])
                        for k in spans
                    }
                    target = mean(list(m.values()))
                    for k in spans:
                        c = clip(target / (m[k] + cfg.adv_eps), 1 / cfg.budget_cap, cfg.budget_cap)
                        out[i][k] = [
                            a * c if tok[0] else a for a, tok in zip(out[i][k], ep["turns"][k]["tokens"])
                        ]
        return out

    if cfg.method == "agentopsd":
        if cfg.lam == 0:
            return out
        for i, ep in enumerate(episodes):
            group = [j for j, other in enumerate(episodes) if other["group"] == ep["group"]]
            if cfg.prior == "success":
                B0 = clip(sum(float(episodes[j]["success"]) for j in group) / len(group), cfg.eps0, 1 - cfg.eps0)
            else:  # the release's raw reward: 10 for a success, 0 otherwise
                B0 = clip(mean([10.0 * float(episodes[j]["success"]) for j in group]), cfg.eps0, 1 - cfg.eps0)
            c, B_prev, dB = 0.0, B0, []
            for turn in ep["turns"]:
                e_k = sum(delta(tok) for tok in turn["tokens"])
                c = cfg.belief_gamma * c + e_k
                B_k = clip(sigma(math.log(B0 / (1 - B0)) + c), 1e-6, 1 - 1e-6)
                dB.append(B_k - B_prev)
                B_prev = B_k
            if not dB:
                continue
            q = [sign(A[i]) * x for x in dB]
            mq, sq = mean(q), pop_std(q)
            for k, turn in enumerate(ep["turns"]):
                z = (q[k] - mq) / (sq + cfg.adv_eps)
                w = clip(1 + cfg.b * z, 1 - cfg.b, 1 + cfg.b)
                out[i][k] = [A[i] * ((1 - cfg.lam) + cfg.lam * w)] * len(turn["tokens"])
        return out
    raise ValueError(cfg.method)


# ---------------------------------------------------------------------------------------------
# Batches from descriptions


def to_batch(episodes, layout: str = "full", seed: int | None = None, obs_tokens: int = 2, dtype=torch.float32):
    """A CreditBatch of `episodes` and, per generated token, where it sits: {(i, k, t): (row, pos)}.

    layout "full": one row per episode (prompt, then each turn's tokens and an observation);
    "turn": one row per turn (a prompt, then the turn's tokens). `seed` shuffles the rows and the
    episode order (group ids and outcomes move with their episodes).
    """
    rng = random.Random(seed)
    order = list(range(len(episodes)))
    if seed is not None:
        rng.shuffle(order)
    new_index = {old: new for new, old in enumerate(order)}
    rows = []  # (episode new index, [(turn_id, span, lp_S, lp_T, key)])
    for i, ep in enumerate(episodes):
        if layout == "full":
            toks = [(-1, False, 0.0, 0.0, None)] * obs_tokens
            for k, turn in enumerate(ep["turns"]):
                for t, (in_span, lp_s, lp_t) in enumerate(turn["tokens"]):
                    toks.append((k, in_span, lp_s, lp_t, (i, k, t)))
                toks += [(-1, False, 0.0, 0.0, None)] * obs_tokens
            rows.append((new_index[i], toks))
        else:
            for k, turn in enumerate(ep["turns"]):
                toks = [(-1, False, 0.0, 0.0, None)] * (obs_tokens + k)
                for t, (in_span, lp_s, lp_t) in enumerate(turn["tokens"]):
                    toks.append((k, in_span, lp_s, lp_t, (i, k, t)))
                rows.append((new_index[i], toks))
    if seed is not None:
        rng.shuffle(rows)
    R = len(rows)
    T = max([len(t) for _, t in rows] + [1]) + 1  # one padding column at least
    turn_id = torch.full((R, T), -1, dtype=torch.long)
    span = torch.zeros(R, T, dtype=torch.bool)
    lp_S = torch.zeros(R, T, dtype=torch.float64)
    lp_T = torch.zeros(R, T, dtype=torch.float64)
    where = {}
    for r, (_, toks) in enumerate(rows):
        for p, (k, s, ls, lt, key) in enumerate(toks):
            turn_id[r, p], span[r, p], lp_S[r, p], lp_T[r, p] = k, s, ls, lt
            if key is not None:
                where[key] = (r, p)
    E = len(episodes)
    eps_new = [episodes[old] for old in order]
    K = max([len(ep["turns"]) for ep in episodes] + [1])
    step_reward = torch.zeros(E, K)
    state_id = torch.full((E, K), -1, dtype=torch.long)
    for n, ep in enumerate(eps_new):
        for k, turn in enumerate(ep["turns"]):
            step_reward[n, k] = turn["reward"]
            state_id[n, k] = turn["state"]
    batch = CreditBatch(
        turn_id=turn_id,
        span=span,
        row_episode=torch.tensor([e for e, _ in rows], dtype=torch.long),
        episode_group=torch.tensor([ep["group"] for ep in eps_new], dtype=torch.long),
        success=torch.tensor([bool(ep["success"]) for ep in eps_new]),
        num_turns=torch.tensor([len(ep["turns"]) for ep in eps_new], dtype=torch.long),
        score=torch.tensor([float(ep["score"]) for ep in eps_new]),
        invalid_turns=torch.tensor([int(ep["invalid"]) for ep in eps_new], dtype=torch.long),
        step_reward=step_reward,
        state_id=state_id,
        student_logprobs=lp_S.to(dtype),
        teacher_logprobs=lp_T.to(dtype),
    )
    return batch, where


def per_token(adv: torch.Tensor, where) -> dict:
    """{(i, k, t): value} read out of an [R, T] advantage tensor."""
    return {key: float(adv[r, p]) for key, (r, p) in where.items()}


def random_episodes(rng: random.Random, n_groups=3, max_group=4, max_turns=4, max_tokens=5, gap_scale=2.0,
                    empty_span_p=0.2):
    episodes = []
    for g in range(n_groups):
        for _ in range(rng.randint(1, max_group)):
            turns = []
            for _ in range(rng.randint(0 if rng.random() < 0.05 else 1, max_turns)):
                n = rng.randint(0, max_tokens)
                empty = rng.random() < empty_span_p
                tokens = []
                for _ in range(n):
                    lp_s = -rng.random() * 5
                    tokens.append((not empty and rng.random() < 0.7, lp_s, lp_s + rng.gauss(0, gap_scale)))
                turns.append({"reward": float(rng.random() < 0.2), "state": rng.randint(-1, 3), "tokens": tokens})
            episodes.append(
                {
                    "group": g,
                    "success": rng.random() < 0.5,
                    "score": rng.random(),
                    "invalid": rng.randint(0, 2),
                    "turns": turns,
                }
            )
    return episodes
