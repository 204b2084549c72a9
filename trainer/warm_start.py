"""The supervised warm start: expert episodes with random detours, and what of them is imitated.

`PerturbedExpert` plays the env's expert with random detours (DART-style); `sft_targets` marks the
tokens to imitate (the expert's own turns, never a detour); `LocalTrainer.sft` runs the epochs.
"""

from __future__ import annotations

import hashlib

import numpy as np
import torch

from agentgym_opsd.agents import ExpertAgent

__all__ = ["PerturbedExpert", "sft_targets"]


class PerturbedExpert:
    """The env's expert with random detours (DART-style state perturbation).

    With probability `noise` a turn is a random admissible action instead of the expert's; the expert
    replans from wherever that leads. The detours put the expert in states it would never visit by
    itself (a wrong receptacle, an object not found yet), so a policy fine-tuned on the expert's
    turns also learns how to recover. `detours` holds `(episode_id, turn)` of the random turns
    (SFT leaves them out). Draws depend on (seed, episode id, turn) only, not on batching.
    """

    def __init__(self, noise: float = 0.0, seed: int = 0) -> None:
        self.name = "expert"
        self.noise = float(noise)
        self.seed = int(seed)
        self.expert = ExpertAgent()
        self.detours: set[tuple[str, int]] = set()

    def act(self, messages, info, env) -> str:
        step = info.get("step")
        if step is not None and self.noise > 0 and step.admissible_actions:
            digest = hashlib.blake2b(step.episode_id.encode("utf-8", "surrogatepass"), digest_size=8).digest()
            rng = np.random.default_rng([self.seed, int.from_bytes(digest, "little"), int(step.turn)])
            if rng.random() < self.noise:
                self.detours.add((step.episode_id, int(step.turn)))
                actions = step.admissible_actions
                return env.format_action(actions[int(rng.integers(len(actions)))])
        return self.expert.act(messages, info, env)


def sft_targets(rows, episodes, detours: set[tuple[str, int]]) -> tuple[torch.Tensor, int]:
    """[R, T] bool: the generated tokens of the expert's own turns (detour turns are left out), and
    the number of detour turns in the rows' episodes."""
    K = max([e.num_turns for e in episodes] + [1])
    detour = torch.zeros(len(episodes), K + 1, dtype=torch.bool)
    for i, e in enumerate(episodes):
        for k in range(e.num_turns):
            detour[i, k] = (e.episode_id, k) in detours
    is_detour = detour[rows.row_episode[:, None], rows.turn_id.clamp(min=0)]
    detour_turns = int(detour.sum())
    return (rows.turn_id >= 0) & ~is_detour, detour_turns
