"""Does RL raise held-out success above the warm start, and does per-turn credit beat GRPO's?

    .venv/bin/python benchmarks/learning.py                    # ALFWorld Pick, small rooms, 4 methods, 1 seed
    .venv/bin/python benchmarks/learning.py --seeds 3          # the README's figure (longer)
    .venv/bin/python benchmarks/learning.py --methods grpo,stepopsd --steps 30 --out runs/learning

1. Warm start once: a tiny Qwen3 (hidden 128, 2 layers, a 1024-token BPE trained on the env's text)
   is fine-tuned on expert episodes of the training split, with random detours the expert recovers
   from (`--sft-noise`; only the expert's turns are imitated) and, with `--sft-privileged` > 0, the
   teacher's privileged contexts on that share of the episodes (a literate teacher, see
   trainer/warm_start.py). Its held-out success is the starting point of every run.
2. The held-out panel: valid_seen games, minus those with a twin in training (the same goal text and
   the same expert plan: a policy could have memorised them), said in the output.
3. For each method and each of `--seeds` seeds, the same RL run from that model: same seeds, same
   tasks, same budget (`--steps` updates of T tasks x G episodes, full-chat context), evaluated on
   the held-out panel at the end (greedy decoding, one episode per game; every `--eval-every`
   updates for the curve). No checkpoint is picked on the panel.
4. Final held-out success per method with a 95% interval (bootstrap over games, the mean over seeds),
   and the paired difference to GRPO on the same seeds and games with its interval and a sign test
   on the games where the two differ. `--jobs` runs (default 2) go at once, each in its own process on
   one torch thread: the results are the same for any `--jobs`, the wall time is not. Writes OUT/learning.txt, OUT/learning.json and
   OUT/learning.png (held-out success against updates, the first seed's runs).

The default panel is the embedded one with 200 training and 300 valid_seen Pick games in small rooms;
the first run generates it (cached under ~/.cache/agentgym-opsd). An interrupted run resumes from
its checkpoints when the command is run again.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

DEFAULT_METHODS = ("grpo", "gigpo", "stepopsd", "agentopsd")


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--env", default="agentgym/ALFWorld-Pick-v0")
    ap.add_argument("--option", action="append", default=None, metavar="KEY=VALUE",
                    help="env keyword for training (default: room=small, split=train, max_turns=12, "
                    "panel_size={train: 200, valid_seen: 300, valid_unseen: 10})")
    ap.add_argument("--eval-option", action="append", default=None, metavar="KEY=VALUE",
                    help="env keyword for the held-out panel (default: split=valid_seen)")
    ap.add_argument("--methods", default=",".join(DEFAULT_METHODS))
    ap.add_argument("--seeds", type=int, default=1, help="RL runs per method (seeds 0..N-1), paired across methods")
    ap.add_argument("--out", default="runs/learning")
    ap.add_argument("--context", default="full")
    ap.add_argument("--vocab-size", type=int, default=1024)
    ap.add_argument("--tiny-hidden", type=int, default=128)
    ap.add_argument("--tiny-layers", type=int, default=2)
    ap.add_argument("--sft-episodes", type=int, default=1500)
    ap.add_argument("--sft-epochs", type=int, default=6)
    ap.add_argument("--sft-noise", type=float, default=0.25)
    ap.add_argument("--sft-lr", type=float, default=3e-3)
    ap.add_argument("--sft-privileged", type=float, default=0.0,
                    help="literate warm start: share of episodes (default 0, plain: 800 episodes x 4 epochs at 0.5 gave "
                    "a tiny policy at 0%% held-out success, nothing for RL to start from)")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--tasks-per-step", type=int, default=8)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--lr-schedule", default="linear", choices=("constant", "linear"))
    ap.add_argument("--mini-batches", type=int, default=4, help="optimizer steps per batch of rollouts")
    ap.add_argument("--max-new-tokens", type=int, default=24)
    ap.add_argument("--eval-games", type=int, default=300, help="valid_seen games considered (twins dropped)")
    ap.add_argument("--eval-every", type=int, default=20)
    ap.add_argument("--bootstrap", type=int, default=2000)
    ap.add_argument("--credit", action="append", default=[], metavar="KEY=VALUE", help="credit setting for every method")
    ap.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1),
                    help="RL runs at once, each in its own process on one torch thread (default: min(2, CPUs)); "
                    "results do not depend on it")
    ap.add_argument("--no-progress", dest="progress", action="store_false")
    args = ap.parse_args(argv)
    if args.jobs < 1:
        ap.error(f"--jobs must be >= 1, got {args.jobs}")
    return args


def rl_run(config_fields: dict, progress: bool) -> float:
    """One RL run (resumed from its checkpoint when there is one); returns its wall seconds. Runs in a
    worker process when --jobs > 1 (each run is seeded and single-threaded: the same result either way)."""
    from trainer.config import TrainConfig
    from trainer.local import LocalTrainer

    t0 = time.perf_counter()
    config = TrainConfig(**config_fields)
    resume = (Path(config.out) / "checkpoint.pt").exists()
    LocalTrainer(config, resume=resume, progress=progress).run()
    return time.perf_counter() - t0


def final_outcomes(run_dir: Path, steps: int) -> list[int]:
    """Success (0/1) per held-out game, in seed order, at the last update."""
    from agentgym_opsd.episode import load_episodes

    episodes = load_episodes(run_dir / "episodes" / f"eval_{steps:05d}.jsonl")
    return [int(e.success) for e in sorted(episodes, key=lambda e: int(e.episode_id.rsplit("-", 1)[1]))]


def interval(table, rng, draws: int) -> tuple[float, float, float]:
    """Mean over seeds and games of a [seeds, games] table, and a 95% bootstrap interval over games."""
    import numpy as np

    table = np.asarray(table, dtype=float)
    per_game = table.mean(axis=0)
    picks = rng.integers(0, per_game.size, size=(draws, per_game.size))
    means = per_game[picks].mean(axis=1)
    return float(per_game.mean()), float(np.percentile(means, 2.5)), float(np.percentile(means, 97.5))


def sign_test(a, b) -> tuple[int, int, float]:
    """Two-sided sign test over (seed, game) pairs where a and b differ: (a wins, b wins, p)."""
    wins_a = sum(1 for x, y in zip(a, b, strict=True) if x > y)
    wins_b = sum(1 for x, y in zip(a, b, strict=True) if y > x)
    n, k = wins_a + wins_b, min(wins_a, wins_b)
    p = min(1.0, 2 * sum(math.comb(n, i) for i in range(k + 1)) / 2**n) if n else 1.0
    return wins_a, wins_b, p


def main(argv=None) -> int:
    args = parse_args(argv)
    import numpy as np
    from held_out_games import twin_free_seeds

    import agentgym_opsd
    from agentgym_opsd.io import atomic_write_json, atomic_write_text
    from agentgym_opsd.usage import parse_options
    from trainer.config import TrainConfig
    from trainer.credit.config import METHODS
    from trainer.local import LocalTrainer
    from trainer.plots import plot_comparison

    agentgym_opsd.load_plugins()
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    bad = [m for m in methods if m not in METHODS]
    if bad:
        print(f"learning.py: unknown method(s) {bad}; use {', '.join(METHODS)}", file=sys.stderr)
        return 2
    env_options = parse_options(args.option) if args.option is not None else {
        "room": "small", "split": "train", "max_turns": 12,
        "panel_size": {"train": 200, "valid_seen": 300, "valid_unseen": 10},
    }
    eval_options = parse_options(args.eval_option) if args.eval_option is not None else {"split": "valid_seen"}
    out = Path(args.out)
    started = time.perf_counter()
    seeds, dropped = twin_free_seeds(args.env, {**env_options, "progress": False},
                                     {**env_options, **eval_options, "progress": False}, args.eval_games)
    print(f"held-out panel: {len(seeds)} {eval_options} games ({dropped} of the first {args.eval_games} dropped: "
          "a training game has the same goal and expert plan)")
    common = dict(
        env_id=args.env, env_options=env_options, eval_env_options=eval_options, context=args.context,
        eval_episodes=len(seeds), eval_seeds=seeds, eval_temperature=0.0, max_new_tokens=args.max_new_tokens,
        device="cpu",
    )

    # 1. the shared warm start, evaluated once
    sft_dir = out / "sft"
    if not (sft_dir / "model" / "config.json").exists():
        sft = TrainConfig(
            out=str(sft_dir), method="grpo", model="tiny", tokenizer="trained", vocab_size=args.vocab_size,
            tiny_hidden=args.tiny_hidden, tiny_layers=args.tiny_layers, sft_episodes=args.sft_episodes,
            sft_epochs=args.sft_epochs, sft_noise=args.sft_noise, sft_lr=args.sft_lr, sft_privileged=args.sft_privileged,
            steps=0, save_every=0, seed=0, **common,
        )
        LocalTrainer(sft, progress=args.progress).run()
    start = final_outcomes(sft_dir, 0)
    sft_seconds = time.perf_counter() - started
    print(f"warm start: held-out success {100 * np.mean(start):.1f}% ({sft_seconds:.0f}s)")

    # 2. one RL run per method and seed from the warm-started model, paired seeds and budget; --jobs
    #    of them at once (each in its own process, one torch thread)
    todo = {}
    for method in methods:
        for seed in range(args.seeds):
            run_dir = out / method / f"seed{seed}"
            if not (run_dir / "report.json").exists():
                todo[(method, seed)] = dict(
                    out=str(run_dir), method=method, model=str(sft_dir / "model"), steps=args.steps, seed=seed,
                    tasks_per_step=args.tasks_per_step, group_size=args.group_size, lr=args.lr,
                    lr_schedule=args.lr_schedule, mini_batches=args.mini_batches, eval_every=args.eval_every,
                    eval_before=False, credit=parse_options(args.credit), save_every=5, **common,
                )
    run_seconds: dict[tuple[str, int], float] = {}
    if todo and args.jobs == 1:
        for key, fields in todo.items():
            run_seconds[key] = rl_run(fields, args.progress)
    elif todo:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor, as_completed

        from tqdm.auto import tqdm

        print(f"{len(todo)} RL runs, {args.jobs} at a time (one line per finished run)")
        with ProcessPoolExecutor(args.jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
            futures = {pool.submit(rl_run, fields, False): key for key, fields in todo.items()}
            with tqdm(total=len(futures), desc="RL runs", unit="run", disable=not args.progress) as bar:
                for future in as_completed(futures):
                    key = futures[future]
                    run_seconds[key] = future.result()
                    bar.update(1)
                    bar.write(f"{key[0]} seed {key[1]}: done in {run_seconds[key]:.0f}s")
    finals: dict[str, list[list[int]]] = {}
    seconds: dict[str, float] = {}
    for method in methods:
        finals[method] = [final_outcomes(out / method / f"seed{seed}", args.steps) for seed in range(args.seeds)]
        seconds[method] = sum(run_seconds.get((method, seed), 0.0) for seed in range(args.seeds))
        rates = [100 * np.mean(x) for x in finals[method]]
        print(f"{method}: {100 * np.mean(start):.1f}% -> " + ", ".join(f"{r:.1f}%" for r in rates) + f" ({seconds[method]:.0f}s)")

    # 3. the figures
    rng = np.random.default_rng(0)
    wall = time.perf_counter() - started
    n = len(seeds)
    _, start_low, start_high = interval([start], rng, args.bootstrap)  # one set of draws for both bounds
    lines = [
        f"env {args.env} {env_options} | held-out {eval_options}: {n} games ({dropped} twins of training games "
        f"dropped), greedy | tiny Qwen3 hidden {args.tiny_hidden} x {args.tiny_layers} | warm start {args.sft_episodes} "
        f"expert episodes (detours {args.sft_noise}, privileged share {args.sft_privileged}) | {args.steps} updates x "
        f"{args.tasks_per_step} tasks x {args.group_size} episodes | context {args.context} | {args.seeds} seed(s)",
        f"warm start: {100 * np.mean(start):.1f}% (95% interval over games "
        f"[{100 * start_low:.1f}, {100 * start_high:.1f}])",
        f"{'method':<10} {'after RL':>9} {'95% interval':>16} {'vs GRPO':>9} {'95% interval':>18} {'sign test':>16} {'RL wall':>8}",
    ]
    results = {}
    for method in methods:
        mean, low, high = interval(finals[method], rng, args.bootstrap)
        entry = {"success": mean, "interval": [low, high], "per_seed": [float(np.mean(x)) for x in finals[method]],
                 "seconds": seconds[method]}
        diff = "-"
        diff_ci = "-"
        test = "-"
        if method != "grpo" and "grpo" in finals:
            delta = np.asarray(finals[method], dtype=float) - np.asarray(finals["grpo"], dtype=float)
            d, d_low, d_high = interval(delta, rng, args.bootstrap)
            wins, losses, p = sign_test(sum(finals[method], []), sum(finals["grpo"], []))
            entry["vs_grpo"] = {"difference": d, "interval": [d_low, d_high], "wins": wins, "losses": losses, "p": p}
            diff, diff_ci, test = f"{100 * d:+.1f}", f"[{100 * d_low:+.1f}, {100 * d_high:+.1f}]", f"{wins}:{losses} p={p:.2f}"
        results[method] = entry
        lines.append(f"{method:<10} {100 * mean:>8.1f}% {f'[{100 * low:.1f}, {100 * high:.1f}]':>16} {diff:>9} {diff_ci:>18} "
                     f"{test:>16} {seconds[method]:>7.0f}s")
    lines.append("After RL: the mean over seeds of the final held-out success; intervals: bootstrap over games. vs GRPO: "
                 "the paired difference (same seeds, same games); sign test over the (seed, game) pairs that differ. "
                 f"RL wall: the sum of the method's runs' wall times in this invocation ({args.jobs} run(s) at once).")
    lines.append(f"warm start {sft_seconds:.0f}s; total wall time {wall:.0f}s ({wall / 60:.1f} min)")
    table = "\n".join(lines)
    print(table)
    atomic_write_text(out / "learning.txt", table + "\n")
    atomic_write_json(out / "learning.json", {"args": vars(args), "held_out_seeds": seeds, "twins_dropped": dropped,
                                              "warm_start": float(np.mean(start)), "results": results, "wall_seconds": wall})
    plot_comparison({m: out / m / "seed0" for m in methods}, out / "learning.png",
                    title=f"held-out success, {args.env.split('/')[-1]}\n(warm start {100 * np.mean(start):.1f}%, seed 0)")
    print(f"wrote {out / 'learning.txt'}, {out / 'learning.json'} and {out / 'learning.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
