"""Bench results as tables: the rows of one result, Markdown tables, and how success is counted.

Shared by `bench` (results.md) and `report` (report.html).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from agentgym_opsd.summary import episodes_cell

__all__ = ["COUNTING_NOTE", "result_row", "subset_rows", "markdown_tables", "chart_groups", "says_something",
           "REFERENCE_AGENT"]

# The scripted agent every bench can run as a reference: a chart in which it alone wins says nothing
# about the other agents.
REFERENCE_AGENT = "expert"


COUNTING_NOTE = (
    "Success %: the mean over the episodes played. 95% CI: Wilson's interval over distinct outcomes: "
    "episodes that played the same task with the same turns (a deterministic agent replaying a task) "
    "count once, shown as `8 (4 distinct)`. Run seeds play different tasks: seed s starts s x N tasks "
    "on (N: the env's episode count), so tasks repeat only when seeds x N exceed the env's tasks."
)



def result_row(summary: dict[str, Any]) -> dict[str, Any]:
    keys = ("episodes", "outcomes", "success_rate", "success_ci95", "mean_score", "mean_turns", "invalid_rate",
            "errors")
    return {k: summary[k] for k in keys if k in summary}


def _pct(x: float) -> str:
    return f"{100 * x:.1f}"


def subset_rows(r: dict[str, Any]) -> list[tuple[str, dict[str, Any], Any]]:
    """The table rows of one result: (subset label, stats, errored). An id of one subset is one row
    named after it; an id that plays several (subset `all`) gets a row per task type and an `all` row."""
    if r["subset"] != "all":
        return [(r["subset"], result_row(r), r.get("errors", 0))]
    rows: list[tuple[str, dict[str, Any], Any]] = [(t, s, "") for t, s in (r.get("subsets") or {}).items()]
    rows.append(("all", result_row(r), r.get("errors", 0)))
    return rows


def markdown_tables(results: dict[str, Any], headline: tuple[str, str, str] | None = None) -> dict[str, str]:
    """A Markdown table per env family: one row per subset, split and agent; the rows of `headline`
    (env id, split, label) have the label beside their subset."""
    by_family: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in results["results"]:
        by_family[r["family"]].append(r)
    out = {}
    header = ("| subset | split | agent | episodes | success % | 95% CI | mean score | mean turns | invalid % | "
              "errored |")
    rule = "|---|---|---|---:|---:|---:|---:|---:|---:|---:|"
    for family, rows in by_family.items():
        lines = [f"### {family}", "", header, rule]
        for r in sorted(rows, key=lambda r: (r["subset"], r["split"])):  # stable: agents keep config order
            marked = headline is not None and (r["env_id"], r["split"]) == headline[:2]
            for name, s, errors in subset_rows(r):
                low, high = s["success_ci95"]
                if marked and name == r["subset"]:
                    name = f"{name} **({headline[2]})**"
                lines.append(
                    f"| {name} | {r['split']} | {r['agent']} | {episodes_cell(s)} | {_pct(s['success_rate'])} | "
                    f"[{_pct(low)}, {_pct(high)}] | {s['mean_score']:.3f} | {s['mean_turns']:.1f} | "
                    f"{_pct(s['invalid_rate'])} | {errors} |"
                )
        out[family] = "\n".join(lines) + "\n"
    return out


def chart_groups(results: dict[str, Any]) -> dict[tuple[str, str], list[dict[str, Any]]]:
    """The rows of each chart: (family, subset) -> one row per agent and split (`agent`, `split`,
    then the stats of `result_row`), in results order."""
    groups: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for r in results["results"]:
        for name, s, _ in subset_rows(r):
            groups[(r["family"], name)].append({"agent": r["agent"], "split": r["split"], **s})
    return dict(groups)


def says_something(rows: list[dict[str, Any]]) -> bool:
    """Whether a chart of these rows tells anything the table does not: not when every agent but
    the reference (`expert`) won no episode (expert 100%, every other agent 0%)."""
    others = [r for r in rows if r["agent"] != REFERENCE_AGENT]
    return not others or any(r["success_rate"] > 0 for r in others)

