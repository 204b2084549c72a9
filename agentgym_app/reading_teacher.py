"""What a teacher that reads does: the demo's real-model credit section.

The tiny policy the demo trains cannot read a hindsight block or a skill note, so its StepOPSD credit
says little about the method. Here the real model, `smollm2-135m` (SmolLM2-135M-Instruct, no warm
start), is student and live teacher at once on a handful of ALFWorld Pick episodes of the expert with
random detours (`trainer.warm_start.PerturbedExpert`, as `benchmarks/credit_quality.py` plays them), and
each turn gets its StepOPSD and AgentOPSD credit (`trainer.credit_pass.credit_pass`, the same steps an
update takes). The report draws that credit as it draws the training credit (the heat map and the
per-turn credit table of the trajectory viewer) and gives the within-episode AUC of those episodes
(`trainer.credit_auc`, the benchmark's implementation): does the credit rank the expert's turns (the
env's label: the turn shortened the expert's remaining plan) above the detours?

`run_reading_teacher(folder, env_options)` writes into `folder` (the demo's `OUT/reading_teacher`):
`episodes.jsonl` (with each episode's credit records in `meta["credit"]`) and `summary.json` (the AUC
table, sizes, seconds, load). A second run with the same settings reads them back. Without the model's
wheel it writes a `summary.json` that says so and how to install it, and the report shows that line.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

import agentgym_opsd
from agentgym_app.report.html import READING_TEACHER_FOLDER, READING_TEACHER_MODEL, READING_TEACHER_SOURCE
from agentgym_opsd.episode import save_episodes
from agentgym_opsd.io import atomic_write_json
from agentgym_opsd.rollout import EpisodeRequest, run_episodes
from trainer.credit_auc import EpisodeItems, interval, pooled_auc, resample_counts, within_auc
from trainer.credit_pass import credit_pass
from trainer.credit_records import CREDIT_KEY, update_credit_records
from trainer.env_knowledge import credit_config
from trainer.models import NamedModelError, resolve_model
from trainer.policy import load_hf_policy
from trainer.warm_start import PerturbedExpert

__all__ = ["FOLDER", "MODEL", "SOURCE", "ReadingTeacherSettings", "auc_table", "run_reading_teacher"]

# The report reads what this section writes: its folder (under the run folder), its model, and the
# trajectory viewer's group for its episodes are the report's.
MODEL = READING_TEACHER_MODEL
FOLDER = READING_TEACHER_FOLDER
SOURCE = READING_TEACHER_SOURCE
ENV = "agentgym/ALFWorld-Pick-v0"
METHODS = ("stepopsd", "agentopsd")


@dataclass(frozen=True)
class ReadingTeacherSettings:
    """The section's sizes: `tasks` x `group_size` episodes (a group of 4 per task, as the benchmark
    plays, so that most groups mix wins and losses and GRPO's episode advantage is not 0)."""

    tasks: int = 2
    group_size: int = 4
    detour: float = 0.5  # the expert's chance of a random detour per turn (the benchmark's ALFWorld rate)
    max_turns: int = 8
    seed: int = 0
    bootstrap: int = 1000
    threads: int = 1  # torch threads while it runs (restored after)


# (row label, method, what EpisodeItems gives, AUC kind): the rows of the AUC table.
ROWS = (
    ("StepOPSD token weights (w_t - 1, signed by A)", "stepopsd", "token_credit", "pooled"),
    ("StepOPSD evidence e_k (hindsight block)", "stepopsd", "evidence", "within"),
    ("AgentOPSD turn credit", "agentopsd", "turn_credit", "within"),
    ("AgentOPSD evidence e_k (skill note)", "agentopsd", "evidence", "within"),
)


def auc_table(items: dict[str, Any], episode_units: list[Any], *, bootstrap: int = 1000, seed: int = 0) -> list[dict]:
    """The AUC rows (`ROWS`) from each method's `trainer.credit_auc.EpisodeItems` (`items[method]`): per row
    the AUC of the episodes (within-episode pairs of an expert turn and a detour; token rows pool the
    action tokens that agree with the expert's action against those that depart from it), the number of
    episodes that have such a pair, and a 95% interval over `bootstrap` draws of `episode_units` (one per
    episode: what a draw resamples)."""
    n = len(episode_units)
    ones = np.ones((1, n), dtype=np.int64)
    draws = resample_counts(episode_units, bootstrap, np.random.default_rng(seed))
    table = []
    for label, method, field, kind in ROWS:
        if method not in items:
            continue
        values = getattr(items[method], field)
        fn = within_auc if kind == "within" else pooled_auc
        counted = sum(1 for v in values if v is not None and any(v[1]) and not all(v[1]))
        cell = interval(float(fn(values, ones)[0]), fn(values, draws), counted)
        table.append({"row": label, "method": method, "kind": kind, **cell})
    return table


def _load_cached(folder: Path, settings: dict) -> dict | None:
    path = folder / "summary.json"
    if not path.is_file() or not (folder / "episodes.jsonl").is_file():
        return None
    try:
        summary = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return summary if summary.get("settings") == settings and not summary.get("skipped") else None


def run_reading_teacher(folder: str | Path, env_options: dict[str, Any], settings: ReadingTeacherSettings | None = None,
                        *, model: str = MODEL, progress: bool = True) -> dict[str, Any]:
    """Play the episodes, compute their credit with `model` as student and teacher, write `episodes.jsonl`
    and `summary.json` into `folder`; returns the summary. `model`: a named model or a model folder.
    A missing model wheel is not an error: the summary says `skipped` and how to install it."""
    settings = settings or ReadingTeacherSettings()
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    key = {**asdict(settings), "model": str(model), "env": ENV,
           "env_options": {k: v for k, v in env_options.items() if k not in ("progress", "cache_dir")}}
    cached = _load_cached(folder, key)
    if cached is not None:
        return cached
    try:
        model_dir = resolve_model(model, progress=progress)  # converted once into the cache, then reused
    except NamedModelError as e:
        summary = {"skipped": f"{e} Then run the demo again.", "settings": key}
        atomic_write_json(folder / "summary.json", summary)
        return summary

    started, load_before = time.perf_counter(), os.getloadavg()
    threads = torch.get_num_threads()
    torch.set_num_threads(settings.threads)
    try:
        student, tokenizer = load_hf_policy(model_dir, device="cpu", dtype="float32")
        student.eval()
        options = {**env_options, "split": "train", "max_turns": settings.max_turns, "progress": False}
        make_env = lambda: agentgym_opsd.make(ENV, **options, turn_labels=True)  # noqa: E731
        requests = [EpisodeRequest(seed=t, episode_id=f"t{t}-g{i}", group=f"t{t}")
                    for t in range(settings.tasks) for i in range(settings.group_size)]
        episodes = run_episodes(make_env, PerturbedExpert(settings.detour, seed=settings.seed), requests,
                                num_envs=len(requests), context="full", progress=False)
        episodes = [e for e in episodes if e.error is None]
        if not episodes:
            raise RuntimeError(f"every {ENV} episode of the reading-teacher section failed")
        labels = {e.episode_id: e.hindsight.details["turn_labels"] for e in episodes}
        items, marks = {}, {}
        with torch.no_grad():
            for method in METHODS:
                config = credit_config(ENV, method, teacher_mode="live", decay_steps=0)
                rows, lp_student, parts = credit_pass(student, student, tokenizer, episodes, config)
                for e, record in zip(episodes, update_credit_records(episodes, rows, parts, method=method, update=None,
                                                                      tokenizer=tokenizer), strict=True):
                    e.meta.setdefault(CREDIT_KEY, {})[method] = {k: v for k, v in record.items()
                                                                  if k not in ("episode_id", "method")}
                items[method] = EpisodeItems(episodes, rows, lp_student, parts, tokenizer, labels, marks)
    finally:
        torch.set_num_threads(threads)
    table = auc_table(items, [e.episode_id for e in episodes], bootstrap=settings.bootstrap, seed=settings.seed)
    turns = [lab for e in episodes for lab in labels[e.episode_id]]
    summary = {
        "settings": key, "model": str(model), "env": ENV, "episodes": len(episodes),
        "successes": sum(bool(e.success) for e in episodes), "turns": len(turns),
        "expert_turns": sum(bool(lab["progress"]) for lab in turns), "auc": table,
        "seconds": round(time.perf_counter() - started, 1), "load": [load_before[0], os.getloadavg()[0]],
        "threads": settings.threads,
    }
    save_episodes(folder / "episodes.jsonl", episodes)
    atomic_write_json(folder / "summary.json", summary)
    return summary
