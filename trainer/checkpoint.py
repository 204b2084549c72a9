"""Checkpoints of a local training run: one file, written atomically, loadable with weights_only.

The checkpoint holds tensors, numbers and strings only (no pickled objects), so it loads with
`torch.load(..., weights_only=True)`: numpy's legacy RNG key is stored as a tensor.
`save_checkpoint(out, config, state)` writes a run's `RunState` (`trainer.run_state`) and settings;
`load_checkpoint(out, config)` makes the state again from them and drops what the run logged after
the checkpoint, so a resumed run ends in the state of one never stopped.
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
from trainer.run_state import RunState, begin_rl, rollout_agent, trainable_policy
from trainer.trainable import load_trainable_state, trainable_names, trainable_state, trains_everything

__all__ = [
    "CHECKPOINT",
    "FORMAT",
    "load_checkpoint",
    "read_checkpoint",
    "restore_rng_states",
    "rng_states",
    "save_checkpoint",
    "truncate_logs",
    "write_checkpoint",
]

CHECKPOINT = "checkpoint.pt"
FORMAT = 1  # the layout below; a checkpoint of another format is refused with a message saying what to do


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


def save_checkpoint(out: Path, config: TrainConfig, state: RunState) -> None:
    """A run's state (`RunState`: model, optimizer, teacher snapshot, KL reference, RNG states, progress)
    and its settings, in `out/checkpoint.pt`, written atomically (a crash leaves the previous checkpoint)."""
    model = state.model
    names = set(model.state_dict()) if trains_everything(model) else trainable_names(model)
    write_checkpoint(out, {
        "format": FORMAT,
        "config": config.to_dict(),
        "step": state.step,
        "sft_done": state.sft_done,
        "evaluated_steps": sorted(state.evaluated_steps),
        # the trained tensors only when the rest is the frozen base model (top layers, adapters)
        "model": trainable_state(model, names),
        "optimizer": state.optimizer.state_dict() if state.optimizer is not None else None,
        "teacher": None if state.teacher_model is None else trainable_state(state.teacher_model, names),
        "reference": None if state.reference_model is None else trainable_state(state.reference_model, names),
        "rng": {
            "trainer": state.rng.bit_generator.state,
            **rng_states(),
            "rollout_agent": None if state.rollout_agent is None else state.rollout_agent.state_dict(),
        },
    })


def load_checkpoint(out: Path, config: TrainConfig) -> RunState:
    """The state of the run in `out` as its checkpoint left it, for a run with `config` (the same
    settings but `RESUMABLE_CHANGES`, else a `TrainError`); its logs are cut back to what was logged
    before the checkpoint (`truncate_logs`), so the resumed run ends as one never stopped would."""
    out = Path(out)
    state = read_checkpoint(out)
    if state.get("format") != FORMAT:
        raise TrainError(
            f"--resume: {out / CHECKPOINT} has checkpoint format {state.get('format')!r}, this version reads "
            f"format {FORMAT}; resume it with the version that wrote it, or start a new run with another --out"
        )
    saved = TrainConfig.from_dict(state["config"])
    changed = {k for k, v in saved.to_dict().items() if getattr(config, k) != v} - RESUMABLE_CHANGES
    if changed:
        raise TrainError(
            f"--resume: the run in {out} was started with other settings ({', '.join(sorted(changed))}); "
            "resume with the same settings, or start a new run with another --out"
        )
    source = str(out / "init") if config.model == "tiny" else config.model
    model, tokenizer = load_policy(source, device=config.device, dtype=config.dtype)
    model = trainable_policy(model, config)
    load_trainable_state(model, state["model"])
    run = RunState(model=model, tokenizer=tokenizer, rng=np.random.default_rng(config.seed), step=int(state["step"]),
                   evaluated_steps=set(state["evaluated_steps"]))
    if state["sft_done"]:
        # the copies are made from the policy as the checkpoint left it, then get their own tensors
        begin_rl(run, config)
        if state["teacher"] is not None:
            load_trainable_state(run.teacher_model, state["teacher"])
        if state["reference"] is not None:
            load_trainable_state(run.reference_model, state["reference"])
        run.optimizer.load_state_dict(state["optimizer"])
    rng = state["rng"]
    run.rng.bit_generator.state = rng["trainer"]
    restore_rng_states(rng)
    if rng["rollout_agent"] is not None:
        run.rollout_agent = rollout_agent(run.model, run.tokenizer, config)
        run.rollout_agent.load_state_dict(rng["rollout_agent"])
    truncate_logs(out, step=run.step, evaluated_steps=run.evaluated_steps, sft_done=run.sft_done)
    return run


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
