"""The local trainer: warm-start a policy on expert episodes, then improve it with per-turn credit.

One process, one device (CPU here, one CUDA GPU in bf16 where present). The warm start is
`trainer.warm_start.sft`; then each update (`LocalTrainer.rl_step`):

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
       micro-batches that accumulate into one optimizer step (`trainer.loss.ppo_update`), at the
       update's learning rate (`trainer.optim`).

Evaluation runs every `eval_every` updates on a held-out panel (fixed seeds, its own env options),
success per subset. The run's state between updates is a `trainer.run_state.RunState`. The run directory
holds config.json, metrics.jsonl, TensorBoard events, episodes, an atomic checkpoint of that state
(`trainer.checkpoint`: model, optimizer, RNG states, step, teacher snapshot),
learning curves as PNG, the final model (`model/`, loadable as `hf:OUT/model`) and report.json.
`resume=True` continues from the checkpoint and reaches the same state as a run that was never stopped.
"""

from __future__ import annotations

import argparse
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
from agentgym_opsd.io import append_jsonl, atomic_directory, atomic_write_json, read_jsonl_numbered
from agentgym_opsd.rollout import EpisodeRequest, run_episodes
from agentgym_opsd.summary import format_table, summarize
from agentgym_opsd.usage import UsageError, make_env_factory
from trainer.checkpoint import CHECKPOINT, load_checkpoint, save_checkpoint
from trainer.config import TrainConfig, TrainError
from trainer.credit import compute_advantages
from trainer.credit_records import update_credit_records
from trainer.forward import row_logprobs
from trainer.loss import ppo_update
from trainer.memory import PhasePeaks
from trainer.optim import rl_learning_rate, set_learning_rate
from trainer.plots import plot_run
from trainer.policy import PolicyLoadError, TinyModelSpec, load_policy, parameter_count
from trainer.run_state import (
    RunState,
    begin_rl,
    compute_context,
    policy_agent,
    policy_rows,
    rollout_agent,
    sampling_context,
    trainable_policy,
)
from trainer.sampling import HFPolicyAgent
from trainer.teacher import score_teacher
from trainer.train_cli import config_from_args
from trainer.trainable import merged_for_saving
from trainer.warm_start import expert_episodes, sft

__all__ = ["LocalTrainer", "TrainConfig", "TrainError", "run_from_args", "sampling_consistency", "train"]


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


class LocalTrainer:
    """A training run in `config.out` (see the module docstring). Its state between updates is
    `self.state` (`trainer.run_state.RunState`: the policy, optimizer, frozen copies, RNG, progress),
    which `trainer.checkpoint` saves and loads; None until `setup`."""

    def __init__(self, config: TrainConfig, *, resume: bool = False, progress: bool = True) -> None:
        config.validate()
        self.config = config
        self.out = Path(config.out)
        self.progress = progress
        if not progress:  # transformers' own bars (loading and writing weights) too
            from transformers.utils import logging as hf_logging

            hf_logging.disable_progress_bar()
        self.resume = resume
        self.state: RunState | None = None
        self.hooks: dict[str, list[Callable[..., None]]] = {"after_rollout": [], "after_update": []}
        self.credit = config.credit_config()  # the method, the env family's defaults and `--credit` overrides
        self.last_credit = None  # the last update's `CreditParts` (for the credit records)
        self._writer = None

    # -- set-up: the policy, or the state a checkpoint left ----------------------------------

    def setup(self) -> None:
        cfg = self.config
        if cfg.cpu_threads > 0 and not str(cfg.device).startswith("cuda"):
            torch.set_num_threads(cfg.cpu_threads)
        self.out.mkdir(parents=True, exist_ok=True)
        ckpt = self.out / CHECKPOINT
        if ckpt.exists() and not self.resume:
            raise TrainError(
                f"{self.out} already holds a run ({CHECKPOINT}); pass --resume to continue it or use a new --out"
            )
        if self.resume and ckpt.exists():
            self.state = load_checkpoint(self.out, cfg)
            return
        torch.manual_seed(cfg.seed)
        random.seed(cfg.seed)
        model, tokenizer = self._init_policy()
        self.state = RunState(model=model, tokenizer=tokenizer, rng=np.random.default_rng(cfg.seed))
        atomic_write_json(self.out / "config.json", cfg.to_dict())
        if (self.out / "metrics.jsonl").exists():
            (self.out / "metrics.jsonl").unlink()

    def _init_policy(self):
        cfg = self.config
        corpus = None
        if cfg.model == "tiny" and cfg.tokenizer in ("trained", "auto"):
            corpus = self._tokenizer_corpus()
        heads = max(4, cfg.tiny_hidden // 64)  # head_dim 16 for the tiny sizes, 64 from hidden 256 up
        spec = TinyModelSpec(hidden_size=cfg.tiny_hidden, num_hidden_layers=cfg.tiny_layers, num_attention_heads=heads,
                             num_key_value_heads=max(1, heads // 2), head_dim=cfg.tiny_hidden // heads,
                             intermediate_size=4 * cfg.tiny_hidden)
        model, tokenizer = load_policy(
            cfg.model, tokenizer=cfg.tokenizer, corpus=corpus, vocab_size=cfg.vocab_size, seed=cfg.seed,
            device=cfg.device, dtype=cfg.dtype, tiny=spec,
        )
        if cfg.model == "tiny":  # the tokenizer (perhaps trained just now) and architecture, for resume and eval
            with atomic_directory(self.out / "init") as tmp:
                model.save_pretrained(tmp)
                tokenizer.save_pretrained(tmp)
        return trainable_policy(model, cfg), tokenizer

    def compute(self):
        """The context the run's forward and backward passes run in (`trainer.run_state.compute_context`)."""
        return compute_context(self.config, self.state.model)

    def _tokenizer_corpus(self) -> list[str]:
        """Text to train a tokenizer on: the env's instructions and the turns of expert episodes (or
        random ones when the env has no expert)."""
        episodes, _ = expert_episodes(self.config, self.make_env, max(16, min(self.config.sft_episodes, 64)),
                                      progress="tokenizer corpus" if self.progress else False)
        texts: list[str] = []
        for e in episodes:
            texts += [e.instructions, e.initial_observation]
            for t in e.turns:
                texts += [t.response, t.observation]
                texts += list(t.step.admissible_actions or [])
        return texts

    def make_env(self):
        return agentgym_opsd.make(self.config.env_id, **self.config.env_options)

    def make_eval_env(self):
        return agentgym_opsd.make(self.config.env_id, **{**self.config.env_options, **self.config.eval_env_options})

    # -- the run ----------------------------------------------------------------------------

    def run(self) -> dict[str, Any]:
        """SFT warm start (if asked and not done), evaluation before RL, the RL updates with periodic
        evaluation and checkpoints, then the final evaluation, model, plots and report."""
        self.start()
        cfg, state = self.config, self.state
        if 0 not in state.evaluated_steps and cfg.eval_episodes > 0 and cfg.eval_before:
            self.evaluate()
            self._checkpoint()
        bar = tqdm(total=cfg.steps, initial=state.step, desc=f"{cfg.method} updates", unit="upd",
                   disable=not self.progress)
        try:
            while state.step < cfg.steps:
                record = self.rl_step()
                bar.update(1)
                bar.set_postfix(success=f"{record['train/success']:.2f}", loss=f"{record['loss']:.3f}")
                due_eval = cfg.eval_every > 0 and state.step % cfg.eval_every == 0
                if (due_eval or state.step == cfg.steps) and cfg.eval_episodes > 0:
                    self.evaluate()
                if cfg.save_every > 0 and (state.step % cfg.save_every == 0 or state.step == cfg.steps):
                    save_checkpoint(self.out, cfg, state)
        finally:
            bar.close()
        return self.finish()

    def start(self) -> None:
        """Set the run up (or load it back) and warm-start the policy: after this, `rl_step` trains."""
        self.setup()
        state = self.state
        if not state.sft_done:
            if self.config.sft_episodes > 0:
                for record in sft(self.config, state.model, state.tokenizer, make_env=self.make_env, out=self.out,
                                  progress=self.progress):
                    self.log(record)
            begin_rl(state, self.config)
            self._checkpoint()

    def _checkpoint(self) -> None:
        if self.config.save_every > 0:
            save_checkpoint(self.out, self.config, self.state)

    def rl_step(self) -> dict[str, Any]:
        state = self.state
        started = time.perf_counter()
        peaks = PhasePeaks()  # each phase's resident high-water mark, from its own start
        episodes = self.rollout()
        rollout_stats = state.rollout_agent.pop_stats()
        rollout_seconds = time.perf_counter() - started
        peaks.end("rollout")
        save_episodes(self.out / "episodes" / f"update_{state.step + 1:05d}.jsonl", episodes)
        for hook in self.hooks["after_rollout"]:
            hook(self, episodes)

        t0 = time.perf_counter()
        played = [e for e in episodes if e.error is None]  # an env failure has no outcome to learn from
        if not played:
            raise TrainError(f"update {state.step + 1}: every episode failed; the first: {episodes[0].error}")
        rows = self.rows(played)
        old_logp = self.logprobs(state.model, rows)
        consistency = sampling_consistency(rows, old_logp)
        advantages, diagnostics, extra = self.advantages(played, rows, old_logp)
        if self.config.credit_records:  # what this update gives each turn, for the report (trainer.credit_records)
            records = update_credit_records(played, rows, self.last_credit, method=self.config.method,
                                            update=state.step + 1, tokenizer=state.tokenizer)
            append_jsonl(self.out / "credit.jsonl", records)
        scoring_seconds = time.perf_counter() - t0
        ref_logp = self.logprobs(state.reference_model, rows) if state.reference_model is not None else None
        peaks.end("scoring")  # old log-probs, the teacher's forwards, the reference's

        t1 = time.perf_counter()
        update = self.update(rows, old_logp, advantages, ref_logp)
        update_seconds = time.perf_counter() - t1
        peaks.end("update")
        state.step += 1
        if state.teacher_model is not None and state.step % self.credit.teacher_refresh == 0:
            state.teacher_model.load_state_dict(state.model.state_dict())

        n = len(episodes)
        record = {
            "kind": "train",
            "step": state.step,
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
        record.update(peaks.record())  # the update's resident high-water mark, and each phase's

        self.log(record)
        for hook in self.hooks["after_update"]:
            hook(self, record)
        return record

    def finish(self) -> dict[str, Any]:
        state = self.state
        with atomic_directory(self.out / "model") as tmp:  # `hf:OUT/model` is whole or absent, adapters merged
            merged_for_saving(state.model).save_pretrained(tmp)
            state.tokenizer.save_pretrained(tmp)
        evals = [r for _, r in read_jsonl_numbered(self.out / "metrics.jsonl") if r.get("kind") == "eval"]
        report = {
            "env_id": self.config.env_id,
            "method": self.config.method,
            "steps": state.step,
            "parameters": parameter_count(state.model),
            "eval": [{k: v for k, v in r.items() if k.startswith("eval/") or k == "step"} for r in evals],
            "success_before": evals[0]["eval/success"] if evals else None,
            "success_after": evals[-1]["eval/success"] if evals else None,
        }
        atomic_write_json(self.out / "report.json", report)
        plot_run(self.out)
        if self._writer is not None:
            self._writer.flush()
        return report

    # -- one update, in order: rollout, rows, log-probs, teacher, advantages, update ----------

    def agent(self, *, temperature: float, seed: int | None = None, name: str = "policy") -> HFPolicyAgent:
        """The policy as an agent (`trainer.run_state.policy_agent`)."""
        return policy_agent(self.state.model, self.state.tokenizer, self.config, temperature=temperature, seed=seed,
                            name=name)

    def rollout(self) -> list[Episode]:
        cfg, state = self.config, self.state
        if state.rollout_agent is None:
            state.rollout_agent = rollout_agent(state.model, state.tokenizer, cfg)
        update = state.step + 1
        if cfg.train_seeds:  # a fixed list of tasks, T per update in order
            first = state.step * cfg.tasks_per_step
            seeds = [cfg.train_seeds[(first + j) % len(cfg.train_seeds)] for j in range(cfg.tasks_per_step)]
        else:
            seeds = state.rng.integers(0, 2**31 - 1, size=cfg.tasks_per_step)
        requests = [
            EpisodeRequest(seed=int(s), episode_id=f"u{update}-t{j}-g{i}", group=f"u{update}-t{j}")
            for j, s in enumerate(seeds)
            for i in range(cfg.group_size)
        ]
        with sampling_context(cfg, state.rollout_agent):
            episodes = run_episodes(
                self.make_env, state.rollout_agent, requests, num_envs=cfg.num_envs or len(requests),
                context=cfg.context, progress=f"rollout {update}" if self.progress else False,
            )
        state.rollout_agent.annotate(episodes)
        return episodes

    def rows(self, episodes: Sequence[Episode]):
        """Token rows of finished episodes (`trainer.run_state.policy_rows`), cut at the model's context."""
        return policy_rows(self.config, self.state.model, self.state.tokenizer, episodes,
                           span_mode=self.credit.span_mode)

    def logprobs(self, model, rows) -> torch.Tensor:
        """[R, T] log-probs of the generated tokens under `model` (0 elsewhere), no grad, at the
        rollout's temperature: the one scoring path the teacher uses too (`trainer.forward`)."""
        with self.compute():
            return row_logprobs(model, rows, micro_batch_tokens=self.config.micro_batch_tokens,
                                temperature=self._train_temperature())

    def _train_temperature(self) -> float:
        return self.config.temperature if self.config.temperature > 0 else 1.0

    def teacher(self):
        """The model that scores with privileged context: the live policy or the snapshot."""
        return self.state.model if self.state.teacher_model is None else self.state.teacher_model

    def teacher_scores(self, episodes, rows, *, strategy: str = "auto"):
        """The teacher's log-probs with privileged context (`trainer.teacher.score_teacher`), or None
        for GRPO and GiGPO."""
        if not self.credit.needs_teacher:
            return None
        with self.compute():
            return score_teacher(self.teacher(), self.state.tokenizer, list(episodes), rows, self.credit,
                                 strategy=strategy,
                                 micro_batch_tokens=self.config.micro_batch_tokens,
                                 temperature=self._train_temperature())

    def advantages(self, episodes, rows, old_logp, scores=None) -> tuple[torch.Tensor, dict[str, Any], dict[str, Any]]:
        """Per-token advantages from the credit core (`compute_advantages`), its diagnostics, and
        extra metrics (the teacher's cost). `scores`: the teacher's, when already computed. The
        call's intermediates (`CreditParts`) are kept in `self.last_credit` for the credit records."""
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
        advantages, diagnostics, self.last_credit = compute_advantages(batch, self.credit, self.state.step,
                                                                       return_parts=True)
        return advantages, diagnostics, extra

    def update(self, rows, old_logp: torch.Tensor, advantages: torch.Tensor,
               ref_logp: torch.Tensor | None) -> dict[str, float]:
        """The clipped policy-gradient update on this batch (`trainer.loss.ppo_update`): `ppo_epochs`
        passes, each `mini_batches` optimizer steps, at this update's learning rate (`trainer.optim`)."""
        state = self.state
        set_learning_rate(state.optimizer, rl_learning_rate(self.config, state.step + 1))
        with self.compute():
            return ppo_update(state.model, state.optimizer, rows, old_logp, advantages, ref_logp, config=self.config,
                              step=state.step, temperature=self._train_temperature())

    # -- evaluation and logging -------------------------------------------------------------

    def evaluate(self) -> dict[str, Any]:
        """The held-out panel: `eval_seeds` (else eval_seed .. eval_seed + n - 1) on the eval env,
        sampled with a generator of its own (the training RNG streams are untouched); success per subset."""
        cfg, step = self.config, self.state.step
        agent = self.agent(temperature=cfg.eval_temperature, seed=cfg.seed + 12345, name=f"{cfg.method}@{step}")
        seeds = list(cfg.eval_seeds) if cfg.eval_seeds else [cfg.eval_seed + i for i in range(cfg.eval_episodes)]
        requests = [EpisodeRequest(seed=int(s), episode_id=f"eval{step}-{i}") for i, s in enumerate(seeds)]
        started = time.perf_counter()
        with sampling_context(cfg, agent):
            episodes = run_episodes(
                self.make_eval_env, agent, requests, num_envs=cfg.num_envs or min(64, len(requests)),
                context=cfg.context, progress=f"eval @ {step}" if self.progress else False,
            )
        save_episodes(self.out / "episodes" / f"eval_{step:05d}.jsonl", episodes)
        summary = summarize(episodes, env_id=cfg.env_id, agent=agent.name)
        record = {
            "kind": "eval",
            "step": step,
            "eval/success": summary["success_rate"],
            "eval/score": summary["mean_score"],
            "eval/turns": summary["mean_turns"],
            "eval/invalid_rate": summary["invalid_rate"],
            "eval/seconds": time.perf_counter() - started,
            **{f"eval/success/{t}": s["success_rate"] for t, s in summary["by_task_type"].items()},
        }
        self.log(record)
        self.state.evaluated_steps.add(step)
        if self.progress:
            tqdm.write(format_table(summary))
        return record

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
            step = self.state.step
            self._writer = SummaryWriter(str(self.out / "tb"), purge_step=step + 1 if step else None)
        return self._writer


def train(config: TrainConfig, *, resume: bool = False, progress: bool = True) -> dict[str, Any]:
    """Run (or resume) a training run; returns its report."""
    return LocalTrainer(config, resume=resume, progress=progress).run()


def run_from_args(args: argparse.Namespace) -> int:
    """Run `agentgym-opsd train` (its arguments: `trainer.train_cli.train_arguments`)."""
    config = config_from_args(args)
    try:
        config.validate()
        make_env_factory(config.env_id, config.env_options)  # unknown id or bad options: one line, now
        report = LocalTrainer(config, resume=args.resume, progress=args.progress).run()
    except (TrainError, PolicyLoadError) as e:
        raise UsageError(f"train: {e}") from None
    before, after = report.get("success_before"), report.get("success_after")
    if before is not None:
        print(f"held-out success: {100 * before:.1f}% before RL -> {100 * after:.1f}% after {report['steps']} updates")
    print(f"wrote {config.out} (metrics.jsonl, curves/, model/, report.json)")
    return 0
