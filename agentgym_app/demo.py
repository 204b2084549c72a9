"""`agentgym-opsd demo` (`make demo`): the main job, on the embedded defaults only (no downloads).

1. Generate the ALFWorld panels (small rooms): the training games and the held-out games of the
   Pick subset (floor plans the training never saw), and a few valid_seen games of each task type.
2. Build the built-in Search-QA index (synthetic corpus) and start its retrieval server on loopback.
3. Warm-start a tiny Qwen3 (its tokenizer trained on the env's text) on expert episodes of the
   Pick training games, then train it further with GRPO and with StepOPSD side by side (same start,
   seeds and budget). The trainer records each update's per-turn credit for the report
   (`credit.jsonl`): the demo computes no credit of its own.
4. Benchmark expert, random and the three tiny policies (the warm start, and the models GRPO and
   StepOPSD trained from it) on the held-out Pick games (enough of them for a success interval that
   means something), on the six ALFWorld subsets and on Search-QA.
5. A teacher that reads: the real model (`smollm2-135m`, no warm start) as its own teacher on a few Pick
   episodes of the expert with detours, their StepOPSD and AgentOPSD credit and its AUC
   (`agentgym_app.reading_teacher`; skipped, with the install line in the report, without the
   model's wheel; its forwards run on one thread, reused by a second demo).
6. Write one HTML report (tables, charts, training curves, trajectories with their credit) and say
   where it is; its header says what the tiny policies are, what their held-out row shows and where
   the real figures are (`about.txt`).

Everything goes under `--out` (default runs/demo), caches included, so a fresh clone generates all
of it; a second run reuses what is there. One progress bar follows the stages; each stage shows its
own bar below it.
"""

from __future__ import annotations

import argparse
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import agentgym_opsd
from agentgym_app.bench import run_bench
from agentgym_app.bench_config import config_from_dict
from agentgym_app.reading_teacher import FOLDER, ReadingTeacherSettings, run_reading_teacher
from agentgym_app.report import write_report
from agentgym_opsd.contract import EnvUnavailable
from agentgym_opsd.io import atomic_write_json, atomic_write_text
from environments.alfworld.expert import SUBSETS
from environments.alfworld.panel import PanelSpec, ensure_panel
from environments.searchqa.synthetic import serve_synthetic
from trainer.config import TrainConfig
from trainer.local import LocalTrainer
from trainer.recipes import PICK_ENV, PICK_TINY_DEMO, TINY_QWEN3

__all__ = ["DemoSettings", "run_demo", "run_from_args"]

TRAIN_ENV = PICK_ENV
SEARCHQA_ENV = "agentgym/SearchQA-Synthetic-v0"
# The bench's names for the tiny policies, and what they are: run folder -> name.
POLICIES = {"warmstart": "warm start", "training/grpo": "grpo", "training/stepopsd": "stepopsd"}

ABOUT = """\
A small run of the whole job, end to end, in minutes on a CPU. The tiny policies are a \
{params} randomly initialised Qwen3 ({layers} layers, hidden {hidden}, a {vocab}-token BPE trained on the env's text), \
warm-started on {sft} expert episodes x {epochs} epochs over {train_games} ALFWorld Pick games (`warm start`), then \
trained for {steps} updates of {tasks} tasks x {group} episodes with GRPO (`grpo`) and with StepOPSD (`stepopsd`) \
from that start. The row that shows whether they learned is Pick on valid_unseen: {held_out} games on floor plans \
the training never saw, one greedy episode each, with a 95% interval and a one-sided Fisher test against the \
random agent. This run: {held_out_results}. \
Expect a few wins in a hundred and GRPO and StepOPSD within each other's intervals: {steps} updates are too \
few to tell the methods apart, which is what benchmarks/learning.py is for. They were trained on Pick only: \
the other subsets and Search-QA are tasks they never saw. The training curves show the reward the update used \
(`credit/reward_mean`, with the penalties for invalid turns) beside the env's own (`train/reward`).

The real figures: `python -m benchmarks.learning` (the real model, SmolLM2-135M-Instruct: held-out success on \
ALFWorld Pick after a warm start and RL with each method, same seeds and budget; the README's Benchmarks table), \
`python -m benchmarks.credit_quality` (how well each method's per-turn credit singles out the turns \
that decided an episode) and `python -m benchmarks.warm_start` (why a tiny policy wins so few held-out \
games: on a few hundred games it memorises them)."""


HELD_OUT_NOTE = (
    "ALFWorld Pick on {held_out} games whose floor plans the training never saw (`valid_unseen`), one greedy episode "
    "per game and agent: the row that shows whether the tiny policies, trained on {train_games} other Pick games, "
    "learned anything that carries over. The header gives each policy's one-sided Fisher test against random."
)


@dataclass(frozen=True)
class DemoSettings:
    """The demo's sizes (`quick` shrinks them for a smoke test)."""

    # What makes the tiny policy win games it never saw (benchmarks/warm_start.py, learning.py): a
    # few hundred training games rather than a few dozen (on 16 it memorises them and wins none
    # elsewhere), ~10,000 expert episode-passes with random detours (so it sees corrections), the full
    # chat as context, hidden 128. The training settings are the demo's recipe (trainer/recipes.py).
    train_games: int = PICK_TINY_DEMO.train_games  # ALFWorld Pick games, train split (the trainer's tasks)
    held_out: int = PICK_TINY_DEMO.eval_games  # Pick games on unseen floor plans (valid_unseen): the benchmark's
    # held-out row (at a few percent, 100 games leave the interval touching 0 and the gap to random untestable)
    panel_eval: int = 5  # per task type, valid_seen split (the benchmark's six subsets)
    max_turns: int = PICK_TINY_DEMO.max_turns  # ALFWorld turns before truncation (the small rooms' expert needs 3-12)
    searchqa_episodes: int = 12
    sft_episodes: int = PICK_TINY_DEMO.sft_episodes
    sft_epochs: int = PICK_TINY_DEMO.sft_epochs
    sft_noise: float = PICK_TINY_DEMO.sft_noise  # the expert's chance of a random detour (then it corrects course)
    sft_lr: float = PICK_TINY_DEMO.sft_lr
    tiny_hidden: int = TINY_QWEN3["tiny_hidden"]
    steps: int = PICK_TINY_DEMO.steps
    tasks_per_step: int = PICK_TINY_DEMO.tasks_per_step
    group_size: int = PICK_TINY_DEMO.group_size
    lr: float = PICK_TINY_DEMO.lr
    max_new_tokens: int = PICK_TINY_DEMO.max_new_tokens
    # The trainer's own evaluation (before and after the updates), greedy on the first held-out games:
    # 64, one decoding batch, so that a policy at the held-out row's ~6% seldom reads 0 (at 5%, 0/64 has
    # a chance of 4%; 0/10 had 60%). The report says how many episodes a point is.
    eval_episodes: int = 64
    vocab_size: int = TINY_QWEN3["vocab_size"]
    context: str = "full"
    # Torch threads of the warm start and the RL runs: their batches are large enough for two (the
    # benchmark's policies keep one: a decoding step's products are small).
    train_threads: int = 2
    # The benchmark's envs run in this process, 8 at a time: their steps cost less than a worker's
    # round trip, and the policies then write 8 turns per decoding batch instead of one per worker.
    workers: int = 0
    bench_envs: int = 32  # envs stepped together: the policies decode that many turns per batch
    # The reading-teacher section: tasks x group of the expert with detours, scored by the real model.
    teacher_tasks: int = 2
    teacher_group: int = 4
    teacher_max_turns: int = 8

    @classmethod
    def quick(cls) -> DemoSettings:
        return cls(train_games=2, held_out=2, panel_eval=1, max_turns=8, searchqa_episodes=3, sft_episodes=8,
                   sft_epochs=1,
                   tiny_hidden=64, steps=1, tasks_per_step=1, group_size=2, max_new_tokens=12, eval_episodes=1,
                   vocab_size=512, teacher_tasks=1, teacher_group=2, teacher_max_turns=3)


class _Stages:
    """The demo's outer progress bar: one step per stage, the stage's name as its label."""

    def __init__(self, names: Sequence[str]) -> None:
        from tqdm.auto import tqdm

        self.bar = tqdm(total=len(names), desc="demo", unit="stage", position=0, leave=True,
                        bar_format="{desc}: {n_fmt}/{total_fmt} stages |{bar}| {elapsed}")
        self.started = time.perf_counter()
        self.times: dict[str, float] = {}
        self._name: str | None = None
        self._t0 = 0.0

    def start(self, name: str) -> None:
        self._name, self._t0 = name, time.perf_counter()
        self.bar.set_description_str(f"demo: {name}")
        self.bar.refresh()

    def done(self) -> None:
        assert self._name is not None
        self.times[self._name] = round(time.perf_counter() - self._t0, 1)
        self.bar.write(f"  {self._name}: {self.times[self._name]:.0f}s")
        self.bar.update(1)

    def close(self) -> None:
        self.bar.set_description_str("demo: done")
        self.bar.close()


def run_demo(out: str | Path = "runs/demo", *, quick: bool = False, progress: bool = True) -> Path:
    """Run the demo into `out`; returns the report's path."""
    settings = DemoSettings.quick() if quick else DemoSettings()
    out = Path(out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    agentgym_opsd.load_plugins()
    families = {e.family for e in agentgym_opsd.registered_envs()}
    missing = {"ALFWorld", "SearchQA"} - families
    if missing:
        raise EnvUnavailable(
            f"the demo needs the {', '.join(sorted(missing))} envs, which are not installed here (pip install -e .)")
    stages = _Stages(["ALFWorld panel", "Search-QA index and server", "warm start", "GRPO", "StepOPSD", "benchmark",
                      "reading teacher", "report"])
    cache = out / "cache"
    # Two panels: Pick only (the training games and the held-out ones), and all six types (a few
    # valid_seen games each, for the benchmark's subsets).
    sizes = {"train": 0, "valid_seen": settings.panel_eval, "valid_unseen": 0}
    pick_sizes = {"train": settings.train_games, "valid_seen": 0, "valid_unseen": settings.held_out}
    alfworld = {"room": "small", "panel_size": sizes, "cache_dir": str(cache / "alfworld"),
                "max_turns": settings.max_turns, "progress": False}
    pick = {**alfworld, "panel_size": pick_sizes, "panel_own_types": True}
    try:
        stages.start("ALFWorld panel")
        ensure_panel(PanelSpec.make(seed=0, room="small", sizes=sizes), cache / "alfworld", progress=progress)
        ensure_panel(PanelSpec.make(seed=0, room="small", sizes=pick_sizes, task_types=[SUBSETS["pick"]]),
                     cache / "alfworld", progress=progress)
        stages.done()

        stages.start("Search-QA index and server")
        server = serve_synthetic(cache / "searchqa")
        stages.done()
        try:
            models = _train(out, pick, settings, stages, progress)
            stages.start("benchmark")
            # Greedy, at the per-turn cap the policies were trained with; a turn ends at </action>.
            policies = [{"name": name,
                         "agent": f"hf:{model}?temperature=0&max_new_tokens={settings.max_new_tokens}&device=cpu"}
                        for name, model in models.items()]
            config = config_from_dict(
                {
                    "name": "agentgym-opsd demo",
                    "agents": ["expert", "random", *policies],
                    "seeds": [0],
                    "workers": settings.workers,
                    "num_envs": settings.bench_envs,
                    "context": settings.context,
                    # The report shows the held-out row first, with the `eval` command that replays it.
                    "headline": {"id": TRAIN_ENV, "split": "valid_unseen", "label": "held-out",
                                 "note": HELD_OUT_NOTE.format(
                        held_out=settings.held_out, train_games=settings.train_games)},
                    "envs": [
                        {"id": TRAIN_ENV, "splits": ["valid_unseen"], "episodes": settings.held_out, "options": pick},
                        {"family": "ALFWorld", "splits": ["valid_seen"], "episodes": settings.panel_eval,
                         "options": alfworld},
                        {"id": SEARCHQA_ENV, "splits": ["test"], "episodes": settings.searchqa_episodes,
                         "options": {"server_url": server.url}},
                    ],
                }
            )
            # The server's port changes from run to run, so a second demo starts its benchmark over.
            run_bench(config, out, restart=True, progress=progress)
            stages.done()
        finally:
            server.stop()
        stages.start("reading teacher")
        run_reading_teacher(out / FOLDER, pick, ReadingTeacherSettings(
            tasks=settings.teacher_tasks, group_size=settings.teacher_group, max_turns=settings.teacher_max_turns),
            progress=progress)
        stages.done()
        _write_about(out, settings, models["warm start"])
        stages.start("report")
        report = write_report(out)
        stages.done()
    finally:
        stages.close()
    wall = time.perf_counter() - stages.started
    atomic_write_json(out / "demo.json",
                      {"settings": settings.__dict__, "stage_seconds": stages.times, "wall_seconds": round(wall, 1)})
    print((out / "results.md").read_text(encoding="utf-8"))
    print(f"demo finished in {wall / 60:.1f} min; report: {report}")
    return report


# ---------------------------------------------------------------------------------------------
# Training: one warm start, then GRPO and StepOPSD from it.


def _fisher_greater(wins: int, n: int, other_wins: int, other_n: int) -> float:
    """One-sided Fisher exact test: the chance, if both agents won at the same rate, that the first
    would win `wins` or more of its `n` games given the `wins + other_wins` wins of both."""
    from math import comb

    total, all_wins = n + other_n, wins + other_wins
    return sum(comb(all_wins, x) * comb(total - all_wins, n - x)
               for x in range(wins, min(n, all_wins) + 1)) / comb(total, n)


def _write_about(out: Path, settings: DemoSettings, model: Path) -> None:
    """`about.txt`: what this run is and what its held-out row shows, for the report's header."""
    import json

    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(model)
    with torch.device("meta"):  # the architecture only: no weights are read
        count = sum(p.numel() for p in AutoModelForCausalLM.from_config(config).parameters())
    rows = {r["agent"]: r for r in json.loads((out / "results.json").read_text(encoding="utf-8"))["results"]
            if r["env_id"] == TRAIN_ENV and r["split"] == "valid_unseen"}
    held_out = []
    wins = {name: (round(r["success_rate"] * r["episodes"]), r["episodes"]) for name, r in rows.items()}
    for name in ("random", *POLICIES.values()):
        if name in rows:
            r = rows[name]
            low, high = (100 * x for x in r["success_ci95"])
            against = f"; more than random: p = {_fisher_greater(*wins[name], *wins['random']):.2g}" \
                if name != "random" and "random" in wins else ""
            held_out.append(f"{name} {wins[name][0]}/{r['episodes']} ({100 * r['success_rate']:.1f}% [{low:.1f}, "
                            f"{high:.1f}], "
                            f"{100 * r['invalid_rate']:.0f}% invalid turns{against})")
    atomic_write_text(out / "about.txt", ABOUT.format(
        params=f"{count / 1e6:.2f}M-parameter", layers=config.num_hidden_layers, hidden=config.hidden_size,
        vocab=config.vocab_size, sft=settings.sft_episodes, epochs=settings.sft_epochs,
        train_games=settings.train_games,
        steps=settings.steps, tasks=settings.tasks_per_step, group=settings.group_size, held_out=settings.held_out,
        held_out_results="; ".join(held_out) or "no held-out row",
    ) + "\n")


def _train(out: Path, alfworld: dict[str, Any], settings: DemoSettings, stages: _Stages,
           progress: bool) -> dict[str, Path]:
    """Warm start (OUT/warmstart) and the two RL runs (OUT/training/<method>, side by side in the
    report); returns the model folder of each, by its name in the benchmark (`POLICIES`)."""
    common = dict(
        env_id=TRAIN_ENV, env_options={**alfworld, "split": "train"}, eval_env_options={"split": "valid_unseen"},
        context=settings.context, seed=0, eval_episodes=settings.eval_episodes, eval_seed=0, eval_temperature=0.0,
        max_new_tokens=settings.max_new_tokens, device="cpu",
    )
    stages.start("warm start")
    warm = out / "warmstart"
    if not (warm / "report.json").exists():
        shutil.rmtree(warm, ignore_errors=True)  # what an interrupted demo left
        config = TrainConfig(
            out=str(warm), method="grpo", model="tiny", tokenizer="trained", vocab_size=settings.vocab_size,
            tiny_hidden=settings.tiny_hidden, sft_episodes=settings.sft_episodes, sft_epochs=settings.sft_epochs,
            sft_noise=settings.sft_noise, sft_lr=settings.sft_lr, steps=0, save_every=0,
            cpu_threads=settings.train_threads, **common,
        )
        LocalTrainer(config, progress=progress).run()
    stages.done()
    for method, label in (("grpo", "GRPO"), ("stepopsd", "StepOPSD")):
        stages.start(label)
        run_dir = out / "training" / method
        if not (run_dir / "report.json").exists():
            shutil.rmtree(run_dir, ignore_errors=True)
            config = TrainConfig(
                out=str(run_dir), method=method, model=str(warm / "model"), steps=settings.steps,
                tasks_per_step=settings.tasks_per_step, group_size=settings.group_size, lr=settings.lr,
                lr_schedule=PICK_TINY_DEMO.lr_schedule, mini_batches=PICK_TINY_DEMO.mini_batches,
                eval_every=settings.steps, save_every=0, cpu_threads=settings.train_threads, **common,
            )
            trainer = LocalTrainer(config, progress=progress)  # it writes each update's credit (credit.jsonl)
            trainer.run()
        stages.done()
    return {name: out / folder / "model" for folder, name in POLICIES.items()}


def run_from_args(args: argparse.Namespace) -> int:
    """Run `agentgym-opsd demo` (its arguments: `agentgym_app.bench_commands.demo_arguments`)."""
    run_demo(Path(args.out), quick=args.quick)
    return 0
