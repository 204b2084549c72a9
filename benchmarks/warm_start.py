"""Does the warm start generalise? A tiny policy's success on its own training games against held-out ones.

    .venv/bin/python benchmarks/warm_start.py                                   # learning.py's warm start: 200 Pick games
    .venv/bin/python benchmarks/warm_start.py --train-games 1000
    .venv/bin/python benchmarks/warm_start.py --train-games 1000 --expert searching --max-turns 15
    .venv/bin/python benchmarks/warm_start.py --model runs/learning/sft/model  # evaluate a warm start you have

1. A warm start as benchmarks/learning.py makes it (a tiny Qwen3, hidden 128 x 2 layers, a 1024-token
   BPE trained on the env's text, SFT on `--sft-episodes` expert episodes with random detours, full-chat
   context) on `--train-games` ALFWorld Pick games in small rooms (a panel of Pick games only,
   `panel_own_types=True`). `--expert searching` imitates the expert that looks for the object
   receptacle by receptacle (`expert_searches=True`) instead of the planner, which goes straight to
   where only the game knows the object is. `--model DIR` skips training and evaluates DIR.
2. Greedy episodes, one per game, on: the first `--episodes` training games; the first `--episodes`
   valid_seen games, split into those with a twin in training (the same goal and expert plan:
   memorisable) and those without; `--episodes` valid_unseen games (floor plans the training never saw).
3. Success per panel with a 95% Wilson interval, and the invalid-turn rate. A policy that wins its
   training games and their held-out twins but not the twin-free or unseen games has memorised
   games instead of learning to act on what it reads. Writes OUT/warm_start.json.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

ENV = "agentgym/ALFWorld-Pick-v0"


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--train-games", type=int, default=200, help="Pick games in the training split (learning.py: 200)")
    ap.add_argument("--expert", choices=("planner", "searching"), default="planner")
    ap.add_argument("--sft-episodes", type=int, default=1500)
    ap.add_argument("--sft-epochs", type=int, default=6)
    ap.add_argument("--sft-noise", type=float, default=0.25)
    ap.add_argument("--sft-lr", type=float, default=3e-3)
    ap.add_argument("--tiny-hidden", type=int, default=128)
    ap.add_argument("--tiny-layers", type=int, default=2)
    ap.add_argument("--max-turns", type=int, default=12)
    ap.add_argument("--episodes", type=int, default=100, help="games per evaluation panel")
    ap.add_argument("--model", default=None, help="evaluate this model folder instead of training one")
    ap.add_argument("--out", default="runs/warm_start")
    ap.add_argument("--no-progress", dest="progress", action="store_false")
    args = ap.parse_args(argv)
    for name in ("train_games", "sft_episodes", "sft_epochs", "max_turns", "episodes"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.model is not None and not (Path(args.model) / "config.json").exists():
        ap.error(f"--model {args.model}: no config.json there (a folder written by `agentgym-opsd train`)")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    import torch
    from held_out_games import twin_free_seeds

    import agentgym_opsd
    from agentgym_opsd.io import atomic_write_json
    from agentgym_opsd.rollout import EpisodeRequest, run_episodes
    from agentgym_opsd.summary import summarize
    from trainer.config import TrainConfig, TrainError
    from trainer.local import LocalTrainer
    from trainer.policy import load_policy
    from trainer.sampling import HFPolicyAgent

    torch.set_num_threads(1)
    agentgym_opsd.load_plugins()
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
            env_id=ENV, out=str(out), method="grpo", model="tiny", tokenizer="trained", vocab_size=1024,
            tiny_hidden=args.tiny_hidden, tiny_layers=args.tiny_layers, env_options=env_options, context="full",
            sft_episodes=args.sft_episodes, sft_epochs=args.sft_epochs, sft_noise=args.sft_noise, sft_lr=args.sft_lr,
            steps=0, save_every=0, eval_episodes=0, max_new_tokens=24, seed=0, device="cpu",
        )
        try:
            LocalTrainer(config, progress=args.progress).run()
        except TrainError as e:
            print(f"warm_start.py: {e}", file=sys.stderr)
            return 2
    warm_seconds = time.perf_counter() - started
    model, tokenizer = load_policy(str(model_dir), device="cpu")
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
        agent = HFPolicyAgent(model, tokenizer, max_new_tokens=24, temperature=0.0, seed=0, name="warm start")
        requests = [EpisodeRequest(seed=s, episode_id=f"{split}-{s}") for s in seeds]
        make_env = lambda split=split: agentgym_opsd.make(ENV, **{**env_options, "split": split})  # noqa: E731
        episodes = run_episodes(make_env, agent, requests, num_envs=min(64, len(requests)), context="full",
                                progress=label if args.progress else False)
        summary = summarize(episodes, env_id=ENV, agent="warm start")  # success with its Wilson interval
        results[label] = {"split": split, "games": len(episodes), "wins": sum(e.success for e in episodes),
                          "success": summary["success_rate"], "ci95": list(summary["success_ci95"]),
                          "invalid_rate": summary["invalid_rate"], "seeds": seeds}

    wall = time.perf_counter() - started
    print(f"warm start: {'model ' + str(model_dir) if args.model else f'{args.sft_episodes} x {args.sft_epochs} SFT'}, "
          f"{args.train_games} Pick training games, {args.expert} expert, small rooms, {args.max_turns} turns, greedy")
    print(f"{'panel':<36} {'games':>5} {'wins':>5} {'success':>8} {'95% interval':>16} {'invalid':>8}")
    for label, r in results.items():
        if not r["games"]:
            print(f"{label:<36} {0:>5}")
            continue
        low, high = r["ci95"]
        print(f"{label:<36} {r['games']:>5} {r['wins']:>5} {100 * r['success']:>7.1f}% "
              f"{f'[{100 * low:.1f}, {100 * high:.1f}]':>16} {100 * r['invalid_rate']:>7.1f}%")
    print(f"warm start {warm_seconds:.0f}s; total {wall:.0f}s")
    atomic_write_json(out / "warm_start.json", {"args": vars(args), "results": results, "warm_start_seconds": warm_seconds,
                                                "wall_seconds": wall})
    return 0


if __name__ == "__main__":
    sys.exit(main())
