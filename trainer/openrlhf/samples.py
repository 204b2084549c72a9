"""OpenRLHF's samples generator, keeping what the agent executor returns beyond OpenRLHF's fields.

OpenRLHF 0.11.2 turns each executor response into an `Experience` and keeps only the action mask of
the turn structure (shifted by one token, length T-1). `AgentGymSamplesGenerator` calls the stock
conversion, then adds to `Experience.info`, aligned with that action mask:

- `agentgym_turn`: (1, T-1) long: turn index + 1 for tokens the model generated, 0 elsewhere (so the
  zero padding OpenRLHF applies when it concatenates experiences means "not generated");
- `agentgym_action`: (1, T-1) long: 1 on the tokens of each turn's parsed action block;
- `agentgym_record`: [JSON string]: the episode record (see `trainer.openrlhf.rollout`).

`CreditExperienceMaker` consumes and removes all three before experiences reach the actors.
"""

from __future__ import annotations

import json
from typing import Any

import torch
from openrlhf.trainer.ppo_utils.samples_generator import SamplesGenerator

__all__ = ["AgentGymSamplesGenerator", "TURN_KEY", "ACTION_KEY", "RECORD_KEY", "turn_structure"]

TURN_KEY = "agentgym_turn"
ACTION_KEY = "agentgym_action"
RECORD_KEY = "agentgym_record"


def turn_structure(response: dict[str, Any], truncate_length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The executor's explicit turn ids and action spans as (T-1)-long tensors in OpenRLHF's layout.

    Position j describes token j+1 of the sequence (OpenRLHF's action mask is `mask[1:]`), and the
    sequence is cut at `truncate_length` as OpenRLHF cuts it.

    An errored episode's sample (`trainer.openrlhf.rollout`) holds one placeholder token in
    OpenRLHF's action mask that no turn generated: it gets turn 0 here (no credit) and is counted
    as a placeholder.

    Returns:
        `(turn_plus_one, action, placeholder)`: long tensors of length `min(T, truncate_length) - 1`.
    """
    extra = response["agentgym"]
    turn_ids = torch.tensor(extra["turn_ids"], dtype=torch.long)
    if turn_ids.numel() != len(response["observation_tokens"]):
        raise ValueError(
            f"agent executor returned {turn_ids.numel()} turn ids for {len(response['observation_tokens'])} tokens"
        )
    action = torch.zeros_like(turn_ids)
    for span in extra["action_spans"]:
        if span is not None:
            action[int(span[0]) : int(span[1])] = 1
    placeholder = torch.zeros_like(turn_ids)
    for position in extra.get("placeholder", []):
        placeholder[int(position)] = 1
    return (turn_ids + 1)[1:truncate_length], action[1:truncate_length], placeholder[1:truncate_length]


class AgentGymSamplesGenerator(SamplesGenerator):
    """`SamplesGenerator` that keeps the executor's turn ids, action spans and episode record."""

    def _process_response_into_experience(self, response, **generate_kwargs):
        experience = super()._process_response_into_experience(response, **generate_kwargs)
        if "agentgym" not in response:
            raise ValueError(
                "the agent executor did not return turn structure: train with "
                "--train.agent_func_path pointing at trainer/openrlhf/agent_func.py (agentgym-opsd train-openrlhf does)"
            )
        truncate_length = generate_kwargs.get("max_len", 2048)
        turn, action, placeholder = turn_structure(response, truncate_length)
        generated = (turn > 0) | (placeholder > 0)
        if not torch.equal(generated.long(), experience.action_mask[0].long()):
            raise AssertionError(
                "turn ids disagree with OpenRLHF's action mask; the executor's ranges are inconsistent")
        experience.info[TURN_KEY] = turn.unsqueeze(0)
        experience.info[ACTION_KEY] = action.unsqueeze(0)
        experience.info[RECORD_KEY] = [json.dumps(response["agentgym"]["record"], ensure_ascii=False)]
        return experience
