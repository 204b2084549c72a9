"""Learning curves of a run, from its metrics.jsonl, as PNG files (matplotlib, no display needed).

`plot_run(OUT)` writes OUT/curves/success.png (held-out success per subset and training success),
reward.png, kl.png (KL to the initial policy, KL old -> new, clip fraction, entropy) and credit.png
(every `credit/*` diagnostic the credit core logged). `plot_comparison` draws the held-out success of
several runs on one figure (benchmarks/learning.py).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agentgym_opsd.io import atomic_write_bytes, read_jsonl_numbered

__all__ = ["plot_run", "plot_comparison", "read_metrics"]


def read_metrics(out: str | Path) -> list[dict[str, Any]]:
    path = Path(out) / "metrics.jsonl"
    if not path.exists():
        return []
    return [r for _, r in read_jsonl_numbered(path, skip_torn_lines=True)]


def _series(records: Sequence[dict[str, Any]], kind: str, key: str) -> tuple[list[float], list[float]]:
    xs, ys = [], []
    for r in records:
        if r.get("kind") == kind and isinstance(r.get(key), (int, float)) and math.isfinite(r[key]):
            xs.append(r["step"])
            ys.append(r[key])
    return xs, ys


def _figure(n: int, title: str):
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    cols = min(3, max(1, n))
    rows = max(1, math.ceil(n / cols))
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.0 * rows), squeeze=False)
    fig.suptitle(title)
    return fig, [ax for row in axes for ax in row]


def _save(fig, path: Path) -> None:
    import io

    import matplotlib.pyplot as plt

    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=90)
    plt.close(fig)
    atomic_write_bytes(path, buffer.getvalue())


def _panels(records: Sequence[dict[str, Any]], panels: Sequence[tuple[str, str]], title: str, path: Path) -> Path:
    """One small plot per (metric key, label) of the training records, in a grid."""
    fig, axes = _figure(len(panels), title)
    for ax, (key, label) in zip(axes, panels):
        xs, ys = _series(records, "train", key)
        ax.plot(xs, ys, "-")
        ax.set_title(label, fontsize=9)
        ax.set_xlabel("update")
    for ax in axes[len(panels):]:
        ax.axis("off")
    _save(fig, path)
    return path


def plot_run(out: str | Path) -> list[Path]:
    """Write the run's curves under OUT/curves; returns the files written."""
    out = Path(out)
    records = read_metrics(out)
    if not records:
        return []
    written = []
    title = out.name
    # success
    eval_keys = sorted({k for r in records if r.get("kind") == "eval" for k in r if k.startswith("eval/success/")})
    fig, (ax,) = _figure(1, f"{title}: success")
    for key, label, style in [("eval/success", "held-out (all)", "o-")] + [(k, f"held-out {k.split('/')[-1]}", ".--") for k in eval_keys]:
        xs, ys = _series(records, "eval", key)
        if xs:
            ax.plot(xs, ys, style, label=label)
    xs, ys = _series(records, "train", "train/success")
    if xs:
        ax.plot(xs, ys, "-", alpha=0.5, label="training rollouts")
    ax.set_xlabel("update")
    ax.set_ylabel("success rate")
    ax.set_ylim(-0.02, 1.02)
    ax.legend(fontsize=7)
    _save(fig, out / "curves" / "success.png")
    written.append(out / "curves" / "success.png")
    panels = [("train/reward", "env reward"), ("credit/reward_mean", "credit reward R_i"), ("loss", "loss"),
              ("train/invalid_rate", "invalid-turn rate"), ("grad_norm", "grad norm"), ("train/turns", "turns per episode"),
              ("rollout/tokens_per_s", "rollout tokens/s"), ("update/tokens_per_s", "update tokens/s")]
    written.append(_panels(records, panels, f"{title}: training", out / "curves" / "reward.png"))
    panels = [("kl_ref", "KL to the initial policy (k3)"), ("kl_old_new", "KL old -> new on the batch (k3)"),
              ("clip_frac", "clipped fraction"), ("entropy", "entropy per token")]
    written.append(_panels(records, panels, f"{title}: KL", out / "curves" / "kl.png"))
    credit_keys = sorted({k for r in records if r.get("kind") == "train" for k, v in r.items()
                          if k.startswith("credit/") and isinstance(v, (int, float))})
    if credit_keys:
        panels = [(k, k.removeprefix("credit/")) for k in credit_keys]
        written.append(_panels(records, panels, f"{title}: credit diagnostics", out / "curves" / "credit.png"))
    return written


def plot_comparison(runs: dict[str, str | Path], path: str | Path, title: str = "held-out success") -> Path:
    """Held-out success against updates, one line per run (label -> run directory)."""
    fig, (ax,) = _figure(1, title)
    top = 0.0
    for label, out in runs.items():
        xs, ys = _series(read_metrics(out), "eval", "eval/success")
        if xs:
            ax.plot(xs, ys, "o-", label=label)
            top = max(top, *ys)
    ax.set_xlabel("update")
    ax.set_ylabel("success rate")
    # Scaled to the data (small differences stay visible), from 0 so that they are not exaggerated.
    ax.set_ylim(0.0, min(1.02, max(0.1, 1.25 * top)))
    ax.legend(fontsize=8)
    _save(fig, Path(path))
    return Path(path)
