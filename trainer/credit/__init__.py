"""Per-turn credit assignment: GRPO, GiGPO, StepOPSD, AgentOPSD (and RLSD), as docs/credit.md describes them.

Pure tensor math: no model, no environment, no tokenizer, no Python loop over tokens (loops over
turns are matrix products). Works on CPU and CUDA tensors alike.

The API (stable; the local trainer and the OpenRLHF bridge both call it)
=========================================================================

One update, end to end (trainer/rows.py, trainer/forward.py and trainer/teacher.py build the inputs):

    from trainer.credit import compute_advantages
    from trainer.env_knowledge import credit_config
    from trainer.rows import build_rows
    from trainer.forward import row_logprobs
    from trainer.teacher import score_teacher

    config = credit_config(env_id, "stepopsd")                   # the env family's defaults
    rows = build_rows(episodes, tokenizer, span_mode=config.span_mode)   # TokenRows, [R, T]
    lp_S = row_logprobs(policy, rows)                            # old log-probs (or the rollout's own)
    if config.needs_teacher:                                     # stepopsd, agentopsd, rlsd
        scores = score_teacher(teacher, tokenizer, episodes, rows, config)   # TeacherScores
        batch = rows.credit_batch(lp_S, scores.logprobs, scores.scored, scores.truncated)
    else:                                                        # grpo, gigpo
        batch = rows.credit_batch(lp_S)
    advantages, diagnostics = compute_advantages(batch, config, step)   # [R, T] float32, dict

Then a clipped policy-gradient loss over the tokens of `rows.generated_mask()` (ratio clip 0.2,
token-mean). Compute advantages on the whole batch (groups must be complete: GRPO normalizes within
them) and slice rows into micro-batches afterwards. A `CreditBatch` can also be built by hand from
the same fields (see its docstring): that is what the OpenRLHF bridge does.

Conventions the two halves must share:
    - Position t of a row holds token t; a log-prob at position t is log p(token t | tokens < t)
      (position 0 is never scored). OpenRLHF's action_mask / log-probs are shifted by one (length
      T - 1): put them back at t = i + 1.
    - `turn_id` [R, T] long: the 0-based turn that generated the token, -1 for every token the
      model did not generate (system, user, observation, chat-template text, padding). The
      template's end-of-turn token after a response (<|im_end|>) counts as generated.
    - `span` [R, T] bool: the scored span T_k (action block for `action_only`, whole response +
      end-of-turn for `clean_step`).
    - Rows are whole episodes (full-chat context) or single turns (window context), freely mixed;
      `row_episode` [R] says whose they are; episode tensors are [E], turn tensors [E, K]. Turn
      order is the turn index, never the row order: permuting rows permutes the output rows and
      changes nothing else.
    - Token-in, token-out: rows hold the ids the policy sampled and was conditioned on
      (`Turn.tokens`, recorded by `trainer.sampling.HFPolicyAgent`); episodes of text agents are
      laid out with the same chat framing (`trainer.chat`).
    - Teacher: `config.teacher_mode` ("stale": a snapshot refreshed every `teacher_refresh`
      updates; "live": the current policy) is the trainer's to honour; `score_teacher` takes
      whichever model it is given, under no_grad.

compute_advantages(batch, config, step) -> (advantages, diagnostics)
    advantages: [R, T] float32 on batch's device, exactly 0 on tokens with turn_id == -1.
    diagnostics: docs/credit.md#logged-per-update, floats under "credit/..." keys: delta_mean, delta_std (mean delta
        is about -KL), evidence_mean, b0_mean and b0_hist (10 bins over [0, 1], a list), dB_mean,
        dB_std, weight_clip_frac, adv_std_ratio (std(A~)/std(A)), lam_t, budget_coef_*,
        teacher_truncated, plus reward_mean/std, success_rate, adv_mean, scored_tokens.
        `TeacherScores.stats()` adds the teacher's cost and truncation counters ("teacher/...").

CreditConfig (all knobs and their defaults, docs/credit.md#configuration;
    `CreditConfig.for_method(method, family_defaults, preset=...)`)
    method in {grpo, gigpo, stepopsd, agentopsd, rlsd}; see `trainer/credit/config.py`.

outcome_reward(success, score, invalid_turns, success_scale=1, score_coef=0, invalid_coef=0.1)
    R_i of docs/credit.md#outcome-reward, [E] float64 (`episode_rewards(batch, config)` applies a config).

Files (each reads top to bottom like its section of docs/credit.md, with its symbols in comments):
    grpo.py       outcome reward, group normalization, sequence advantage
    gigpo.py      discounted step returns, state-key clusters, step advantage
    evidence.py   token gap delta and turn evidence e_k
    stepopsd.py   lam_t schedule, sign-preserving token weights, per-step budget (and RLSD weights)
    agentopsd.py  belief prior, recursive belief, bounded turn weights, release preset
    compute.py    the entry point and the diagnostics
    batch.py      CreditBatch and the [E, K] turn bookkeeping
    config.py     CreditConfig
"""

from importlib import import_module

from trainer.credit.config import METHODS, RELEASE_PRESET, SPAN_MODES, CreditConfig

# The tensor code is imported when first used, so that `trainer.credit.config` (METHODS, CreditConfig)
# stays importable without torch (the command line reads METHODS).
_LAZY = {
    "CreditBatch": "trainer.credit.batch",
    "TurnLayout": "trainer.credit.batch",
    "compute_advantages": "trainer.credit.compute",
    "CreditParts": "trainer.credit.compute",
    "episode_rewards": "trainer.credit.compute",
    "group_normalize": "trainer.credit.grpo",
    "outcome_reward": "trainer.credit.grpo",
}


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'trainer.credit' has no attribute {name!r}")


__all__ = [
    "METHODS",
    "RELEASE_PRESET",
    "SPAN_MODES",
    "CreditBatch",
    "CreditConfig",
    "CreditParts",
    "TurnLayout",
    "compute_advantages",
    "episode_rewards",
    "group_normalize",
    "outcome_reward",
]
