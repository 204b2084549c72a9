"""Does the warm start generalise? A policy's success on its own training games against held-out ones.

    .venv/bin/python -m benchmarks.warm_start                                   # learning.py's tiny one: 200 Pick games
    .venv/bin/python -m benchmarks.warm_start --train-games 1000 --expert searching --max-turns 15
    .venv/bin/python -m benchmarks.warm_start --base smollm2-135m               # the real model (its defaults below)
    .venv/bin/python -m benchmarks.warm_start --model runs/learning/sft/model  # evaluate a warm start you have

1. A warm start on `--train-games` ALFWorld Pick games in small rooms (a panel of Pick games only,
   `panel_own_types=True`): SFT on `--sft-episodes` expert episodes with random detours (only the
   expert's turns imitated), full-chat context, from `--base`: `tiny` (a tiny Qwen3, hidden 128 x 2
   layers, a 1024-token BPE trained on the env's text: learning.py's tiny warm start) or a real model
   (`smollm2-135m`, or a model folder), whose defaults are the searching expert, 15 turns, 1,000
   training games, the top 8 layers trained in bf16 autocast where the CPU has bf16 units
   (`--train-layers`, `--lora-rank`, `--autocast`; benchmarks/train_speed.py measures the choices).
   `--expert searching` imitates the expert that looks for the object receptacle by receptacle
   (`expert_searches=True`: it uses only what the agent reads) instead of the planner, which goes
   straight to where only the game knows the object is. `--sft-privileged s` also teaches the
   teacher's privileged contexts on a share s of the episodes (the literate warm start).
   `--model DIR` skips training and evaluates DIR. The defaults are the warm start of the model kind's
   recipe (trainer/recipes.py: `PICK_TINY`, `PICK_REAL`).
2. Greedy episodes, one per game, on: the first `--episodes` training games; the first `--episodes`
   valid_seen games, split into those with a twin in training (the same goal and expert plan:
   memorisable) and those without; `--episodes` valid_unseen games (floor plans the training never saw).
3. Per panel: success with a 95% Wilson interval, and the share of turns in the action format
   (format-ok) and admissible (a command the game can do now). A policy that wins its training games
   and their held-out twins but not the twin-free or unseen games has memorised games instead of
   learning to act on what it reads. Writes OUT/warm_start.json; resumes: a trained model in OUT is
   evaluated again, not retrained. `--page` also writes the table to docs/benchmarks/warm_start.md.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import agentgym_opsd
from agentgym_opsd.io import atomic_write_json
from agentgym_opsd.rollout import EpisodeRequest, run_episodes
from agentgym_opsd.summary import summarize
from benchmarks.common import add_page_argument, benchmark_command, load_average, markdown_table, write_results_page
from benchmarks.held_out_games import twin_free_seeds
from trainer.config import TrainConfig, TrainError
from trainer.local import LocalTrainer
from trainer.models import is_named_model
from trainer.policy import autocast_context, load_hf_policy
from trainer.recipes import PICK_ENV as ENV
from trainer.recipes import PICK_REAL, PICK_TINY, SFT_NOISE, TINY_QWEN3, PickRecipe
from trainer.sampling import HFPolicyAgent


def warm_start_defaults(recipe: PickRecipe) -> dict:
    """The flags' defaults from a model kind's recipe (trainer/recipes.py): its warm start."""
    return {"expert": "searching" if recipe.expert_searches else "planner", "max_turns": recipe.max_turns,
            "train_games": recipe.train_games, "sft_episodes": recipe.sft_episodes, "sft_epochs": recipe.sft_epochs,
            "sft_lr": recipe.sft_lr, "train_layers": recipe.train_layers, "autocast": recipe.autocast,
            "max_new_tokens": recipe.max_new_tokens}


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", default="tiny", help="what the warm start fine-tunes: tiny (default), smollm2-135m, "
                    "or a model folder")
    ap.add_argument("--train-games", type=int, help="Pick games in the training split (tiny: 200, as learning.py; "
                    "a real model: 1000)")
    ap.add_argument("--expert", choices=("planner", "searching"))
    ap.add_argument("--sft-episodes", type=int)
    ap.add_argument("--sft-epochs", type=int)
    ap.add_argument("--sft-noise", type=float, default=SFT_NOISE)
    ap.add_argument("--sft-lr", type=float)
    ap.add_argument("--sft-privileged", type=float, default=0.0, help="literate warm start: share of episodes also "
                    "taught in the teacher's privileged contexts")
    ap.add_argument("--train-layers", type=int, help="train the top K layers (real model default 8)")
    ap.add_argument("--lora-rank", type=int, default=0, help="train LoRA adapters of this rank instead")
    ap.add_argument("--autocast", choices=("none", "bf16", "auto"))
    ap.add_argument("--tiny-hidden", type=int, default=TINY_QWEN3["tiny_hidden"])
    ap.add_argument("--tiny-layers", type=int, default=TINY_QWEN3["tiny_layers"])
    ap.add_argument("--max-turns", type=int)
    ap.add_argument("--max-new-tokens", type=int, help="per-turn token cap when the policy plays")
    ap.add_argument("--episodes", type=int, default=100, help="games per evaluation panel")
    ap.add_argument("--model", default=None, help="evaluate this model folder instead of training one")
    ap.add_argument("--out", default="runs/warm_start")
    ap.add_argument("--no-progress", dest="progress", action="store_false")
    add_page_argument(ap)
    args = ap.parse_args(argv)
    defaults = warm_start_defaults(PICK_TINY if args.base == "tiny" else PICK_REAL)
    for name, value in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    for name in ("train_games", "sft_episodes", "sft_epochs", "max_turns", "episodes", "max_new_tokens"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.train_layers < 0 or args.lora_rank < 0:
        ap.error("--train-layers and --lora-rank must be >= 0")

    for flag, value in (("--model", args.model), ("--base", None if args.base == "tiny" else args.base)):
        if value is not None and not is_named_model(value) and not (Path(value) / "config.json").exists():
            ap.error(f"{flag} {value}: no config.json there (a model folder, or a named model such as smollm2-135m)")
    return args


def results_page_body(described: str, results: dict[str, dict]) -> str:
    """The results page's figures: what was evaluated (a line), then per panel the games, wins, success with its
    95% Wilson interval, and the shares of turns format-ok and admissible (`results` as warm_start.json holds it)."""
    table = []
    for label, r in results.items():
        if not r["games"]:
            table.append([label, 0, "", "", "", "", ""])
            continue
        low, high = r["ci95"]
        table.append([label, r["games"], r["wins"], f"{100 * r['success']:.1f}%",
                      f"[{100 * low:.1f}, {100 * high:.1f}]", f"{100 * r['format_ok']:.1f}%",
                      f"{100 * r['admissible']:.1f}%"])
    return described + "\n\n" + markdown_table(
        ["panel", "games", "wins", "success", "95% interval", "format-ok", "admissible"], table)


def main(argv=None) -> int:
    args = parse_args(argv)
    import torch

    torch.set_num_threads(1)
    agentgym_opsd.load_plugins()
    load_before = load_average()
    command = benchmark_command("warm_start", argv)  # before anything can change sys.argv (alfworld's code does)
    started = time.perf_counter()
    out = Path(args.out)
    n = args.episodes
    env_options = {"room": "small", "split": "train", "max_turns": args.max_turns, "panel_own_types": True,
                   "panel_size": {"train": args.train_games, "valid_seen": n, "valid_unseen": n},
                   "expert_searches": args.expert == "searching", "progress": False}

    # 1. the warm start
    model_dir = Path(args.model) if args.model else out / "model"
    if args.model is None and not (model_dir / "config.json").exists():
        config = TrainConfig(
            env_id=ENV, out=str(out), method="grpo", model=args.base, tokenizer="trained",
            vocab_size=TINY_QWEN3["vocab_size"],
            tiny_hidden=args.tiny_hidden, tiny_layers=args.tiny_layers, env_options=env_options, context="full",
            sft_episodes=args.sft_episodes, sft_epochs=args.sft_epochs, sft_noise=args.sft_noise, sft_lr=args.sft_lr,
            sft_privileged=args.sft_privileged, train_layers=args.train_layers, lora_rank=args.lora_rank,
            autocast=args.autocast, steps=0, save_every=0, eval_episodes=0, max_new_tokens=args.max_new_tokens,
            seed=0, device="cpu",
        )
        try:
            LocalTrainer(config, progress=args.progress).run()
        except TrainError as e:
            print(f"warm_start.py: {e}", file=sys.stderr)
            return 2
    warm_seconds = time.perf_counter() - started
    model, tokenizer = load_hf_policy(str(model_dir), device="cpu", dtype="float32")
    model.eval()

    # 2. the panels: training games, held-out twins and twin-free games, unseen floor plans
    free, _ = twin_free_seeds(ENV, env_options, {**env_options, "split": "valid_seen"}, n)
    panels = {
        "train (its own games)": ("train", list(range(n))),
        "valid_seen, twin in training": ("valid_seen", [s for s in range(n) if s not in set(free)]),
        "valid_seen, twin-free": ("valid_seen", free),
        "valid_unseen (unseen floor plans)": ("valid_unseen", list(range(n))),
    }
    results = {}
    for label, (split, seeds) in panels.items():
        if not seeds:
            results[label] = {"split": split, "games": 0}
            continue
        agent = HFPolicyAgent(model, tokenizer, max_new_tokens=args.max_new_tokens, temperature=0.0, seed=0,
                              name="warm start")
        requests = [EpisodeRequest(seed=s, episode_id=f"{split}-{s}") for s in seeds]
        make_env = lambda split=split: agentgym_opsd.make(ENV, **{**env_options, "split": split})  # noqa: E731
        with autocast_context(args.autocast, "cpu"):
            episodes = run_episodes(make_env, agent, requests, num_envs=min(64, len(requests)), context="full",
                                    progress=label if args.progress else False)
        summary = summarize(episodes, env_id=ENV, agent="warm start")  # success with its Wilson interval
        turns = [t for e in episodes for t in e.turns]
        results[label] = {"split": split, "games": len(episodes), "wins": sum(e.success for e in episodes),
                          "success": summary["success_rate"], "ci95": list(summary["success_ci95"]),
                          "invalid_rate": summary["invalid_rate"], "turns": len(turns),
                          "format_ok": sum(t.step.format_ok for t in turns) / max(1, len(turns)),
                          "admissible": sum(bool(t.step.admissible) for t in turns) / max(1, len(turns)),
                          "seeds": seeds}

    wall = time.perf_counter() - started
    trained = (f"{args.sft_episodes} x {args.sft_epochs} SFT of {args.base}"
               + (f", top {args.train_layers} layers" if args.train_layers else "")
               + (f", LoRA rank {args.lora_rank}" if args.lora_rank else "")
               + (f", literate {args.sft_privileged}" if args.sft_privileged else "") + f", autocast {args.autocast}")
    described = (f"warm start: {'model ' + str(model_dir) if args.model else trained}, {args.train_games} Pick "
                 f"training games, {args.expert} expert, small rooms, {args.max_turns} turns, greedy, "
                 f"{args.max_new_tokens} tokens a turn")
    print(described)
    print(f"{'panel':<36} {'games':>5} {'wins':>5} {'success':>8} {'95% interval':>16} {'format-ok':>9} "
          f"{'admissible':>10}")
    for label, r in results.items():
        if not r["games"]:
            print(f"{label:<36} {0:>5}")
            continue
        low, high = r["ci95"]
        print(f"{label:<36} {r['games']:>5} {r['wins']:>5} {100 * r['success']:>7.1f}% "
              f"{f'[{100 * low:.1f}, {100 * high:.1f}]':>16} {100 * r['format_ok']:>8.1f}% "
              f"{100 * r['admissible']:>9.1f}%")
    print(f"warm start {warm_seconds:.0f}s; total {wall:.0f}s")
    atomic_write_json(out / "warm_start.json",
                      {"args": vars(args), "results": results, "warm_start_seconds": warm_seconds,
                                                "wall_seconds": wall})
    if args.page:
        page = write_results_page(
            "warm_start", "Does the warm start generalise? Success on its training games and on held-out ones",
            results_page_body(described + f"; warm start {warm_seconds:.0f} s, total {wall:.0f} s", results),
            command=command, threads=1, load=[load_before[0], load_average()[0]])
        print(f"results page: {page}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
