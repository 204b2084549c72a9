"""Named recipes of the local trainer: the settings the demo and the benchmarks train with, in one
place (as `trainer/openrlhf/presets.py` holds the OpenRLHF runs').

The ALFWorld Pick recipes warm-start a model on expert episodes of Pick games in small rooms (a
panel of Pick games only), with random detours that the expert recovers from (`SFT_NOISE`; only the
expert's own turns are imitated), then train it further with RL from that start. Per model kind:

- `PICK_REAL`: the real model (SmolLM2-135M-Instruct, `smollm2-135m`): the searching expert (it looks
  for the object receptacle by receptacle, as a policy must), 1,000 training games, 15 turns, the top
  8 layers trained in bf16 autocast where the CPU has bf16 units (benchmarks/train_speed.py measured
  the choice); warm start at lr 1e-4; RL at lr 2e-5, one optimizer step per update, rollouts at
  temperature 0.5, groups of 8 (benchmarks/budget_sweep.py measured the choice), a KL penalty to the
  warm start (0.1) and no invalid-turn penalty (docs/benchmarks/learning.md: with the penalty, groups
  without a win push the policy away from taking and moving, and held-out success falls below the warm
  start; without it GRPO rises above it); held out: 50 valid_unseen games (floor plans the training never
  saw).
- `PICK_TINY`: the tiny Qwen3 (`TINY_QWEN3`): the planner expert, 200 training games, 12 turns, every
  weight; warm start at lr 3e-3, RL at 1e-3 decaying linearly; held out: valid_seen games (those
  without a training twin, benchmarks/held_out_games.py).
- `PICK_REAL_QUICK`, `PICK_TINY_QUICK`: a smoke run of every stage of the same recipe.
- `PICK_TINY_DEMO`: the demo's (`agentgym-opsd demo`): the tiny recipe with 7 warm-start epochs and
  4 RL updates of 4 tasks x 8 episodes at a constant rate.

The fields are `TrainConfig`'s of the same names, and the training env's (`PickRecipe.env_options`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

__all__ = ["PICK_ENV", "PICK_REAL", "PICK_REAL_QUICK", "PICK_TINY", "PICK_TINY_DEMO", "PICK_TINY_QUICK",
           "PickRecipe", "SFT_NOISE", "TINY_QWEN3"]

PICK_ENV = "agentgym/ALFWorld-Pick-v0"
# The expert's chance, per turn of a warm-start episode, of a random admissible action (a detour it
# then recovers from): the policy also learns to correct course.
SFT_NOISE = 0.25
# The tiny model the recipes train: a seeded random Qwen3, hidden 128 x 2 layers, on a 1,024-token BPE
# trained on the env's text (`TrainConfig` fields).
TINY_QWEN3: dict[str, Any] = {"model": "tiny", "tokenizer": "trained", "vocab_size": 1024, "tiny_hidden": 128,
                              "tiny_layers": 2}


@dataclass(frozen=True)
class PickRecipe:
    """One model kind's ALFWorld Pick recipe.

    train_games: Pick games in the training split. eval_split, eval_games: the held-out panel.
    max_turns: turns before an episode is truncated. expert_searches: the warm start imitates the
        searching expert (True) or the planner, which goes straight to where only the game knows the
        object is (False).
    sft_episodes, sft_epochs, sft_lr, sft_noise: the warm start. train_layers: the top layers trained
        (0: every weight). autocast: `TrainConfig.autocast`. max_new_tokens: the per-turn token cap.
    steps, tasks_per_step, group_size, lr, lr_schedule, mini_batches, ppo_epochs, temperature, kl_coef,
        invalid_coef: RL from the warm start (temperature: the rollouts' sampling temperature; kl_coef: the
        weight of the KL penalty to the warm start, 0 for none; invalid_coef: the credit's penalty per
        invalid turn, `CreditConfig.invalid_coef`, None for the env family's default).
    """

    train_games: int
    eval_split: str
    eval_games: int
    max_turns: int
    expert_searches: bool
    sft_episodes: int
    sft_epochs: int
    sft_lr: float
    sft_noise: float
    train_layers: int
    autocast: str
    steps: int
    tasks_per_step: int
    group_size: int
    lr: float
    lr_schedule: str
    mini_batches: int
    max_new_tokens: int
    ppo_epochs: int = 1
    temperature: float = 1.0
    kl_coef: float = 0.0
    invalid_coef: float | None = None

    def fields(self) -> dict[str, Any]:
        """The recipe as a dict, in field order."""
        return dataclasses.asdict(self)

    def env_options(self, panel_size: dict[str, int]) -> dict[str, Any]:
        """The training env's options (`PICK_ENV`, training split) over a Pick panel of `panel_size`
        games per split."""
        return {"room": "small", "split": "train", "max_turns": self.max_turns, "panel_size": dict(panel_size),
                "panel_own_types": True, "expert_searches": self.expert_searches, "progress": False}


# The real model's RL budget: a GRPO run from a finished warm start (12 updates of 4 games x 8 episodes)
# is meant to fit in 90 minutes on two cores; the update settings are budget_sweep's pick
# (docs/benchmarks/budget_sweep.md: at temperature 1 a group rarely holds a success to learn from; more
# optimizer steps or a higher rate collapse success in the first update); rate, KL and invalid-turn penalty
# are the held-out sweep's pick (docs/benchmarks/learning.md, which also has the times measured).
PICK_REAL = PickRecipe(
    train_games=1000, eval_split="valid_unseen", eval_games=50, max_turns=15, expert_searches=True,
    sft_episodes=400, sft_epochs=2, sft_lr=1e-4, sft_noise=SFT_NOISE, train_layers=8, autocast="auto",
    steps=12, tasks_per_step=4, group_size=8, lr=2e-5, lr_schedule="constant", mini_batches=1, max_new_tokens=32,
    ppo_epochs=1, temperature=0.5, kl_coef=0.1, invalid_coef=0.0,
)
PICK_REAL_QUICK = dataclasses.replace(PICK_REAL, eval_games=10, sft_episodes=40, sft_epochs=1, steps=1,
                                      tasks_per_step=2, group_size=4)
PICK_TINY = PickRecipe(
    train_games=200, eval_split="valid_seen", eval_games=300, max_turns=12, expert_searches=False,
    sft_episodes=1500, sft_epochs=6, sft_lr=3e-3, sft_noise=SFT_NOISE, train_layers=0, autocast="none",
    steps=20, tasks_per_step=8, group_size=8, lr=1e-3, lr_schedule="linear", mini_batches=4, max_new_tokens=24,
)
PICK_TINY_QUICK = dataclasses.replace(PICK_TINY, eval_games=40, sft_episodes=200, sft_epochs=2, steps=2,
                                      tasks_per_step=4, group_size=4)
PICK_TINY_DEMO = dataclasses.replace(PICK_TINY, eval_split="valid_unseen", eval_games=200, sft_epochs=7, steps=4,
                                     tasks_per_step=4, group_size=8, lr_schedule="constant", mini_batches=1)
