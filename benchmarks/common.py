"""What more than one benchmark needs: where the checkout and the shared data are, the commit a
report names, and the helpers that time work and write figures."""

from __future__ import annotations

import gc
import io
import os
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agentgym_opsd.io import atomic_write_bytes

__all__ = ["REPO", "SHARED_DATA", "git_commit", "load_average", "percentile", "save_png", "timed"]

REPO = Path(__file__).resolve().parents[1]
# Real public samples (../shared/data beside the checkout): only benchmarks and real-data tests read them.
SHARED_DATA = REPO.parent / "shared" / "data"


def git_commit() -> str:
    """The checkout's short commit, with `+changes` when tracked files differ from it; `unknown` outside git."""
    try:
        done = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, timeout=10, check=True)
        dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10, check=True)
        return done.stdout.strip() + ("+changes" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def load_average() -> list[float]:
    """The machine's 1, 5 and 15-minute load averages, to 2 decimals (other jobs share the cores)."""
    return [round(x, 2) for x in os.getloadavg()]


def timed(fn: Callable[[], Any]) -> tuple[float, float, Any]:
    """(process CPU seconds, wall seconds, result) of `fn()`, after a garbage collection."""
    gc.collect()
    c0, w0 = time.process_time(), time.perf_counter()
    out = fn()
    return time.process_time() - c0, time.perf_counter() - w0, out


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (nearest rank) of `values`; NaN when empty."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, int(round(q / 100 * (len(ordered) - 1)))))]


def save_png(fig, path: Path, *, dpi: int = 120, metadata: dict | None = None) -> None:
    """A matplotlib figure to `path` as PNG, written atomically (a result file is complete or absent),
    and the figure closed."""
    import matplotlib.pyplot as plt

    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=dpi, metadata=metadata)
    plt.close(fig)
    atomic_write_bytes(path, buffer.getvalue())
