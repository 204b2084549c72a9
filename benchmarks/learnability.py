"""Does GRPO lift the real model on the games it trains on? Sampled success on a fixed set of training games,
before and after, with the update sizes that got it there.

    .venv/bin/python -m benchmarks.learnability         # 8 games x 8 episodes, 16 updates, learning's warm start 0
    .venv/bin/python -m benchmarks.learnability --lr 3e-5 --steps 20 --out runs/learnability-lr3e-5
    .venv/bin/python -m benchmarks.learnability --quick # 2 games x 4 episodes, 2 updates: a smoke run

Before any comparison of credit methods: with this trainer, budget and warm start, does plain GRPO raise
success at all, on the very games it trains on? A run that cannot do that cannot rank methods.

1. The warm start: `--warm` (default: `benchmarks.learning`'s warm start 0, runs/learning-smollm2-135m/warm0/model;
   `python -m benchmarks.learning --warm-only` makes it).
2. The games: `--games` G games of its training panel (ALFWorld Pick, small rooms, `trainer.recipes.PICK_REAL`),
   drawn with `--seed`, the same G games in every update (`TrainConfig.train_seeds`).
3. GRPO from the warm start: `--steps` updates of G games x `--group-size` episodes at `--temperature`, at
   `--lr` (constant), `--mini-batches` x `--ppo-epochs` optimizer steps per update, the KL penalty to the
   warm start `--kl-coef` and the invalid-turn penalty `--invalid-coef` (defaults: `PICK_REAL`'s, the
   learning benchmark's), on `--threads` torch threads (all of them:
   the run is alone). Resumes from its checkpoint: run it again to continue.
4. Before and after, paired: the warm start's sampled success on those games is its first update's rollout;
   after the last update the trained policy plays that rollout again (same games, episode ids and sampling
   seed). The difference with a 95% interval from a bootstrap over games (a game's episodes go together)
   and an exact McNemar test over the episodes whose outcome changed.
5. Per update: train success (the learning curve), KL to the warm start, KL(old || new) against
   `kl_floor` (the same policy's log-probs through the two code paths the update compares: what rounding
   alone shows), clip fraction,
   gradient norm, phase seconds. Writes OUT/learnability.txt, .json and .png.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from pathlib import Path

import numpy as np

import agentgym_opsd
from agentgym_opsd.episode import load_episodes
from agentgym_opsd.io import atomic_write_json, atomic_write_text, read_jsonl
from agentgym_opsd.rollout import EpisodeRequest, run_episodes
from benchmarks.common import PAGES, add_page_argument, git_commit, markdown_table, save_png, write_results_page
from trainer.config import TrainConfig, TrainError
from trainer.local import LocalTrainer
from trainer.policy import load_policy
from trainer.recipes import PICK_ENV, PICK_REAL
from trainer.run_state import rollout_agent, sampling_context

DEFAULT_WARM = "runs/learning-smollm2-135m/warm0/model"


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--warm", default=DEFAULT_WARM, help="the warm start's model folder")
    ap.add_argument("--games", type=int, default=8)
    ap.add_argument("--group-size", type=int, default=PICK_REAL.group_size)
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--lr", type=float, default=PICK_REAL.lr)
    ap.add_argument("--mini-batches", type=int, default=PICK_REAL.mini_batches)
    ap.add_argument("--ppo-epochs", type=int, default=PICK_REAL.ppo_epochs)
    ap.add_argument("--temperature", type=float, default=PICK_REAL.temperature,
                    help="sampling temperature of the rollouts (and of the log-probs the update compares)")
    ap.add_argument("--kl-coef", type=float, default=PICK_REAL.kl_coef,
                    help="weight of the KL penalty to the warm start (default: the recipe's)")
    ap.add_argument("--invalid-coef", type=float, default=PICK_REAL.invalid_coef,
                    help="invalid-turn penalty (default: the recipe's; `PICK_REAL` has none)")
    ap.add_argument("--seed", type=int, default=0, help="picks the games and seeds the run")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--quick", action="store_true", help="2 games x 4 episodes, 2 updates")
    ap.add_argument("--out", default="runs/learnability")
    ap.add_argument("--no-progress", dest="progress", action="store_false")
    add_page_argument(ap)
    args = ap.parse_args(argv)
    if args.quick:
        args.games, args.group_size, args.steps = 2, 4, 2
        if args.out == "runs/learnability":
            args.out = "runs/learnability-quick"
    if not 0 < args.temperature <= 2:
        ap.error(f"--temperature must be in (0, 2], got {args.temperature}")
    for name in ("kl_coef", "invalid_coef"):
        value = getattr(args, name)
        if value is not None and not value >= 0:
            ap.error(f"--{name.replace('_', '-')} must be >= 0, got {value}")
    for name in ("games", "group_size", "steps", "mini_batches", "ppo_epochs", "threads"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.games > PICK_REAL.train_games:
        ap.error(f"--games {args.games}: the training panel has {PICK_REAL.train_games}")
    if args.group_size < 2:
        ap.error("--group-size must be >= 2 (GRPO compares episodes of the same game)")
    if not (Path(args.warm) / "config.json").is_file():
        ap.error(f"--warm {args.warm}: no model folder there; make learning's warm start with "
                 "`python -m benchmarks.learning --warm-only` or pass another folder")
    return args


def run_config(args, games: list[int]) -> TrainConfig:
    recipe = PICK_REAL
    panel = {"train": recipe.train_games, "valid_seen": 0, "valid_unseen": recipe.eval_games}
    credit = {} if args.invalid_coef is None else {"invalid_coef": args.invalid_coef}
    return TrainConfig(
        env_id=PICK_ENV, out=str(Path(args.out) / "run"), method="grpo", model=str(args.warm),
        env_options=recipe.env_options(panel), steps=args.steps, tasks_per_step=len(games),
        group_size=args.group_size, train_seeds=games, temperature=args.temperature, lr=args.lr, kl_coef=args.kl_coef,
        lr_schedule="constant",
        mini_batches=args.mini_batches, ppo_epochs=args.ppo_epochs, max_new_tokens=recipe.max_new_tokens,
        train_layers=recipe.train_layers, autocast=recipe.autocast, eval_episodes=0, eval_before=False,
        eval_every=0, seed=args.seed, cpu_threads=args.threads, credit=credit, save_every=1,
    )


def replay_first_rollout(config: TrainConfig, model_dir: Path) -> list:
    """The first update's rollout again (its games, episode ids and sampling seed) with the model in
    `model_dir`: the same draws, another policy."""
    model, tokenizer = load_policy(str(model_dir), device="cpu", dtype="float32")
    first = load_episodes(Path(config.out) / "episodes" / "update_00001.jsonl")
    requests = [EpisodeRequest(seed=e.seed, episode_id=e.episode_id, group=e.group) for e in first]
    agent = rollout_agent(model, tokenizer, config)
    with sampling_context(config, agent):
        return run_episodes(lambda: agentgym_opsd.make(config.env_id, **config.env_options), agent, requests,
                            num_envs=len(requests), context=config.context, progress=False)


def paired_change(before: list, after: list, draws: int = 4000) -> dict:
    """Success before and after (episodes paired by id), the difference with a 95% interval from a
    bootstrap over games, an exact two-sided McNemar p over the discordant episodes, and the share of
    invalid turns before and after."""
    by_id = {e.episode_id: e for e in after}
    pairs = [(int(e.success), int(by_id[e.episode_id].success), e.group) for e in before]
    games = sorted({g for _, _, g in pairs})
    per_game = np.array([[np.mean([b for b, _, g in pairs if g == game]),
                          np.mean([a for _, a, g in pairs if g == game])] for game in games])
    rng = np.random.default_rng(0)
    picks = rng.integers(0, len(games), size=(draws, len(games)))
    diffs = (per_game[picks, 1] - per_game[picks, 0]).mean(axis=1)
    up = sum(1 for b, a, _ in pairs if a > b)
    down = sum(1 for b, a, _ in pairs if b > a)
    n = up + down
    tail = sum(math.comb(n, k) for k in range(0, min(up, down) + 1)) / 2**n if n else 1.0
    return {"before": float(np.mean([b for b, _, _ in pairs])), "after": float(np.mean([a for _, a, _ in pairs])),
            "difference": float(per_game[:, 1].mean() - per_game[:, 0].mean()),
            "interval": [float(np.percentile(diffs, 2.5)), float(np.percentile(diffs, 97.5))],
            "gained": up, "lost": down, "mcnemar_p": min(1.0, 2 * tail), "episodes": len(pairs),
            "invalid_before": invalid_share(before), "invalid_after": invalid_share(after)}


def invalid_share(episodes: list) -> float:
    """Invalid turns over all turns of `episodes` (0 when they played none)."""
    turns = sum(e.num_turns for e in episodes)
    return sum(e.invalid_turns for e in episodes) / turns if turns else 0.0


def format_table(args, games: list[int], updates: list[dict], change: dict, seconds: float,
                 load: tuple[float, float]) -> str:
    lines = [f"learnability: GRPO on {len(games)} fixed training games x {args.group_size} episodes, {args.steps} "
             f"updates, temperature {args.temperature}, lr {args.lr}, {args.mini_batches} mini-batches x "
             f"{args.ppo_epochs} epochs, KL to the warm start x {args.kl_coef}, invalid-turn penalty "
             f"{'the family default' if args.invalid_coef is None else args.invalid_coef}, from {args.warm} | "
             f"games {games} | commit {git_commit()}, {args.threads} threads, load {load[0]:.1f} -> {load[1]:.1f}, "
             f"{seconds / 60:.1f} min",
             f"{'update':>6} {'success':>8} {'reward':>7} {'invalid':>8} {'KL start':>9} {'KL old-new':>11} "
             f"{'KL floor':>9} "
             f"{'clip':>6} {'grad':>6} {'step s':>7} {'rollout s':>9}"]
    for r in updates:
        floor = r.get("kl_floor", float("nan"))
        lines.append(f"{r['step']:>6} {100 * r['train/success']:>7.1f}% {r['train/reward']:>7.3f} "
                     f"{100 * r['train/invalid_rate']:>7.1f}% {r.get('kl_ref', float('nan')):>9.2e} "
                     f"{r['kl_old_new']:>11.2e} {floor:>9.1e} "
                     f"{r['clip_frac']:>6.3f} {r['grad_norm']:>6.2f} {r['time/step_s']:>7.0f} "
                     f"{r['time/rollout_s']:>9.0f}")
    lines.append(f"sampled success on the {len(games)} games ({change['episodes']} episodes, same draws): before "
                 f"{100 * change['before']:.1f}% -> after {100 * change['after']:.1f}%, difference "
                 f"{100 * change['difference']:+.1f} points [{100 * change['interval'][0]:+.1f}, "
                 f"{100 * change['interval'][1]:+.1f}] (bootstrap over games), {change['gained']} episodes won that "
                 f"were lost, {change['lost']} lost that were won (exact McNemar p = {change['mcnemar_p']:.3g})")
    return "\n".join(line.rstrip() for line in lines)


def page_body(args, games: list[int], updates: list[dict], change: dict, seconds: float) -> str:
    """The results page's figures: the settings, the paired before/after change, the per-update table."""
    rows = [[r["step"], f"{100 * r['train/success']:.1f}%", f"{r['train/reward']:.3f}",
             f"{100 * r['train/invalid_rate']:.1f}%", f"{r.get('kl_ref', float('nan')):.2e}", f"{r['kl_old_new']:.2e}",
             f"{r.get('kl_floor', float('nan')):.1e}",
             f"{r['clip_frac']:.3f}", f"{r['grad_norm']:.2f}", f"{r['time/step_s']:.0f}"] for r in updates]
    table = markdown_table(["update", "train success", "reward", "invalid turns", "KL to start", "KL old->new",
                            "KL floor",
                            "clip fraction", "grad norm", "step s"], rows)
    return (f"GRPO from `{args.warm}` on {len(games)} fixed training games of ALFWorld Pick (reset seeds "
            f"{games}) x {args.group_size} episodes per update at temperature {args.temperature}, "
            f"{args.steps} updates, lr {args.lr}, "
            f"{args.mini_batches} mini-batch(es) x {args.ppo_epochs} epoch(s), KL penalty to the warm start x "
            f"{args.kl_coef}, invalid-turn penalty "
            f"{'the family default' if args.invalid_coef is None else args.invalid_coef}; "
            f"{seconds / 60:.1f} min.\n\n"
            f"**Sampled success on those games, before -> after** (the first update's rollout, then the trained "
            f"policy on the same games, episode ids and sampling seed; {change['episodes']} episodes): "
            f"{100 * change['before']:.1f}% -> {100 * change['after']:.1f}%, "
            f"{100 * change['difference']:+.1f} points [{100 * change['interval'][0]:+.1f}, "
            f"{100 * change['interval'][1]:+.1f}] (95%, bootstrap over games); {change['gained']} episodes won that "
            f"were lost, {change['lost']} lost that were won (exact McNemar p = {change['mcnemar_p']:.3g}).\n\n"
            f"{table}\n\nKL to start: the mean per-token KL (k3) of the policy to the warm start; "
            "KL old->new: the mean per-token KL between the rollout's log-probs and the updated "
            "policy's; KL floor: the same policy's log-probs through the update's two code paths before any "
            "step (rounding alone): a KL near its floor means the update did not move the policy.")


def plot(updates: list[dict], change: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [r["step"] for r in updates]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    left.plot(steps, [100 * r["train/success"] for r in updates], marker="o", label="train rollout (same games)")
    left.axhline(100 * change["before"], color="gray", ls="--", label="warm start (update 1's rollout)")
    left.scatter([steps[-1] + 0.5], [100 * change["after"]], color="C3", zorder=3, label="after (same draws)")
    left.set(xlabel="update", ylabel="sampled success, %", title="success on the training games")
    left.legend(fontsize=8)
    right.semilogy(steps, [max(r["kl_old_new"], 1e-12) for r in updates], marker="o", label="KL(old || new)")
    right.semilogy(steps, [max(r.get("kl_floor", 0.0), 1e-12) for r in updates], ls="--", label="floor (rounding)")
    right.set(xlabel="update", ylabel="KL per token", title="how far each update moved the policy")
    right.legend(fontsize=8)
    fig.tight_layout()
    save_png(fig, path)
    plt.close(fig)


def main(argv=None) -> int:
    args = parse_args(argv)
    agentgym_opsd.load_plugins()
    out = Path(args.out)
    draw = np.random.default_rng(args.seed).choice(PICK_REAL.train_games, args.games, replace=False)
    games = sorted(int(g) for g in draw)
    config = run_config(args, games)
    started, load_before = time.perf_counter(), os.getloadavg()[0]
    resume = (Path(config.out) / "checkpoint.pt").exists()
    try:
        LocalTrainer(config, resume=resume, progress=args.progress).run()
    except TrainError as e:
        raise SystemExit(f"learnability: {e}") from None
    updates = [r for r in read_jsonl(Path(config.out) / "metrics.jsonl") if r.get("kind") == "train"]
    before = load_episodes(Path(config.out) / "episodes" / "update_00001.jsonl")
    after = replay_first_rollout(config, Path(config.out) / "model")
    change = paired_change(before, after)
    seconds = time.perf_counter() - started
    table = format_table(args, games, updates, change, seconds, (load_before, os.getloadavg()[0]))
    print(table)
    atomic_write_text(out / "learnability.txt", table + "\n")
    atomic_write_json(out / "learnability.json", {
        "args": vars(args), "games": games, "commit": git_commit(), "change": change, "seconds": seconds,
        "updates": [{k: v for k, v in r.items() if not k.startswith("memory")} for r in updates]})
    plot(updates, change, out / "learnability.png")
    print(f"wrote {out / 'learnability.txt'}, {out / 'learnability.json'} and {out / 'learnability.png'}")
    if args.page:
        plot(updates, change, PAGES / "learnability.png")
        page = write_results_page("learnability", "Does GRPO lift the real model on the games it trains on?",
                                  page_body(args, games, updates, change, seconds), threads=args.threads,
                                  load=[round(load_before, 2), round(os.getloadavg()[0], 2)],
                                  command="python -m benchmarks.learnability " + " ".join(sys.argv[1:]),
                                  plots=("learnability.png",))
        print(f"wrote {page}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
