"""Hand-computed reference values for one small group, per method (docs/credit.md#properties).

The group: three episodes of one task (group 0) and a lone episode (group 1, A = 0). Each turn's
tokens are (in scored span, lp_S, lp_T); delta = lp_T - lp_S on the span:

    ep0  success, 0 invalid   t0: [off, d=+0.5, d=-1.0]  t1: [d=+2.0, d=+0.1]  t2: [off, d=-0.4]  r_t2 = 1
    ep1  failure, 1 invalid   t0: [off, d=-0.3]           t1: [d=+0.4, d=-2.0]
    ep2  failure, 0 invalid   t0: [off, off, d=+1.5]
    ep3  success (alone)      t0: [d=0.0]
    states (GiGPO): ep0 t0/t1/t2 = 10/11/12, ep1 t0/t1 = 10/11, ep2 t0 = 10

Outcome rewards (success_scale 1, invalid_coef 0.1): R = [1, -0.1, 0 | 1].
GRPO: mean 0.3, deviations [0.7, -0.4, -0.3], unbiased std sqrt((0.49 + 0.16 + 0.09) / 2) = 0.6082762530
    A = [0.7, -0.4, -0.3] / (0.6082762530 + 1e-6) = [1.1507910192, -0.6575948681, -0.4931961511], ep3: 0.
The expected numbers below were worked through by hand from the formulas of docs/credit.md (the intermediate
values are in the comments) and are written out literally.
"""

from __future__ import annotations

import pytest
from credit_reference import per_token, to_batch

from trainer.credit import CreditConfig, compute_advantages

pytestmark = pytest.mark.float_sensitive  # also run under a second set of CPU kernels (.ci/run)

OFF = (False, -1.0, -1.0)


def tok(lp_s: float, lp_t: float):
    return (True, lp_s, lp_t)


SMALL_GROUP = [
    {"group": 0, "success": True, "score": 1.0, "invalid": 0, "turns": [
        {"reward": 0.0, "state": 10, "tokens": [OFF, tok(-1.0, -0.5), tok(-2.0, -3.0)]},
        {"reward": 0.0, "state": 11, "tokens": [tok(-2.5, -0.5), tok(-1.0, -0.9)]},
        {"reward": 1.0, "state": 12, "tokens": [OFF, tok(-0.6, -1.0)]},
    ]},
    {"group": 0, "success": False, "score": 0.0, "invalid": 1, "turns": [
        {"reward": 0.0, "state": 10, "tokens": [OFF, tok(-0.7, -1.0)]},
        {"reward": 0.0, "state": 11, "tokens": [tok(-1.0, -0.6), tok(-0.5, -2.5)]},
    ]},
    {"group": 0, "success": False, "score": 0.0, "invalid": 0, "turns": [
        {"reward": 0.0, "state": 10, "tokens": [OFF, OFF, tok(-2.0, -0.5)]},
    ]},
    {"group": 1, "success": True, "score": 1.0, "invalid": 0, "turns": [
        {"reward": 1.0, "state": 10, "tokens": [tok(-1.0, -1.0)]},
    ]},
]

A0, A1, A2 = 1.1507910192487194, -0.6575948681421254, -0.49319615110659404

GRPO = {
    0: [[A0, A0, A0], [A0, A0], [A0, A0]],
    1: [[A1, A1], [A1, A1]],
    2: [[A2, A2, A2]],
    3: [[0.0]],
}

# GiGPO (gamma 0.95, omega 1). Step returns: ep0 [0.9025, 0.95, 1], ep1 [0, 0], ep2 [0].
# Cluster state 10: {0.9025, 0, 0}: mean 0.300833, std 0.5210586 -> A_step [1.1546983, -0.5773492, -0.5773492]
# Cluster state 11: {0.95, 0}: mean 0.475, std 0.6717514 -> A_step [0.7071057, -0.7071057]
# State 12 and ep3's state-10 turn (another group) are singletons -> 0.
GIGPO = {
    0: [[2.3054893415657416] * 3, [1.8578967478052548] * 2, [A0] * 2],
    1: [[-1.2349440293006366] * 2, [-1.364700596698661] * 2],
    2: [[-1.0705453122651054] * 3],
    3: [[0.0]],
}

# StepOPSD, step 0: lam_t = 0.2, alpha 0.2, budget C = 2.
# w = clip(2 sigma(sign(A) delta), 0.8, 1.2):
#   ep0 (A > 0): t0 [1, 2s(0.5)=1.2449->1.2, 2s(-1)=0.5379->0.8], t1 [2s(2)->1.2, 2s(0.1)=1.0499584],
#                t2 [1, 2s(-0.4)=0.8026247]
#   ep1 (A < 0): t0 [1, 2s(0.3)=1.1488850], t1 [2s(-0.4)=0.8026247, 2s(2)->1.2]
#   ep2 (A < 0): t0 [1, 1, 2s(-1.5)=0.3646->0.8]
# A~ = A (0.8 + 0.2 w). Budget, ep0: m = [1.1507910, 1.1795560, 1.1053635] (mean |A~| on each span),
#   target 1.1452368, c = [0.9951727, 0.9709042, 1.0360717]; ep1: m = [0.6771761, 0.6577675],
#   target 0.6674718, c = [0.9856680, 1.0147519]; ep2 has one span: no budget.
STEPOPSD = {
    0: [[A0, 1.1910452695611602, 1.0994264026718403], [1.1620001284203638, 1.1284715923497208],
        [A0, 1.1452357952175396]],
    1: [[A1, -0.6674707846770466], [-0.6409540748482934, -0.693987436338083]],
    2: [[A2, A2, -0.47346830506233034]],
    3: [[0.0]],
}

# AgentOPSD (lam 0.5, b 0.2, gamma 0.95, eps0 1e-3). B_0 = 1/3 for group 0.
# ep0: e = [-0.5, 2.1, -0.4]; c = [-0.5, 1.625, 1.14375]; B = [0.2326965, 0.7174510, 0.6107826]
#      dB = [-0.1006368, 0.4847545, -0.1066685]; z = [-0.6962041, 1.4141527, -0.7179486]
#      w = [0.8607592, 1.2 (clipped), 0.8564103]
# ep1: e = [-0.3, -1.6]; B = [0.2702909, 0.0705581]; dB = [-0.0630424, -0.1997328]
#      q = -dB (A < 0) = [0.0630424, 0.1997328]; z = [-0.9999854, 0.9999854]; w = [0.8000029, 1.1999971]
# ep2: one turn -> z = 0, w = 1 -> GRPO.   A~ = A (0.5 + 0.5 w).
AGENTOPSD = {
    0: [[1.070672471179832] * 3, [1.2658701211735914] * 2, [1.0681701399784775] * 2],
    1: [[-0.5918363434812423] * 2, [-0.7233533928030086] * 2],
    2: [[A2] * 3],
    3: [[0.0]],
}

# AgentOPSD `release` preset: gamma 1, eps0 1e-4, B_0 = clip(mean(10 x success), eps0, 1 - eps0): group 0
# has one success, mean 10/3, so B_0 = 1 - 1e-4 = 0.9999 (saturated), logit(B_0) = ln 9999 = 9.2102404.
# ep0: c = [-0.5, 1.6, 1.2]; B = [0.9998351386, 0.9999798087, 0.9999698785]
#      dB = [-6.486143e-05, 1.446702e-04, -9.930263e-06]; z = [-0.9826784, 1.3530248, -0.3703464]
#      w = [0.8034643, 1.2 (clipped), 0.9259307]
# ep1: c = [-0.3, -1.9]; B = [0.9998650188, 0.9993317905]; dB = [-3.498116e-05, -5.332283e-04]
#      q = -dB; z = [-0.9960020, 0.9960020] (the 1e-6 in popstd + 1e-6 shows at this scale); w = [0.8007996, 1.1992004]
AGENTOPSD_RELEASE = {
    0: [[1.0377052739749173] * 3, [1.2658701211735914] * 2, [1.1081718906579745] * 2],
    1: [[-0.5920982892983541] * 2, [-0.7230914469858967] * 2],
    2: [[A2] * 3],
    3: [[0.0]],
}

CASES = {
    "grpo": (CreditConfig(method="grpo"), GRPO),
    "gigpo": (CreditConfig(method="gigpo"), GIGPO),
    "stepopsd": (CreditConfig(method="stepopsd", span_mode="action_only"), STEPOPSD),
    "agentopsd": (CreditConfig(method="agentopsd", span_mode="clean_step"), AGENTOPSD),
    "agentopsd-release": (CreditConfig.for_method("agentopsd", preset="release"), AGENTOPSD_RELEASE),
}


@pytest.mark.parametrize("layout", ["full", "turn"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_small_group_matches_hand_computed_values(case, layout):
    config, expected = CASES[case]
    batch, where = to_batch(SMALL_GROUP, layout=layout, seed=7)
    advantages, diag = compute_advantages(batch, config, step=0)
    got = per_token(advantages, where)
    for i, turns in expected.items():
        for k, values in enumerate(turns):
            for t, value in enumerate(values):
                assert got[(i, k, t)] == pytest.approx(value, rel=1e-5, abs=1e-6), (case, i, k, t)
    # Tokens the model did not generate carry exactly 0.
    assert bool((advantages[batch.turn_id < 0] == 0).all())
    assert all(isinstance(v, (float, list)) for v in diag.values())


def test_reference_diagnostics_small_group():
    """The diagnostics (docs/credit.md#logged-per-update) on the small group, by hand."""
    batch, _ = to_batch(SMALL_GROUP, layout="full")
    _, d = compute_advantages(batch, CreditConfig(method="agentopsd", span_mode="clean_step"), step=0)
    deltas = [0.5, -1.0, 2.0, 0.1, -0.4, -0.3, 0.4, -2.0, 1.5, 0.0]
    assert d["credit/delta_mean"] == pytest.approx(sum(deltas) / len(deltas), rel=1e-6)
    assert d["credit/scored_tokens"] == len(deltas)
    # e_k over the 7 turns with a span: [-0.5, 2.1, -0.4, -0.3, -1.6, 1.5, 0.0]
    assert d["credit/evidence_mean"] == pytest.approx(0.8 / 7, rel=1e-5)
    # B_0: 1/3 for the three episodes of group 0, 1 - eps0 for the lone success.
    assert d["credit/b0_hist"] == [0, 0, 0, 3, 0, 0, 0, 0, 0, 1]
    # 1 of the 7 turns' weights sits at a clip bound (ep0 t1; ep1's 0.8000029 is just inside).
    assert d["credit/weight_clip_frac"] == pytest.approx(1 / 7)
    assert d["credit/lam_t"] == 0.5

    _, d = compute_advantages(batch, CreditConfig(method="stepopsd", span_mode="action_only"), step=25)
    assert d["credit/lam_t"] == pytest.approx(0.1)  # 0.2 * (1 - 25 / 50)
    assert d["credit/budget_episodes"] == 2  # ep0 and ep1 have >= 2 spans; ep2 and ep3 one each
