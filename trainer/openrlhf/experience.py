"""OpenRLHF's experience maker with the credit core's per-turn advantages.

`CreditExperienceMaker` subclasses `openrlhf.trainer.ppo_utils.experience_maker.RemoteExperienceMaker`
and overrides `compute_advantages_and_returns`, which OpenRLHF calls on the whole rollout batch right
after `make_experience` (the stock student forward on the actor group, the reference model):

1. the stock computation (GRPO group normalisation with `--algo.advantage.estimator group_norm`,
   returns, OpenRLHF's logs);
2. the teacher forward, for the methods that have one: one extra no-grad pass on the same actor
   group (see `trainer.openrlhf.teacher` for why there and not in vLLM);
3. the credit core's `compute_advantages` over the whole batch (groups are OpenRLHF's prompt groups,
   turn ids and spans the agent executor's, outcomes the executor's records), which replaces
   `experience.advantages` on generated tokens (0 elsewhere).

Everything the bridge added to `Experience.info` is removed, and the credit diagnostics
(docs/credit.md#logged-per-update) and teacher counters are put there as per-sample scalars, so OpenRLHF's logging
(console, wandb, TensorBoard) shows them under `credit/...` and `teacher/...`.
"""

from __future__ import annotations

import json

import torch
from openrlhf.trainer.ppo_utils.experience_maker import RemoteExperienceMaker

from trainer.openrlhf.config import BridgeConfig, ConfigError
from trainer.openrlhf.credit_rows import credit_advantages, rollout_token_rows, scalar_logs, teacher_logprobs
from trainer.openrlhf.samples import ACTION_KEY, RECORD_KEY, TURN_KEY

__all__ = ["CreditExperienceMaker"]


class CreditExperienceMaker(RemoteExperienceMaker):
    """`RemoteExperienceMaker` whose advantages are the credit core's (see the module docstring).

    Args:
        *args, **kwargs: as `RemoteExperienceMaker`.
        bridge: the bridge config (`credit` and `teacher` sections).
    """

    def __init__(self, *args, bridge: BridgeConfig | None = None, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.bridge = bridge or BridgeConfig.from_environment()
        self.update_step = 0
        self.last_diagnostics: dict[str, float] = {}
        args = self.args
        if args.algo.advantage.estimator != "group_norm":
            raise ConfigError(
                f"--algo.advantage.estimator {args.algo.advantage.estimator}: the credit methods reshape GRPO's "
                "group-normalised advantage; use --algo.advantage.estimator group_norm"
            )
        if args.rollout.n_samples_per_prompt < 2:
            raise ConfigError(
                "--rollout.n_samples_per_prompt must be >= 2: credit is computed within groups of one task")
        if self.initial_model_group is not None and not args.algo.kl.use_loss and self.kl_ctl.value > 0:
            raise ConfigError(
                "a KL penalty folded into the reward would be overwritten by the credit advantages; "
                "use --algo.kl.use_loss (GRPO-style KL loss) or --algo.kl.init_coef 0"
            )

    @torch.no_grad()
    def compute_advantages_and_returns(self, experiences):
        records = [json.loads(r) for e in experiences for r in e.info[RECORD_KEY]]
        errored = [r["episode"] for r in records if r["episode"].get("error")]
        if errored and len(errored) == len(records):
            raise RuntimeError(
                f"every episode of this batch failed ({len(records)}); the first: {errored[0]['error']} "
                "(is the retrieval server up, and does the env load?)"
            )
        experiences = super().compute_advantages_and_returns(experiences)  # 1. stock GRPO, returns, logs
        # An errored episode gets no credit, so its env does not decide the batch's family defaults.
        env_id = self.bridge.batch_env_id(r["episode"]["env_id"] for r in records if not r["episode"].get("error"))
        config = self.bridge.credit_config(env_id)
        batch = rollout_token_rows(
            experiences, int(self.args.rollout.n_samples_per_prompt), self.tokenizer, config,
            TURN_KEY, ACTION_KEY, RECORD_KEY, self.bridge.rollout.chat_template_kwargs,
        )
        teacher = None
        logs: dict[str, float] = {}
        if config.needs_teacher:  # 2. teacher forward on the actor group
            teacher = teacher_logprobs(batch, self.tokenizer, config, self.actor_model_group,
                                       self.bridge.teacher.max_len, self.bridge.teacher.micro_batch_size)
            logs.update({f"teacher/{k}": float(v) for k, v in teacher[2].items()})
        advantages, diagnostics = credit_advantages(batch, config, self.update_step, teacher)  # 3. credit
        logs.update(scalar_logs(diagnostics))
        logs["credit/errored_episodes"] = float(len(errored))
        self.last_diagnostics = logs
        for e, (start, end) in zip(experiences, batch.slices, strict=True):
            n = e.action_mask.shape[1]
            e.advantages = advantages[start:end,
                                      1 : n + 1].to(e.advantages.dtype) * e.action_mask.to(e.advantages.dtype)
            for key in (TURN_KEY, ACTION_KEY, RECORD_KEY):
                e.info.pop(key, None)
            for key, value in logs.items():
                e.info[key] = torch.full((end - start,), value)
        return experiences
