"""Per-turn credit assignment: GRPO, GiGPO, StepOPSD, AgentOPSD (and RLSD), exactly as ../shared/spec/credit.md.

Pure tensor math: no model, no environment, no tokenizer, no Python loop over tokens (loops over
turns are matrix products). Works on CPU and CUDA tensors alike.

The API (stable; the local trainer and the OpenRLHF bridge both call it)
=========================================================================

    from trainer.credit import CreditConfig, CreditBatch, compute_advantages

    config = CreditConfig.for_env("agentgym/ALFWorld-Heat-v0", "stepopsd")   # spec defaults per env family
    batch = rows.credit_batch(student_logprobs=lp_S, teacher_logprobs=scores.logprobs,
                              teacher_scored=scores.scored, teacher_truncated=scores.truncated)
    advantages, diagnostics = compute_advantages(batch, config, step)        # [R, T] float32, dict

`rows` is a `trainer.rows.TokenRows` (`build_rows(episodes, tokenizer, span_mode=config.span_mode)`),
`scores` a `trainer.teacher.TeacherScores` (`score_teacher(...)`); a `CreditBatch` can also be built
by hand (see its docstring), which is what the bridge does.

Layout (one for every method):
    - token tensors [R, T], right-padded; rows are whole episodes (full-chat context) or single turns
      (window context), freely mixed;
    - position t holds token t, and a log-prob at position t is log p(token t | tokens < t);
    - `turn_id` [R, T] long: the 0-based turn that generated the token, -1 for every token the model
      did not generate (system, user, observation, chat-template text, padding);
    - `span` [R, T] bool: the scored span T_k (StepOPSD's action block or whole response);
    - `row_episode` [R]: the episode each row belongs to; episode tensors [E]; turn tensors [E, K].
    Turn order is the turn index, never the row order: permuting rows permutes the output rows and
    changes nothing else.

compute_advantages(batch, config, step) -> (advantages, diagnostics)
    advantages: [R, T] float32 on batch's device, exactly 0 on tokens with turn_id == -1. Feed them
        to a clipped policy-gradient loss with token-mean reduction (ratio clip 0.2).
    diagnostics: spec section 5 as floats under "credit/..." keys: delta_mean, delta_std (mean delta
        is about -KL), evidence_mean, b0_mean and b0_hist (10 bins over [0, 1]), dB_mean, dB_std,
        weight_clip_frac, adv_std_ratio (std(A~)/std(A)), lam_t, budget_coef_*, teacher_truncated,
        plus reward_mean/std, success_rate, adv_mean, scored_tokens.

CreditConfig (all knobs, spec defaults; `CreditConfig.for_env(env_id, method, preset=...)`)
    method in {grpo, gigpo, stepopsd, agentopsd, rlsd}; see `trainer/credit/config.py`.

outcome_reward(success, score, invalid_turns, success_scale=1, score_coef=0, invalid_coef=0.1)
    R_i of spec section 0 step 2, [E] float64.

Files (each reads top to bottom like the paper, with its symbols in comments):
    grpo.py       outcome reward, group normalization, sequence advantage
    gigpo.py      discounted step returns, state-key clusters, step advantage
    evidence.py   token gap delta and turn evidence e_k
    stepopsd.py   lam_t schedule, sign-preserving token weights, per-step budget (and RLSD weights)
    agentopsd.py  belief prior, recursive belief, bounded turn weights, release preset
    compute.py    the entry point and the diagnostics
    batch.py      CreditBatch and the [E, K] turn bookkeeping
    config.py     CreditConfig
"""

from trainer.credit.batch import CreditBatch, TurnLayout
from trainer.credit.compute import compute_advantages, episode_rewards
from trainer.credit.config import METHODS, RELEASE_PRESET, SPAN_MODES, CreditConfig, env_family
from trainer.credit.grpo import group_normalize, outcome_reward

__all__ = [
    "METHODS",
    "RELEASE_PRESET",
    "SPAN_MODES",
    "CreditBatch",
    "CreditConfig",
    "TurnLayout",
    "compute_advantages",
    "env_family",
    "episode_rewards",
    "group_normalize",
    "outcome_reward",
]
