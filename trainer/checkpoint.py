"""Checkpoints of a local training run: one file, written atomically, loadable with weights_only.

The checkpoint holds tensors, numbers and strings only (no pickled objects), so it loads with
`torch.load(..., weights_only=True)`: numpy's legacy RNG key is stored as a tensor.
"""

from __future__ import annotations

import io
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch

from agentgym_opsd.io import atomic_write_bytes

__all__ = ["CHECKPOINT", "write_checkpoint", "read_checkpoint", "rng_states", "restore_rng_states"]

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
