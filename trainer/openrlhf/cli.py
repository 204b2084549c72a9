"""`agentgym-opsd train-openrlhf` and `agentgym-opsd openrlhf-prompts` (named in the CLI's command table;
OpenRLHF is imported only when a launch runs)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from agentgym_opsd.usage import UsageError, parse_options
from trainer.openrlhf.config import BridgeConfig, load_sections, merge_sections
from trainer.openrlhf.dataset import parse_seeds, write_prompt_dataset
from trainer.openrlhf.launch import launch
from trainer.openrlhf.presets import preset

__all__ = ["train_arguments", "prompts_arguments"]

_TRAIN_EPILOG = """\
examples:
  # the papers' settings (see trainer/openrlhf/presets.py and scripts/openrlhf/train.sh)
  agentgym-opsd train-openrlhf --preset alfworld --model-preset qwen2.5-3b --method stepopsd \\
      --prompts runs/alf/train.jsonl --eval-prompts runs/alf/eval.jsonl --out runs/alf
  # your own: a bridge config file and OpenRLHF's flags after --
  agentgym-opsd train-openrlhf --config bridge.yaml -- --actor.model_name_or_path PATH \\
      --data.prompt_dataset train.jsonl --rollout.n_samples_per_prompt 8 ...
  # check a command line on a machine without GPUs (OpenRLHF's parser and checks, no Ray)
  agentgym-opsd train-openrlhf --dry-run ...
"""


def _cmd_train(args: argparse.Namespace) -> int:
    flags = list(args.openrlhf_flags or [])
    if flags and flags[0] == "--":
        flags = flags[1:]
    try:
        sections: dict = {}
        if args.preset:
            if not args.prompts:
                raise UsageError("--preset needs --prompts (write them with `agentgym-opsd openrlhf-prompts`)")
            sections, preset_flags = preset(
                args.preset, args.model_preset, args.method or "grpo", model_path=args.model, prompts=args.prompts,
                eval_prompts=args.eval_prompts, prompt_rows=_count_rows(args.prompts), gpus=args.gpus, out=args.out,
            )
            flags = preset_flags + flags  # flags after -- come last: they win
        elif args.config is None:
            raise UsageError("give --config FILE (bridge settings) or --preset FAMILY; see --help")
        if args.config is not None:
            sections = merge_sections(sections, load_sections(args.config))
        if args.method and not args.preset:
            sections = merge_sections(sections, {"credit": {"method": args.method}})
        config = BridgeConfig.from_dict(sections, args.config or "preset")

        launch(config, flags, dry_run=args.dry_run)
    except ValueError as e:  # ConfigError, LaunchError
        raise UsageError(str(e).splitlines()[0]) from None
    except ImportError as e:
        raise UsageError(
            f"train-openrlhf needs OpenRLHF: install the [gpu] extra on a GPU machine (see the README) ({e})"
        ) from None
    return 0


def _count_rows(path: str) -> int | None:
    p = Path(path)
    if not p.is_file():
        return None
    with open(p, encoding="utf-8") as f:
        return sum(1 for line in f if line.strip())


def train_arguments(p: argparse.ArgumentParser) -> None:
    """The arguments of `agentgym-opsd train-openrlhf` (on the parser the CLI made for it)."""
    p.description = ("Run OpenRLHF's stock train_ppo_ray with the agentgym-opsd agent executor, experience maker and "
                     "trainer installed. OpenRLHF's own flags go after --; the bridge's settings come from --config "
                     "and/or a --preset.")
    p.epilog = _TRAIN_EPILOG
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.add_argument("--config", help="bridge config (YAML or JSON: rollout, credit, teacher sections)")
    p.add_argument("--preset", choices=["alfworld", "webshop", "searchqa"], help="a paper setting (presets.py)")
    p.add_argument("--model-preset", default="qwen2.5-3b", choices=["qwen2.5-3b", "qwen3-1.7b"])
    p.add_argument("--method", choices=["grpo", "gigpo", "stepopsd", "agentopsd", "rlsd"],
                   help="credit method (default: the config's, else grpo)")
    p.add_argument("--model", help="weights to train (default: the model preset's hub id)")
    p.add_argument("--prompts", help="training prompt dataset (agentgym-opsd openrlhf-prompts)")
    p.add_argument("--eval-prompts", help="evaluation prompt dataset")
    p.add_argument("--gpus", type=int, default=8, help="GPUs of the node (preset layout)")
    p.add_argument("--out", default="runs/openrlhf", help="output folder (preset)")
    p.add_argument("--dry-run", action="store_true",
                   help="run OpenRLHF's argument parser and checks only, print the command")
    p.add_argument("openrlhf_flags", nargs=argparse.REMAINDER, help="-- then OpenRLHF flags (override the preset's)")
    p.set_defaults(func=_cmd_train)


def _cmd_prompts(args: argparse.Namespace) -> int:
    try:
        seeds = parse_seeds(args.seeds)
    except ValueError as e:
        raise UsageError(str(e)) from None
    n = write_prompt_dataset(args.out, args.env_id, seeds, parse_options(args.option), parse_options(args.reset_option))
    print(f"wrote {n} prompts to {args.out}", file=sys.stderr)
    return 0


def prompts_arguments(p: argparse.ArgumentParser) -> None:
    """The arguments of `agentgym-opsd openrlhf-prompts` (on the parser the CLI made for it)."""
    p.description = ("Write a JSONL prompt dataset for `train-openrlhf`: for each seed, the first chat of the task it "
                     "picks (prompt), the task label (env id, seed, options) and the subset (datasource).")
    p.add_argument("--env", dest="env_id", required=True, help="registered env id (agentgym-opsd list)")
    p.add_argument("--seeds", required=True, help="START:END (END excluded) or a comma list; seed s plays task s %% N")
    p.add_argument("--option", action="append", metavar="KEY=VALUE", help="env keyword, e.g. split=train (repeatable)")
    p.add_argument("--reset-option", action="append", metavar="KEY=VALUE", help="reset option (repeatable)")
    p.add_argument("--out", required=True, help="output .jsonl")
    p.set_defaults(func=_cmd_prompts)
