"""OpenRLHF's Ray trainer actor with our samples generator and experience maker installed.

`openrlhf.trainer.ppo_trainer.PPOTrainer` is a Ray actor class; `AgentGymPPOTrainer` derives from the
class under it and swaps two parts after the stock constructor has built everything else (datasets,
loggers, KL controller):

- `samples_generator`: `AgentGymSamplesGenerator` (keeps the executor's turn ids and records);
- `experience_maker`: `CreditExperienceMaker` (teacher forward on the actor group, then the credit
  core's advantages).

`trainer.openrlhf.launch` puts `AgentGymPPOTrainerActor` where `openrlhf.cli.train_ppo_ray.train`
imports its trainer from, then runs the stock entry point.
"""

from __future__ import annotations

import ray
from openrlhf.trainer.ppo_trainer import PPOTrainer as _StockPPOTrainerActor

from trainer.openrlhf.config import BridgeConfig
from trainer.openrlhf.experience import CreditExperienceMaker
from trainer.openrlhf.samples import AgentGymSamplesGenerator

__all__ = ["AgentGymPPOTrainer", "AgentGymPPOTrainerActor", "StockPPOTrainer"]

StockPPOTrainer = _StockPPOTrainerActor.__ray_actor_class__


class AgentGymPPOTrainer(StockPPOTrainer):
    """OpenRLHF's PPO trainer (single controller) with per-turn credit."""

    def __init__(self, pretrain, strategy, actor_model_group, critic_model_group, reward_model_group,
                 reference_model_group, vllm_engines, **generate_kwargs) -> None:
        super().__init__(pretrain, strategy, actor_model_group, critic_model_group, reward_model_group,
                         reference_model_group, vllm_engines, **generate_kwargs)
        self.bridge = BridgeConfig.from_environment()
        self.samples_generator = AgentGymSamplesGenerator(
            strategy=strategy,
            prompts_dataloader=self.prompts_dataloader,
            eval_dataloader=self.eval_dataloader,
            tokenizer=self.tokenizer,
            vllm_engines=vllm_engines,
        )
        self.experience_maker = CreditExperienceMaker(
            actor_model_group, critic_model_group, reward_model_group, reference_model_group,
            self.kl_ctl, strategy, self.tokenizer, bridge=self.bridge,
        )

    def train_step(self, rollout_samples, global_step: int):
        # The credit schedules (StepOPSD's lambda decay) follow the update count, resumes included.
        self.experience_maker.update_step = int(global_step)
        return super().train_step(rollout_samples, global_step)


AgentGymPPOTrainerActor = ray.remote(AgentGymPPOTrainer)
