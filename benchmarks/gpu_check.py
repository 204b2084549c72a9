"""A few RL updates of a larger randomly initialised Qwen3 on one CUDA GPU in bf16: rollout and update speed.

    python -m benchmarks.gpu_check                      # hidden 1024, 8 layers, Qwen3 tokenizer (about 0.25B)
    python -m benchmarks.gpu_check --hidden 2048 --layers 16 --steps 3

It runs the local trainer (`trainer.local`) for `--steps` GRPO updates of T tasks x G episodes on
an env (`--env`, default ALFWorld Pick), and prints the
model size, rollout tokens/s (generated tokens over rollout wall time), update tokens/s (trained
tokens over forward+backward+AdamW wall time) and peak GPU memory. Where no CUDA GPU is visible it
exits at once with a message saying so (`--allow-cpu` runs a small model on the CPU instead, to
check the script itself).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import agentgym_opsd
from agentgym_opsd.registry import registered_envs
from trainer.local import LocalTrainer, TrainConfig
from trainer.policy import parameter_count

DEFAULT_ENV = "agentgym/ALFWorld-Pick-v0"


def pick_env(requested: str | None) -> tuple[str, dict]:
    """(env id, its options): `requested`, or ALFWorld Pick with its defaults; an id nobody registered exits
    with a message."""
    agentgym_opsd.load_plugins()
    ids = {e.id for e in registered_envs()}
    env_id = requested or DEFAULT_ENV
    if env_id not in ids:
        raise SystemExit(f"gpu_check: no env {env_id!r} is registered here; install the project (pip install -e .) "
                         f"or pass --env with one of: {', '.join(sorted(ids)) or 'none'}")
    return env_id, {}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--tasks-per-step", type=int, default=8)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--env", default=None, help=f"a registered env id (default: {DEFAULT_ENV})")
    ap.add_argument("--tokenizer", default="auto", help="auto: ../shared/data/tokenizers/qwen3 when present")
    ap.add_argument("--allow-cpu", action="store_true", help="no GPU: run a small model on the CPU (script check)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()

    import torch

    if not torch.cuda.is_available():
        if not args.allow_cpu:
            print("gpu_check: no CUDA GPU is visible here (torch.cuda.is_available() is False); run it on a machine "
                  "with an NVIDIA GPU and a CUDA build of torch (or pass --allow-cpu to check the script on CPU)",
                  file=sys.stderr)
            return 2
        device, dtype = "cpu", "float32"
        args.hidden, args.layers = min(args.hidden, 64), min(args.layers, 2)
        args.tasks_per_step, args.group_size, args.max_new_tokens = 2, 2, min(args.max_new_tokens, 8)
    else:
        device, dtype = "cuda", "bfloat16"

    env_id, env_options = pick_env(args.env)
    out = Path(args.out or tempfile.mkdtemp(prefix="gpu_check-"))
    config = TrainConfig(
        env_id=env_id, env_options=env_options, out=str(out), method="grpo", model="tiny", tokenizer=args.tokenizer,
        tiny_hidden=args.hidden, tiny_layers=args.layers, steps=args.steps, tasks_per_step=args.tasks_per_step,
        group_size=args.group_size, max_new_tokens=args.max_new_tokens, eval_episodes=0, sft_episodes=0,
        device=device, dtype=dtype, lr=1e-5, micro_batch_tokens=65536, save_every=0,
    )
    trainer = LocalTrainer(config, progress=True)
    records = []
    trainer.hooks["after_update"].append(lambda tr, rec: records.append(rec))
    started = time.perf_counter()
    trainer.start()
    print(f"model: Qwen3 hidden {args.hidden}, {args.layers} layers, vocab {len(trainer.state.tokenizer)}: "
          f"{parameter_count(trainer.state.model) / 1e6:.1f}M parameters on {device} in {dtype}; env {env_id}")
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    while trainer.state.step < config.steps:
        trainer.rl_step()
    wall = time.perf_counter() - started
    print(f"{'update':>6} {'episodes':>8} {'gen tokens':>10} {'rollout tok/s':>13} {'train tokens':>12} "
          f"{'update tok/s':>12} {'step s':>7}")
    for r in records:
        print(f"{r['step']:>6} {config.tasks_per_step * config.group_size:>8} {int(r['rollout/new_tokens']):>10} "
              f"{r['rollout/tokens_per_s']:>13.0f} {int(r['update/tokens']):>12} {r['update/tokens_per_s']:>12.0f} "
              f"{r['time/step_s']:>7.2f}")
    later = records[1:] or records  # the first update includes CUDA warm-up
    summary = {
        "device": torch.cuda.get_device_name(0) if device == "cuda" else "cpu",
        "parameters_m": round(parameter_count(trainer.state.model) / 1e6, 1),
        "rollout_tokens_per_s": round(sum(r["rollout/tokens_per_s"] for r in later) / len(later), 1),
        "update_tokens_per_s": round(sum(r["update/tokens_per_s"] for r in later) / len(later), 1),
        "peak_gpu_memory_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2) if device == "cuda" else None,
        "wall_s": round(wall, 1),
    }
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
