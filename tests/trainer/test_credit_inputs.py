"""What goes into the credit core, checked against docs/credit.md: the teacher's temperature, the teacher
modes of the two trainers, float64 turn sums, non-finite rewards, the release preset's prior."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from credit_reference import to_batch
from episodes_for_tests import UNICODE_RESPONSES, make_episode

import trainer.teacher as teacher_module
from trainer.credit import compute_advantages
from trainer.credit.agentopsd import belief_prior
from trainer.credit.batch import TurnLayout
from trainer.env_knowledge import credit_config
from trainer.local import LocalTrainer, TrainConfig
from trainer.openrlhf.config import BridgeConfig
from trainer.rows import build_rows


@pytest.mark.parametrize("temperature", [0.7, 1.0])
def test_a_teacher_identical_to_the_student_shows_no_gap(tmp_path: Path, monkeypatch, temperature):
    """AgentOPSD with the live policy as teacher and the privileged note taken out: the teacher reads
    exactly the student's context, so delta = lp_T - lp_S is zero on every token at any sampling
    temperature (before teacher log-probs used the sampling temperature too, 0.7 gave 0.7 nats)."""
    monkeypatch.setattr(teacher_module, "privileged_messages", lambda messages, skill: [dict(m) for m in messages])
    from test_local_train import config

    run = LocalTrainer(config(tmp_path / "run", method="agentopsd", temperature=temperature, max_new_tokens=8),
                       progress=False)
    run.start()
    assert run.teacher() is run.state.model  # AgentOPSD: the live policy
    episodes = run.rollout()
    rows = run.rows(episodes)
    old = run.logprobs(run.state.model, rows)
    _, diagnostics, extra = run.advantages(episodes, rows, old)
    assert extra["teacher/tokens"] > 0 and diagnostics["credit/scored_tokens"] > 0
    assert abs(diagnostics["credit/delta_mean"]) < 1e-6 and diagnostics["credit/delta_std"] < 1e-6
    assert abs(diagnostics["credit/evidence_mean"]) < 1e-5


def test_local_and_bridge_trainers_default_to_the_same_credit(tmp_path: Path):
    """docs/credit.md#agentopsd-teacher: AgentOPSD's teacher is the current (old) policy: live in both trainers. Every
    other default agrees too; StepOPSD's `stale` snapshot is the local trainer's default, the bridge
    scores on its actor group (always live) and says so."""
    for env_id in ("agentgym/ALFWorld-Pick-v0", "agentgym/WebShop-v0", "agentgym/SearchQA-NQ-v0",
                   "example/GuessNumber-v0"):
        for method in ("grpo", "gigpo", "stepopsd", "agentopsd"):
            local = TrainConfig(env_id=env_id, out=str(tmp_path), method=method).credit_config().to_dict()
            bridge = BridgeConfig.from_dict({"credit": {"method": method}}).credit_config(env_id).to_dict()
            if method == "stepopsd":
                assert (local["teacher_mode"], bridge["teacher_mode"]) == ("stale", "live")
            if method != "agentopsd":  # GRPO and GiGPO have no teacher
                local["teacher_mode"] = bridge["teacher_mode"]
            assert local == bridge, (env_id, method)
            if method == "agentopsd":
                assert local["teacher_mode"] == "live"


def test_turn_sums_are_float64_for_float32_inputs():
    """A float32 accumulation of (1e8, 1, -1e8) loses the 1; turn sums are float64 (docs/credit.md#properties)."""
    episodes = [{"group": 0, "success": True, "score": 1.0, "invalid": 0, "turns": [
        {"reward": 0.0, "state": 1, "tokens": [(True, 0.0, 1e8), (True, 0.0, 1.0), (True, 0.0, -1e8)]}]}]
    batch, _ = to_batch(episodes, layout="full", dtype=torch.float32)
    layout = TurnLayout.of(batch)
    delta = layout.take(batch.teacher_logprobs) - layout.take(batch.student_logprobs)
    assert delta.dtype == torch.float32
    sums = layout.turn_sum(delta)
    assert sums.dtype == torch.float64 and sums[0, 0].item() == 1.0


def _batch_with(score=None, step_reward=None):
    episodes = [
        {"group": 0, "success": s, "score": float(s), "invalid": 0,
         "turns": [{"reward": 0.0, "state": 1, "tokens": [(True, -1.0, -1.0)]}]}
        for s in (True, False, True, False)
    ]
    batch, _ = to_batch(episodes, layout="full")
    if score is not None:
        batch.score[1] = score
    if step_reward is not None:
        batch.step_reward[2, 0] = step_reward
    batch.meta["episode_ids"] = ["ep-a", "ep-b", "ep-c", "ep-d"]
    return batch


@pytest.mark.parametrize("method", ["grpo", "gigpo", "stepopsd", "agentopsd"])
def test_non_finite_rewards_are_an_error_naming_the_episode(method):
    config = credit_config("agentgym/WebShop-v0", method)  # score_coef 1: the score is in R
    with pytest.raises(ValueError, match="episode 'ep-b' has a non-finite score"):
        compute_advantages(_batch_with(score=float("nan")), config)
    with pytest.raises(ValueError, match="episode 'ep-c' has a non-finite step reward"):
        compute_advantages(_batch_with(step_reward=float("inf")), config)
    advantages, _ = compute_advantages(_batch_with(), config)
    assert bool(torch.isfinite(advantages).all())


def test_rows_name_their_episodes_for_the_credit_core(qwen3_tokenizer):
    episode = make_episode(UNICODE_RESPONSES[:2], episode_id="webshop-7", success=True)
    episode.hindsight.score = float("nan")
    rows = build_rows([episode, make_episode(UNICODE_RESPONSES[:1], episode_id="other")], qwen3_tokenizer)
    lp = torch.zeros(rows.input_ids.shape)
    with pytest.raises(ValueError, match="'webshop-7'"):
        compute_advantages(rows.credit_batch(lp, lp), credit_config("agentgym/WebShop-v0", "stepopsd"))


def test_release_prior_is_the_group_mean_of_the_raw_0_10_reward():
    """docs/credit.md#the-release-preset: B_0 = clip(mean_g(10 x success), eps0, 1 - eps0): 1 - eps0 as soon
    as one episode of the group succeeds, eps0 when none does; scores and invalid-turn penalties
    play no part (they did when B_0 was the mean of R)."""
    config = credit_config("agentgym/WebShop-v0", "agentopsd", preset="release")
    assert config.prior == "release_reward"
    success = torch.tensor([True, True, False, False, False, False, False, False])
    groups = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])
    B0 = belief_prior(10.0 * success.to(torch.float64), groups, config.eps0)
    assert B0.tolist() == [1 - 1e-4] * 4 + [1e-4] * 4
    # Through compute_advantages, with scores and penalties that moved the old prior: the same B_0.
    episodes = [
        {"group": g, "success": s, "score": sc, "invalid": inv,
         "turns": [{"reward": 0.0, "state": 1, "tokens": [(True, -1.0, -0.5)]},
                   {"reward": 0.0, "state": 2, "tokens": [(True, -1.0, -1.5)]}]}
        for g, s, sc, inv in ((0, True, 1.0, 0), (0, True, 1.0, 0), (0, False, 0.8, 2), (0, False, 0.6, 0),
                              (1, False, 0.0, 3), (1, False, 0.1, 5), (1, False, 0.2, 0), (1, False, 0.0, 1))
    ]
    batch, _ = to_batch(episodes, layout="full")
    _, diagnostics = compute_advantages(batch, config)
    assert diagnostics["credit/b0_hist"] == [4, 0, 0, 0, 0, 0, 0, 0, 0, 4]
