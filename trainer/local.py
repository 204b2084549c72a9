"""The local trainer: warm-start a policy on expert episodes, then improve it with per-turn credit.

One process, one device (CPU here, one CUDA GPU in bf16 where present). Each update:

    1. roll out G episodes for each of T tasks with the current policy (one batched decoding call for
       all live episodes per tick; the env's context policy; a per-turn token cap);
    2. episodes -> token rows (`trainer.rows.build_rows`, the policy's chat template);
    3. old log-probs lp_old = log pi_old(y_t | .) of the generated tokens (no grad);
    4. teacher log-probs lp_T with privileged context (`trainer.teacher`), for StepOPSD and AgentOPSD:
       the live policy, or a snapshot refreshed every N updates;
    5. per-token advantages A~ = `trainer.credit.compute_advantages` (GRPO, GiGPO, StepOPSD, AgentOPSD);
    6. clipped policy-gradient loss, token mean over the batch's generated tokens:
           r_t = exp(lp_new - lp_old),  L = -mean_t min(r_t A~_t, clip(r_t, 1 - eps, 1 + eps) A~_t)
       plus beta * KL(pi || pi_init) (k3 estimator) when beta > 0; AdamW, gradient-norm clipping,
       micro-batches that accumulate into one optimizer step.

Evaluation runs every `eval_every` updates on a held-out panel (fixed seeds, its own env options),
success per subset. The run directory holds config.json, metrics.jsonl, TensorBoard events, episodes,
an atomic checkpoint (model, optimizer, RNG states, step, teacher snapshot), learning curves as PNG,
the final model (`model/`, loadable as `hf:OUT/model`) and report.json. `resume=True` continues from
the checkpoint and reaches the same state as a run that was never stopped.
"""

from __future__ import annotations

import copy
import json
import math
import random
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

import agentgym_opsd
from agentgym_opsd.episode import Episode, save_episodes
from agentgym_opsd.io import append_jsonl, atomic_directory, atomic_write_json, atomic_write_text, read_jsonl_numbered
from agentgym_opsd.rollout import EpisodeRequest, run_episodes
from agentgym_opsd.summary import format_table, summarize
from trainer.checkpoint import CHECKPOINT, read_checkpoint, restore_rng_states, rng_states, write_checkpoint
from trainer.config import RESUMABLE_CHANGES, TrainConfig, TrainError
from trainer.forward import block_causal_mask, token_logprobs
from trainer.loss import clipped_pg_loss, kl_k3, micro_batches
from trainer.policy import TinyModelSpec, load_policy, parameter_count
from trainer.sampling import HFPolicyAgent
from trainer.warm_start import PerturbedExpert, SFTExample, sft_targets

__all__ = ["TrainConfig", "LocalTrainer", "TrainError", "train", "sampling_consistency"]


def sampling_consistency(rows, old_logp: torch.Tensor) -> dict[str, float]:
    """Do the token rows hold what the policy sampled, in the context it sampled it?

    Returns `rollout/recorded_turns` (fraction of the rows' turns laid out from the rollout's own
    ids: 1.0 for the trainer's rollouts) and `rollout/logprob_gap` (mean |lp_old - lp_sampled| over
    the recorded tokens: float error, about 1e-6, when the rows hold the sampled ids in their
    sampling context and the old log-probs use the sampling temperature).
    """
    turns = rows.recorded_turns + rows.text_turns
    mask = rows.recorded
    n = int(mask.sum())
    gap = float(((old_logp - rows.rollout_logprobs).abs() * mask).sum()) / max(1, n)
    return {"rollout/recorded_turns": rows.recorded_turns / max(1, turns), "rollout/logprob_gap": gap}


# ---------------------------------------------------------------------------------------------


class LocalTrainer:
    """A training run in `config.out` (see the module docstring)."""

    def __init__(self, config: TrainConfig, *, resume: bool = False, progress: bool = True) -> None:
        config.validate()
        self.config = config
        self.out = Path(config.out)
        self.progress = progress
        if not progress:  # transformers' own bars (loading and writing weights) too
            from transformers.utils import logging as hf_logging

            hf_logging.disable_progress_bar()
        self.resume = resume
        self.step = 0
        self.sft_done = False
        self.evaluated_steps: set[int] = set()
        self.hooks: dict[str, list[Callable[..., None]]] = {"after_rollout": [], "after_update": []}
        self.model = None
        self.tokenizer = None
        self.teacher_model = None
        self.reference_model = None
        self.optimizer: torch.optim.Optimizer | None = None
        self.rng = np.random.default_rng(config.seed)
        self._writer = None
        self._last_eval: dict[str, Any] | None = None

    # -- env --------------------------------------------------------------------------------

    def make_env(self):
        return agentgym_opsd.make(self.config.env_id, **self.config.env_options)

    def make_eval_env(self):
        return agentgym_opsd.make(self.config.env_id, **{**self.config.env_options, **self.config.eval_env_options})

    # -- set-up -----------------------------------------------------------------------------

    def setup(self) -> None:
        cfg = self.config
        if cfg.cpu_threads > 0 and not str(cfg.device).startswith("cuda"):
            torch.set_num_threads(cfg.cpu_threads)
        self.out.mkdir(parents=True, exist_ok=True)
        ckpt = self.out / CHECKPOINT
        if ckpt.exists() and not self.resume:
            raise TrainError(f"{self.out} already holds a run ({CHECKPOINT}); pass --resume to continue it or use a new --out")
        if self.resume and ckpt.exists():
            self._load_run()
            return
        torch.manual_seed(cfg.seed)
        random.seed(cfg.seed)
        self._init_policy()
        atomic_write_json(self.out / "config.json", cfg.to_dict())
        if (self.out / "metrics.jsonl").exists():
            (self.out / "metrics.jsonl").unlink()

    def _init_policy(self) -> None:
        cfg = self.config
        corpus = None
        if cfg.model == "tiny" and cfg.tokenizer in ("trained", "auto"):
            corpus = self._tokenizer_corpus()
        heads = max(4, cfg.tiny_hidden // 64)  # head_dim 16 for the tiny sizes, 64 from hidden 256 up
        spec = TinyModelSpec(hidden_size=cfg.tiny_hidden, num_hidden_layers=cfg.tiny_layers, num_attention_heads=heads,
                             num_key_value_heads=max(1, heads // 2), head_dim=cfg.tiny_hidden // heads,
                             intermediate_size=4 * cfg.tiny_hidden)
        self.model, self.tokenizer = load_policy(
            cfg.model, tokenizer=cfg.tokenizer, corpus=corpus, vocab_size=cfg.vocab_size, seed=cfg.seed,
            device=cfg.device, dtype=cfg.dtype, tiny=spec,
        )
        if cfg.model == "tiny":  # the tokenizer (perhaps trained just now) and architecture, for resume and eval
            with atomic_directory(self.out / "init") as tmp:
                self.model.save_pretrained(tmp)
                self.tokenizer.save_pretrained(tmp)
        self._make_optimizer(cfg.lr)

    def _tokenizer_corpus(self) -> list[str]:
        """Text to train a tokenizer on: the env's instructions and the turns of expert episodes (or
        random ones when the env has no expert)."""
        episodes, _ = self._expert_episodes(max(16, min(self.config.sft_episodes, 64)), progress="tokenizer corpus")
        texts: list[str] = []
        for e in episodes:
            texts += [e.instructions, e.initial_observation]
            for t in e.turns:
                texts += [t.response, t.observation]
                texts += list(t.step.admissible_actions or [])
        return texts

    def _make_optimizer(self, lr: float) -> None:
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(), lr=lr, weight_decay=self.config.weight_decay, betas=(0.9, 0.99)
        )

    # -- the run ----------------------------------------------------------------------------

    def run(self) -> dict[str, Any]:
        """SFT warm start (if asked and not done), evaluation before RL, the RL updates with periodic
        evaluation and checkpoints, then the final evaluation, model, plots and report."""
        self.start()
        cfg = self.config
        if 0 not in self.evaluated_steps and cfg.eval_episodes > 0 and cfg.eval_before:
            self.evaluate()
            self._checkpoint()
        bar = tqdm(total=cfg.steps, initial=self.step, desc=f"{cfg.method} updates", unit="upd",
                   disable=not self.progress)
        try:
            while self.step < cfg.steps:
                record = self.rl_step()
                bar.update(1)
                bar.set_postfix(success=f"{record['train/success']:.2f}", loss=f"{record['loss']:.3f}")
                due_eval = cfg.eval_every > 0 and self.step % cfg.eval_every == 0
                if (due_eval or self.step == cfg.steps) and cfg.eval_episodes > 0:
                    self.evaluate()
                if cfg.save_every > 0 and (self.step % cfg.save_every == 0 or self.step == cfg.steps):
                    self.save_checkpoint()
        finally:
            bar.close()
        return self.finish()

    def start(self) -> None:
        """Set the run up (or load it back) and warm-start the policy: after this, `rl_step` trains."""
        self.setup()
        if not self.sft_done:
            if self.config.sft_episodes > 0:
                self.sft()
            self.sft_done = True
            self._init_rl_models()
            self._make_optimizer(self.config.lr)
            self._checkpoint()

    def _checkpoint(self) -> None:
        if self.config.save_every > 0:
            self.save_checkpoint()

    def finish(self) -> dict[str, Any]:
        from trainer.plots import plot_run

        with atomic_directory(self.out / "model") as tmp:  # `hf:OUT/model` is whole or absent
            self.model.save_pretrained(tmp)
            self.tokenizer.save_pretrained(tmp)
        evals = [r for _, r in read_jsonl_numbered(self.out / "metrics.jsonl") if r.get("kind") == "eval"]
        report = {
            "env_id": self.config.env_id,
            "method": self.config.method,
            "steps": self.step,
            "parameters": parameter_count(self.model),
            "eval": [{k: v for k, v in r.items() if k.startswith("eval/") or k == "step"} for r in evals],
            "success_before": evals[0]["eval/success"] if evals else None,
            "success_after": evals[-1]["eval/success"] if evals else None,
        }
        atomic_write_json(self.out / "report.json", report)
        plot_run(self.out)
        if self._writer is not None:
            self._writer.flush()
        return report

    # -- RL models (teacher snapshot, KL reference) -----------------------------------------

    def _init_rl_models(self) -> None:
        cfg = self.config
        credit = cfg.credit_config()
        if credit.needs_teacher and credit.teacher_mode == "stale":
            self.teacher_model = self._frozen_copy(self.model)
        if cfg.kl_coef > 0:
            self.reference_model = self._frozen_copy(self.model)

    @staticmethod
    def _frozen_copy(model):
        twin = copy.deepcopy(model)
        twin.eval()
        twin.requires_grad_(False)
        return twin

    def teacher(self):
        """The model that scores with privileged context: the live policy or the snapshot."""
        return self.model if self.teacher_model is None else self.teacher_model

    # -- rollouts ---------------------------------------------------------------------------

    def agent(self, *, temperature: float, seed: int | None = None, name: str = "policy") -> HFPolicyAgent:
        """The policy as an agent: it builds its contexts in token space and records the ids it
        samples, which the token rows are laid out from."""
        return HFPolicyAgent(
            self.model, self.tokenizer, max_new_tokens=self.config.max_new_tokens, temperature=temperature,
            seed=self.config.seed if seed is None else seed, chat_template_kwargs=dict(self.config.chat_template_kwargs),
            name=name,
        )

    def _expert_episodes(self, n: int, *, progress: str = "expert episodes") -> tuple[list[Episode], PerturbedExpert]:
        """`n` episodes of the (perturbed) expert on seeds sft_seed.., and the expert (its detours and
        their corrections)."""
        requests = [EpisodeRequest(seed=self.config.sft_seed + i, episode_id=f"expert-{i}") for i in range(n)]
        expert = PerturbedExpert(self.config.sft_noise, seed=self.config.seed)
        episodes = run_episodes(
            self.make_env, expert, requests, num_envs=min(16, max(1, n)), context=self.config.context,
            progress=progress if self.progress else False,
        )
        return episodes, expert

    # -- token rows and log-probs -----------------------------------------------------------

    def rows(self, episodes: Sequence[Episode]):
        """Token rows of finished episodes (`trainer.rows.build_rows`), cut at the model's context."""
        from trainer.rows import build_rows

        return build_rows(list(episodes), self.tokenizer, span_mode=self.credit.span_mode,
                          chat_template_kwargs=self.config.chat_template_kwargs,
                          max_length=getattr(self.model.config, "max_position_embeddings", None))

    def _batches(self, rows, max_tokens: int | None = None) -> list[list[int]]:
        lengths = rows.attention_mask.sum(-1).tolist()
        return micro_batches(lengths, max_tokens or self.config.micro_batch_tokens)

    def _slice(self, rows, index: list[int]) -> dict[str, torch.Tensor]:
        idx = torch.tensor(index, dtype=torch.long)
        width = int(rows.attention_mask[idx].sum(-1).max())
        device = self.model.device
        return {
            "input_ids": rows.input_ids[idx, :width].to(device),
            "attention_mask": rows.attention_mask[idx, :width].to(device),
            "generated": (rows.turn_id[idx, :width] >= 0).to(device),
        }

    def logprobs(self, model, rows) -> torch.Tensor:
        """[R, T] log-probs of the generated tokens under `model` (0 elsewhere), no grad, at the
        rollout's temperature: the one scoring path the teacher uses too (`trainer.teacher`)."""
        from trainer.forward import row_logprobs

        return row_logprobs(model, rows, micro_batch_tokens=self.config.micro_batch_tokens,
                            temperature=self._train_temperature())

    def _train_temperature(self) -> float:
        return self.config.temperature if self.config.temperature > 0 else 1.0

    # -- SFT warm start ---------------------------------------------------------------------

    def sft(self) -> dict[str, Any]:
        """Supervised fine-tuning on the env's expert: token-mean cross-entropy of the expert's own
        turns of its successful episodes (observations are context only), and with
        `sft_privileged` > 0 the teacher's privileged contexts too (`trainer.warm_start`)."""
        cfg = self.config
        started = time.perf_counter()
        played, expert = self._expert_episodes(cfg.sft_episodes)
        episodes = [e for e in played if e.success and not e.error]
        if not episodes:
            raise TrainError(f"{cfg.env_id}: the expert solved none of {cfg.sft_episodes} episodes; nothing to warm-start on")
        save_episodes(self.out / "episodes" / "sft_expert.jsonl", episodes)
        rows = self.rows(episodes)
        target, detour_turns = sft_targets(rows, episodes, expert.detours)  # the expert's own turns only
        examples = [SFTExample(rows.input_ids[r, : int(rows.length[r])], target[r, : int(rows.length[r])])
                    for r in range(rows.num_rows)]
        examples = [x for x in examples if bool(x.target.any())]
        generated_tokens = int(target.sum())
        privileged = self._privileged_examples([e for e in played if not e.error], expert.corrections)
        examples += privileged
        self._make_optimizer(cfg.sft_lr)
        bar = tqdm(total=cfg.sft_epochs, desc="SFT warm start", unit="epoch", disable=not self.progress)
        loss_value = float("nan")
        sft_rng = np.random.default_rng(cfg.seed + 7)
        for epoch in range(cfg.sft_epochs):
            loss_value = self._sft_epoch(examples, sft_rng)
            bar.update(1)
            bar.set_postfix(loss=f"{loss_value:.3f}")
            self.log({"kind": "sft", "step": 0, "sft/epoch": epoch + 1, "sft/loss": loss_value})
        bar.close()
        record = {
            "kind": "sft_done", "step": 0, "sft/episodes": len(episodes), "sft/generated_tokens": generated_tokens,
            "sft/detour_turns": detour_turns, "sft/privileged_examples": len(privileged),
            "sft/loss": loss_value, "sft/seconds": time.perf_counter() - started,
        }
        self.log(record)
        return record

    def _privileged_examples(self, played: list[Episode], corrections: dict) -> list:
        """The literate warm start's examples (`trainer.warm_start.privileged_examples`) on a share
        `sft_privileged` of the played expert episodes, both outcomes."""
        cfg = self.config
        if cfg.sft_privileged <= 0 or not played:
            return []
        from trainer.env_knowledge import credit_config
        from trainer.warm_start import privileged_examples

        pick = np.random.default_rng(cfg.seed + 11).random(len(played)) < cfg.sft_privileged
        chosen = [e for e, keep in zip(played, pick, strict=True) if keep]
        context_keys = {"hindsight_reference", "hindsight_peer", "peer_format", "peer_max_chars", "skills_dir", "teacher_max_length"}
        shared = {k: v for k, v in cfg.credit.items() if k in context_keys}
        hindsight = credit_config(cfg.env_id, "stepopsd", **shared) if cfg.sft_privileged_context in ("both", "hindsight") else None
        skills = credit_config(cfg.env_id, "agentopsd", **shared) if cfg.sft_privileged_context in ("both", "skills") else None
        limit = int(getattr(self.model.config, "max_position_embeddings", 32768) or 32768)
        return privileged_examples(self.tokenizer, chosen, corrections, hindsight_config=hindsight, skills_config=skills,
                                   max_length=limit, chat_template_kwargs=cfg.chat_template_kwargs, seed=cfg.seed + 13)

    def _sft_epoch(self, examples: list[SFTExample], rng) -> float:
        """One pass over the examples in shuffled micro-batches of about `sft_batch_tokens` padded
        tokens (packed and plain ones in separate batches); returns the epoch's token-mean loss."""
        cfg = self.config
        lengths = [x.length for x in examples]
        batches: list[list[SFTExample]] = []
        for packed in (False, True):
            idx = [i for i, x in enumerate(examples) if x.packed == packed]
            batches += [[examples[idx[j]] for j in batch] for batch in micro_batches([lengths[i] for i in idx], cfg.sft_batch_tokens)]
        total, count = 0.0, 0
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        device = self.model.device
        for b in rng.permutation(len(batches)):
            chosen = batches[b]
            width = max(x.length for x in chosen)
            ids = torch.full((len(chosen), width), int(pad), dtype=torch.long)
            valid = torch.zeros((len(chosen), width), dtype=torch.bool)
            mask = torch.zeros((len(chosen), width), dtype=torch.bool)
            for j, x in enumerate(chosen):
                ids[j, : x.length], valid[j, : x.length], mask[j, : x.length] = x.ids, True, x.target
            positions = None
            if chosen[0].packed:  # the teacher's packed layout: a block-causal 4-D mask and position ids
                positions = torch.zeros((len(chosen), width), dtype=torch.long)
                segment = torch.full((len(chosen), width), -1, dtype=torch.long)
                prefix = torch.zeros((len(chosen), width), dtype=torch.long)
                for j, x in enumerate(chosen):
                    positions[j, : x.length], segment[j, : x.length], prefix[j, : x.length] = x.positions, x.segment, x.prefix
                dtype = next(self.model.parameters()).dtype
                attention = block_causal_mask(segment.to(device), prefix.to(device), valid.to(device), dtype)
                positions = positions.to(device)
            else:
                attention = valid.to(torch.long).to(device)
            # Plain rows share their start (instructions, first observation): it runs once per batch.
            lp = token_logprobs(self.model, ids.to(device), attention, mask.to(device), position_ids=positions,
                                share_prefix=positions is None)
            n = mask.sum().clamp(min=1)
            loss = -(lp * mask.to(device)).sum() / n.to(device)
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.max_grad_norm)
            self.optimizer.step()
            total += loss.item() * int(n)
            count += int(n)
        return total / max(1, count)

    # -- one RL update ----------------------------------------------------------------------

    def rollout(self) -> list[Episode]:
        cfg = self.config
        seeds = self.rng.integers(0, 2**31 - 1, size=cfg.tasks_per_step)
        requests = [
            EpisodeRequest(seed=int(s), episode_id=f"u{self.step + 1}-t{j}-g{i}", group=f"u{self.step + 1}-t{j}")
            for j, s in enumerate(seeds)
            for i in range(cfg.group_size)
        ]
        episodes = run_episodes(
            self.make_env, self._rollout_agent, requests, num_envs=cfg.num_envs or len(requests),
            context=cfg.context, progress=f"rollout {self.step + 1}" if self.progress else False,
        )
        self._rollout_agent.annotate(episodes)
        return episodes

    def rl_step(self) -> dict[str, Any]:
        started = time.perf_counter()
        agent = self._rollout_agent
        episodes = self.rollout()
        rollout_stats = agent.pop_stats()
        rollout_seconds = time.perf_counter() - started
        save_episodes(self.out / "episodes" / f"update_{self.step + 1:05d}.jsonl", episodes)
        for hook in self.hooks["after_rollout"]:
            hook(self, episodes)

        t0 = time.perf_counter()
        played = [e for e in episodes if e.error is None]  # an env failure has no outcome to learn from
        if not played:
            raise TrainError(f"update {self.step + 1}: every episode failed; the first: {episodes[0].error}")
        rows = self.rows(played)
        old_logp = self.logprobs(self.model, rows)
        consistency = sampling_consistency(rows, old_logp)
        advantages, diagnostics, extra = self.advantages(played, rows, old_logp)
        if self.config.credit_records:  # what this update gives each turn, for the report (trainer.credit_records)
            from trainer.credit_records import update_credit_records

            append_jsonl(self.out / "credit.jsonl", update_credit_records(
                played, rows, self.last_credit, method=self.config.method, update=self.step + 1, tokenizer=self.tokenizer))
        scoring_seconds = time.perf_counter() - t0
        ref_logp = self.logprobs(self.reference_model, rows) if self.reference_model is not None else None

        t1 = time.perf_counter()
        update = self.update(rows, old_logp, advantages, ref_logp)
        update_seconds = time.perf_counter() - t1
        self.step += 1
        if self.teacher_model is not None and self.step % self.credit.teacher_refresh == 0:
            self.teacher_model.load_state_dict(self.model.state_dict())

        n = len(episodes)
        record = {
            "kind": "train",
            "step": self.step,
            "train/success": sum(e.success for e in episodes) / max(1, n),
            "train/reward": float(np.mean([e.total_reward for e in episodes])) if n else 0.0,
            "train/turns": float(np.mean([e.num_turns for e in episodes])) if n else 0.0,
            "train/invalid_rate": sum(e.invalid_turns for e in episodes) / max(1, sum(e.num_turns for e in episodes)),
            "train/errors": sum(1 for e in episodes if e.error),
            **update,
            **diagnostics,
            **extra,
            "rollout/new_tokens": rollout_stats["new_tokens"],
            "rollout/capped_turns": rollout_stats["capped_turns"],
            "rows/count": rows.num_rows,
            "rows/tokens": rows.num_tokens,
            "rows/truncated": rows.truncated_rows,
            **consistency,
            "rollout/tokens_per_s": rollout_stats["new_tokens"] / max(1e-9, rollout_seconds),
            "time/rollout_s": rollout_seconds,
            "time/scoring_s": scoring_seconds,
            "time/update_s": update_seconds,
            "time/step_s": time.perf_counter() - started,
        }
        self.log(record)
        for hook in self.hooks["after_update"]:
            hook(self, record)
        return record

    @property
    def credit(self):
        if getattr(self, "_credit", None) is None:
            self._credit = self.config.credit_config()
        return self._credit

    def teacher_scores(self, episodes, rows, *, strategy: str = "auto"):
        """The teacher's log-probs with privileged context (`trainer.teacher.score_teacher`), or None
        for GRPO and GiGPO."""
        if not self.credit.needs_teacher:
            return None
        from trainer.teacher import score_teacher

        return score_teacher(self.teacher(), self.tokenizer, list(episodes), rows, self.credit, strategy=strategy,
                             micro_batch_tokens=self.config.micro_batch_tokens, temperature=self._train_temperature())

    def advantages(self, episodes, rows, old_logp, scores=None) -> tuple[torch.Tensor, dict[str, Any], dict[str, Any]]:
        """Per-token advantages from the credit core (`compute_advantages`), its diagnostics, and
        extra metrics (the teacher's cost). `scores`: the teacher's, when already computed. The
        call's intermediates (`CreditParts`) are kept in `self.last_credit` for the credit records."""
        from trainer.credit import compute_advantages

        extra: dict[str, Any] = {}
        if scores is None and self.credit.needs_teacher:
            t0 = time.perf_counter()
            scores = self.teacher_scores(episodes, rows)
            extra["time/teacher_s"] = time.perf_counter() - t0
        teacher: dict[str, Any] = {}
        if scores is not None:
            teacher = {"teacher_logprobs": scores.logprobs, "teacher_scored": scores.scored,
                       "teacher_truncated": scores.truncated}
            extra.update(scores.stats())
        batch = rows.credit_batch(student_logprobs=old_logp, **teacher)
        advantages, diagnostics, self.last_credit = compute_advantages(batch, self.credit, self.step, return_parts=True)
        return advantages, diagnostics, extra

    def learning_rate(self, update: int) -> float:
        """The RL learning rate of update number `update` (1-based)."""
        cfg = self.config
        if cfg.lr_schedule == "linear" and cfg.steps > 0:
            return cfg.lr * max(0.0, cfg.steps - update + 1) / cfg.steps
        return cfg.lr

    def update(self, rows, old_logp: torch.Tensor, advantages: torch.Tensor, ref_logp: torch.Tensor | None) -> dict[str, float]:
        """`ppo_epochs` passes over the batch, each split into `mini_batches` random mini-batches of rows;
        each mini-batch is one optimizer step (its micro-batches accumulate gradients; the loss is the
        token mean over the mini-batch). The first mini-batch of the first pass is on-policy (ratio 1);
        later ones are off-policy by the steps before them, which the ratio clip bounds."""
        cfg = self.config
        mask_all = rows.turn_id >= 0
        if int(mask_all.sum()) == 0:
            return {"loss": 0.0, "pg_loss": 0.0, "kl_ref": 0.0, "clip_frac": 0.0, "grad_norm": 0.0, "ratio_mean": 1.0,
                    "entropy": 0.0, "optimizer_steps": 0, "update/tokens": 0, "update/tokens_per_s": 0.0}
        started = time.perf_counter()
        lr = self.learning_rate(self.step + 1)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        totals = dict.fromkeys(("pg", "kl", "clipped", "ratio", "entropy", "tokens", "grad_norm"), 0.0)
        steps = 0
        shuffle = torch.Generator().manual_seed(cfg.seed * 1_000_003 + self.step)
        for _ in range(cfg.ppo_epochs):
            order = torch.randperm(rows.num_rows, generator=shuffle).tolist()
            parts = max(1, min(cfg.mini_batches, rows.num_rows))
            for part in range(parts):
                members = sorted(order[part::parts])
                n_tokens = int(mask_all[members].sum())
                if n_tokens == 0:
                    continue
                self.optimizer.zero_grad(set_to_none=True)
                lengths = rows.attention_mask[members].sum(-1).tolist()
                for local in micro_batches(lengths, cfg.micro_batch_tokens):
                    index = [members[i] for i in local]
                    mb = self._slice(rows, index)
                    width = mb["input_ids"].shape[1]
                    idx = torch.tensor(index)
                    old = old_logp[idx, :width].to(self.model.device)
                    adv = advantages[idx, :width].to(self.model.device, torch.float32)
                    mask = mb["generated"]
                    new, entropy = token_logprobs(self.model, mb["input_ids"], mb["attention_mask"], mask,
                                                  temperature=self._train_temperature(), with_entropy=True,
                                                  share_prefix=True)
                    pg, clipped, ratio = clipped_pg_loss(new, old, adv, mask, cfg.clip_eps)
                    loss = pg / n_tokens
                    if ref_logp is not None:
                        kl = (kl_k3(new, ref_logp[idx, :width].to(self.model.device)) * mask).sum()
                        loss = loss + cfg.kl_coef * kl / n_tokens
                        totals["kl"] += float(kl.detach())
                    loss.backward()
                    totals["pg"] += float(pg.detach())
                    totals["clipped"] += float(clipped)
                    totals["ratio"] += float(ratio)
                    totals["entropy"] += float((entropy * mask).sum())
                    totals["tokens"] += int(mask.sum())
                totals["grad_norm"] += float(torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.max_grad_norm))
                self.optimizer.step()
                steps += 1
        n = max(1.0, totals["tokens"])
        stats = {
            "loss": (totals["pg"] + cfg.kl_coef * totals["kl"]) / n,
            "pg_loss": totals["pg"] / n,
            "kl_ref": totals["kl"] / n,
            "clip_frac": totals["clipped"] / n,
            "ratio_mean": totals["ratio"] / n,
            "entropy": totals["entropy"] / n,
            "grad_norm": totals["grad_norm"] / max(1, steps),
            "optimizer_steps": steps,
            "lr": lr,
        }
        processed = int(totals["tokens"])
        n_tokens = int(mask_all.sum())
        # How far the update moved the policy: KL(old || new) on the batch, k3 estimator (>= 0), over
        # the tokens of every 4th micro-batch (a quarter of the cost of a full extra forward pass).
        kl_num = kl_den = 0.0
        with torch.no_grad():
            for index in self._batches(rows)[::4]:
                mb = self._slice(rows, index)
                width = mb["input_ids"].shape[1]
                new = token_logprobs(self.model, mb["input_ids"], mb["attention_mask"], mb["generated"],
                                     temperature=self._train_temperature(), share_prefix=True)
                old = old_logp[torch.tensor(index), :width].to(new.device)
                kl_num += float((kl_k3(old, new) * mb["generated"]).sum())  # samples come from old
                kl_den += float(mb["generated"].sum())
        stats["kl_old_new"] = kl_num / max(1.0, kl_den)
        stats["update/tokens"] = n_tokens
        stats["update/tokens_per_s"] = processed / max(1e-9, time.perf_counter() - started)
        return stats

    # -- evaluation -------------------------------------------------------------------------

    def evaluate(self) -> dict[str, Any]:
        """The held-out panel: `eval_seeds` (else eval_seed .. eval_seed + n - 1) on the eval env,
        sampled with a generator of its own (the training RNG streams are untouched); success per subset."""
        cfg = self.config
        agent = self.agent(temperature=cfg.eval_temperature, seed=cfg.seed + 12345, name=f"{cfg.method}@{self.step}")
        seeds = list(cfg.eval_seeds) if cfg.eval_seeds else [cfg.eval_seed + i for i in range(cfg.eval_episodes)]
        requests = [EpisodeRequest(seed=int(s), episode_id=f"eval{self.step}-{i}") for i, s in enumerate(seeds)]
        started = time.perf_counter()
        episodes = run_episodes(
            self.make_eval_env, agent, requests, num_envs=cfg.num_envs or min(64, len(requests)), context=cfg.context,
            progress=f"eval @ {self.step}" if self.progress else False,
        )
        save_episodes(self.out / "episodes" / f"eval_{self.step:05d}.jsonl", episodes)
        summary = summarize(episodes, env_id=cfg.env_id, agent=agent.name)
        record = {
            "kind": "eval",
            "step": self.step,
            "eval/success": summary["success_rate"],
            "eval/score": summary["mean_score"],
            "eval/turns": summary["mean_turns"],
            "eval/invalid_rate": summary["invalid_rate"],
            "eval/seconds": time.perf_counter() - started,
            **{f"eval/success/{t}": s["success_rate"] for t, s in summary["by_task_type"].items()},
        }
        self.log(record)
        self.evaluated_steps.add(self.step)
        self._last_eval = summary
        if self.progress:
            tqdm.write(format_table(summary))
        return record

    # -- logging ----------------------------------------------------------------------------

    def log(self, record: dict[str, Any]) -> None:
        clean = {k: (float(v) if isinstance(v, (np.floating, torch.Tensor)) else v) for k, v in record.items()}
        clean["time"] = time.time()
        append_jsonl(self.out / "metrics.jsonl", [clean])
        writer = self._tb()
        if writer is not None:
            for key, value in clean.items():
                if key not in ("step", "time", "kind") and isinstance(value, (int, float)) and math.isfinite(value):
                    writer.add_scalar(key, value, clean["step"])

    def _tb(self):
        if self._writer is None:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:  # tensorboard missing: JSONL and plots still record everything
                return None
            self._writer = SummaryWriter(str(self.out / "tb"), purge_step=self.step + 1 if self.step else None)
        return self._writer

    # -- checkpoints ------------------------------------------------------------------------

    def save_checkpoint(self) -> None:
        """model, optimizer, teacher snapshot, KL reference, RNG states and progress, in one file
        written atomically (a crash leaves the previous checkpoint)."""
        write_checkpoint(self.out, {
            "format": 1,
            "config": self.config.to_dict(),
            "step": self.step,
            "sft_done": self.sft_done,
            "evaluated_steps": sorted(self.evaluated_steps),
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "teacher": None if self.teacher_model is None else self.teacher_model.state_dict(),
            "reference": None if self.reference_model is None else self.reference_model.state_dict(),
            "rng": {
                "trainer": self.rng.bit_generator.state,
                **rng_states(),
                "rollout_agent": self._rollout_agent.state_dict() if self._agent is not None else None,
            },
        })

    def _load_run(self) -> None:
        state = read_checkpoint(self.out)
        saved = TrainConfig.from_dict(state["config"])
        changed = {k for k, v in saved.to_dict().items() if getattr(self.config, k) != v} - RESUMABLE_CHANGES
        if changed:
            raise TrainError(
                f"--resume: the run in {self.out} was started with other settings ({', '.join(sorted(changed))}); "
                "resume with the same settings, or start a new run with another --out"
            )
        cfg = self.config
        if cfg.model == "tiny":
            self.model, self.tokenizer = load_policy(str(self.out / "init"), device=cfg.device, dtype=cfg.dtype)
        else:
            self.model, self.tokenizer = load_policy(cfg.model, device=cfg.device, dtype=cfg.dtype)
        self.model.load_state_dict(state["model"])
        self.step = int(state["step"])
        self.sft_done = bool(state["sft_done"])
        self.evaluated_steps = set(state["evaluated_steps"])
        if self.sft_done:
            self._init_rl_models()
            if state["teacher"] is not None:
                self.teacher_model.load_state_dict(state["teacher"])
            if state["reference"] is not None:
                self.reference_model.load_state_dict(state["reference"])
        self._make_optimizer(cfg.lr if self.sft_done else cfg.sft_lr)
        self.optimizer.load_state_dict(state["optimizer"])
        rng = state["rng"]
        self.rng.bit_generator.state = rng["trainer"]
        restore_rng_states(rng)
        if rng["rollout_agent"] is not None:
            self._rollout_agent.load_state_dict(rng["rollout_agent"])
        self._truncate_metrics()

    def _truncate_metrics(self) -> None:
        """Drop what a killed run logged after its last checkpoint (it will be redone): metrics, and
        the credit records of updates after it."""
        path = self.out / "metrics.jsonl"
        if path.exists():
            keep = []
            for _, record in read_jsonl_numbered(path, skip_torn_lines=True):
                step = int(record.get("step", 0))
                if step < self.step or (step == self.step and self._logged_before_checkpoint(record)):
                    keep.append(record)
            atomic_write_text(path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in keep))
        credit = self.out / "credit.jsonl"
        if credit.exists():
            kept = [r for _, r in read_jsonl_numbered(credit, skip_torn_lines=True) if int(r.get("update", 0)) <= self.step]
            atomic_write_text(credit, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in kept))

    def _logged_before_checkpoint(self, record: dict[str, Any]) -> bool:
        kind = record.get("kind")
        if kind == "eval":
            return self.step in self.evaluated_steps
        if kind in ("sft", "sft_done"):
            return self.sft_done
        return True

    _agent: HFPolicyAgent | None = None

    @property
    def _rollout_agent(self) -> HFPolicyAgent:
        if self._agent is None:
            self._agent = self.agent(temperature=self.config.temperature, seed=self.config.seed, name=f"{self.config.method}")
        return self._agent


def train(config: TrainConfig, *, resume: bool = False, progress: bool = True) -> dict[str, Any]:
    """Run (or resume) a training run; returns its report."""
    return LocalTrainer(config, resume=resume, progress=progress).run()
