"""Does RL raise held-out success above the SFT warm start? One run per credit method, same budget.

    python benchmarks/learning.py                       # ALFWorld Pick, small rooms, all four methods
    python benchmarks/learning.py --methods grpo,stepopsd --steps 30 --out runs/learning

1. Warm start once: a tiny Qwen3 (hidden 128, 2 layers, a 1024-token BPE trained on the env's text) is
   fine-tuned on expert episodes of the training split, with random detours the expert recovers from
   (`--sft-noise`; only the expert's turns are imitated). Its held-out success is the starting point.
2. For each method, the same RL run from that model: same seeds, same tasks, same budget
   (`--steps` updates of T tasks x G episodes, full-chat context), evaluated on the same held-out
   panel every few updates (greedy decoding, one episode per held-out game).
3. Prints success before and after RL per method and the wall time, and writes OUT/learning.txt,
   OUT/learning.json, OUT/learning.png (held-out success against updates, one line per method) and each
   run's curves (OUT/<method>/curves/).

The default panel is the embedded one with 200 training and 300 valid_seen Pick games in small rooms
(`panel_size`); the first run generates it (a few minutes, cached under ~/.cache/agentgym-opsd).
A method's run that is interrupted resumes from its checkpoint when the command is run again.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

METHODS = ("grpo", "gigpo", "stepopsd", "agentopsd")


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--env", default="agentgym/ALFWorld-Pick-v0")
    ap.add_argument("--option", action="append", default=None, metavar="KEY=VALUE",
                    help="env keyword for training (default: room=small, split=train, max_turns=12, "
                    "panel_size={train: 200, valid_seen: 300, valid_unseen: 10})")
    ap.add_argument("--eval-option", action="append", default=None, metavar="KEY=VALUE",
                    help="env keyword for the held-out panel (default: split=valid_seen)")
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument("--out", default="runs/learning")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--context", default="full")
    ap.add_argument("--vocab-size", type=int, default=1024)
    ap.add_argument("--tiny-hidden", type=int, default=128)
    ap.add_argument("--tiny-layers", type=int, default=2)
    ap.add_argument("--sft-episodes", type=int, default=1500)
    ap.add_argument("--sft-epochs", type=int, default=6)
    ap.add_argument("--sft-noise", type=float, default=0.25)
    ap.add_argument("--sft-lr", type=float, default=3e-3)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--tasks-per-step", type=int, default=8)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--lr-schedule", default="linear", choices=("constant", "linear"))
    ap.add_argument("--mini-batches", type=int, default=4, help="optimizer steps per batch of rollouts")
    ap.add_argument("--max-new-tokens", type=int, default=24)
    ap.add_argument("--eval-episodes", type=int, default=300)
    ap.add_argument("--eval-every", type=int, default=10)
    ap.add_argument("--credit", action="append", default=[], metavar="KEY=VALUE", help="credit setting for every method")
    ap.add_argument("--no-progress", dest="progress", action="store_false")
    return ap.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    import agentgym_opsd
    from agentgym_opsd.io import atomic_write_json, atomic_write_text
    from agentgym_opsd.usage import parse_options
    from trainer.local import LocalTrainer, TrainConfig
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
    common = dict(
        env_id=args.env, env_options=env_options, eval_env_options=eval_options, context=args.context,
        seed=args.seed, eval_episodes=args.eval_episodes, eval_seed=0, eval_temperature=0.0,
        max_new_tokens=args.max_new_tokens, device="cpu",
    )
    started = time.perf_counter()

    # 1. the shared warm start
    sft_dir = out / "sft"
    if not (sft_dir / "model" / "config.json").exists():
        sft = TrainConfig(
            out=str(sft_dir), method="grpo", model="tiny", tokenizer="trained", vocab_size=args.vocab_size,
            tiny_hidden=args.tiny_hidden, tiny_layers=args.tiny_layers, sft_episodes=args.sft_episodes,
            sft_epochs=args.sft_epochs, sft_noise=args.sft_noise, sft_lr=args.sft_lr, steps=0, save_every=0, **common,
        )
        LocalTrainer(sft, progress=args.progress).run()
    sft_report = json.loads((sft_dir / "report.json").read_text())
    sft_seconds = time.perf_counter() - started
    print(f"SFT warm start: held-out success {100 * sft_report['success_after']:.1f}% ({sft_seconds:.0f}s)")

    # 2. one RL run per method from the warm-started model, same seeds and budget
    results = {}
    for method in methods:
        t0 = time.perf_counter()
        config = TrainConfig(
            out=str(out / method), method=method, model=str(sft_dir / "model"), steps=args.steps,
            tasks_per_step=args.tasks_per_step, group_size=args.group_size, lr=args.lr, lr_schedule=args.lr_schedule, mini_batches=args.mini_batches, eval_every=args.eval_every,
            credit=parse_options(args.credit), save_every=5, **common,
        )
        resume = (out / method / "checkpoint.pt").exists()
        report = LocalTrainer(config, resume=resume, progress=args.progress).run()
        evals = report["eval"]
        results[method] = {
            "before": report["success_before"],
            "after": report["success_after"],
            "best": max(e["eval/success"] for e in evals),
            # the mean of the evaluations after RL began: less sensitive to one evaluation's luck
            "mean_rl": sum(e["eval/success"] for e in evals if e["step"] > 0) / max(1, sum(e["step"] > 0 for e in evals)),
            "curve": [(e["step"], e["eval/success"]) for e in evals],
            "by_subset_after": {k.split("/")[-1]: v for k, v in evals[-1].items() if k.startswith("eval/success/")},
            "seconds": time.perf_counter() - t0,
        }
        print(f"{method}: {100 * report['success_before']:.1f}% -> {100 * report['success_after']:.1f}% "
              f"({results[method]['seconds']:.0f}s)")

    wall = time.perf_counter() - started
    n = args.eval_episodes
    lines = [
        f"env {args.env} {env_options} | held-out {eval_options}, {n} episodes, greedy | tiny Qwen3 "
        f"hidden {args.tiny_hidden} x {args.tiny_layers} layers | {args.steps} updates x {args.tasks_per_step} tasks x "
        f"{args.group_size} episodes | context {args.context}",
        f"{'method':<10} {'SFT start':>9} {'after RL':>9} {'change':>8} {'best':>7} {'RL mean':>8} {'RL wall':>8}",
    ]
    for method, r in results.items():
        lines.append(
            f"{method:<10} {100 * r['before']:>8.1f}% {100 * r['after']:>8.1f}% {100 * (r['after'] - r['before']):>+7.1f} "
            f"{100 * r['best']:>6.1f}% {100 * r['mean_rl']:>7.1f}% {r['seconds']:>7.0f}s"
        )
    p0 = sft_report["success_after"]
    lines.append(f"'RL mean': mean of the evaluations after the first update; one evaluation's binomial standard "
                 f"error at the SFT rate: +-{100 * (p0 * (1 - p0) / max(1, n)) ** 0.5:.1f} points")
    lines.append(f"SFT warm start {sft_seconds:.0f}s; total wall time {wall:.0f}s ({wall / 60:.1f} min)")
    table = "\n".join(lines)
    print(table)
    atomic_write_text(out / "learning.txt", table + "\n")

    atomic_write_json(out / "learning.json", {"args": vars(args), "sft": sft_report, "results": results,
                                              "wall_seconds": wall})
    plot_comparison({m: out / m for m in results}, out / "learning.png",
                    title=f"held-out success, {args.env.split('/')[-1]}\n(SFT start {100 * sft_report['success_after']:.1f}%)")
    print(f"wrote {out / 'learning.json'}, {out / 'learning.png'} and per-run curves under {out}/<method>/curves")
    return 0


if __name__ == "__main__":
    sys.exit(main())
