"""CreditConfig: the defaults per env family and method (docs/credit.md#configuration), validation, and the
outcome reward."""

from __future__ import annotations

import pytest
import torch

from trainer.credit import CreditConfig, outcome_reward
from trainer.credit.stepopsd import lam_schedule
from trainer.env_knowledge import credit_config


def test_method_defaults():
    c = CreditConfig(method="stepopsd")
    assert (c.alpha_clip, c.lam_mix, c.decay_steps, c.budget, c.budget_cap) == (0.2, 0.2, 50, True, 2.0)
    assert (c.teacher_mode, c.teacher_refresh) == ("stale", 10)
    c = CreditConfig(method="agentopsd", span_mode="clean_step")
    assert (c.lam, c.b, c.belief_gamma, c.eps0, c.prior) == (0.5, 0.2, 0.95, 1e-3, "success")
    c = CreditConfig(method="gigpo")
    assert (c.gigpo_omega, c.gigpo_gamma) == (1.0, 0.95)
    assert (c.success_scale, c.invalid_coef, c.adv_eps) == (1.0, 0.1, 1e-6)


@pytest.mark.parametrize(
    "env_id,family,span,invalid,score",
    [
        ("agentgym/ALFWorld-Heat-v0", "ALFWorld", "action_only", 0.1, 0.0),
        ("agentgym/WebShop-v0", "WebShop", "action_only", 0.1, 1.0),
        ("agentgym/SearchQA-HotpotQA-v0", "SearchQA", "clean_step", 0.01, 0.0),
        ("example/GuessNumber-v0", "Example", "action_only", 0.05, 0.0),  # the plug-in's own defaults
    ],
)
def test_family_defaults_come_from_the_registry(env_id, family, span, invalid, score):
    from agentgym_opsd.registry import entry

    assert entry(env_id).family == family
    c = credit_config(env_id, "stepopsd")
    assert (c.span_mode, c.invalid_coef, c.score_coef) == (span, invalid, score)
    assert 0.05 <= c.lam_mix <= 0.3
    # AgentOPSD always scores the whole response, with the live policy as teacher.
    agentopsd = credit_config(env_id, "agentopsd")
    assert (agentopsd.span_mode, agentopsd.teacher_mode) == ("clean_step", "live")
    assert credit_config(env_id, "grpo", invalid_coef=0.5).invalid_coef == 0.5


def test_family_defaults_are_checked():
    assert CreditConfig.for_method("stepopsd").span_mode == "clean_step"  # generic: works for any action format
    with pytest.raises(ValueError, match="unknown CreditConfig fields"):
        CreditConfig.for_method("grpo", {"lam_mixx": 0.1})
    from agentgym_opsd.registry import UnknownEnvError

    with pytest.raises(UnknownEnvError):
        credit_config("nobody/Nothing-v0", "grpo")


def test_release_preset():
    c = credit_config("agentgym/ALFWorld-Pick-v0", "agentopsd", preset="release")
    assert (c.belief_gamma, c.eps0, c.prior) == (1.0, 1e-4, "release_reward")
    with pytest.raises(ValueError, match="preset"):
        CreditConfig.for_method("agentopsd", preset="paper2")


@pytest.mark.parametrize(
    "kw,match",
    [
        ({"method": "ppo"}, "method"),
        ({"method": "agentopsd", "span_mode": "action_only"}, "clean_step"),
        ({"alpha_clip": 1.0}, "alpha_clip"),
        ({"b": 1.5}, "b="),
        ({"lam_mix": 1.2}, "lam_mix"),
        ({"eps0": 0.0}, "eps0"),
        ({"budget_cap": 0.5}, "budget_cap"),
        ({"teacher_mode": "frozen"}, "teacher_mode"),
        ({"span_mode": "all"}, "span_mode"),
    ],
)
def test_bad_values_are_refused_with_the_rule(kw, match):
    with pytest.raises(ValueError, match=match):
        CreditConfig(**kw)


def test_round_trip_and_lam_schedule():
    c = credit_config("agentgym/ALFWorld-Heat-v0", "stepopsd", lam_mix=0.2, decay_steps=50)
    assert CreditConfig.from_dict(c.to_dict()) == c
    assert [round(lam_schedule(c.lam_mix, s, c.decay_steps), 6) for s in (0, 25, 50, 80)] == [0.2, 0.1, 0.0, 0.0]
    assert lam_schedule(c.lam_mix, 1000, 0) == 0.2
    with pytest.raises(ValueError, match="unknown"):
        CreditConfig.from_dict({"method": "grpo", "nope": 1})


def test_outcome_reward():
    success = torch.tensor([True, False, True])
    score = torch.tensor([1.0, 0.4, 0.7])
    invalid = torch.tensor([0, 3, 1])
    # R = success_scale * success + score_coef * score - invalid_coef * invalid
    R = outcome_reward(success, score, invalid, success_scale=2.0, score_coef=0.5, invalid_coef=0.1)
    assert R.tolist() == pytest.approx([2.5, -0.1, 2.25])
    assert outcome_reward(success).tolist() == [1.0, 0.0, 1.0]


def test_field_types_are_checked_with_a_clear_error() -> None:
    from trainer.credit import CreditConfig

    assert CreditConfig(lam_mix=1).lam_mix == 1.0 and isinstance(CreditConfig(lam_mix=1).lam_mix, float)
    for field, value, rule in [("lam_mix", "abc", "must be a number"), ("decay_steps", 2.5, "must be an integer"),
                               ("budget", 1, "must be true or false"), ("span_mode", 3, "must be a string"),
                               ("decay_steps", True, "must be an integer")]:  # fmt: skip
        with pytest.raises(ValueError, match=f"CreditConfig.{field}=.*{rule}"):
            CreditConfig(**{field: value})
