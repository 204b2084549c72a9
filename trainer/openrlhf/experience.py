"""OpenRLHF's experience maker with the credit core's per-turn advantages.

`CreditExperienceMaker` subclasses `openrlhf.trainer.ppo_utils.experience_maker.RemoteExperienceMaker`:

1. `make_experience`: the stock forwards (student log-probs on the actor group, reference model),
   then, for the methods that need one, the teacher forward on the same actor group
   (`trainer.openrlhf.teacher`).
2. `compute_advantages_and_returns`: the stock computation first (length penalties, GRPO group
   normalisation with `--algo.advantage.estimator group_norm`, returns, logs), then the credit
   core's `compute_advantages` over the whole rollout batch: groups are OpenRLHF's prompt groups,
   turn ids and spans come from the agent executor, outcomes are OpenRLHF's (penalised) rewards.
   The result replaces `experience.advantages`, on generated tokens only (0 elsewhere).

Everything the bridge added to `Experience.info` is removed here, and the credit diagnostics are
put there as per-sample scalars, so OpenRLHF's logging (console, wandb, TensorBoard) shows them
under `credit/...`.
"""

from __future__ import annotations

import json
from typing import Any

import torch
from openrlhf.trainer.ppo_utils.experience_maker import RemoteExperienceMaker

from trainer.openrlhf.config import BridgeConfig, ConfigError
from trainer.openrlhf.credit_rows import RolloutRows, credit_advantages, make_credit_config, teacher_rows_for
from trainer.openrlhf.samples import ACTION_KEY, RECORD_KEY, TURN_KEY
from trainer.openrlhf.teacher import score_rows

__all__ = ["CreditExperienceMaker", "TEACHER_KEY"]

TEACHER_KEY = "agentgym_teacher"  # (B, T-1) teacher log-probs on scored tokens, NaN elsewhere


class CreditExperienceMaker(RemoteExperienceMaker):
    """`RemoteExperienceMaker` whose advantages are the credit core's (see the module docstring).

    Args:
        *args, **kwargs: as `RemoteExperienceMaker`.
        bridge: the bridge config (`credit` section: `CreditConfig` fields; `teacher` section).
    """

    def __init__(self, *args, bridge: BridgeConfig | None = None, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.bridge = bridge or BridgeConfig.from_environment()
        self.credit_config = make_credit_config(self.bridge.credit)
        self.update_step = 0
        args = self.args
        if args.algo.advantage.estimator != "group_norm":
            raise ConfigError(
                f"--algo.advantage.estimator {args.algo.advantage.estimator}: the credit methods reshape GRPO's "
                "group-normalised advantage; use --algo.advantage.estimator group_norm"
            )
        if args.rollout.n_samples_per_prompt < 2:
            raise ConfigError("--rollout.n_samples_per_prompt must be >= 2: credit is computed within groups of one task")
        if self.initial_model_group is not None and not args.algo.kl.use_loss and self.kl_ctl.value > 0:
            raise ConfigError(
                "a KL penalty folded into the reward would be overwritten by the credit advantages; "
                "use --algo.kl.use_loss (GRPO-style KL loss) or --algo.kl.init_coef 0"
            )

    # -- 1. forwards ------------------------------------------------------------------------

    @torch.no_grad()
    def make_experience(self, samples_list):
        experiences = super().make_experience(samples_list)
        rows, truncated = teacher_rows_for(experiences, self.credit_config, self.tokenizer, self.bridge.teacher)
        for e in experiences:
            e.info[TEACHER_KEY] = torch.full_like(e.action_mask, float("nan"), dtype=torch.float32)
            e.info["credit/teacher_truncated"] = torch.zeros(len(e.sequences))
        for (ei, ri), n in truncated.items():
            experiences[ei].info["credit/teacher_truncated"][ri] = float(n)
        if rows:
            scores = score_rows(self.actor_model_group, rows, self.bridge.teacher.micro_batch_size, self.tokenizer.pad_token_id)
            for row, lp in zip(rows, scores, strict=True):
                ei, ri = row.owner
                target = experiences[ei].info[TEACHER_KEY]
                index = torch.tensor([j for _, j in row.scored], dtype=torch.long)
                target[ri, index] = lp.to(target.dtype)
        return experiences

    # -- 2. advantages ----------------------------------------------------------------------

    @torch.no_grad()
    def compute_advantages_and_returns(self, experiences):
        experiences = super().compute_advantages_and_returns(experiences)
        n = int(self.args.rollout.n_samples_per_prompt)
        rows = RolloutRows.from_experiences(experiences, n, TURN_KEY, ACTION_KEY, RECORD_KEY, TEACHER_KEY)
        advantages, diagnostics = credit_advantages(rows, self.credit_config, self.update_step)
        for e, (start, end) in zip(experiences, rows.slices, strict=True):
            width = e.action_mask.shape[1]
            mask = e.action_mask.to(advantages.dtype)
            e.advantages = advantages[start:end, :width].to(e.advantages.dtype) * mask
            for key in (TURN_KEY, ACTION_KEY, RECORD_KEY, TEACHER_KEY):
                e.info.pop(key, None)
            for key, value in diagnostics.items():
                e.info[f"credit/{key}"] = torch.full((end - start,), float(value))
        return experiences


def parse_records(values: list[Any]) -> list[dict[str, Any]]:
    return [json.loads(v) if isinstance(v, str) else dict(v) for v in values]
