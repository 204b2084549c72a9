"""Does per-turn credit land on the turns that mattered? Within-episode and pooled AUCs of credit against
an env's turn labels, with bootstrap intervals that resample tasks.

An env with `turn_labels=True` labels each turn in `Hindsight.details["turn_labels"]`: `progress` (the turn
moved the task forward: ALFWorld's expert plan got shorter, a WebShop search found the target, a Search-QA
search found the gold answer) and `expert_action` (what the env's expert would have done there).
`EpisodeItems` turns one method's `CreditParts` (from `compute_advantages(..., return_parts=True)`, e.g.
`trainer.credit_pass.credit_pass`) into per-episode (scores, labels) items; `within_auc`, `pooled_auc`
and `beyond_auc` score them, one value per row of bootstrap counts (`resample_counts`; ones for the
sample itself), and `interval` gives the point value with its 95% interval.

Used by `benchmarks/credit_quality.py` (every method, every family) and by the demo's reading-teacher
section (`agentgym_app.reading_teacher`).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import numpy as np

from agentgym_opsd.parsing import parse_action
from trainer.chat import generated_char_offsets

__all__ = ["EpisodeItems", "Items", "Paired", "auc", "beyond_auc", "expert_action_marks", "interval", "pooled_auc",
           "resample_counts", "side_items", "within_auc"]


def auc(scores, labels, strata=None) -> float | None:
    """P(score of a positive > score of a negative) (ties count half); with `strata`, only pairs
    within one stratum count (within-episode AUC). None when there is no pair."""
    scores, labels = np.asarray(scores, dtype=float), np.asarray(labels, dtype=bool)
    groups = [slice(None)] if strata is None else [np.asarray(strata) == s for s in set(strata)]
    wins = pairs = 0.0
    for g in groups:
        pos, neg = scores[g][labels[g]], scores[g][~labels[g]]
        if len(pos) == 0 or len(neg) == 0:
            continue
        diff = pos[:, None] - neg[None, :]
        wins += float((diff > 0).sum() + 0.5 * (diff == 0).sum())
        pairs += diff.size
    return wins / pairs if pairs else None


def resample_counts(units: Sequence[Any], draws: int, rng: np.random.Generator) -> np.ndarray:
    """[draws, n]: how often each of the n episodes is in each bootstrap draw, when a draw takes len(set(units))
    units (one per episode: its task group; or the episode itself) with replacement, with all their episodes."""
    keys = {u: i for i, u in enumerate(dict.fromkeys(units))}
    index = np.array([keys[u] for u in units], dtype=int)
    picks = rng.integers(0, len(keys), size=(draws, len(keys)))
    unit_counts = np.zeros((draws, len(keys)), dtype=np.int64)
    np.add.at(unit_counts, (np.repeat(np.arange(draws), len(keys)), picks.ravel()), 1)
    return unit_counts[:, index]


Items = Sequence[tuple[Sequence[float], Sequence[bool]] | None]  # per episode: (scores, labels), None: not in the cell
Paired = Sequence[tuple[Sequence[float], Sequence[float], Sequence[bool]] | None]  # per episode: (e_k, lp_S, labels)


def within_auc(items: Items, counts: np.ndarray) -> np.ndarray:
    """Within-episode AUC (pairs of a positive and a negative of one episode), one per row of `counts`
    ([D, n]: each episode's weight in each draw; ones for the sample itself). NaN where no pair."""
    pair_episode, wins = [], []
    for e, item in enumerate(items):
        if item is None:
            continue
        s, lab = np.asarray(item[0], dtype=float), np.asarray(item[1], dtype=bool)
        d = (s[lab][:, None] - s[~lab][None, :]).ravel()
        pair_episode += [e] * d.size
        wins.append((d > 0) + 0.5 * (d == 0))
    if not pair_episode:
        return np.full(len(counts), np.nan)
    w = counts[:, np.asarray(pair_episode)].astype(float)
    total = w.sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(total > 0, w @ np.concatenate(wins) / np.where(total > 0, total, 1), np.nan)


def pooled_auc(items: Items, counts: np.ndarray) -> np.ndarray:
    """AUC over the pooled items of the episodes (every positive against every negative, across
    episodes), each episode weighted by its count in each row of `counts`. NaN where no pair."""
    ep, score, label = [], [], []
    for e, item in enumerate(items):
        if item is not None:
            ep += [e] * len(item[0])
            score += list(item[0])
            label += list(item[1])
    out = np.full(len(counts), np.nan)
    if not ep:
        return out
    ep, label = np.asarray(ep), np.asarray(label, dtype=bool)
    values, where = np.unique(np.asarray(score, dtype=float), return_inverse=True)
    for d, row in enumerate(counts):
        w = row[ep].astype(float)
        pos = np.bincount(where, weights=w * label, minlength=len(values))
        neg = np.bincount(where, weights=w * ~label, minlength=len(values))
        denominator = pos.sum() * neg.sum()
        if denominator > 0:
            below = np.cumsum(neg) - neg  # negatives strictly below each value
            out[d] = float((pos * (below + 0.5 * neg)).sum() / denominator)
    return out


def beyond_auc(paired: Paired, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Within-episode AUC of e_k - b lp_S, b the least-squares slope of e_k on lp_S over the pooled turns
    of each draw (each episode weighted by its count), refitted per row of `counts`. Returns (AUCs, b)."""
    ep, e_k, lp, pair_episode, de, dl = [], [], [], [], [], []
    for i, item in enumerate(paired):
        if item is None:
            continue
        ev, lps = np.asarray(item[0], dtype=float), np.asarray(item[1], dtype=float)
        lab = np.asarray(item[2], dtype=bool)
        ep += [i] * len(ev)
        e_k += list(ev)
        lp += list(lps)
        de.append((ev[lab][:, None] - ev[~lab][None, :]).ravel())
        dl.append((lps[lab][:, None] - lps[~lab][None, :]).ravel())
        pair_episode += [i] * de[-1].size
    nan = np.full(len(counts), np.nan)
    if len(ep) < 3:
        return nan, nan
    w = counts[:, np.asarray(ep)].astype(float)  # [D, turns]
    total = w.sum(axis=1, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean_lp = (w @ np.asarray(lp)) / total[:, 0]
        mean_e = (w @ np.asarray(e_k)) / total[:, 0]
        centred = np.asarray(lp)[None, :] - mean_lp[:, None]
        var = (w * centred**2).sum(axis=1)
        cov = (w * centred * (np.asarray(e_k)[None, :] - mean_e[:, None])).sum(axis=1)
        slope = np.where(var > 0, cov / np.where(var > 0, var, 1), np.nan)
    if not pair_episode:
        return nan, slope
    diff = np.concatenate(de)[None, :] - slope[:, None] * np.concatenate(dl)[None, :]
    win = (diff > 0) + 0.5 * (diff == 0)
    pw = counts[:, np.asarray(pair_episode)].astype(float)
    pt = pw.sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        out = np.where((pt > 0) & np.isfinite(slope), (pw * win).sum(axis=1) / np.where(pt > 0, pt, 1), np.nan)
    return out, slope


def interval(point: float, draws: np.ndarray, n_episodes: int) -> dict[str, Any]:
    """The point AUC and the 2.5 / 97.5 percentiles of the draws (NaN draws, without pairs, left out)."""
    values = draws[np.isfinite(draws)]
    if not np.isfinite(point) or len(values) == 0:
        return {"auc": None, "low": None, "high": None, "episodes": n_episodes, "draws": int(len(values))}
    return {"auc": float(point), "low": float(np.percentile(values, 2.5)), "high": float(np.percentile(values, 97.5)),
            "episodes": n_episodes, "draws": int(len(values))}


# ---------------------------------------------------------------------------------------------
# Per-episode items for the AUCs


def expert_action_marks(tokenizer, rows, r, k, response: str, expert_action: str | None, span_positions):
    """For the scored tokens of turn k in row r: 1 where the token's characters lie in a word of the
    agent's action that agrees with the expert's action (same word at the same place), 0 where it
    departs, None for tag and punctuation tokens (neither)."""
    parsed = parse_action(response, ("action", "search", "answer"))
    if parsed.span is None or expert_action is None:
        return None
    a, b = parsed.span
    content = response[a:b]
    inner_start = content.find(">") + 1
    inner = content[inner_start:content.rfind("<")] if "<" in content[inner_start:] else content[inner_start:]
    words = [(m.start() + a + inner_start, m.end() + a + inner_start, m.group()) for m in re.finditer(r"\S+", inner)]
    expert = expert_action.split()
    ids = rows.input_ids[r, span_positions].tolist()
    # A whole-response span ends with the end-of-turn token, which is not in the response's text.
    for cut in range(min(3, len(ids))):
        text, offsets = generated_char_offsets(tokenizer, ids[: len(ids) - cut])
        first = response.find(text) if text else -1
        if first >= 0:
            break
    if first < 0:
        return None
    marks = []
    for s, e in offsets:
        s, e = s + first, e + first
        hit = [i for i, (ws, we, _) in enumerate(words) if s < we and e > ws]
        if not hit:
            marks.append(None)
            continue
        marks.append(int(all(i < len(expert) and words[i][2] == expert[i] for i in hit)))
    return marks + [None] * cut


class EpisodeItems:
    """What one method's credit (one `CreditParts`) gives each episode, for the AUC cells: per episode,
    the turns' credit, evidence and student log-prob of the span with their progress labels, and the
    action tokens' scores, gaps and log-probs with their agree-with-the-expert labels."""

    def __init__(self, episodes, rows, student, parts, tokenizer, labels, marks_cache: dict):
        self.turn_credit: list = []
        self.evidence: list = []
        self.student: list = []
        self.paired: list = []
        self.token_credit: list = []
        self.token_gap: list = []
        self.token_student: list = []
        advantages, A = parts.advantages, parts.A_episode
        for e, episode in enumerate(episodes):
            credit, prog, ev, lp_sum = [], [], [], []
            tok_scores, tok_score_labels, tok_labels, tok_gap, tok_lp = [], [], [], [], []
            a = float(A[e])
            for r in (rows.row_episode == e).nonzero().squeeze(1).tolist():
                for k in range(episode.num_turns):
                    mine = rows.turn_id[r] == k
                    if not bool(mine.any()):
                        continue
                    span = mine & rows.span[r]
                    label = labels[episode.episode_id][k]
                    # float64 mean, rounded: equal token values give an exact tie
                    credit.append(round(float(advantages[r][mine].double().mean()) / abs(a), 6) if a != 0 else None)
                    prog.append(bool(label["progress"]))
                    lp_sum.append(float(student[r][span].double().sum()) if bool(span.any()) else None)
                    ev.append(float(parts.evidence[e, k]) if parts.evidence is not None and bool(span.any()) else None)
                    if parts.delta is None or not bool(span.any()):
                        continue
                    positions = span.nonzero().squeeze(1)
                    key = (rows.span_mode, r, k)
                    if key not in marks_cache:
                        marks_cache[key] = expert_action_marks(tokenizer, rows, r, k, episode.turns[k].response,
                                                               label.get("expert_action"), positions)
                    marks = marks_cache[key]
                    if not marks:
                        continue
                    sign = 1.0 if a > 0 else -1.0
                    for p, mark in zip(positions.tolist(), marks, strict=True):
                        if mark is None:
                            continue
                        if parts.token_weight is not None and a != 0:
                            tok_scores.append(sign * (float(parts.token_weight[r, p]) - 1.0))
                            tok_score_labels.append(bool(mark))
                        tok_gap.append(float(parts.delta[r, p]))
                        tok_lp.append(float(student[r, p]))
                        tok_labels.append(bool(mark))
            keep = [i for i, c in enumerate(credit) if c is not None]
            self.turn_credit.append(([credit[i] for i in keep], [prog[i] for i in keep]) if keep else None)
            keep = [i for i, v in enumerate(ev) if v is not None]
            self.evidence.append(([ev[i] for i in keep], [prog[i] for i in keep]) if keep else None)
            keep = [i for i, v in enumerate(lp_sum) if v is not None]
            self.student.append(([lp_sum[i] for i in keep], [prog[i] for i in keep]) if keep else None)
            keep = [i for i in range(len(ev)) if ev[i] is not None and lp_sum[i] is not None]
            paired = ([ev[i] for i in keep], [lp_sum[i] for i in keep], [prog[i] for i in keep])
            self.paired.append(paired if keep else None)
            self.token_credit.append((tok_scores, tok_score_labels) if tok_scores else None)
            self.token_gap.append((tok_gap, tok_labels) if tok_gap else None)
            self.token_student.append((tok_lp, tok_labels) if tok_lp else None)


def side_items(items: Sequence[Any], success: Sequence[bool], side: str) -> list:
    """The items of the successful (side "success") or failed episodes; None for the others."""
    want = side == "success"
    return [item if bool(ok) == want else None for item, ok in zip(items, success, strict=True)]
