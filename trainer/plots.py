"""Learning curves of runs, from their metrics.jsonl, as PNG files (matplotlib, no display needed).

The one training-curve plotter of the project: `curves_png(runs, metrics)` draws one panel per
metric and one line per run against the update. `plot_run(OUT)` writes OUT/curves/success.png
(held-out success per subset and training success), reward.png, kl.png (KL to the initial policy,
KL old -> new, clip fraction, entropy) and credit.png (every `credit/*` diagnostic the credit core
logged). `plot_paired_runs` draws runs beside their reference per group (benchmarks/learning.py:
every run's held-out success beside its warm start); the report's training section draws its methods with `curves_png`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agentgym_opsd.io import atomic_write_bytes, read_jsonl_numbered

__all__ = ["curves_png", "plot_run", "plot_paired_runs", "read_metrics"]

# Runs that log the same values must not hide one another: each has its own marker, size and line
# style, the first drawn largest and hollow.
_STYLES = [("o", 7, "-"), ("s", 4, "--"), ("^", 4, ":"), ("D", 3, "-."), ("v", 4, "-")]


def read_metrics(out: str | Path) -> list[dict[str, Any]]:
    path = Path(out) / "metrics.jsonl"
    if not path.exists():
        return []
    return [r for _, r in read_jsonl_numbered(path, skip_torn_lines=True)]


def _series(records: Sequence[dict[str, Any]], kind: str | None, key: str) -> tuple[list[float], list[float]]:
    """(update, value) of the finite values of `key` in the records of `kind` (None: any kind); the
    update is a record's `update`, else its `step`, else its position."""
    xs, ys = [], []
    for i, r in enumerate(records):
        value = r.get(key)
        if (kind is None or r.get("kind") == kind) and isinstance(value, (int, float)) and not isinstance(value, bool) \
                and math.isfinite(value):
            xs.append(r.get("update", r.get("step", i)))
            ys.append(value)
    return xs, ys


def _figure(n: int, title: str | None):
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    cols = min(4, max(1, n))
    rows = max(1, math.ceil(n / cols))
    fig, axes = plt.subplots(rows, cols, figsize=(3.8 * cols, 2.9 * rows + (0.4 if title else 0)), squeeze=False)
    if title:
        fig.suptitle(title)
    return fig, [ax for row in axes for ax in row]


def _png(fig) -> bytes:
    import io

    import matplotlib.pyplot as plt

    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=90, metadata={"Software": None})  # the same curves, the same bytes
    plt.close(fig)
    return buffer.getvalue()


def _save(fig, path: Path) -> Path:
    atomic_write_bytes(path, _png(fig))
    return path


def curves_png(
    runs: dict[str, Sequence[dict[str, Any]]],
    metrics: Sequence[str],
    *,
    kind: str | None = None,
    titles: dict[str, str] | None = None,
    title: str | None = None,
) -> bytes:
    """A PNG with one panel per metric (in a grid of up to 4 columns), one line per run (label ->
    its metrics records, of `kind` only when given) against the update; a panel whose metric no run
    logged says so. A rate (a name with `success` or ending in `_rate`) is drawn from 0 up to a
    little above its largest value: small differences stay visible, and are not exaggerated."""
    from matplotlib.ticker import MaxNLocator

    fig, axes = _figure(len(metrics), title)
    for ax, metric in zip(axes, metrics):
        top = 0.0
        for number, (label, records) in enumerate(runs.items()):
            xs, ys = _series(records, kind, metric)
            if xs:
                marker, size, line = _STYLES[number % len(_STYLES)]
                marker = marker if len(xs) <= 40 else None  # a long curve is a line, not a row of dots
                ax.plot(xs, ys, marker=marker, markersize=size, linestyle=line, label=label,
                        markerfacecolor="none" if number == 0 else None, alpha=0.9)  # fmt: skip
                top = max(top, *ys)
        if "success" in metric or metric.endswith("_rate"):
            ax.set_ylim(-0.02, min(1.02, max(0.1, 1.25 * top)))
        xs = {x for line in ax.get_lines() for x in line.get_xdata()}
        if len(xs) == 1:  # one update: centre it instead of an axis of fractional updates
            (x,) = xs
            ax.set_xlim(x - 1, x + 1)
        name = (titles or {}).get(metric, metric.replace("_", " "))
        ax.set_title(name if ax.get_lines() else f"{name}: not logged", fontsize=9)
        ax.set_xlabel("update")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.spines[["top", "right"]].set_visible(False)
    with_lines = [ax for ax in axes if ax.get_lines()]
    if len(runs) > 1 and with_lines:
        with_lines[0].legend(fontsize=7)  # one legend: every panel draws the runs alike
    for ax in axes[len(metrics):]:
        ax.axis("off")
    return _png(fig)


def _panels(records: Sequence[dict[str, Any]], panels: Sequence[tuple[str, str]], title: str, path: Path) -> Path:
    """One small plot per (metric key, label) of one run's training records, in a grid."""
    png = curves_png({title: records}, [key for key, _ in panels], kind="train", titles=dict(panels), title=title)
    atomic_write_bytes(path, png)
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
    for key, label, style in [("eval/success", "held-out (all)",
                               "o-")] + [(k, f"held-out {k.split('/')[-1]}", ".--") for k in eval_keys]:
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
              ("train/invalid_rate", "invalid-turn rate"), ("grad_norm", "grad norm"),
              ("train/turns", "turns per episode"),
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


def plot_paired_runs(reference: dict[str, float], runs: dict[str, dict[str, Sequence[float]]], path: str | Path,
                     title: str = "held-out success", reference_label: str = "warm start") -> Path:
    """One x position per group (a warm start): its `reference` value as a black bar, every run of each
    method (label -> group -> one value per run, e.g. per seed) as a dot beside it, the method's mean over
    the group's runs as a short line. Raises ValueError for a group that has no reference value."""
    unknown = sorted({g for per_group in runs.values() for g in per_group} - set(reference))
    if unknown:
        raise ValueError(f"plot_paired_runs: group(s) {unknown} have no {reference_label} value; "
                         f"give one in `reference` ({sorted(reference)})")
    fig, (ax,) = _figure(1, title)
    groups = list(reference)
    fig.set_size_inches(max(6.0, 1.6 * len(groups) + 1.5), 3.6)  # room for the title and every group's name
    width = 0.8 / (len(runs) + 1)
    for x, group in enumerate(groups):
        left = x - 0.4 + width / 2
        ax.hlines(reference[group], left - width / 2, left + width / 2, colors="black", linewidth=2.5,
                  label=reference_label)
    for number, (label, per_group) in enumerate(runs.items()):
        marker, size, _ = _STYLES[number % len(_STYLES)]
        color = f"C{number}"
        for x, group in enumerate(groups):
            values = list(per_group.get(group, []))
            if not values:
                continue
            centre = x - 0.4 + width * (number + 1.5)
            spread = [centre + width * 0.5 * (k / max(1, len(values) - 1) - 0.5) for k in range(len(values))]
            ax.plot(spread, values, linestyle="none", marker=marker, markersize=max(size, 5), color=color,
                    label=label)
            ax.hlines(sum(values) / len(values), centre - width / 2, centre + width / 2, colors=color, linewidth=1)
    ax.set_xticks(range(len(groups)), groups)
    ax.set_xlim(-0.6, len(groups) - 0.4)
    top = max([*reference.values(), *(v for per_group in runs.values() for vs in per_group.values() for v in vs)],
              default=0.0)
    ax.set_ylim(-0.02, min(1.02, max(0.1, 1.25 * top)))
    ax.set_ylabel("success rate")
    ax.spines[["top", "right"]].set_visible(False)
    handles, labels = ax.get_legend_handles_labels()
    unique = dict(zip(labels, handles, strict=True))  # one legend entry per label, not per group
    ax.legend(unique.values(), unique.keys(), fontsize=7)
    atomic_write_bytes(Path(path), _png(fig))
    return Path(path)
