"""trainer/credit_auc.py: the AUCs of credit against turn labels, and their intervals.

The intervals resample tasks (the episodes of one task share their group's normalisation), the "beyond
lp_S" slope is refitted inside every draw, the weighted AUCs equal the plain AUC of the resampled
episodes written out. (Moved from benchmarks/credit_quality.py's tests with the code.)
"""

from __future__ import annotations

import numpy as np
import pytest

from trainer import credit_auc as ca


def _expand(items, row):
    """The sample a row of counts stands for, written out: each episode repeated as often as drawn."""
    out = []
    for item, n in zip(items, row, strict=True):
        if item is not None:
            out += [item] * int(n)
    return out


def test_task_resampling_keeps_a_tasks_episodes_together():
    units = [f"t{i // 4}" for i in range(40)]
    counts = ca.resample_counts(units, 200, np.random.default_rng(0))
    assert counts.shape == (200, 40)
    blocks = counts.reshape(200, 10, 4)
    assert (blocks == blocks[:, :, :1]).all()  # all four episodes of a task are drawn together
    assert (counts.sum(axis=1) == 40).all()  # ten tasks per draw, four episodes each
    per_episode = ca.resample_counts(list(range(40)), 200, np.random.default_rng(0)).reshape(200, 10, 4)
    assert not (per_episode == per_episode[:, :, :1]).all()


def test_task_resampling_widens_the_interval_when_a_tasks_episodes_agree():
    # 24 tasks x 4 episodes; in each task all four episodes rank alike (the task decides), so the sample
    # holds 24 independent results, not 96: resampling episodes would understate the spread by about 2x.
    rng = np.random.default_rng(1)
    items, units = [], []
    for t in range(24):
        good = rng.random() < 0.6
        for _ in range(4):
            noise = rng.normal(0, 0.1, 4)
            scores = ([1.0, 1.0, 0.0, 0.0] if good else [0.0, 0.0, 1.0, 1.0]) + noise
            items.append((list(scores), [True, True, False, False]))
            units.append(t)
    ones = np.ones((1, len(items)))
    point = ca.within_auc(items, ones)[0]
    by_task = ca.interval(point, ca.within_auc(items, ca.resample_counts(units, 2000, np.random.default_rng(2))), 96)
    by_episode = ca.interval(point, ca.within_auc(items, ca.resample_counts(list(range(96)), 2000,
                                                                           np.random.default_rng(2))), 96)
    width_task = by_task["high"] - by_task["low"]
    width_episode = by_episode["high"] - by_episode["low"]
    assert width_task > 1.6 * width_episode, (width_task, width_episode)


def test_within_and_pooled_auc_equal_the_plain_auc_of_the_drawn_sample():
    rng = np.random.default_rng(3)
    items = []
    for e in range(12):
        n = int(rng.integers(2, 7))
        scores = list(np.round(rng.normal(0, 1, n), 1))  # rounded: ties occur
        labels = list(rng.random(n) < 0.5)
        items.append((scores, labels) if e % 5 else None)  # some episodes are not in the cell
    counts = ca.resample_counts([e // 3 for e in range(12)], 5, rng)
    within = ca.within_auc(items, counts)
    pooled = ca.pooled_auc(items, counts)
    for d in range(5):
        sample = _expand(items, counts[d])
        flat_s = [s for sc, _ in sample for s in sc]
        flat_l = [lab for _, la in sample for lab in la]
        strata = [j for j, (sc, _) in enumerate(sample) for _ in sc]
        want_within = ca.auc(flat_s, flat_l, strata)
        want_pooled = ca.auc(flat_s, flat_l)
        assert (np.isnan(within[d]) and want_within is None) or within[d] == pytest.approx(want_within, abs=1e-12)
        assert (np.isnan(pooled[d]) and want_pooled is None) or pooled[d] == pytest.approx(want_pooled, abs=1e-12)


def _flattening_sample(rng, tasks=16, group=4, slopes=None):
    """Per episode (e_k, lp_S, progress): lp_S is higher on progress turns (the student already knows
    them), and e_k = -b lp_S + 1.5 progress: raw evidence points the wrong way, what is left beyond
    lp_S the right one. The slope b differs across tasks."""
    paired, units = [], []
    for t in range(tasks):
        b = slopes[t] if slopes is not None else 1.0
        for _ in range(group):
            labels = [True, False, True, False, False]
            lp = [(3.0 if lab else 0.0) + rng.normal(0, 3.0) for lab in labels]
            ev = [-b * x + (1.5 if lab else 0.0) + rng.normal(0, 0.05) for x, lab in zip(lp, labels, strict=True)]
            paired.append((ev, lp, labels))
            units.append(t)
    return paired, units


def test_beyond_lp_s_removes_the_flattening():
    paired, _ = _flattening_sample(np.random.default_rng(4))
    ones = np.ones((1, len(paired)))
    raw = ca.within_auc([(ev, lab) for ev, _, lab in paired], ones)[0]
    beyond, slope = ca.beyond_auc(paired, ones)
    assert raw < 0.45  # the evidence alone ranks progress turns last
    assert beyond[0] > 0.9  # the information beyond lp_S ranks them first
    assert slope[0] == pytest.approx(np.polyfit([x for _, lp, _ in paired for x in lp],
                                                [x for ev, _, _ in paired for x in ev], 1)[0], rel=1e-9)


def test_the_slope_is_refitted_inside_every_draw():
    rng = np.random.default_rng(5)
    slopes = list(np.linspace(0.2, 2.5, 16))
    paired, units = _flattening_sample(rng, slopes=slopes)
    counts = ca.resample_counts(units, 40, rng)
    values, b = ca.beyond_auc(paired, counts)
    refit_differs = 0
    for d in range(40):
        sample = _expand(paired, counts[d])
        lp = [x for _, l_, _ in sample for x in l_]
        ev = [x for e_, _, _ in sample for x in e_]
        b_draw = np.polyfit(lp, ev, 1)[0]
        assert b[d] == pytest.approx(b_draw, rel=1e-9)
        residual = [x - b_draw * y for e_, l_, _ in sample for x, y in zip(e_, l_, strict=True)]
        labels = [lab for _, _, la in sample for lab in la]
        strata = [j for j, (e_, _, _) in enumerate(sample) for _ in e_]
        assert values[d] == pytest.approx(ca.auc(residual, labels, strata), abs=1e-12)
        # the full sample's slope would give another AUC in this draw: the refit matters
        b_full = ca.beyond_auc(paired, np.ones((1, len(paired))))[1][0]
        fixed = [x - b_full * y for e_, l_, _ in sample for x, y in zip(e_, l_, strict=True)]
        refit_differs += ca.auc(fixed, labels, strata) != pytest.approx(values[d], abs=1e-9)
    assert refit_differs > 5


def test_an_interval_leaves_out_draws_without_pairs():
    draws = np.array([0.6, np.nan, 0.7, 0.8])
    out = ca.interval(0.7, draws, 3)
    assert out["draws"] == 3 and 0.6 <= out["low"] < out["high"] <= 0.8
    assert ca.interval(float("nan"), draws, 3)["auc"] is None
