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
the final command: use it to check a launch script on a machine without GPUs. Flag combinations the
bridge cannot honour (a KL penalty folded into the reward, which the credit advantages would
overwrite) are refused in both modes, before Ray or any model starts.

Multi-node: OpenRLHF loads the agent module from a file path in every rollout actor. The launcher
ships the project's four packages (`agentgym_opsd`, `environments`, `retrieval_index`, `trainer`)
with Ray's `py_modules`, and a loader file `agentgym_agent_func.py` in Ray's `working_dir`; the
agent path it passes is that file's name, relative to the working directory Ray gives each worker,
so it resolves on every node (`code_runtime_env`). What the envs read from disk (an ALFWorld data
folder, a WebShop catalog, a retrieval index) must exist at the same path on every node, or be
served (the retrieval server's URL).
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

from agentgym_opsd.io import atomic_write_text
from trainer.openrlhf.config import ENV_VAR, BridgeConfig, TaskLabel

__all__ = [
    "LaunchError",
    "complete_flags",
    "parse_openrlhf_flags",
    "launch",
    "installed_trainer",
    "AGENT_FUNC_PATH",
    "AGENT_LOADER",
    "ENTRY_MODULE",
    "check_openrlhf_args",
    "code_runtime_env",
]

ENTRY_MODULE = "openrlhf.cli.train_ppo_ray"
AGENT_FUNC_PATH = str(Path(__file__).with_name("agent_func.py"))  # this machine's copy (single-process use)
AGENT_LOADER = "agentgym_agent_func.py"  # in the shipped working_dir: the path every worker resolves
SHIPPED_PACKAGES = ("agentgym_opsd", "environments", "retrieval_index", "trainer")

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
                "score_coef, invalid_coef), so OpenRLHF's length penalties would not reach the advantages; drop "
                "the flag"
            )
    added: list[str] = []
    if not _has(flags, "--train.agent_func_path"):
        added += ["--train.agent_func_path", AGENT_LOADER]
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

    with mock.patch.object(openrlhf.utils, "get_strategy",
                           stop), mock.patch.object(ray, "is_initialized", lambda: True):
        try:
            _run_entry(list(flags), checks_only=True)
        except _Parsed as parsed:
            return parsed.namespace
    raise LaunchError("OpenRLHF's train_ppo_ray returned before building its strategy")  # pragma: no cover


def dataset_env_ids(path: str | None, limit: int = 10_000) -> list[str]:
    """The env ids in the labels of a prompt dataset file (empty when the file is not local)."""
    if not path or not Path(path).is_file():
        return []

    ids = set()
    with open(path, encoding="utf-8") as f:
        for i, line in enumerate(f):
            if i >= limit:
                break
            if line.strip():
                ids.add(TaskLabel.parse(json.loads(line).get("label")).env_id)
    return sorted(ids)


def check_openrlhf_args(args: Any) -> None:
    """Refuse what OpenRLHF would accept but the bridge cannot honour, before anything starts."""
    kl = args.algo.kl
    if float(kl.init_coef) > 0 and not kl.use_loss:
        raise LaunchError(
            f"--algo.kl.init_coef {kl.init_coef} without --algo.kl.use_loss puts a KL penalty into the reward, "
            "which the credit advantages would overwrite (OpenRLHF's default is 0.01): add --algo.kl.use_loss "
            "(GRPO-style KL loss) or give --algo.kl.init_coef 0"
        )


def code_runtime_env(folder: str | os.PathLike[str]) -> dict[str, Any]:
    """Ray's runtime_env entries that make the agent module resolve on every node.

    Writes the loader file into `folder` (Ray's `working_dir`: every worker starts in a copy of it,
    so `--train.agent_func_path agentgym_agent_func.py` resolves there) and lists the project's
    package folders as `py_modules` (Ray puts them on every worker's import path).
    """
    import importlib

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)

    atomic_write_text(
        folder / AGENT_LOADER,
        '"""OpenRLHF loads this file by path in each rollout actor; the code comes from py_modules."""\n'
        "from trainer.openrlhf.agent_func import AgentExecutor  # noqa: F401\n",
    )
    modules = [str(Path(importlib.import_module(name).__file__).parent) for name in SHIPPED_PACKAGES]
    return {"working_dir": str(folder), "py_modules": modules}


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
    args = parse_openrlhf_flags(final)  # OpenRLHF's own parser, defaults and checks, no Ray
    check_openrlhf_args(args)
    command = "python -m " + ENTRY_MODULE + " " + " ".join(shlex.quote(f) for f in final)
    if dry_run:
        print(f"{ENV_VAR}={shlex.quote(config.to_json())}", file=out)
        print(command, file=out)
        return args
    import tempfile

    import ray

    env_vars = {k: os.environ.get(k, v) for k, v in _STOCK_RAY_ENV.items()}
    env_vars[ENV_VAR] = config.to_json()
    os.environ[ENV_VAR] = env_vars[ENV_VAR]  # the driver reads it too
    with tempfile.TemporaryDirectory(prefix="agentgym-ray-") as workdir:
        if not ray.is_initialized():
            ray.init(runtime_env={"env_vars": env_vars, **code_runtime_env(workdir)})
        elif _flag_value(final, "--train.agent_func_path") == AGENT_LOADER:
            raise LaunchError(
                "Ray is already running in this process without the project's code in its runtime_env; "
                "start it with ray.init(runtime_env=code_runtime_env(DIR)) or pass --train.agent_func_path "
                f"{AGENT_FUNC_PATH}"
            )
        print(command, file=out)
        with installed_trainer():
            _run_entry(final)
    return None


@contextlib.contextmanager
def installed_trainer():
    """While open, `from openrlhf.trainer.ppo_trainer import PPOTrainer` (what `train_ppo_ray.train`
    runs) gives `AgentGymPPOTrainerActor`."""
    import openrlhf.trainer.ppo_trainer as stock

    # Ours, but OpenRLHF's Ray actor at heart: it loads with OpenRLHF and Ray (the [gpu] extra), so only here.
    from trainer.openrlhf.ray_trainer import AgentGymPPOTrainerActor

    with mock.patch.object(stock, "PPOTrainer", AgentGymPPOTrainerActor):
        yield AgentGymPPOTrainerActor

