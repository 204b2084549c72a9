"""Summaries of played episodes: success per subset, score, turns, invalid-action rate.

The success rate is the mean over the episodes played. Its 95% Wilson interval counts distinct
outcomes, not plays: episodes that played the same task with the same turns (a deterministic
agent replaying a task, e.g. under another run seed or past the end of the task list) are one
outcome, so replays do not narrow the interval. `outcomes` in a summary says how many there were.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from agentgym_opsd.episode import Episode

__all__ = ["summarize", "format_table", "wilson_interval", "outcome_key", "episodes_cell"]


def wilson_interval(successes: float, n: int, z: float = 1.96) -> tuple[float, float]:
    """The 95% Wilson score interval of a success rate (well-behaved at 0 and 1 and for small n).
    `successes` may be fractional: the rate times n, when n counts distinct outcomes."""
    if n == 0:
        return (0.0, 0.0)
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return (max(0.0, centre - half), min(1.0, centre + half))


def _mean(values: Sequence[float]) -> float:
    return float(sum(values) / len(values)) if values else 0.0


def outcome_key(episode: Episode) -> tuple[Any, ...]:
    """What makes two episodes the same outcome: the task and every turn the agent wrote (an
    errored episode is always its own outcome)."""
    if episode.error:
        return ("errored", episode.episode_id, episode.seed, episode.error)
    return (episode.env_id, episode.task_id, tuple(t.response for t in episode.turns))


def _stats(episodes: Sequence[Episode]) -> dict[str, Any]:
    n = len(episodes)
    wins = sum(e.success for e in episodes)
    rate = wins / n if n else 0.0
    outcomes = len({outcome_key(e) for e in episodes})
    low, high = wilson_interval(rate * outcomes, outcomes)
    turns = sum(e.num_turns for e in episodes)
    return {
        "episodes": n,
        "outcomes": outcomes,
        "success_rate": rate,
        "success_ci95": [low, high],
        "mean_score": _mean([e.score for e in episodes]),
        "mean_turns": _mean([e.num_turns for e in episodes]),
        "invalid_rate": (sum(e.invalid_turns for e in episodes) / turns) if turns else 0.0,
        "errors": sum(1 for e in episodes if e.error),
    }


def summarize(episodes: Sequence[Episode], *, env_id: str, agent: str) -> dict[str, Any]:
    """The summary `agentgym-opsd eval` writes as summary.json.

    Errored episodes count as failures (they are listed in `errors`)."""
    by_type: dict[str, list[Episode]] = defaultdict(list)
    for e in episodes:
        by_type[e.task_type or "unknown"].append(e)
    summary = {"env_id": env_id, "agent": agent, **_stats(episodes)}
    summary["by_task_type"] = {
        t: {k: v for k, v in _stats(eps).items() if k in ("episodes", "outcomes", "success_rate", "success_ci95",
                                                          "mean_score", "mean_turns", "invalid_rate")}
        for t, eps in sorted(by_type.items())
    }
    return summary


def episodes_cell(stats: dict[str, Any]) -> str:
    """A table's episode count: `8`, or `8 (4 distinct)` when replays gave identical outcomes."""
    n, distinct = stats["episodes"], stats.get("outcomes", stats["episodes"])
    return str(n) if distinct == n else f"{n} ({distinct} distinct)"


def format_table(summary: dict[str, Any]) -> str:
    """A plain-text table of a summary: one row per task type and a total row."""
    header = ("subset", "episodes", "success", "95% CI", "score", "turns", "invalid")
    rows = []

    def row(name: str, s: dict[str, Any]) -> tuple[str, ...]:
        low, high = s.get("success_ci95", (0.0, 0.0))
        return (
            name,
            episodes_cell(s),
            f"{100 * s['success_rate']:.1f}%",
            f"[{100 * low:.0f}, {100 * high:.0f}]",
            f"{s['mean_score']:.3f}",
            f"{s.get('mean_turns', 0.0):.1f}",
            f"{100 * s.get('invalid_rate', 0.0):.1f}%",
        )

    for name, s in summary["by_task_type"].items():
        rows.append(row(name, s))
    rows.append(row("all", summary))
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = [f"{summary['env_id']}  agent={summary['agent']}"]
    lines.append("  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)))
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    if summary.get("errors"):
        lines.append(f"({summary['errors']} episode(s) errored; see episodes.jsonl)")
    return "\n".join(lines)
