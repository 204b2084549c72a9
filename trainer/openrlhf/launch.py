"""Run OpenRLHF 0.11.2's stock `openrlhf.cli.train_ppo_ray` with per-turn credit installed.

    agentgym-opsd train-openrlhf --config bridge.yaml -- --actor.model_name_or_path ... (OpenRLHF flags)

What it does, in order:

1. Reads our bridge config (`trainer.openrlhf.config`) and checks it (the credit config too).
2. Completes the OpenRLHF flags with what the bridge needs, unless given: `--train.agent_func_path`
   (our executor), `--data.input_key prompt --data.label_key label --data.apply_chat_template`
   (the prompt dataset's layout), `--algo.advantage.estimator group_norm`. It refuses flags the
   bridge cannot honour (another estimator, `--train.async_enable`).
3. Starts Ray (or joins the cluster in `RAY_ADDRESS`) with the bridge config in every worker's
   environment, puts `AgentGymPPOTrainerActor` where `train_ppo_ray.train` imports its trainer
   class from, and runs `train_ppo_ray` as `__main__`, so OpenRLHF's own argument parser, checks and
   training loop run unchanged.

`--dry-run` stops after OpenRLHF's parser and its argument checks (step 3 without Ray) and prints
the final command: use it to check a launch script on a machine without GPUs.
"""

from __future__ import annotations

import contextlib
import json
import os
import runpy
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from unittest import mock

from trainer.openrlhf.config import ENV_VAR, BridgeConfig

__all__ = [
    "LaunchError",
    "complete_flags",
    "parse_openrlhf_flags",
    "launch",
    "installed_trainer",
    "AGENT_FUNC_PATH",
    "ENTRY_MODULE",
]

ENTRY_MODULE = "openrlhf.cli.train_ppo_ray"
AGENT_FUNC_PATH = str(Path(__file__).with_name("agent_func.py"))

# Ray worker environment that `train_ppo_ray.train` would set if it started Ray itself.
_STOCK_RAY_ENV = {"TOKENIZERS_PARALLELISM": "true", "NCCL_DEBUG": "WARN", "RAY_ENABLE_ZERO_COPY_TORCH_TENSORS": "1"}


class LaunchError(ValueError):
    """The command line cannot be run; the message says why and what to change."""


def _flag_value(flags: Sequence[str], name: str) -> str | None:
    """The last value given to `name` (`--x v` or `--x=v`), or None."""
    value = None
    for i, f in enumerate(flags):
        if f == name and i + 1 < len(flags):
            value = flags[i + 1]
        elif f.startswith(name + "="):
            value = f.split("=", 1)[1]
    return value


def _has(flags: Sequence[str], name: str) -> bool:
    return any(f == name or f.startswith(name + "=") for f in flags)


def complete_flags(flags: Sequence[str]) -> list[str]:
    """The OpenRLHF flags with the bridge's required ones added (see the module docstring)."""
    flags = list(flags)
    estimator = _flag_value(flags, "--algo.advantage.estimator")
    if estimator is not None and estimator != "group_norm":
        raise LaunchError(
            f"--algo.advantage.estimator {estimator}: the credit methods reshape GRPO's group-normalised "
            "advantage; leave the flag out or give group_norm"
        )
    if _has(flags, "--train.async_enable"):
        raise LaunchError("--train.async_enable: the bridge installs the synchronous PPOTrainer only; drop the flag")
    for name in ("--reward.overlong_buffer_len", "--reward.stop_properly_penalty_coef"):
        if _has(flags, name):
            raise LaunchError(
                f"{name}: the credit core computes the outcome reward from the episode records (credit.success_scale, "
                "score_coef, invalid_coef), so OpenRLHF's length penalties would not reach the advantages; drop the flag"
            )
    added: list[str] = []
    if not _has(flags, "--train.agent_func_path"):
        added += ["--train.agent_func_path", AGENT_FUNC_PATH]
    if not _has(flags, "--data.input_key"):
        added += ["--data.input_key", "prompt"]
    if not _has(flags, "--data.label_key"):
        added += ["--data.label_key", "label"]
    if not _has(flags, "--data.apply_chat_template"):
        added += ["--data.apply_chat_template"]
    if estimator is None:
        added += ["--algo.advantage.estimator", "group_norm"]
    return added + flags


class _Parsed(Exception):
    def __init__(self, namespace: Any) -> None:
        super().__init__("parsed")
        self.namespace = namespace


@contextlib.contextmanager
def _argv(argv: list[str]):
    saved = sys.argv
    sys.argv = argv
    try:
        yield
    finally:
        sys.argv = saved


def _run_entry(flags: list[str], checks_only: bool = False) -> None:
    """Run `train_ppo_ray` as `__main__`. OpenRLHF's usage errors become LaunchError; so do its
    argument checks (plain asserts) when only the checks run."""
    with _argv([ENTRY_MODULE.replace(".", "/") + ".py", *flags]):
        try:
            runpy.run_module(ENTRY_MODULE, run_name="__main__", alter_sys=False)
        except SystemExit as e:
            if e.code not in (0, None):
                raise LaunchError("OpenRLHF's train_ppo_ray rejected the flags (its message is above)") from None
            raise
        except AssertionError as e:
            if not checks_only:
                raise
            raise LaunchError(f"OpenRLHF's argument checks failed: {e}") from None


def parse_openrlhf_flags(flags: Sequence[str]) -> Any:
    """Run OpenRLHF's own parser and argument checks on `flags`, without starting Ray or a model.

    `train_ppo_ray` builds its parser under `if __name__ == "__main__"`, then checks the arguments,
    then calls `train(args)`, whose first steps are `ray.init` (skipped when Ray is up) and
    `get_strategy(args)`. The dry run reports Ray as up and stops at `get_strategy`.

    Returns:
        OpenRLHF's hierarchical args namespace (`args.actor.model_name_or_path`, ...).
    """
    import openrlhf.utils
    import ray

    def stop(args):
        raise _Parsed(args)

    with mock.patch.object(openrlhf.utils, "get_strategy", stop), mock.patch.object(ray, "is_initialized", lambda: True):
        try:
            _run_entry(list(flags), checks_only=True)
        except _Parsed as parsed:
            return parsed.namespace
    raise LaunchError("OpenRLHF's train_ppo_ray returned before building its strategy")  # pragma: no cover


def dataset_env_ids(path: str | None, limit: int = 10_000) -> list[str]:
    """The env ids in the labels of a prompt dataset file (empty when the file is not local)."""
    if not path or not Path(path).is_file():
        return []
    from trainer.openrlhf.config import TaskLabel

    ids = set()
    with open(path, encoding="utf-8") as f:
        for i, line in enumerate(f):
            if i >= limit:
                break
            if line.strip():
                ids.add(TaskLabel.parse(json.loads(line).get("label")).env_id)
    return sorted(ids)


def check_bridge(config: BridgeConfig, flags: Sequence[str]) -> None:
    """Resolve the credit config now, so a typo fails before Ray and the models start."""
    env_ids = []
    for name in ("--data.prompt_dataset", "--eval.dataset"):
        for path in (_flag_value(flags, name) or "").split(","):
            env_ids += dataset_env_ids(path.strip() or None)
    env_id = config.batch_env_id(env_ids) if env_ids or config.credit.get("env") else "generic"
    config.credit_config(env_id)


def launch(config: BridgeConfig, flags: Sequence[str], dry_run: bool = False, out=None) -> Any:
    """Validate, then train (or, with `dry_run`, stop after OpenRLHF's argument checks).

    Returns:
        OpenRLHF's parsed args (dry run) or None after training.
    """
    out = out or sys.stdout
    final = complete_flags(flags)
    check_bridge(config, final)
    command = "python -m " + ENTRY_MODULE + " " + " ".join(shlex.quote(f) for f in final)
    if dry_run:
        args = parse_openrlhf_flags(final)
        print(f"{ENV_VAR}={shlex.quote(config.to_json())}", file=out)
        print(command, file=out)
        return args
    import ray

    env_vars = {k: os.environ.get(k, v) for k, v in _STOCK_RAY_ENV.items()}
    env_vars[ENV_VAR] = config.to_json()
    os.environ[ENV_VAR] = env_vars[ENV_VAR]  # the driver reads it too
    if not ray.is_initialized():
        ray.init(runtime_env={"env_vars": env_vars})
    print(command, file=out)
    with installed_trainer():
        _run_entry(final)
    return None


@contextlib.contextmanager
def installed_trainer():
    """While open, `from openrlhf.trainer.ppo_trainer import PPOTrainer` (what `train_ppo_ray.train`
    runs) gives `AgentGymPPOTrainerActor`."""
    import openrlhf.trainer.ppo_trainer as stock

    from trainer.openrlhf.ray_trainer import AgentGymPPOTrainerActor

    with mock.patch.object(stock, "PPOTrainer", AgentGymPPOTrainerActor):
        yield AgentGymPPOTrainerActor

