"""Does RL raise held-out success above the warm start, and does per-turn credit beat GRPO's?

    .venv/bin/python -m benchmarks.learning                       # real model: 1 warm start, 1 seed, 4 methods
    .venv/bin/python -m benchmarks.learning --seeds 3             # two more seeds per method (finished runs kept)
    .venv/bin/python -m benchmarks.learning --seeds 3 --warm-starts 2
    .venv/bin/python -m benchmarks.learning --quick               # smoke run: 1 update, 10 games
    .venv/bin/python -m benchmarks.learning --model tiny          # the 0.6M-parameter tiny Qwen3 (its own defaults)
    .venv/bin/python -m benchmarks.learning --sft-privileged 0.5 --warm-only --out runs/learning-literate
    .venv/bin/python -m benchmarks.learning --table-only --out runs/learning-smollm2-135m  # the finished runs' table
    .venv/bin/python -m benchmarks.learning --seeds 3 --warm-starts 3 --ledger docs/benchmarks/learning-runs.jsonl

1. Warm starts (`--warm-starts W`, each once, cached under OUT/warm<w>): the model fine-tuned on expert
   episodes of ALFWorld Pick (small rooms) with random detours the expert recovers from (only the
   expert's turns are imitated), by the model kind's recipe (trainer/recipes.py: `PICK_REAL`,
   `PICK_TINY`, their `_QUICK` forms with `--quick`; flags override it). For the real model
   (`--model smollm2-135m`, the default, or a model folder): the searching expert (it looks for the
   object receptacle by receptacle, as a policy must), 1,000 training games, the top 8 layers trained,
   bf16 autocast where the CPU has bf16 units (benchmarks/train_speed.py). Warm start w imitates its own
   games (from game w x sft_episodes of the panel on: `sft_seed`), with its own detours and shuffling.
2. The held-out panel: for the real model, valid_unseen games (floor plans the training never saw);
   for the tiny model, valid_seen games without a training twin (the same goal and expert plan).
   Greedy, one episode per game. Each warm start is evaluated on it once.
3. For each warm start, method and seed (`--seeds S`), one RL run from that warm start: same tasks,
   seeds and budget for every method (`--steps` updates of T tasks x G episodes, full chat),
   evaluated on the held-out panel after the last update only (no checkpoint is picked). `--kl-coef`
   weighs a KL penalty to the warm start and `--invalid-coef` the penalty per invalid turn (the recipe's
   `kl_coef`, 0.1, and `invalid_coef`, 0, for the real model; `--invalid-coef 0.1` is the ALFWorld
   family's default), `--credit KEY=VALUE` any other credit setting for every method. `--jobs` runs at
   once, each in its own process on `--threads` or CPUs // runs-at-once torch threads (a run alone uses
   every core; the tiny model keeps one). More threads split matrix products differently: samples may
   differ at rounding.
   Every run resumes from its checkpoint, and a finished run is never redone: stop the command at
   any point, or run it again with more seeds or warm starts, and only what is missing runs;
   `--table-only` prints the table of the finished runs without training. `--ledger FILE` carries that
   across checkouts (benchmarks/run_ledger.py): each finished warm start and run is recorded there as it
   ends (held-out outcome per game, step costs, commit, CPU, threads), runs it holds are not run again, the
   table counts them, and a warm start that must be trained again for missing runs has to come back with
   the recorded weights (SHA-256), else the benchmark stops rather than pair runs of two models.
4. Figures: per method, held-out success (mean over warm starts, seeds and games) and its paired
   differences to its warm start (same games) and to GRPO (same warm start, seed and games: the seeds both
   ran; each method's other figures use every run it finished on the table's warm starts), each with
   a 95% interval (`mean_interval`: a cluster t over two or more warm starts; with one, a hierarchical
   bootstrap that resamples seeds and games; every warm start
   weighs the same, whatever its number of finished seeds): the interval
   holds the run-to-run variance that decided rankings before, not game sampling alone (with one
   run per method it cannot, and the table says so). From the observed spread of the per-run
   differences, how many runs would measure each difference. The whole-step cost of each method
   (rollout, teacher, update) against GRPO's, and its resident memory peak, from the runs in the table. Writes
   OUT/learning.txt, OUT/learning.json and OUT/learning.png.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

import agentgym_opsd
from agentgym_opsd.episode import load_episodes
from agentgym_opsd.io import DataFileError, atomic_write_bytes, atomic_write_json, atomic_write_text, read_jsonl
from agentgym_opsd.summary import wilson_interval as wilson
from agentgym_opsd.usage import UsageError, parse_options
from benchmarks.common import PAGES, add_page_argument, cpu_model, git_commit, write_results_page
from benchmarks.held_out_games import twin_free_seeds
from benchmarks.run_ledger import LedgerMismatch, RunLedger, outcome_bits, weights_sha256
from trainer.config import TrainConfig
from trainer.credit.config import METHODS
from trainer.local import LocalTrainer
from trainer.models import is_named_model
from trainer.plots import plot_paired_runs
from trainer.recipes import (
    PICK_ENV,
    PICK_REAL,
    PICK_REAL_QUICK,
    PICK_TINY,
    PICK_TINY_QUICK,
    TINY_QWEN3,
    PickRecipe,
)

DEFAULT_METHODS = ("grpo", "gigpo", "stepopsd", "agentopsd")


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m", help="smollm2-135m (default), a model folder, or tiny")
    ap.add_argument("--env", default=PICK_ENV)
    ap.add_argument("--methods", default=",".join(DEFAULT_METHODS))
    ap.add_argument("--seeds", type=int, default=1, help="RL runs per method and warm start (seeds 0..N-1), paired")
    ap.add_argument("--warm-starts", type=int, default=1, help="independent warm starts (0..W-1), each with every run")
    ap.add_argument("--only-warm-starts", metavar="W[,W...]",
                    help="train and run from only these of the warm starts 0..W-1 (to split a grid over sittings; "
                    "the table still counts every finished run)")
    ap.add_argument("--quick", action="store_true", help="a smoke run of every stage (its own OUT)")
    ap.add_argument("--out", help="default runs/learning-<model>[-quick]")
    for name, kind in (("train-games", int), ("eval-games", int), ("max-turns", int), ("sft-episodes", int),
                       ("sft-epochs", int), ("sft-lr", float), ("sft-noise", float), ("train-layers", int),
                       ("steps", int), ("tasks-per-step", int), ("group-size", int), ("lr", float),
                       ("mini-batches", int), ("ppo-epochs", int), ("temperature", float), ("max-new-tokens", int),
                       ("kl-coef", float), ("invalid-coef", float)):
        ap.add_argument(f"--{name}", type=kind, help="default: the model kind's recipe (trainer/recipes.py)")
    ap.add_argument("--autocast", choices=("none", "bf16", "auto"))
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"),
                    help="cpu (default) or cuda: one GPU, the model in bf16 "
                    "(benchmarks/gpu_learning.sh runs this benchmark there at a larger budget)")
    ap.add_argument("--lr-schedule", choices=("constant", "linear"))
    ap.add_argument("--sft-privileged", type=float, default=0.0, help="literate warm start: the share of episodes "
                    "also taught in the teacher's privileged contexts")
    ap.add_argument("--tiny-hidden", type=int, default=TINY_QWEN3["tiny_hidden"])
    ap.add_argument("--tiny-layers", type=int, default=TINY_QWEN3["tiny_layers"])
    ap.add_argument("--vocab-size", type=int, default=TINY_QWEN3["vocab_size"])
    ap.add_argument("--bootstrap", type=int, default=2000)
    ap.add_argument("--credit", action="append", default=[], metavar="KEY=VALUE",
                    help="credit setting for every method")
    ap.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1),
                    help="RL runs at once, each in its own process on CPUs // runs-at-once threads "
                    "(default: min(2, CPUs))")
    ap.add_argument("--threads", type=int, help="torch threads per run (default: CPUs // runs at once; set it when "
                    "another invocation shares the CPUs)")
    ap.add_argument("--warm-only", action="store_true",
                    help="train and evaluate the warm start(s), then stop (e.g. a literate one with --sft-privileged)")
    ap.add_argument("--table-only", action="store_true",
                    help="train nothing: the table of every finished run under OUT (e.g. of a stopped invocation)")
    ap.add_argument("--ledger", metavar="FILE.jsonl",
                    help="a ledger of finished runs kept in the repository (the page's is docs/benchmarks/"
                    "learning-runs.jsonl): its runs count as finished in any checkout, each finished run is added as "
                    "it ends, and a warm start retrained for missing runs must have the ledger's weights")
    ap.add_argument("--no-progress", dest="progress", action="store_false")
    add_page_argument(ap)
    args = ap.parse_args(argv)
    if args.jobs < 1:
        ap.error(f"--jobs must be >= 1, got {args.jobs}")
    if args.threads is not None and args.threads < 1:
        ap.error(f"--threads must be >= 1, got {args.threads}")
    for name in ("seeds", "warm_starts"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.only_warm_starts is not None:
        try:
            only = sorted({int(w) for w in args.only_warm_starts.split(",") if w.strip()})
        except ValueError:
            only = []
        if not only or not all(0 <= w < args.warm_starts for w in only):
            ap.error(f"--only-warm-starts takes warm starts among 0..{args.warm_starts - 1} (of --warm-starts "
                     f"{args.warm_starts}), comma-separated; got {args.only_warm_starts!r}")
        args.only_warm_starts = only
    # the invalid-turn penalty is a recipe field (`--invalid-coef`); `--credit invalid_coef=X` is the same setting
    try:
        credit = parse_options(args.credit)
    except UsageError as exc:
        ap.error(str(exc).replace("--option", "--credit"))
    if "invalid_coef" in credit:
        if args.invalid_coef is not None:
            ap.error("--invalid-coef and --credit invalid_coef=... set the same penalty: give one")
        args.invalid_coef = credit.pop("invalid_coef")
        args.credit = [pair for pair in args.credit if "invalid_coef" not in parse_options([pair])]
    tiny = args.model == "tiny"
    recipe = (PICK_TINY_QUICK if args.quick else PICK_TINY) if tiny else (PICK_REAL_QUICK if args.quick else PICK_REAL)
    for name, value in recipe.fields().items():
        if getattr(args, name, None) is None:
            setattr(args, name, value)
    for name in ("train_games", "eval_games", "max_turns", "sft_episodes", "sft_epochs", "steps", "tasks_per_step",
                 "group_size", "mini_batches", "ppo_epochs", "max_new_tokens"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if not 0 < args.temperature <= 2:
        ap.error(f"--temperature must be in (0, 2], got {args.temperature}")
    if not args.kl_coef >= 0:
        ap.error(f"--kl-coef must be >= 0, got {args.kl_coef}")
    if args.invalid_coef is not None and not (isinstance(args.invalid_coef, (int, float)) and args.invalid_coef >= 0):
        ap.error(f"--invalid-coef must be a number >= 0, got {args.invalid_coef}")
    if not tiny:
        if not is_named_model(args.model) and not (Path(args.model) / "config.json").is_file():
            ap.error(f"--model {args.model}: not a named model (smollm2-135m) nor a model folder (no config.json)")
    if args.out is None:
        label = Path(args.model).name if not tiny else "tiny"
        args.out = f"runs/learning-{label}" + ("-quick" if args.quick else "")
    return args


def recipe_of(args: argparse.Namespace) -> PickRecipe:
    """The recipe this invocation trains: the model kind's (trainer/recipes.py) with the flags given."""
    return PickRecipe(**{f.name: getattr(args, f.name) for f in dataclasses.fields(PickRecipe)})


# ---------------------------------------------------------------------------------------------
# Statistics (pure functions of the outcome tables)


def hierarchical_mean(tables: Sequence[np.ndarray]) -> float:
    """The mean of per-warm-start [seeds, games] tables: over warm starts of each one's mean over its seeds
    and games (every warm start weighs the same, whatever its number of seeds)."""
    return float(np.mean([np.asarray(t, dtype=float).mean() for t in tables]))


def hierarchical_bootstrap(tables: Sequence[np.ndarray], draws: int, rng: np.random.Generator) -> np.ndarray:
    """Bootstrap `hierarchical_mean`s of per-warm-start [seeds, games] tables (a [warm starts, seeds, games]
    array is one; warm starts may have different numbers of seeds, the games are the same): each draw
    resamples warm starts, then seeds within each drawn warm start (from its own), then games (one set
    of games per draw, shared by every run, so a paired table stays paired). Returns [draws] means."""
    tables = [np.asarray(t, dtype=float) for t in tables]
    W, G = len(tables), tables[0].shape[1]
    out = np.empty(draws)
    for d in range(draws):
        warm = rng.integers(0, W, size=W)
        seeds = [rng.integers(0, len(tables[w]), size=len(tables[w])) for w in warm]
        games = rng.integers(0, G, size=G)
        out[d] = np.mean([tables[w][s][:, games].mean() for w, s in zip(warm, seeds, strict=True)])
    return out


# The t distribution's 97.5th percentile by degrees of freedom (a table: scipy is not a dependency); a df
# between entries takes the smaller df's value, a slightly wider interval.
T_975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228,
         12: 2.179, 15: 2.131, 20: 2.086, 25: 2.060, 30: 2.042, 40: 2.021, 60: 2.000, 120: 1.980}


def t_975(df: int) -> float:
    """The 97.5th percentile of Student's t with `df` degrees of freedom (1.96 past 120)."""
    if df < 1:
        raise ValueError(f"t needs df >= 1, got {df}")
    return T_975[max(k for k in T_975 if k <= df)] if df <= 120 else 1.96


def mean_interval(tables: Sequence[np.ndarray], draws: int,
                  rng: np.random.Generator) -> tuple[float, float, float]:
    """The tables' `hierarchical_mean` and a 95% interval for it. With two or more warm starts: a cluster t
    interval, the warm starts as clusters (mean +- t(W-1) x the sd of the per-warm-start means / sqrt(W);
    it holds the warm-start, seed and game variance, and with 2-3 warm starts it is wide, as it must be: a
    bootstrap over so few warm starts is too narrow). With one warm start: `hierarchical_bootstrap` over its
    seeds and games, which holds no warm-start variance (the table says so)."""
    mean = hierarchical_mean(tables)
    if len(tables) >= 2:
        half = t_975(len(tables) - 1) * cluster_sd(tables) / math.sqrt(len(tables))
        return mean, mean - half, mean + half
    means = hierarchical_bootstrap(tables, draws, rng)
    return mean, float(np.percentile(means, 2.5)), float(np.percentile(means, 97.5))


def cluster_sd(tables: Sequence[np.ndarray]) -> float:
    """The sample sd (ddof 1) of the per-warm-start means of [seeds, games] tables."""
    return float(np.std([np.asarray(t, dtype=float).mean() for t in tables], ddof=1))


def runs_needed(tables: Sequence[np.ndarray], target: float) -> int | None:
    """How many runs a mean difference needs for its 95% interval (`mean_interval`'s, the same variance
    model) to reach a half-width of `target`. With two or more warm starts: warm starts, each with as many
    seeds as the tables have on average, the smallest W with t(W-1) x sd / sqrt(W) <= target, sd the
    spread of the per-warm-start means seen. With one warm start: seeds from it (normal approximation on
    the per-seed spread, game sampling included), the interval's own model, which leaves out warm-start
    variance. Never fewer than were run; None without a spread to go on (one run) or with a zero target."""
    tables = [np.asarray(t, dtype=float) for t in tables]
    if target <= 0:
        return None
    if len(tables) >= 2:
        sd, count = cluster_sd(tables), len(tables)
        while t_975(count - 1) * sd / math.sqrt(count) > target and count < 100_000:
            count += 1
        return count
    per_seed = tables[0].mean(axis=1)
    if per_seed.size < 2:
        return None
    return max(per_seed.size, math.ceil((1.96 * float(per_seed.std(ddof=1)) / target) ** 2))


def finished_design(out: Path, methods: Sequence[str], warm_starts: int | None,
                    seeds: int | None, ledger: RunLedger | None = None) -> dict[str, dict[int, list[int]]]:
    """Per method, per evaluated warm start, the seeds whose runs have finished (a report.json under `out`, or a
    record in `ledger`), within the first `warm_starts` and `seeds` (None: every one there). A warm start is
    kept only where every method has a finished run, so every method's figures cover the same warm starts;
    within one, each method keeps all its finished seeds (its comparisons to GRPO pair the seeds both ran)."""
    def numbered(folder: Path, prefix: str, limit: int | None, recorded: Sequence[int] = ()) -> list[int]:
        found = {int(p.name[len(prefix):]) for p in folder.glob(f"{prefix}*") if p.name[len(prefix):].isdigit()}
        return sorted(n for n in found | set(recorded) if limit is None or n < limit)

    design: dict[str, dict[int, list[int]]] = {m: {} for m in methods}
    for w in numbered(out, "warm", warm_starts, ledger.warm_starts() if ledger else ()):
        warm = out / f"warm{w}"
        if not ((warm / "report.json").exists() or (ledger and ledger.warm(w))):
            continue
        done = {m: [s for s in numbered(warm / m, "seed", seeds, ledger.seeds(m, w) if ledger else ())
                    if (warm / m / f"seed{s}" / "report.json").exists() or (ledger and ledger.run(m, w, s))]
                for m in methods}
        if all(done.values()):
            for m in methods:
                design[m][w] = done[m]
    return design if methods and design[methods[0]] else {}


def warm_starts_of(design: dict[str, dict[int, list[int]]]) -> list[int]:
    """The warm starts a `finished_design` covers (the same for every method)."""
    return sorted(next(iter(design.values()))) if design else []


def step_costs(metrics: Sequence[dict]) -> dict[str, float]:
    """Median seconds per update of a run's phases (from its metrics.jsonl train records)."""
    train = [r for r in metrics if r.get("kind") == "train"]
    if not train:
        return {}

    def median(key):
        values = [float(r[key]) for r in train if key in r]
        return float(np.median(values)) if values else 0.0

    peaks = [r for r in train if "memory/peak_gb" in r]
    top = max(peaks, key=lambda r: float(r["memory/peak_gb"])) if peaks else {}
    phases = {phase: float(top[f"memory/{phase}_peak_gb"]) for phase in ("rollout", "scoring", "update")
              if f"memory/{phase}_peak_gb" in top}  # logged per phase from 5842c86 on
    return {"rollout": median("time/rollout_s"), "teacher": median("time/teacher_s"),
            "scoring": median("time/scoring_s"), "update": median("time/update_s"), "step": median("time/step_s"),
            "peak_gb": float(top["memory/peak_gb"]) if top else None,
            "peak_phase": max(phases, key=phases.get) if phases else None}


def run_seconds(metrics: Sequence[dict]) -> float | None:
    """A run's own seconds from its metrics.jsonl: every update's step time plus its evaluations, summed over
    all the invocations that ran it (a resumed run counts the updates before the resume too). None where the
    metrics hold no step times."""
    steps = {r.get("step"): float(r["time/step_s"])
             for r in metrics if r.get("kind") == "train" and "time/step_s" in r}
    if not steps:
        return None
    evals = {r.get("step"): float(r.get("eval/seconds", 0.0)) for r in metrics if r.get("kind") == "eval"}
    return sum(steps.values()) + sum(evals.values())


# ---------------------------------------------------------------------------------------------


def rl_run(config_fields: dict, progress: bool) -> float:
    """One training run (resumed from its checkpoint when there is one); returns its wall seconds. Runs
    in a worker process when --jobs > 1, on its fields' `cpu_threads` torch threads."""
    import torch

    torch.set_num_threads(max(1, int(config_fields.get("cpu_threads") or 1)))
    t0 = time.perf_counter()
    config = TrainConfig(**config_fields)
    resume = (Path(config.out) / "checkpoint.pt").exists()
    LocalTrainer(config, resume=resume, progress=progress).run()
    return time.perf_counter() - t0


def final_outcomes(run_dir: Path, step: int) -> list[int]:
    """Success (0/1) per held-out game, in seed order, at update `step`."""
    episodes = load_episodes(run_dir / "episodes" / f"eval_{step:05d}.jsonl")
    return [int(e.success) for e in sorted(episodes, key=lambda e: int(e.episode_id.rsplit("-", 1)[1]))]


def held_out_panel(args, env_options: dict) -> tuple[dict, list[int], str]:
    """(eval env options, the panel's reset seeds, a line saying what the panel is)."""
    eval_options = {"split": args.eval_split}
    if args.eval_split == "valid_unseen":
        return eval_options, list(range(args.eval_games)), (
            f"held-out panel: {args.eval_games} valid_unseen games (floor plans the training never saw)")
    seeds, dropped = twin_free_seeds(args.env, {**env_options, "progress": False},
                                     {**env_options, **eval_options, "progress": False}, args.eval_games)
    return eval_options, seeds, (f"held-out panel: {len(seeds)} {args.eval_split} games ({dropped} of the first "
                                 f"{args.eval_games} dropped: a training game has the same goal and expert plan)")


def run_jobs(todo: dict, jobs: int, progress: bool, run=rl_run, threads: int | None = None,
             done: Callable[[Any, float], None] | None = None) -> dict:
    """Run every (key -> TrainConfig fields) job, `jobs` at a time, each on `threads` torch threads or by
    default the CPUs' share of the runs at once (a run alone uses them all); returns key -> wall seconds.
    `done(key, seconds)` is called as each job finishes (the ledger records it then)."""
    seconds: dict = {}
    if not todo:
        return seconds
    at_once = min(jobs, len(todo))
    threads = threads or max(1, (os.cpu_count() or 1) // at_once)
    # (The tiny model's matrices are too small to split: it keeps one thread; CUDA runs have cpu_threads 0.)
    todo = {key: {**fields, "cpu_threads": threads} if fields.get("cpu_threads") and fields.get("model") != "tiny"
            else fields for key, fields in todo.items()}
    if jobs == 1:
        for key, fields in todo.items():
            seconds[key] = run(fields, progress)
            print(f"{key}: done in {seconds[key]:.0f}s", flush=True)
            if done:
                done(key, seconds[key])
        return seconds
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, as_completed
    from concurrent.futures.process import BrokenProcessPool

    from tqdm.auto import tqdm

    print(f"{len(todo)} runs, {jobs} at a time (one line per finished run)", flush=True)
    with ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = {pool.submit(run, fields, False): key for key, fields in todo.items()}
        with tqdm(total=len(futures), desc="runs", unit="run", disable=not progress) as bar:
            for future in as_completed(futures):
                key = futures[future]
                try:
                    seconds[key] = future.result()
                except BrokenProcessPool:
                    raise SystemExit(
                        f"learning.py: the process of run {key} died (killed for memory? `dmesg | tail` says); the "
                        "finished runs and every run's last checkpoint are kept: run the same command again to resume "
                        "(with --jobs 1 if memory is short)") from None
                bar.update(1)
                bar.write(f"{key}: done in {seconds[key]:.0f}s")
                if done:
                    done(key, seconds[key])
    return seconds


def shared_fields(args, env_options: dict, eval_options: dict, seeds: list[int]) -> dict:
    """The `TrainConfig` fields every run of this invocation shares (the env, the held-out panel, the device)."""
    return dict(
        env_id=args.env, env_options=env_options, eval_env_options=eval_options, context="full",
        eval_episodes=len(seeds), eval_seeds=seeds, eval_temperature=0.0, max_new_tokens=args.max_new_tokens,
        device=args.device, cpu_threads=1 if args.device == "cpu" else 0, train_layers=args.train_layers,
        autocast=args.autocast if args.device == "cpu" else "none",  # CUDA: the weights are bf16 already
        # The real model plays at most 16 games at once: keys and values grow with the games in a batch
        # (50 held-out games of 15 turns hold about 15 GB), and two evaluations may run at once in 24 GB.
        num_envs=0 if args.model == "tiny" else 16,
    )


def sft_seed(warm: int, episodes: int) -> int:
    """The first reset seed of warm start `warm`'s expert episodes. A seed plays game seed mod the panel's
    size: warm start w starts w x `episodes` games on, so warm starts imitate different games (they
    overlap only once w x episodes wraps past the panel). Warm start 0 keeps the seed it always had."""
    return 1_000_000 + 100_000 * warm + warm * episodes


def shared_sft_games(warm_starts: int, episodes: int, games: int) -> list[tuple[int, int, int]]:
    """(warm start a, warm start b, games both imitate) for each pair of warm starts whose SFT games overlap:
    warm start w plays games (sft_seed(w) + i) mod `games`, so they overlap once W x episodes passes the panel."""
    played = [{(sft_seed(w, episodes) + i) % games for i in range(episodes)} for w in range(warm_starts)]
    return [(a, b, len(played[a] & played[b])) for a in range(warm_starts) for b in range(a + 1, warm_starts)
            if played[a] & played[b]]


def shared_sft_note(warm_starts: int, episodes: int, games: int) -> str | None:
    """One line naming the warm starts that imitate the same games, and the fix; None when none do."""
    shared = shared_sft_games(warm_starts, episodes, games)
    if not shared:
        return None
    pairs = ", ".join(f"{a} and {b} share {n}" for a, b, n in shared)
    return (f"note: warm starts {pairs} of their {episodes} SFT games ({warm_starts} x {episodes} > {games} training "
            f"games); for warm starts on different games use --train-games >= {warm_starts * episodes} or "
            f"--sft-episodes <= {games // warm_starts}")


def chosen_warm_starts(args) -> list[int]:
    """The warm starts this invocation trains and runs from: `--only-warm-starts`, else 0..W-1."""
    return args.only_warm_starts if args.only_warm_starts is not None else list(range(args.warm_starts))


def run_warm_starts(args, out: Path, common: dict, methods: Sequence[str] = (), ledger: RunLedger | None = None,
                    done: Callable[[Any, float], None] | None = None) -> tuple[dict, dict[int, list[int]]]:
    """Train and evaluate the warm starts not done yet (one the ledger holds only where an RL run of `methods`
    from it is still to do); (wall seconds per job, held-out outcomes per warm start)."""
    model_fields = ({**TINY_QWEN3, "vocab_size": args.vocab_size, "tiny_hidden": args.tiny_hidden,
                     "tiny_layers": args.tiny_layers} if args.model == "tiny" else dict(model=args.model))
    todo = {}
    for w in ([] if args.table_only else chosen_warm_starts(args)):
        warm = out / f"warm{w}"
        recorded = ledger is not None and ledger.warm(w) is not None
        runs_left = not args.warm_only and ledger is not None and any(
            ledger.run(m, w, s) is None for m in methods for s in range(args.seeds))
        if not (warm / "report.json").exists() and (not recorded or runs_left):
            todo[("warm start", w)] = dict(
                out=str(warm), method="grpo", steps=0, save_every=0, seed=w, sft_seed=sft_seed(w, args.sft_episodes),
                sft_episodes=args.sft_episodes, sft_epochs=args.sft_epochs, sft_noise=args.sft_noise,
                sft_lr=args.sft_lr, sft_privileged=args.sft_privileged, **model_fields, **common,
            )
    seconds = run_jobs(todo, args.jobs, args.progress, threads=args.threads, done=done)
    starts = {w: final_outcomes(out / f"warm{w}", 0) for w in range(args.warm_starts)
              if (out / f"warm{w}" / "report.json").exists()}
    if ledger is not None:
        starts.update({w: [int(c) for c in ledger.warm(w)["outcomes"]] for w in ledger.warm_starts()
                       if w not in starts and (args.table_only or w < args.warm_starts)})
    return seconds, starts


def run_rl(args, out: Path, methods: Sequence[str], common: dict, ledger: RunLedger | None = None,
           done: Callable[[Any, float], None] | None = None) -> dict:
    """The RL runs not finished yet (under `out` or in the ledger), seed 0 of every method (and warm start)
    first, so a stopped invocation leaves whole seeds; returns wall seconds per run."""
    todo = {}
    credit = parse_options(args.credit)
    if args.invalid_coef is not None:
        credit["invalid_coef"] = args.invalid_coef
    for seed in ([] if args.table_only else range(args.seeds)):
        for w in chosen_warm_starts(args):
            for method in methods:
                run_dir = out / f"warm{w}" / method / f"seed{seed}"
                if not (run_dir / "report.json").exists() and not (ledger and ledger.run(method, w, seed)):
                    todo[(method, w, seed)] = dict(
                        out=str(run_dir), method=method, model=str(out / f"warm{w}" / "model"), steps=args.steps,
                        seed=seed, tasks_per_step=args.tasks_per_step, group_size=args.group_size, lr=args.lr,
                        lr_schedule=args.lr_schedule, mini_batches=args.mini_batches, ppo_epochs=args.ppo_epochs,
                        temperature=args.temperature, kl_coef=args.kl_coef, eval_every=0,
                        eval_before=False, credit=credit, save_every=1, **common,
                    )
    return run_jobs(todo, args.jobs, args.progress, threads=args.threads, done=done)


def measured_on(args: argparse.Namespace, ledger: RunLedger | None) -> dict[str, Any]:
    """The results page's CPU and threads: this invocation's, or for a table of a ledger's runs (`--table-only`)
    the CPU and thread counts the ledger's records name."""
    if not (args.table_only and ledger is not None and ledger.records):
        return {"threads": threads_per_run(args)}
    counts = sorted({int(r["threads"]) for r in ledger.records if r.get("threads")})
    return {"cpu": ledger.settings["cpu"], "threads": "/".join(map(str, counts)) or None}


def threads_per_run(args: argparse.Namespace) -> int:
    """The torch threads each run of a full round of `--jobs` runs gets: `--threads`, else the CPUs' share."""
    return args.threads or max(1, (os.cpu_count() or 1) // args.jobs)


def rl_run_dir(out: Path, warm: int, method: str, seed: int) -> Path:
    return out / f"warm{warm}" / method / f"seed{seed}"


def ledger_settings(args: argparse.Namespace, held_out_seeds: list[int], cpu: str | None = None) -> dict[str, Any]:
    """Every setting that changes what a warm start or run measures, and the CPU (its kernels, and whether
    `autocast auto` is bf16 there, change every number): the ledger shares runs only between invocations where
    these are equal (not --jobs, --threads, --out or the table's bootstrap)."""
    credit = parse_options(args.credit)
    if args.invalid_coef is not None:
        credit["invalid_coef"] = args.invalid_coef
    model = ({"tiny_hidden": args.tiny_hidden, "tiny_layers": args.tiny_layers, "vocab_size": args.vocab_size}
             if args.model == "tiny" else Path(args.model).name)
    return {"env": args.env, "model": model, "recipe": recipe_of(args).fields(), "credit": credit,
            "sft_privileged": args.sft_privileged, "device": args.device, "held_out_seeds": held_out_seeds,
            "cpu": cpu or cpu_model()}


def open_ledger(args: argparse.Namespace, held_out_seeds: list[int]) -> RunLedger | None:
    """`--ledger`'s runs on this CPU. A table (`--table-only`) of a ledger with none from this CPU reads the runs
    of these settings from the CPU with the most of them, and says so."""
    if not args.ledger:
        return None
    ledger = RunLedger(args.ledger, ledger_settings(args, held_out_seeds))
    if args.table_only and not ledger.records:
        tried = [RunLedger(args.ledger, ledger_settings(args, held_out_seeds, cpu)) for cpu in ledger.cpus()]
        if found := max((t for t in tried if t.records), key=lambda t: len(t.records), default=None):
            print(f"ledger {args.ledger}: no runs of these settings on this CPU ({cpu_model()}); the table is of "
                  f"those on {found.settings['cpu']}", flush=True)
            return found
    return ledger


def record_finished(ledger: RunLedger, out: Path, methods: Sequence[str], seconds: dict | None = None,
                    fingerprints: dict[int, str] | None = None) -> int:
    """Add every warm start and run of `methods` finished under `out` that the ledger lacks; returns how many.
    A warm start under `out` whose weights differ from the ledger's record raises `LedgerMismatch` (runs from
    it could not be paired with the ledger's). `seconds`: wall seconds by run_jobs key, where known;
    `fingerprints`: a cache of warm starts' weight hashes (hashing 0.5 GB takes a second). An RL run's seconds
    are its own (`run_seconds`: all its updates and evaluations, also across a resume), not this invocation's."""
    seconds = seconds or {}
    fingerprints = {} if fingerprints is None else fingerprints
    added = 0

    def provenance(run_dir: Path, wall: float | None) -> dict:
        config = json.loads((run_dir / "config.json").read_text()) if (run_dir / "config.json").exists() else {}
        return {"commit": git_commit(), "cpu": cpu_model(), "threads": config.get("cpu_threads"),
                "seconds": round(wall, 1) if wall is not None else None}

    for warm in sorted(out.glob("warm*")):
        if not warm.name[4:].isdigit() or not (warm / "report.json").exists():
            continue
        w = int(warm.name[4:])
        if w not in fingerprints:
            fingerprints[w] = weights_sha256(warm / "model")
        record = ledger.warm(w)
        if record is not None and record["weights_sha256"] != fingerprints[w]:
            raise LedgerMismatch(
                f"warm start {w} under {out} has other weights (sha256 {fingerprints[w][:12]}) than the ledger "
                f"{ledger.path} recorded (sha256 {record['weights_sha256'][:12]}, trained on {record['cpu']} with "
                f"{record['threads']} thread(s) at {record['commit']}): new runs from it cannot be paired with the "
                f"ledger's. Train it where the ledger's was (same CPU kind and --threads), or give another --ledger")
        if record is None:
            ledger.add({"warm": w, "outcomes": outcome_bits(final_outcomes(warm, 0)),
                        "weights_sha256": fingerprints[w], "settings": ledger.settings,
                        **provenance(warm, seconds.get(("warm start", w)))})
            added += 1
        for method in methods:
            for run_dir in sorted((warm / method).glob("seed*")):
                if not run_dir.name[4:].isdigit() or not (run_dir / "report.json").exists():
                    continue
                s = int(run_dir.name[4:])
                if ledger.run(method, w, s) is None:
                    metrics = list(read_jsonl(run_dir / "metrics.jsonl"))  # read once: costs and seconds
                    own = run_seconds(metrics)
                    ledger.add({"warm": w, "method": method, "seed": s,
                                "outcomes": outcome_bits(run_outcomes(out, method, w, s)), "costs": step_costs(metrics),
                                **provenance(run_dir, own if own is not None else seconds.get((method, w, s)))})
                    added += 1
    return added


def run_outcomes(out: Path, method: str, warm: int, seed: int, ledger: RunLedger | None = None) -> list[int]:
    """A finished run's held-out success per game at its last update: the ledger's record, else its folder."""
    if ledger is not None and (record := ledger.run(method, warm, seed)):
        return [int(c) for c in record["outcomes"]]
    run_dir = rl_run_dir(out, warm, method, seed)
    return final_outcomes(run_dir, int(json.loads((run_dir / "report.json").read_text())["steps"]))


def run_costs(out: Path, method: str, warm: int, seed: int, ledger: RunLedger | None = None) -> dict[str, float]:
    """A finished run's `step_costs`: the ledger's record, else from its metrics.jsonl."""
    if ledger is not None and (record := ledger.run(method, warm, seed)):
        return record["costs"]
    return step_costs(read_jsonl(rl_run_dir(out, warm, method, seed) / "metrics.jsonl"))


def analyse(args, out: Path, methods: Sequence[str], design: dict[str, dict[int, list[int]]],
            starts: dict[int, list[int]], ledger: RunLedger | None = None) -> dict:
    """The figures of the finished runs in `design` (read from the ledger where it holds them): the warm
    start's held-out success and, per method, success after RL, its paired differences to its warm start and
    to GRPO (`mean_interval`s, one generator seeded 0 drawn in a fixed order) and its step costs and memory
    peak."""
    rng = np.random.default_rng(0)
    warms = warm_starts_of(design)
    outcome = {(m, w, s): np.asarray(run_outcomes(out, m, w, s, ledger), dtype=float)
               for m in methods for w in warms for s in design[m][w]}
    # per method, per warm start: a [seeds, games] table of its finished runs
    finals = {m: [np.stack([outcome[m, w, s] for s in design[m][w]]) for w in warms] for m in methods}
    costs = {m: [run_costs(out, m, w, s, ledger) for w in warms for s in design[m][w]] for m in methods}
    for w in warms:
        if w not in starts:
            record = ledger.warm(w) if ledger is not None else None
            starts[w] = [int(c) for c in record["outcomes"]] if record else final_outcomes(out / f"warm{w}", 0)
    start_table = [np.array([starts[w]], dtype=float) for w in warms]  # per warm start: [1 "seed", games]
    start = mean_interval(start_table, args.bootstrap, rng)
    grpo_step = float(np.median([c["step"] for c in costs.get("grpo", []) if c])) if costs.get("grpo") else None
    results = {}
    for method in methods:
        mean, low, high = mean_interval(finals[method], args.bootstrap, rng)
        phase = {k: float(np.median([c[k] for c in costs[method] if c])) for k in ("step", "rollout", "teacher",
                                                                                  "update")}
        entry = {"success": mean, "interval": [low, high], "per_run": [t.mean(axis=1).tolist() for t in finals[method]],
                 "step_seconds": phase}
        # paired to its own warm start: every seed's run minus the warm start's outcome on the same game
        gain = [t - s for t, s in zip(finals[method], start_table, strict=True)]
        g, g_low, g_high = mean_interval(gain, args.bootstrap, rng)
        entry["vs_start"] = {"difference": g, "interval": [g_low, g_high],
                             "per_run": np.concatenate([t.mean(axis=1) for t in gain]).tolist()}
        if method != "grpo" and "grpo" in finals:
            # paired to GRPO on the same warm start, seed (its tasks and sampling seeds) and game: only the
            # seeds both methods ran; a warm start where they share none drops out of this comparison
            paired = {w: [s for s in design[method][w] if s in design["grpo"][w]] for w in warms}
            delta = [np.stack([outcome[method, w, s] - outcome["grpo", w, s] for s in seeds_of])
                     for w, seeds_of in paired.items() if seeds_of]
            if delta:
                d, d_low, d_high = mean_interval(delta, args.bootstrap, rng)
                per_run = np.concatenate([t.mean(axis=1) for t in delta])
                entry["vs_grpo"] = {"difference": d, "interval": [d_low, d_high], "per_run": per_run.tolist(),
                                    "paired_runs": {str(w): v for w, v in paired.items() if v},
                                    "runs_for_2_points": runs_needed(delta, 0.02),
                                    "runs_counted_in": "warm starts" if len(delta) >= 2 else "seeds"}
        peaks = [c for c in costs[method] if c and c.get("peak_gb") is not None]
        top = max(peaks, key=lambda c: c["peak_gb"]) if peaks else {}
        entry["peak_gb"], entry["peak_phase"] = top.get("peak_gb"), top.get("peak_phase")
        results[method] = entry
    return {"start": start, "starts": starts, "results": results, "grpo_step": grpo_step}


def table_lines(args, methods: Sequence[str], design: dict[str, dict[int, list[int]]], figures: dict,
                panel_line: str) -> list[str]:
    """The table of `analyse`'s figures: the settings, the warm start, one row per method, what it means."""
    start_mean, start_low, start_high = figures["start"]
    what = "tiny Qwen3" if args.model == "tiny" else args.model
    trained = (f"top {args.train_layers} layers" if args.train_layers
               else "all weights") + f", autocast {args.autocast}"
    warms = warm_starts_of(design)
    counts = {m: [len(design[m][w]) for w in warms] for m in methods}
    one_run_each = all(n == 1 for c in counts.values() for n in c)
    same_seeds = len({tuple(c) for c in counts.values()}) == 1  # every method: the same count per warm start
    if same_seeds:
        c = counts[methods[0]]
        shape = (f"{len(warms)} warm start(s) x {c[0]} seed(s)" if len(set(c)) == 1
                 else f"{len(warms)} warm starts x " + "+".join(map(str, c)) + " seeds")
    else:
        shape = (f"{len(warms)} warm start(s); seeds per warm start: "
                 + ", ".join(f"{m} " + "+".join(map(str, counts[m])) for m in methods))
    lines = [
        f"{args.env}, small rooms, {args.max_turns} turns, {args.train_games} training games | {panel_line}, greedy | "
        f"{what}, {trained} | warm start: {args.sft_episodes} expert episodes x {args.sft_epochs} epochs "
        f"({'searching' if args.expert_searches else 'planner'} expert, detours {args.sft_noise}, lr {args.sft_lr}) | "
        f"RL: {args.steps} updates x {args.tasks_per_step} tasks x {args.group_size} episodes, lr {args.lr}, "
        f"{args.mini_batches}x{args.ppo_epochs} optimizer steps, temperature {args.temperature}"
        + (f", KL to the warm start x {args.kl_coef}" if args.kl_coef else "")
        + (f", invalid-turn penalty {args.invalid_coef}" if args.invalid_coef is not None else "")
        + (f", credit {' '.join(args.credit)}" if args.credit else "") + " | "
        f"{shape}",
        *filter(None, [shared_sft_note(max(warms) + 1, args.sft_episodes, args.train_games)]),
        f"warm start: {100 * start_mean:.1f}% [{100 * start_low:.1f}, {100 * start_high:.1f}]",
        f"{'method':<10} {'after RL':>9} {'95% interval':>16} {'vs start':>9} {'95% interval':>18} "
        f"{'vs GRPO':>9} {'95% interval':>18} {'runs for +-2':>12} "
        f"{'step s':>7} {'rollout':>8} {'teacher':>8} {'update':>7} {'x GRPO':>7} {'peak GB':>7} {'in':<8}",
    ]
    grpo_step = figures["grpo_step"]
    for method in methods:
        entry = figures["results"][method]
        (low, high), phase = entry["interval"], entry["step_seconds"]
        diff = diff_ci = need = "-"
        if "vs_grpo" in entry:
            d, (d_low, d_high) = entry["vs_grpo"]["difference"], entry["vs_grpo"]["interval"]
            needed = entry["vs_grpo"]["runs_for_2_points"]
            diff, diff_ci = f"{100 * d:+.1f}", f"[{100 * d_low:+.1f}, {100 * d_high:+.1f}]"
            need = str(needed) if needed is not None else "?"
        gain, (g_low, g_high) = entry["vs_start"]["difference"], entry["vs_start"]["interval"]
        gain_ci = f"[{100 * g_low:+.1f}, {100 * g_high:+.1f}]"
        ratio = f"{phase['step'] / grpo_step:.2f}" if grpo_step else "-"
        peak = f"{entry['peak_gb']:.1f}" if entry["peak_gb"] is not None else "-"
        lines.append(f"{method:<10} {100 * entry['success']:>8.1f}% {f'[{100 * low:.1f}, {100 * high:.1f}]':>16} "
                     f"{100 * gain:>+9.1f} {gain_ci:>18} {diff:>9} {diff_ci:>18} {need:>12} "
                     f"{phase['step']:>7.0f} {phase['rollout']:>8.0f} "
                     f"{phase['teacher']:>8.0f} "
                     f"{phase['update']:>7.0f} {ratio:>7} {peak:>7} {entry['peak_phase'] or '-':<8}")
    lines.append(
        "After RL: held-out success at the last update, the mean over warm starts (each weighing the same) of the "
        "mean over their seeds and games. vs start: the paired difference to the warm start on the same games. "
        "Intervals, paired for the differences: "
        + ("a cluster t over the warm starts (t with W-1 degrees of freedom on the per-warm-start means: it holds "
           "warm-start, seed and game variance; with few warm starts it is wide). " if len(warms) >= 2 else
           "a bootstrap over seeds and games: one warm start, so warm-start variance is NOT in the interval. ")
        + (("With one run per method the interval holds game sampling only: the run-to-run spread, which decided "
            "rankings before, is not in it. " if len(warms) < 2 else
            "One seed per warm start: the spread between warm starts holds seed variance too, the two are not "
            "told apart. ") if one_run_each else "")
        + ("vs GRPO: paired on the seeds both methods ran from each warm start (each method's own columns use all "
           "its runs). " if not same_seeds else "")
        + ("runs for +-2: warm starts (each with as many seeds) for a +-2-point interval on the difference, with "
           "the interval's own model and the spread of the warm starts seen. " if len(warms) >= 2 else
           "runs for +-2: seeds from this warm start for a +-2-point interval, with the interval's own model "
           "(no warm-start variance; '?': one run shows no spread). ")
        + "Peak GB: the largest resident memory an update of the method "
          "reached, and in which phase of it (rollout; scoring: old log-probs and the teacher; update) "
          "('-': runs from before it was logged). Step seconds: medians per update, "
          + ("as the runs ran." if args.table_only else
             f"each run on {threads_per_run(args)} thread(s), "
             f"{args.jobs} at a time."))
    return lines


def main(argv=None) -> int:
    args = parse_args(argv)

    agentgym_opsd.load_plugins()
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    bad = [m for m in methods if m not in METHODS]
    if bad:
        print(f"learning.py: unknown method(s) {bad}; use {', '.join(METHODS)}", file=sys.stderr)
        return 2
    out = Path(args.out)
    started = time.perf_counter()
    load_before = os.getloadavg()[0]
    panel = {"train": args.train_games, "valid_seen": args.eval_games if args.eval_split == "valid_seen" else 0,
             "valid_unseen": args.eval_games if args.eval_split == "valid_unseen" else 0}
    env_options = recipe_of(args).env_options(panel)
    eval_options, seeds, panel_line = held_out_panel(args, env_options)
    print(panel_line, flush=True)
    common = shared_fields(args, env_options, eval_options, seeds)
    try:
        ledger = open_ledger(args, seeds)
    except (DataFileError, OSError) as exc:
        print(f"learning.py: --ledger {args.ledger} cannot be read ({exc}); give a JSON-lines ledger this benchmark "
              "wrote, or a new path", file=sys.stderr)
        return 2
    try:
        return run_and_report(args, out, methods, common, seeds, panel_line, ledger, started, load_before)
    except LedgerMismatch as exc:
        print(f"learning.py: {exc}", file=sys.stderr)
        return 1


def run_and_report(args, out: Path, methods: list[str], common: dict, seeds: list[int], panel_line: str,
                   ledger: RunLedger | None, started: float, load_before: float) -> int:
    """main's body once the panel is known: the warm starts, the RL runs, the table, the page."""
    fingerprints: dict[int, str] = {}

    def finished(key=None, seconds: float | None = None) -> None:  # a job just ended: the ledger records it
        if ledger is not None:
            record_finished(ledger, out, methods, {key: seconds} if key is not None else None, fingerprints)

    if ledger is not None:
        finished()  # runs an earlier invocation finished under OUT
        print(f"ledger {ledger.path}: {len(ledger.warm_starts())} warm start(s) and "
              f"{len(ledger.records) - len(ledger.warm_starts())} run(s) of this design"
              + (f" ({ledger.other_designs} record(s) of other designs not counted)" if ledger.other_designs else ""),
              flush=True)

    # 1. the warm starts, each evaluated once on the held-out panel
    if note := shared_sft_note(args.warm_starts, args.sft_episodes, args.train_games):
        print(note, flush=True)
    warm_seconds, starts = run_warm_starts(args, out, common, methods, ledger, done=finished)
    for w, outcomes in starts.items():
        low, high = wilson(sum(outcomes), len(outcomes))
        print(f"warm start {w}: held-out {sum(outcomes)}/{len(outcomes)} = {100 * np.mean(outcomes):.1f}% "
              f"[{100 * low:.1f}, {100 * high:.1f}]", flush=True)
    if args.warm_only:
        print(f"--warm-only: the warm start(s) are in {out}/warm*; RL runs from them with the same --out and "
              f"without --warm-only")
        return 0

    # 2. the RL runs
    run_seconds = run_rl(args, out, methods, common, ledger, done=finished)

    # 3. the figures, over every warm start and seed whose runs of every method are done (all of them, after
    # a whole invocation; with --table-only, whatever is under OUT and in the ledger)
    design = finished_design(out, methods, *((None, None) if args.table_only else (args.warm_starts, args.seeds)),
                             ledger=ledger)
    if not design:
        print(f"learning.py: no warm start under {out} has a finished run of every method ({', '.join(methods)}); "
              "run it without --table-only", file=sys.stderr)
        return 1
    figures = analyse(args, out, methods, design, starts, ledger)
    warms = warm_starts_of(design)
    lines = table_lines(args, methods, design, figures, panel_line)
    wall = time.perf_counter() - started
    load_after = os.getloadavg()[0]
    lines.append(f"this invocation: {wall / 60:.1f} min (warm starts {sum(warm_seconds.values()):.0f}s, "
                 f"RL runs {sum(run_seconds.values()):.0f}s of run time), load average {load_before:.1f} -> "
                 f"{load_after:.1f}")
    table = "\n".join(line.rstrip() for line in lines)
    print(table)
    start_mean, start_low, start_high = figures["start"]
    atomic_write_text(out / "learning.txt", table + "\n")
    atomic_write_json(out / "learning.json", {
        "args": vars(args), "held_out_seeds": seeds,
        "design": {m: {str(w): v for w, v in runs.items()} for m, runs in design.items()},
        "warm_start": {"success": start_mean, "interval": [start_low, start_high],
                       "per_warm_start": [float(np.mean(figures["starts"][w])) for w in warms]},
        "results": figures["results"], "wall_seconds": wall, "load": [load_before, load_after]})
    what = "tiny Qwen3" if args.model == "tiny" else args.model
    groups = [f"warm start {w}" for w in warms]
    plot_paired_runs({g: float(np.mean(figures["starts"][w])) for g, w in zip(groups, warms, strict=True)},
                     {m: dict(zip(groups, figures["results"][m]["per_run"], strict=True)) for m in methods},
                     out / "learning.png",
                     title=f"held-out success after RL, {args.env.split('/')[-1]}, {what}\n"
                           f"(each dot a seed's run; bar: its warm start)")
    print(f"wrote {out / 'learning.txt'}, {out / 'learning.json'} and {out / 'learning.png'}")
    if args.page:
        atomic_write_bytes(PAGES / "learning.png", (out / "learning.png").read_bytes())
        page = write_results_page(
            "learning", "Does RL raise held-out success above the warm start, and does per-turn credit beat GRPO?",
            f"```\n{table}\n```", command="python -m benchmarks.learning " + " ".join(sys.argv[1:]),
            load=None if args.table_only else [round(load_before, 2), round(load_after, 2)],  # a read-back
            plots=("learning.png",), **measured_on(args, ledger))
        print(f"wrote {page}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
