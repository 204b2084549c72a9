"""Checkpoints of a local training run: one file, written atomically, loadable with weights_only.

The checkpoint holds tensors, numbers and strings only (no pickled objects), so it loads with
`torch.load(..., weights_only=True)`: numpy's legacy RNG key is stored as a tensor.
`save_checkpoint(run)` writes a `LocalTrainer` run's state; `load_checkpoint(run)` puts it back and
drops what the run logged after it, so a resumed run ends in the state of one never stopped.
"""

from __future__ import annotations

import io
import json
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch

from agentgym_opsd.io import atomic_write_bytes, atomic_write_text, read_jsonl_numbered
from trainer.config import RESUMABLE_CHANGES, TrainConfig, TrainError
from trainer.policy import load_policy
from trainer.trainable import load_trainable_state, trainable_names, trainable_state, trains_everything

__all__ = [
    "CHECKPOINT",
    "load_checkpoint",
    "read_checkpoint",
    "restore_rng_states",
    "rng_states",
    "save_checkpoint",
    "truncate_logs",
    "write_checkpoint",
]

CHECKPOINT = "checkpoint.pt"


def _numpy_state_to_safe(state: tuple) -> tuple:
    """numpy's legacy RNG state with its key array as a tensor (loadable with weights_only=True)."""
    name, key, pos, has_gauss, gauss = state
    return (name, torch.from_numpy(np.asarray(key, dtype=np.int64)), int(pos), int(has_gauss), float(gauss))


def _numpy_state_from_safe(state: tuple) -> tuple:
    name, key, pos, has_gauss, gauss = state
    return (name, key.numpy().astype(np.uint32), pos, has_gauss, gauss)


def rng_states() -> dict[str, Any]:
    """The process-wide RNG states (python, numpy, torch, CUDA)."""
    return {
        "python": random.getstate(),
        "numpy": _numpy_state_to_safe(np.random.get_state()),
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
    }


def restore_rng_states(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(_numpy_state_from_safe(state["numpy"]))
    torch.set_rng_state(state["torch"])
    if state.get("cuda") is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def write_checkpoint(folder: Path, state: dict[str, Any]) -> None:
    """`state` to `folder/checkpoint.pt`, atomically (a crash leaves the previous checkpoint)."""
    buffer = io.BytesIO()
    torch.save(state, buffer)
    atomic_write_bytes(Path(folder) / CHECKPOINT, buffer.getvalue())


def read_checkpoint(folder: Path) -> dict[str, Any]:
    # weights_only: a checkpoint holds tensors, numbers and strings only (no pickled objects)
    path = Path(folder) / CHECKPOINT
    return torch.load(path, map_location="cpu", weights_only=True)


def save_checkpoint(run) -> None:
    """A `LocalTrainer` run's model, optimizer, teacher snapshot, KL reference, RNG states and
    progress, in one file written atomically (a crash leaves the previous checkpoint)."""
    names = set(run.model.state_dict()) if trains_everything(run.model) else trainable_names(run.model)
    write_checkpoint(run.out, {
        "format": 1,
        "config": run.config.to_dict(),
        "step": run.step,
        "sft_done": run.sft_done,
        "evaluated_steps": sorted(run.evaluated_steps),
        # the trained tensors only when the rest is the frozen base model (top layers, adapters)
        "model": trainable_state(run.model, names),
        "optimizer": run.optimizer.state_dict(),
        "teacher": None if run.teacher_model is None else trainable_state(run.teacher_model, names),
        "reference": None if run.reference_model is None else trainable_state(run.reference_model, names),
        "rng": {
            "trainer": run.rng.bit_generator.state,
            **rng_states(),
            "rollout_agent": None if run.rollout_agent is None else run.rollout_agent.state_dict(),
        },
    })


def load_checkpoint(run) -> None:
    """A `LocalTrainer` run back from its checkpoint in `run.out` (the same settings, else a
    `TrainError`), and its logs cut back to what was logged before it (`truncate_logs`)."""
    state = read_checkpoint(run.out)
    saved = TrainConfig.from_dict(state["config"])
    changed = {k for k, v in saved.to_dict().items() if getattr(run.config, k) != v} - RESUMABLE_CHANGES
    if changed:
        raise TrainError(
            f"--resume: the run in {run.out} was started with other settings ({', '.join(sorted(changed))}); "
            "resume with the same settings, or start a new run with another --out"
        )
    cfg = run.config
    if cfg.model == "tiny":
        run.model, run.tokenizer = load_policy(str(run.out / "init"), device=cfg.device, dtype=cfg.dtype)
    else:
        run.model, run.tokenizer = load_policy(cfg.model, device=cfg.device, dtype=cfg.dtype)
    run.model = run.select_trainable(run.model)
    load_trainable_state(run.model, state["model"])
    run.step = int(state["step"])
    run.sft_done = bool(state["sft_done"])
    run.evaluated_steps = set(state["evaluated_steps"])
    if run.sft_done:
        # the copies are made from the policy as the checkpoint left it, then get their own tensors
        run.init_rl_models()
        if state["teacher"] is not None:
            load_trainable_state(run.teacher_model, state["teacher"])
        if state["reference"] is not None:
            load_trainable_state(run.reference_model, state["reference"])
    run.make_optimizer(cfg.lr if run.sft_done else cfg.sft_lr)
    run.optimizer.load_state_dict(state["optimizer"])
    rng = state["rng"]
    run.rng.bit_generator.state = rng["trainer"]
    restore_rng_states(rng)
    if rng["rollout_agent"] is not None:
        run.rollout_agent = run.new_rollout_agent()
        run.rollout_agent.load_state_dict(rng["rollout_agent"])
    truncate_logs(run.out, step=run.step, evaluated_steps=run.evaluated_steps, sft_done=run.sft_done)


def truncate_logs(out: Path, *, step: int, evaluated_steps: set[int], sft_done: bool) -> None:
    """Drop what a killed run logged after its last checkpoint (it will be redone): metrics, and
    the credit records of updates after it."""
    path = out / "metrics.jsonl"
    if path.exists():
        keep = []
        for _, record in read_jsonl_numbered(path, skip_torn_lines=True):
            logged = int(record.get("step", 0))
            if logged < step or (logged == step and _logged_before_checkpoint(record, step, evaluated_steps, sft_done)):
                keep.append(record)
        atomic_write_text(path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in keep))
    credit = out / "credit.jsonl"
    if credit.exists():
        kept = [r for _, r in read_jsonl_numbered(credit, skip_torn_lines=True) if int(r.get("update", 0)) <= step]
        atomic_write_text(credit, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in kept))


def _logged_before_checkpoint(record: dict[str, Any], step: int, evaluated_steps: set[int], sft_done: bool) -> bool:
    kind = record.get("kind")
    if kind == "eval":
        return step in evaluated_steps
    if kind in ("sft", "sft_done"):
        return sft_done
    return True
