"""docs/credit.md#properties: the properties every method must keep, one test each, plus property-based
tests (hypothesis) over random batches and a differential test against the loop-by-loop reference."""

from __future__ import annotations

import math
import random

import pytest
import torch
from credit_reference import per_token, random_episodes, reference, to_batch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trainer.credit import CreditBatch, CreditConfig, compute_advantages

pytestmark = pytest.mark.float_sensitive  # also run under a second set of CPU kernels (.ci/run)

ALL = ["grpo", "gigpo", "stepopsd", "agentopsd", "rlsd"]
TEACHER = ["stepopsd", "agentopsd", "rlsd"]


def config(method: str, **kw) -> CreditConfig:
    span_mode = "clean_step" if method in ("agentopsd", "rlsd") else "action_only"
    return CreditConfig(method=method, span_mode=kw.pop("span_mode", span_mode), **kw)


def grpo_of(batch: CreditBatch, cfg: CreditConfig) -> torch.Tensor:
    return compute_advantages(batch, cfg.replace(method="grpo"), 0)[0]


def mixed_batch(seed=0, layout="full", gap_scale=2.0):
    episodes = random_episodes(random.Random(seed), n_groups=4, max_group=5, max_turns=5, gap_scale=gap_scale)
    return to_batch(episodes, layout=layout, seed=seed)


# ---------------------------------------------------------------------------------------------
# lam = 0 gives GRPO exactly, for every method; A = 0 gives 0.


@pytest.mark.parametrize(
    "cfg",
    [
        config("stepopsd", lam_mix=0.0),
        config("stepopsd", span_mode="clean_step", lam_mix=0.0),
        config("agentopsd", lam=0.0),
        config("rlsd", lam_mix=0.0),
        config("gigpo", gigpo_omega=0.0),  # GiGPO has no lam; omega = 0 is its GRPO limit
        config("stepopsd", lam_mix=0.2, decay_steps=50),  # lam_t = 0 from step 50 on (see the call)
    ],
    ids=["stepopsd", "stepopsd-clean", "agentopsd", "rlsd", "gigpo-omega0", "stepopsd-decayed"],
)
def test_lam_zero_gives_grpo_exactly(cfg):
    batch, _ = mixed_batch(1)
    step = 50 if cfg.decay_steps == 50 and cfg.lam_mix else 0
    got, _ = compute_advantages(batch, cfg, step)
    assert torch.equal(got, grpo_of(batch, cfg))
    assert grpo_of(batch, cfg).abs().sum() > 0  # the comparison is not trivially between zeros


@pytest.mark.parametrize("method", TEACHER)
def test_zero_advantage_gives_zero(method):
    episodes = random_episodes(random.Random(3), n_groups=3, max_group=4)
    for ep in episodes:  # every group all-success or all-failure, no penalties: A = 0
        ep["success"], ep["invalid"] = ep["group"] % 2 == 0, 0
    batch, _ = to_batch(episodes)
    got, _ = compute_advantages(batch, config(method), 0)
    assert bool((got == 0).all())
    assert bool((batch.teacher_logprobs != batch.student_logprobs).any())  # there was evidence to use


def test_gigpo_with_equal_outcomes_keeps_only_the_step_term():
    episodes = random_episodes(random.Random(4), n_groups=2, max_group=4)
    for ep in episodes:
        ep["success"], ep["invalid"] = True, 0
    batch, where = to_batch(episodes)
    got, _ = compute_advantages(batch, config("gigpo"), 0)
    ref = reference(episodes, config("gigpo"))
    for (i, k, t), v in per_token(got, where).items():
        assert v == pytest.approx(ref[i][k][t], abs=1e-6)


# ---------------------------------------------------------------------------------------------
# sign(A~) == sign(A) everywhere; |A~| / |A| bounds.


def ratio(got: torch.Tensor, base: torch.Tensor) -> torch.Tensor:
    nz = base != 0
    return (got[nz] / base[nz]).abs()


@pytest.mark.parametrize("method", TEACHER)
def test_signs_preserved(method):
    for seed in range(5):
        batch, _ = mixed_batch(seed, gap_scale=20.0)
        got, _ = compute_advantages(batch, config(method), 0)
        assert torch.equal(torch.sign(got), torch.sign(grpo_of(batch, config(method))))


def test_stepopsd_bounds_before_budget():
    lam, alpha = 0.2, 0.2
    batch, _ = mixed_batch(5, gap_scale=20.0)
    cfg = config("stepopsd", budget=False, lam_mix=lam, alpha_clip=alpha)
    r = ratio(compute_advantages(batch, cfg, 0)[0], grpo_of(batch, cfg))
    assert float(r.min()) >= 1 - lam * alpha - 1e-6 and float(r.max()) <= 1 + lam * alpha + 1e-6
    assert float(r.min()) < 1 - lam * alpha + 1e-3 and float(r.max()) > 1 + lam * alpha - 1e-3  # bounds reached


def test_agentopsd_bounds():
    lam, b = 0.5, 0.2
    batch, _ = mixed_batch(6, gap_scale=5.0)
    cfg = config("agentopsd", lam=lam, b=b)
    r = ratio(compute_advantages(batch, cfg, 0)[0], grpo_of(batch, cfg))
    assert float(r.min()) >= 1 - lam * b - 1e-6 and float(r.max()) <= 1 + lam * b + 1e-6
    assert float(r.max()) > 1.0 and float(r.min()) < 1.0


# ---------------------------------------------------------------------------------------------
# AgentOPSD: a one-turn episode, or all-equal dB, gives GRPO.


def test_agentopsd_one_turn_episodes_give_grpo():
    episodes = random_episodes(random.Random(7), n_groups=3, max_group=4, max_turns=1)
    episodes = [ep for ep in episodes if len(ep["turns"]) == 1]
    batch, _ = to_batch(episodes)
    cfg = config("agentopsd")
    got = compute_advantages(batch, cfg, 0)[0]
    assert torch.equal(got, grpo_of(batch, cfg))
    assert grpo_of(batch, cfg).abs().sum() > 0


def test_agentopsd_zero_evidence_gives_grpo_exactly():
    """No evidence: dB_k = 0 for every turn (all equal) -> z = 0 -> w = 1 -> GRPO exactly."""
    batch, _ = mixed_batch(8)
    batch.teacher_logprobs = batch.student_logprobs.clone()
    cfg = config("agentopsd")
    assert torch.equal(compute_advantages(batch, cfg, 0)[0], grpo_of(batch, cfg))


def test_agentopsd_equal_nonzero_db_gives_grpo():
    """Evidence chosen so that B_k climbs by the same dB = 0.05 every turn (gamma 1)."""
    B0, d, K = 0.5, 0.05, 4
    logit = lambda p: math.log(p / (1 - p))  # noqa: E731
    c = [logit(B0 + d * k) - logit(B0) for k in range(1, K + 1)]
    e = [c[0]] + [c[k] - c[k - 1] for k in range(1, K)]
    turns = [{"reward": 0.0, "state": 0, "tokens": [(True, -1.0, -1.0 + e_k)]} for e_k in e]
    episodes = [
        {"group": 0, "success": True, "score": 1.0, "invalid": 0, "turns": turns},
        {"group": 0, "success": False, "score": 0.0, "invalid": 0, "turns": [dict(t) for t in turns]},
    ]
    batch, _ = to_batch(episodes, dtype=torch.float64)
    cfg = config("agentopsd", belief_gamma=1.0)
    got, diag = compute_advantages(batch, cfg, 0)
    assert diag["credit/dB_std"] == pytest.approx(0.0,
                                                  abs=1e-6) and diag["credit/dB_mean"] == pytest.approx(d, rel=1e-5)
    torch.testing.assert_close(got, grpo_of(batch, cfg), rtol=1e-6, atol=0)


# ---------------------------------------------------------------------------------------------
# Turn order comes from the turn index, not from batch order: shuffling rows changes nothing.


@pytest.mark.parametrize("method", ALL)
@pytest.mark.parametrize("layout", ["full", "turn"])
def test_shuffling_rows_and_episodes_changes_nothing(method, layout):
    episodes = random_episodes(random.Random(9), n_groups=4, max_group=4, max_turns=5)
    base = per_token(compute_advantages(*[to_batch(episodes, layout)[0], config(method)], 0)[0],
                     to_batch(episodes, layout)[1])
    for seed in (1, 2, 3):
        batch, where = to_batch(episodes, layout, seed=seed)
        got = per_token(compute_advantages(batch, config(method), 0)[0], where)
        assert got.keys() == base.keys()
        for key in base:
            assert got[key] == pytest.approx(base[key], rel=1e-6, abs=1e-7), key


@pytest.mark.parametrize("method", ALL)
def test_whole_episode_rows_and_turn_rows_agree(method):
    """Full-chat rows (one per episode) and window rows (one per turn) give the same credit."""
    episodes = random_episodes(random.Random(10), n_groups=4, max_group=4, max_turns=5)
    full, turn = to_batch(episodes, "full"), to_batch(episodes, "turn", seed=4)
    a = per_token(compute_advantages(full[0], config(method), 0)[0], full[1])
    b = per_token(compute_advantages(turn[0], config(method), 0)[0], turn[1])
    assert a.keys() == b.keys()
    for key in a:
        assert a[key] == pytest.approx(b[key], rel=1e-6, abs=1e-7)


# ---------------------------------------------------------------------------------------------
# A saturated prior (B_0 = 1 - eps0) with large negative evidence stays finite.


@pytest.mark.parametrize("extreme", [-1e4, -1e30, -math.inf])
def test_saturated_prior_with_huge_negative_evidence_stays_finite(extreme):
    turns = lambda: [{"reward": 0.0, "state": 0, "tokens": [(True, -0.1, extreme)] * 3} for _ in range(4)]  # noqa: E731
    episodes = [{"group": 0, "success": True, "score": 1.0, "invalid": i, "turns": turns()} for i in range(3)]
    batch, _ = to_batch(episodes)
    cfg = config("agentopsd")
    got, diag = compute_advantages(batch, cfg, 0)
    assert bool(torch.isfinite(got).all())
    assert diag["credit/b0_hist"][-1] == 3  # B_0 = 1 - eps0 for all three
    assert all(math.isfinite(v) for v in diag.values() if isinstance(v, float))
    r = ratio(got, grpo_of(batch, cfg))
    assert float(r.min()) >= 0.9 - 1e-6 and float(r.max()) <= 1.1 + 1e-6
    for method in ("stepopsd", "rlsd"):
        assert bool(torch.isfinite(compute_advantages(batch, config(method), 0)[0]).all())


def test_nan_log_probs_in_the_span_are_an_error():
    batch, _ = mixed_batch(11)
    batch.teacher_logprobs[batch.span] = float("nan")
    with pytest.raises(ValueError, match="NaN"):
        compute_advantages(batch, config("stepopsd"), 0)


# ---------------------------------------------------------------------------------------------
# An empty span leaves its turn unchanged; budget normalization skips episodes with < 2 spans.


@pytest.mark.parametrize("method", ["stepopsd", "rlsd"])
def test_empty_span_leaves_its_turn_unchanged(method):
    batch, _ = mixed_batch(12, gap_scale=10.0)
    cfg = config(method)
    # Empty the span of turn 1 of every episode.
    batch.span &= batch.turn_id != 1
    got, base = compute_advantages(batch, cfg, 0)[0], grpo_of(batch, cfg)
    turn1 = batch.turn_id == 1
    assert bool(turn1.any())
    assert torch.equal(got[turn1], base[turn1])
    assert not torch.equal(got, base)


def test_budget_skips_episodes_with_fewer_than_two_spans():
    batch, _ = mixed_batch(13, gap_scale=10.0)
    batch.span &= batch.turn_id == 0  # at most one non-empty span per episode
    on = compute_advantages(batch, config("stepopsd", budget=True), 0)
    off = compute_advantages(batch, config("stepopsd", budget=False), 0)
    assert torch.equal(on[0], off[0])
    assert on[1]["credit/budget_episodes"] == 0


def test_budget_equalizes_mean_credit_per_step():
    """With C large enough, every span of an eligible episode ends with the same mean |A~|."""
    batch, where = mixed_batch(14, gap_scale=10.0)
    got, diag = compute_advantages(batch, config("stepopsd", budget_cap=100.0, lam_mix=1.0, alpha_clip=0.9), 0)
    assert diag["credit/budget_episodes"] > 0
    table: dict = {}
    for (i, k, t), (r, p) in where.items():
        if batch.span[r, p]:
            table.setdefault(i, {}).setdefault(k, []).append(abs(float(got[r, p])))
    checked = 0
    for i, turns in table.items():
        means = [sum(v) / len(v) for v in turns.values()]
        if len(means) >= 2 and max(means) > 0:
            assert max(means) == pytest.approx(min(means), rel=1e-4)
            checked += 1
    assert checked > 0


# ---------------------------------------------------------------------------------------------
# Property-based tests over random batches.


@st.composite
def episode_batches(draw):
    n_groups = draw(st.integers(1, 3))
    gap = st.one_of(
        st.floats(-50, 50),
        st.sampled_from([-1e6, 1e6, -1e30, 1e30, -math.inf, math.inf, 0.0]),
    )
    episodes = []
    for g in range(n_groups):
        for _ in range(draw(st.integers(1, 4))):
            turns = []
            for _ in range(draw(st.integers(0, 4))):
                tokens = draw(
                    st.lists(st.tuples(st.booleans(), st.floats(-30, 0), gap), min_size=0, max_size=4)
                )
                tokens = [(s, lp, lp + d) for s, lp, d in tokens]
                turns.append({"reward": draw(st.sampled_from([0.0, 1.0])), "state": draw(st.integers(-1, 2)),
                              "tokens": tokens})
            episodes.append(
                {"group": g, "success": draw(st.booleans()), "score": draw(st.floats(0, 1)),
                 "invalid": draw(st.integers(0, 3)), "turns": turns}
            )
    return episodes


SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(
    episodes=episode_batches(),
    method=st.sampled_from(TEACHER),
    saturated=st.booleans(),
    seed=st.integers(0, 1000),
)
def test_property_signs_bounds_finite(episodes, method, saturated, seed):
    if saturated:  # every group all-success: B_0 = 1 - eps0 (A is then 0 unless penalties differ)
        for ep in episodes:
            ep["success"] = True
    batch, _ = to_batch(episodes, layout="full", seed=seed)
    cfg = config(method, budget=False)
    got, diag = compute_advantages(batch, cfg, 0)
    base = grpo_of(batch, cfg)
    assert bool(torch.isfinite(got).all())
    assert all(math.isfinite(v) for v in diag.values() if isinstance(v, float))
    assert torch.equal(torch.sign(got), torch.sign(base))
    bound = {"stepopsd": cfg.lam_mix * cfg.alpha_clip, "agentopsd": cfg.lam * cfg.b,
             "rlsd": cfg.lam_mix * cfg.rlsd_clip}[method]
    r = ratio(got, base)
    if r.numel():
        assert float(r.min()) >= 1 - bound - 1e-5 and float(r.max()) <= 1 + bound + 1e-5
    assert bool((got[batch.turn_id < 0] == 0).all())
    # With the budget on, the bounds widen by at most C each way and signs still hold.
    got_b, _ = compute_advantages(batch, config(method), 0)
    assert bool(torch.isfinite(got_b).all()) and torch.equal(torch.sign(got_b), torch.sign(base))
    r = ratio(got_b, base)
    if r.numel():
        C = cfg.budget_cap
        assert float(r.min()) >= (1 - bound) / C - 1e-5 and float(r.max()) <= (1 + bound) * C + 1e-5


@SETTINGS
@given(episodes=episode_batches(), method=st.sampled_from(ALL), seed=st.integers(0, 1000))
def test_property_row_order_and_layout_invariance(episodes, method, seed):
    a = to_batch(episodes, layout="full")
    b = to_batch(episodes, layout="turn", seed=seed)
    pa = per_token(compute_advantages(a[0], config(method), 2)[0], a[1])
    pb = per_token(compute_advantages(b[0], config(method), 2)[0], b[1])
    assert pa.keys() == pb.keys()
    for key in pa:
        assert pa[key] == pytest.approx(pb[key], rel=1e-5, abs=1e-6)


@SETTINGS
@given(seed=st.integers(0, 10_000), method=st.sampled_from(ALL), gap_scale=st.sampled_from([0.01, 1.0, 10.0]))
def test_property_matches_loop_reference(seed, method, gap_scale):
    episodes = random_episodes(random.Random(seed), gap_scale=gap_scale)
    cfg = config(method, lam_mix=0.6, lam=0.7, b=0.3, alpha_clip=0.4, budget_cap=1.5)
    # float64 log-probs: the comparison is of the math, not of float32 rounding of the inputs.
    batch, where = to_batch(episodes, layout="turn", seed=seed, dtype=torch.float64)
    got = per_token(compute_advantages(batch, cfg, 7)[0], where)
    ref = reference(episodes, cfg, 7)
    for (i, k, t), v in got.items():
        assert v == pytest.approx(ref[i][k][t], rel=1e-5, abs=1e-6), (i, k, t)


# ---------------------------------------------------------------------------------------------
# Input checks


def test_teacher_methods_need_log_probs():
    batch, _ = mixed_batch(15)
    batch.teacher_logprobs = None
    with pytest.raises(ValueError, match="teacher_logprobs"):
        compute_advantages(batch, config("agentopsd"), 0)
    assert compute_advantages(batch, config("grpo"), 0)[0].shape == batch.turn_id.shape


def test_turn_ids_beyond_the_episode_are_rejected():
    batch, _ = mixed_batch(16)
    batch.turn_id[0, -1] = int(batch.num_turns[batch.row_episode[0]])
    with pytest.raises(ValueError, match="turn_id"):
        compute_advantages(batch, config("grpo"), 0)


def test_gigpo_needs_states():
    batch, _ = mixed_batch(17)
    batch.state_id = None
    with pytest.raises(ValueError, match="state_id"):
        compute_advantages(batch, config("gigpo"), 0)


@pytest.mark.parametrize("method", TEACHER)
def test_garbage_log_probs_outside_the_scored_span_are_ignored(method):
    """NaN or inf log-probs where the teacher did not score (prompt, unscored span) change nothing."""
    batch, _ = mixed_batch(18, gap_scale=3.0)
    clean, _ = compute_advantages(batch, config(method), 0)
    scored = batch.span & (batch.turn_id >= 0)
    batch.teacher_scored = scored.clone()
    some = scored & (torch.rand(scored.shape, generator=torch.Generator().manual_seed(0)) < 0.3)
    batch.teacher_scored &= ~some  # these span tokens were not scored by the teacher ...
    batch.teacher_logprobs = batch.teacher_logprobs.clone()
    batch.teacher_logprobs[~batch.teacher_scored] = float("nan")  # ... and hold garbage
    batch.student_logprobs = batch.student_logprobs.clone()
    batch.student_logprobs[~scored] = -math.inf
    got, diag = compute_advantages(batch, config(method), 0)
    assert bool(torch.isfinite(got).all()) and math.isfinite(diag["credit/delta_mean"])
    # Equal to zeroing those tokens' gaps by hand.
    batch2, _ = mixed_batch(18, gap_scale=3.0)
    batch2.teacher_logprobs = torch.where(some, batch2.student_logprobs, batch2.teacher_logprobs)
    expected, _ = compute_advantages(batch2, config(method), 0)
    torch.testing.assert_close(got, expected)
    assert not torch.equal(got, clean) or not bool(some.any())
