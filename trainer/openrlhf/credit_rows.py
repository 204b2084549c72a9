"""The bridge's rollout batch in the credit core's layout, and the calls into the credit core.

`RolloutRows.from_experiences` lays a list of OpenRLHF experiences (micro-batches of episodes, each
in OpenRLHF's (B, T-1) action layout) out as one padded [R, T] batch: one row per episode (the full
chat is one sequence), turn ids from the agent executor (-1 for tokens the model did not generate),
the action-block mask, group ids from OpenRLHF's prompt groups, the outcome rewards OpenRLHF
normalised, the student log-probs of `make_experience` and the teacher log-probs of the actor-group
teacher forward (NaN where not scored).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["RolloutRows", "make_credit_config", "credit_advantages", "teacher_rows_for"]


@dataclass
class RolloutRows:
    """One rollout batch, padded to [R, T] (R episodes, T the longest action layout).

    Attributes:
        turn_id: long [R, T]: the turn of each generated token, -1 elsewhere.
        action_span: bool [R, T]: tokens of the turn's parsed action block (tags included).
        group: long [R]: the prompt group (OpenRLHF samples n episodes per prompt, one task).
        reward: float [R]: the outcome reward R_i as OpenRLHF used it (length penalties applied).
        success: bool [R]: the env's success flag.
        lp_student: float [R, T]: old log-probs from the actor group (0 where not generated).
        lp_teacher: float [R, T]: teacher log-probs on scored tokens, NaN elsewhere.
        records: the episode records from the executor (one dict per row).
        slices: the rows of each experience, in order: `(start, end)`.
    """

    turn_id: torch.Tensor
    action_span: torch.Tensor
    group: torch.Tensor
    reward: torch.Tensor
    success: torch.Tensor
    lp_student: torch.Tensor
    lp_teacher: torch.Tensor
    records: list[dict[str, Any]]
    slices: list[tuple[int, int]]

    @property
    def response_span(self) -> torch.Tensor:
        return self.turn_id >= 0

    @classmethod
    def from_experiences(cls, experiences, n_samples_per_prompt: int, turn_key: str, action_key: str,
                         record_key: str, teacher_key: str) -> RolloutRows:
        width = max(int(e.action_mask.shape[1]) for e in experiences)

        def pad(t: torch.Tensor, value) -> torch.Tensor:
            return torch.nn.functional.pad(t, (0, width - t.shape[1]), value=value)

        turn, action, lp_s, lp_t, group, reward, records, slices = [], [], [], [], [], [], [], []
        start = 0
        for e in experiences:
            b = len(e.sequences)
            turn.append(pad(e.info[turn_key].long() - 1, -1))
            action.append(pad(e.info[action_key].bool(), False))
            lp_s.append(pad(e.action_log_probs.float() * e.action_mask.float(), 0.0))
            lp_t.append(pad(e.info[teacher_key].float(), float("nan")))
            if e.index is None or len(e.index) != b:
                raise ValueError("experiences lost their rollout index; credit needs OpenRLHF's prompt groups")
            group.append(torch.tensor([int(i) // n_samples_per_prompt for i in e.index], dtype=torch.long))
            reward.append(e.rewards.float().reshape(-1))
            records.extend(json.loads(r) if isinstance(r, str) else dict(r) for r in e.info[record_key])
            slices.append((start, start + b))
            start += b
        turn_id = torch.cat(turn)
        mask = turn_id >= 0
        return cls(
            turn_id=turn_id,
            action_span=torch.cat(action) & mask,
            group=torch.cat(group),
            reward=torch.cat(reward),
            success=torch.tensor([bool(r["success"]) for r in records]),
            lp_student=torch.cat(lp_s),
            lp_teacher=torch.cat(lp_t),
            records=records,
            slices=slices,
        )


# ---------------------------------------------------------------------------------------------
# Calls into the credit core (trainer/credit). PROVISIONAL until the credit core lands on main:
# GRPO only (spec section 0, step 3), so the bridge can be exercised end to end.


def make_credit_config(fields: dict[str, Any]) -> dict[str, Any]:
    config = {"method": "grpo", **fields}
    if config["method"] != "grpo":
        raise NotImplementedError("only grpo until the credit core is wired in")
    return config


def teacher_rows_for(experiences, config, tokenizer, settings):
    return [], {}


def credit_advantages(rows: RolloutRows, config, step: int) -> tuple[torch.Tensor, dict[str, float]]:
    adv = torch.zeros(len(rows.reward))
    for g in rows.group.unique():
        sel = rows.group == g
        r = rows.reward[sel]
        if r.numel() > 1:
            adv[sel] = (r - r.mean()) / (r.std() + 1e-6)
    return adv[:, None] * rows.response_span.float(), {"adv_abs_mean": float(adv.abs().mean())}
