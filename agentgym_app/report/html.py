"""Render a run folder as one self-contained HTML page (see `agentgym_app.report`)."""

from __future__ import annotations

import base64
import html
import json
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentgym_app.bench import HEADLINE_CHART, eval_command, headline_title
from agentgym_app.bench_config import BenchConfig
from agentgym_app.report.credit import episode_credit, merge_credit_file
from agentgym_app.results import COUNTING_NOTE, REFERENCE_AGENT, chart_groups, says_something, subset_rows
from agentgym_opsd.episode import Episode, load_episodes
from agentgym_opsd.io import atomic_write_text, read_jsonl_numbered
from agentgym_opsd.summary import episodes_cell
from trainer.plots import curves_png

__all__ = ["READING_TEACHER_FOLDER", "READING_TEACHER_MODEL", "READING_TEACHER_SOURCE", "RunData", "Section",
           "SECTIONS", "load_run", "render_report", "write_report"]

# The demo's reading-teacher section, which `agentgym_app.reading_teacher` writes: its folder in the run
# folder, the model it runs, and the trajectory viewer's group for its episodes.
READING_TEACHER_FOLDER = "reading_teacher"
READING_TEACHER_MODEL = "smollm2-135m"
READING_TEACHER_SOURCE = f"reading teacher · {READING_TEACHER_MODEL}"

# Metrics drawn first when a training run logs them (then any other shared numeric key).
_PREFERRED_METRICS = (
    "eval/success", "train/success", "success_rate", "credit/reward_mean", "train/reward", "mean_reward", "mean_score",
    "loss", "credit/adv_std_ratio", "train/invalid_rate", "invalid_rate",
)
# What the panels are called: the credit's reward is what the update used (shaped: invalid-action
# penalties included), the env's reward is what the episodes earned.
_METRIC_TITLES = {"credit/reward_mean": "credit/reward_mean (reward the update used)",
                  "train/reward": "train/reward (env reward)"}
# Bookkeeping keys of a metrics row, never drawn.
_NOT_METRICS = {"update", "step", "time", "kind"}


@dataclass
class RunData:
    """What a run folder holds, read once.

    Attributes:
        run_dir: the folder.
        name: the run's name (bench config name or folder name).
        results: results.json's content, or None.
        plots: the bench's PNG charts.
        training: method -> its metrics rows (one per update).
        viewer: (source, episode) pairs for the trajectory viewer; source is `bench` or
            `train:<method>`.
        meta: counts and notes shown in the header (`about`: the run folder's `about.txt`, a
            note its producer left for readers, e.g. the demo's "what this run is").
        bench: the bench's config (`agentgym_app.bench_config.BenchConfig`, from config.json), or None.
        training_configs: method -> its trainer config (training/<method>/config.json).
        reading_teacher: the real model's credit on expert-with-detours episodes
            (`reading_teacher/summary.json`, `agentgym_app.reading_teacher`), or None.
    """

    run_dir: Path
    name: str
    results: dict[str, Any] | None = None
    plots: list[Path] = field(default_factory=list)
    training: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    viewer: list[tuple[str, Episode]] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)
    bench: Any = None
    training_configs: dict[str, dict[str, Any]] = field(default_factory=dict)
    reading_teacher: dict[str, Any] | None = None


def _pick_bench_episodes(episodes: list[Episode], per_group: int) -> list[Episode]:
    """Up to `per_group` episodes per (agent, env, split): successes and failures alternately, in
    file order."""
    groups: dict[tuple[str, str, str], list[Episode]] = defaultdict(list)
    for e in episodes:
        groups[(e.agent, e.env_id, str(e.meta.get("split", "")))].append(e)
    picked = []
    for group in groups.values():
        wins = [e for e in group if e.success]
        losses = [e for e in group if not e.success]
        chosen: list[Episode] = []
        while len(chosen) < per_group and (wins or losses):
            for pool in (wins, losses):
                if pool and len(chosen) < per_group:
                    chosen.append(pool.pop(0))
        picked.extend(chosen)
    return picked


def _latest_by_key(episodes: list[Episode]) -> list[Episode]:
    """A bench file may hold an errored record and its replay: keep the last record per key."""
    by_key: dict[str, Episode] = {}
    loose = []
    for e in episodes:
        key = e.meta.get("bench_key")
        if key is None:
            loose.append(e)
        else:
            by_key[key] = e
    return loose + list(by_key.values())


def _training_episodes(method_dir: Path) -> list[Episode]:
    """A training run's episodes: `episodes.jsonl`, else the trainer's `episodes/update_*.jsonl`
    (each episode's `meta["update"]` says which update played it)."""
    if (method_dir / "episodes.jsonl").exists():
        return load_episodes(method_dir / "episodes.jsonl", skip_torn_lines=True)
    out: list[Episode] = []
    for path in sorted((method_dir / "episodes").glob("update_*.jsonl")) if (method_dir / "episodes").is_dir() else []:
        update = int(path.stem.split("_")[1])
        for e in load_episodes(path, skip_torn_lines=True):
            e.meta.setdefault("update", update)
            out.append(e)
    return out


def load_run(run_dir: str | Path, *, per_group: int = 4, per_method: int = 24) -> RunData:
    """Read a run folder for the report.

    Args:
        per_group: bench episodes shown per agent, env and split.
        per_method: training episodes (with credit) shown per method.
    """
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise FileNotFoundError(f"{run_dir}: no such run folder")
    data = RunData(run_dir=run_dir, name=run_dir.name)
    data.meta.update(per_group=per_group, per_method=per_method)
    if (run_dir / "about.txt").is_file():
        data.meta["about"] = (run_dir / "about.txt").read_text(encoding="utf-8").strip()
    results_path = run_dir / "results.json"
    if results_path.exists():
        data.results = json.loads(results_path.read_text(encoding="utf-8"))
        data.name = str(data.results.get("name") or data.name)
    data.plots = sorted((run_dir / "plots").glob("*.png")) if (run_dir / "plots").is_dir() else []
    config_path = run_dir / "config.json"
    if config_path.exists():
        saved = json.loads(config_path.read_text(encoding="utf-8"))
        if isinstance(saved, dict) and isinstance(saved.get("config"), dict) and "agents" in saved["config"]:
            data.bench = BenchConfig.from_dict(saved["config"])
    episodes_path = run_dir / "episodes.jsonl"
    bench_episodes: list[Episode] = []
    if episodes_path.exists():
        bench_episodes = _latest_by_key(load_episodes(episodes_path, skip_torn_lines=True))
        if (run_dir / "credit.jsonl").exists():
            merge_credit_file(run_dir / "credit.jsonl", bench_episodes)
        data.viewer += [("bench", e) for e in _pick_bench_episodes(bench_episodes, per_group)]
    data.meta["bench_episodes"] = len(bench_episodes)
    training_dir = run_dir / "training"
    if training_dir.is_dir():
        for method_dir in sorted(p for p in training_dir.iterdir() if p.is_dir()):
            method = method_dir.name
            if (method_dir / "config.json").is_file():
                data.training_configs[method] = json.loads((method_dir / "config.json").read_text(encoding="utf-8"))
            metrics_path = method_dir / "metrics.jsonl"
            if metrics_path.exists():
                rows = [row for _, row in read_jsonl_numbered(metrics_path, skip_torn_lines=True)]
                data.training[method] = [r for r in rows if r.get("kind") != "sft"]  # warm-start epochs
            episodes = _training_episodes(method_dir)
            for credit_path in (method_dir / "credit.jsonl", run_dir / "credit.jsonl"):
                if credit_path.exists():
                    merge_credit_file(credit_path, episodes)
            with_credit = [e for e in episodes if e.meta.get("credit")]
            data.viewer += [(f"train:{method}", e) for e in (with_credit or episodes)[-per_method:]]
    teacher_dir = run_dir / READING_TEACHER_FOLDER
    if (teacher_dir / "summary.json").is_file():
        data.reading_teacher = json.loads((teacher_dir / "summary.json").read_text(encoding="utf-8"))
        if (teacher_dir / "episodes.jsonl").is_file() and not data.reading_teacher.get("skipped"):
            read = load_episodes(teacher_dir / "episodes.jsonl", skip_torn_lines=True)
            data.viewer += [(READING_TEACHER_SOURCE, e) for e in read]
    return data


# ---------------------------------------------------------------------------------------------
# Pieces of the page.


def _png_data_uri(data: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(data).decode("ascii")


def _pct(x: float) -> str:
    return f"{100 * x:.1f}"


_RESULTS_HEAD = ("<tr><th>subset</th><th>split</th><th>agent</th><th>episodes</th><th>success %</th><th>95% CI</th>"
                 "<th></th><th>mean score</th><th>mean turns</th><th>invalid %</th><th>errored</th></tr>")


def _result_row_html(r: dict[str, Any], name: str, s: dict[str, Any], errors: Any, mark: str | None) -> str:
    """One table row: subset (with the headline's mark), split, agent, episodes, success with its 95%
    interval (and a bar), mean score, mean turns, invalid-action rate, errored episodes."""
    low, high = s["success_ci95"]
    rate = s["success_rate"]
    bar = (
        f'<span class="ci" style="left:{100 * low:.1f}%;width:{100 * (high - low):.1f}%"></span>'
        f'<span class="pt" style="left:{100 * rate:.1f}%"></span>'
    )
    marked = f' <span class="mark">{html.escape(mark)}</span>' if mark else ""
    return (
        f"<tr{' class=headline' if mark else ''}>"
        f"<td>{html.escape(name)}{marked}</td><td>{html.escape(r['split'])}</td>"
        f"<td class=agent>{html.escape(r['agent'])}</td><td class=num>{episodes_cell(s)}</td>"
        f"<td class=num><b>{_pct(rate)}</b></td>"
        f"<td class=num>[{_pct(low)}, {_pct(high)}]</td><td class=bar><div class=track>{bar}</div></td>"
        f"<td class=num>{s['mean_score']:.3f}</td><td class=num>{s['mean_turns']:.1f}</td>"
        f"<td class=num>{_pct(s['invalid_rate'])}</td><td class=num>{errors}</td>"
        "</tr>"
    )


def _is_headline(r: dict[str, Any], headline: Any) -> bool:
    return headline is not None and (r["env_id"], r["split"]) == (headline.id, headline.split)


def _results_html(results: dict[str, Any], headline: Any = None) -> str:
    """One table per env family (rows by subset and split, agents in config order); the headline's
    rows are marked with its label."""
    by_family: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in results.get("results", []):
        by_family[r["family"]].append(r)
    parts = []
    for family, rows in by_family.items():
        body = []
        for r in sorted(rows, key=lambda r: (r["subset"], r["split"])):
            mark = headline.label if _is_headline(r, headline) else None
            for name, s, errors in subset_rows(r):
                body.append(_result_row_html(r, name, s, errors, mark if name == r["subset"] else None))
        parts.append(f'<h3>{html.escape(family)}</h3><table class="results"><thead>{_RESULTS_HEAD}</thead><tbody>'
                     + "".join(body) + "</tbody></table>")
    return "\n".join(parts)


def _figure_html(path: Path, caption: str) -> str:
    return (f'<figure><img alt="{html.escape(path.stem)}" src="{_png_data_uri(path.read_bytes())}">'
            f"<figcaption>{html.escape(caption)}</figcaption></figure>")


def _plots_html(plots: list[Path], results: dict[str, Any]) -> str:
    """The charts that say something, and a line naming the ones not drawn (every agent but the
    expert won nothing there: the table holds those rows)."""
    figures = "".join(_figure_html(path, path.stem) for path in plots if path.name != HEADLINE_CHART)
    silent = [f"{family} {subset}" for (family, subset), rows in chart_groups(results).items()
              if not says_something(rows)]
    note = ""
    if silent:
        note = (f'<p class="note">Not drawn: {len(silent)} chart{"s" if len(silent) > 1 else ""} in which no agent '
                f"but the {REFERENCE_AGENT} won an episode ({html.escape(', '.join(silent))}); the tables above hold "
                "their rows.</p>")
    return (f'<div class="plots">{figures}</div>' if figures else "") + note


def _training_metric_names(training: dict[str, list[dict[str, Any]]]) -> list[str]:
    shared: set[str] | None = None
    for rows in training.values():
        names = {k for row in rows for k, v in row.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
        names -= _NOT_METRICS
        names = {n for n in names if not any(w in n for w in ("seconds", "time/", "_s", "tokens_per_s"))}  # timings
        shared = names if shared is None else shared & names
    shared = shared or set()
    ordered = [m for m in _PREFERRED_METRICS if m in shared] + sorted(shared - set(_PREFERRED_METRICS))
    return ordered[:4]


def _eval_size(config: dict[str, Any]) -> int | None:
    """Episodes per in-training evaluation of a trainer config (None: it does not evaluate)."""
    seeds = config.get("eval_seeds") or []
    n = len(seeds) if seeds else int(config.get("eval_episodes") or 0)
    return n or None


def _eval_note(data: RunData) -> str:
    """What a point of the in-training evaluation curve is, and what it can see: with n episodes a
    low success rate reads 0/n most of the time, which the chart alone would not say."""
    sizes = {m: _eval_size(c) for m, c in data.training_configs.items()}
    sizes = {m: n for m, n in sizes.items() if n}
    if not sizes:
        return ""
    n = min(sizes.values())
    config = next(c for m, c in data.training_configs.items() if sizes.get(m) == n)
    options = ", ".join(f"{k}={v}" for k, v in (config.get("eval_env_options") or {}).items())
    temperature = config.get("eval_temperature")
    how = "greedy" if temperature == 0 else f"temperature {temperature}"
    same = "the same games at every point" if not config.get("eval_seeds") else "the same seeds at every point"
    text = (f"eval/success: each point is {n} {how} episode{'s' if n > 1 else ''} on {config.get('env_id', 'the env')}"
            f"{f' ({options})' if options else ''}, {same}. A policy that wins 5% of its games reads 0/{n} there "
            f"{100 * 0.95 ** n:.0f}% of the time")
    headline = data.bench.headline if data.bench is not None else None
    row = next((r for r in (data.results or {}).get("results", []) if _is_headline(r, headline)), None)
    if row is not None:
        text += (f"; the {headline.label} result above ({row['episodes']} episodes per agent) is the measure of what "
                 "the policies learned")
    return text + "."


def _training_html(training: dict[str, list[dict[str, Any]]], eval_sizes: dict[str, int] | None = None) -> str:
    if not training:
        return ""
    names = _training_metric_names(training)
    titles = {n: _METRIC_TITLES.get(n, n.replace("_", " ")) for n in names}
    sizes = set((eval_sizes or {}).values())
    for n in names:
        if n.startswith("eval/success") and len(sizes) == 1:
            titles[n] += f" ({sizes.pop()} episodes per point)"
    png = curves_png(training, names, titles=titles) if names else None
    rows = []
    for method, metrics in training.items():
        cells = ""
        for n in names:
            values = [row[n] for row in metrics if isinstance(row.get(n), (int, float))]
            first, last = (values[0], values[-1]) if values else (None, None)
            cells += f"<td class=num>{_fmt(first)} &rarr; <b>{_fmt(last)}</b></td>"
        updates = max((int(row.get("update", row.get("step", 0))) for row in metrics), default=0)
        rows.append(f"<tr><td class=agent>{html.escape(method)}</td><td class=num>{updates}</td>{cells}</tr>")
    head = "".join(f"<th>{html.escape(n.replace('_', ' '))} (first &rarr; last)</th>" for n in names)
    table = ('<table class="results"><thead><tr><th>method</th><th>updates</th>'
             f'{head}</tr></thead><tbody>{"".join(rows)}</tbody></table>')
    image = (f'<div class="plots wide"><figure><img alt="training curves" src="{_png_data_uri(png)}"></figure></div>'
             if png else "")
    return table + image


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.3f}"
    return html.escape(str(value)) if value is not None else "&ndash;"


def _viewer_keys(viewer: list[tuple[str, Episode]]) -> list[str]:
    """A link key per viewer episode, unique in the page: source, agent, episode id and update
    (the expert and a policy play the same `env:split:i@seed` ids), numbered if still equal."""
    keys, seen = [], {}
    for source, e in viewer:
        key = "|".join(str(p) for p in (source, e.agent, e.episode_id, e.meta.get("update", "")))
        seen[key] = seen.get(key, 0) + 1
        keys.append(key if seen[key] == 1 else f"{key}#{seen[key]}")
    return keys


def _episode_json(source: str, episode: Episode, instructions: dict[str, int]) -> dict[str, Any]:
    if episode.instructions not in instructions:
        instructions[episode.instructions] = len(instructions)
    try:
        credit = episode_credit(episode)
    except ValueError as e:  # a bad record is shown as such, not fatal to the report
        credit, credit_error = {}, str(e)
    else:
        credit_error = None
    return {
        "source": source,
        "id": episode.episode_id,
        "agent": episode.agent,
        "env": episode.env_id,
        "split": str(episode.meta.get("split", "")),
        "update": episode.meta.get("update"),
        "seed": episode.seed,
        "task": episode.task_id,
        "type": episode.task_type,
        "success": episode.success,
        "score": episode.score,
        "error": episode.error,
        "instructions": instructions[episode.instructions],
        "initial": episode.initial_observation,
        "hindsight": None if episode.hindsight is None else episode.hindsight.reference,
        "turns": [
            {
                "response": t.response,
                "action": t.action,
                "observation": t.observation,
                "reward": t.reward,
                "format_ok": t.step.format_ok,
                "format_error": t.step.format_error,
                "admissible": t.step.admissible,
                "span": None if t.step.action_span is None else list(t.step.action_span),
            }
            for t in episode.turns
        ],
        "credit": credit,
        "credit_error": credit_error,
    }


def _script_json(obj: Any) -> str:
    """JSON safe inside a <script> element: `<`, `>` and `&` only occur inside JSON strings, where
    their \\u escapes mean the same, so no env text can close the element or open a comment."""
    text = json.dumps(obj, ensure_ascii=False)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


_TEMPLATE = Path(__file__).with_name("template.html")


@dataclass(frozen=True)
class Section:
    """One section of the page: its anchor, its heading (also its link in the header) and its HTML."""

    id: str
    title: str
    body: str


def headline_section(data: RunData) -> Section | None:
    """The result that matters (the bench's `headline`), first and large: its full-width chart, its
    rows, and the exact `agentgym-opsd eval` command that plays its episodes again."""
    headline = data.bench.headline if data.bench is not None else None
    if headline is None or not data.results:
        return None
    rows = [r for r in data.results.get("results", []) if _is_headline(r, headline)]
    if not rows:
        return None
    parts = [f"<p>{_inline_code(headline.note)}</p>" if headline.note else ""]
    chart = next((p for p in data.plots if p.name == HEADLINE_CHART), None)
    if chart is not None:
        parts.append(f'<div class="plots wide">{_figure_html(chart, headline_title(headline))}</div>')
    body = "".join(_result_row_html(r, name, st, errors, None) for r in rows for name, st, errors in subset_rows(r)
                   if name == r["subset"])  # fmt: skip
    parts.append(f'<table class="results"><thead>{_RESULTS_HEAD}</thead><tbody>{body}</tbody></table>')
    spec = data.bench.headline_spec()
    seeds = list(data.bench.seeds)
    per_seed = spec.episodes if isinstance(spec.episodes, int) else rows[0]["episodes"] // max(1, len(seeds))
    commands = [(a, eval_command(data.bench, spec, a, per_seed, seed=seeds[0])) for a in data.bench.agents]
    shown = commands[-1]
    others = "".join(f"<p class=note>{html.escape(a.name)}:</p><pre class=command>{html.escape(c)}</pre>"
                     for a, c in commands)
    more = (f" Run seed {seeds[0]} of {len(seeds)}: another run seed s plays the episodes of "
            f"<code>--seed</code> s &times; {per_seed}." if len(seeds) > 1 else "")
    parts.append(
        f'<h3>Play these episodes again</h3><p class="note">The {html.escape(headline.label)} row of '
        f"<code>{html.escape(shown[0].name)}</code>, with the bench's env keywords, tasks and context ("
        f"<code>--agent</code> takes any agent of the table: the commands for each are below).{more}</p>"
        f'<pre class="command">{html.escape(shown[1])}</pre>'
        f"<details><summary>the command for each agent</summary>{others}</details>"
    )
    return Section("headline", headline.label[:1].upper() + headline.label[1:], "".join(parts))


def results_section(data: RunData) -> Section | None:
    """Every result, a table per env family (the headline's rows marked), and the charts that say something."""
    if not data.results:
        return None
    headline = data.bench.headline if data.bench is not None else None
    marked = (f' Rows marked <span class="mark">{html.escape(headline.label)}</span> are the '
              f'{html.escape(headline.label)} result shown first.' if headline is not None else "")
    note = ('<p class="note">Success rate with its 95% Wilson interval (the bar: the interval, the mark: the rate); '
            "invalid % is the share of turns that were malformed or not admissible."
            + marked + " " + _inline_code(COUNTING_NOTE) + "</p>")
    return Section("results", "Results",
                   note + _results_html(data.results, headline) + _plots_html(data.plots, data.results))


def training_section(data: RunData) -> Section | None:
    """Each training run's curves side by side, with what its in-training evaluation can see."""
    if not data.training:
        return None
    sizes = {m: n for m, c in data.training_configs.items() if (n := _eval_size(c))}
    note = _eval_note(data)
    return Section("training", "Training", (f'<p class="note">{html.escape(note)}</p>' if note else "")
                   + _training_html(data.training, sizes))


def reading_teacher_section(data: RunData) -> Section | None:
    """The real model as its own teacher on expert-with-detours episodes: the AUC of its credit, and where
    the viewer shows the episodes (`agentgym_app.reading_teacher`)."""
    summary = data.reading_teacher
    if not summary:
        return None
    title = "A teacher that reads"
    model = html.escape(str(summary.get("settings", {}).get("model", "the real model")))
    if summary.get("skipped"):
        skipped = _inline_code(str(summary["skipped"]))
        return Section("reading-teacher", title, f'<p class="note">Not run: {skipped}</p>')
    head = "<tr><th>credit</th><th>AUC</th><th>95% interval</th><th>episodes with pairs</th></tr>"

    def spread(r: dict[str, Any]) -> str:
        return "&ndash;" if r["low"] is None else f"[{r['low']:.2f}, {r['high']:.2f}]"

    body = "".join(f"<tr><td>{html.escape(r['row'])}</td><td>{_fmt(r['auc'])}</td><td>{spread(r)}</td>"
                   f"<td>{r['episodes']}</td></tr>" for r in summary["auc"])
    settings = summary.get("settings", {})
    note = (
        f"The tiny policy above cannot read, so its StepOPSD teacher says little. Here the real model, "
        f"<code>{model}</code> (SmolLM2-135M-Instruct, no warm start), is student and live teacher at once on "
        f"{summary['episodes']} ALFWorld Pick episodes of the expert with random detours ({settings.get('tasks')} "
        f"tasks x {settings.get('group_size')}, detour rate {settings.get('detour')}; {summary['successes']} won; "
        f"{summary['turns']} turns, {summary['expert_turns']} of them expert turns: the env's label, the turn "
        "shortened the expert's remaining plan). Each turn's StepOPSD and AgentOPSD credit is in the trajectory "
        "viewer below (group <code>" + html.escape(READING_TEACHER_SOURCE) + "</code>), drawn as the training credit "
        "is. The AUC: within each episode, the chance that an expert turn gets more credit than a detour (per turn: "
        "its credit over |A|, or its evidence e_k; token weights: the action tokens that agree with the expert's "
        "action against those that depart from it, pooled). 0.5 is chance. The interval resamples the "
        f"episodes ({settings.get('bootstrap')} draws); with this few it is wide: "
        "<code>python -m benchmarks.credit_quality --model smollm2-135m</code> measures it on 128 episodes with "
        f"placebo controls. Computed in {summary['seconds']:.0f}s on {summary.get('threads', 1)} thread(s), load "
        f"{summary['load'][0]:.1f} to {summary['load'][1]:.1f}."
    )
    return Section("reading-teacher", title, f'<p class="note">{note}</p><table class="results"><thead>{head}</thead>'
                   f"<tbody>{body}</tbody></table>")


def trajectories_section(data: RunData) -> Section | None:
    """The trajectory viewer (filled by the page's script from the data block)."""
    if not data.viewer:
        return None
    return Section(
        "trajectories", "Trajectories",
        '<p class="note">' + html.escape(_viewer_note(data)) + "</p>"
        '<p class="note">Each turn: the agent\'s response, '
        "the per-turn credit, and the env's observation. Where a trainer recorded StepOPSD credit, the scored "
        "action tokens are coloured by their weight w<sub>t</sub>: green above 1 (the token takes more of the "
        "episode's advantage: more credit when A &gt; 0, more blame when A &lt; 0), red below 1; or by the "
        "teacher-student gap &delta;<sub>t</sub> (green: the teacher with hindsight finds the token likelier).</p>"
        '<div class="viewer"><div class="picker"><select id="filter"></select><ol id="episode-list"></ol></div>'
        '<div id="episode"></div></div>',
    )


# The page's sections, in order: each takes the run's data and returns its Section, or None when
# the run has nothing for it. A new section is one more function here.
SECTIONS: list[Callable[[RunData], Section | None]] = [headline_section, results_section, training_section,
                                                       reading_teacher_section, trajectories_section]


def render_report(data: RunData, sections: list[Callable[[RunData], Section | None]] | None = None) -> str:
    """The report page as one HTML string, with `sections` (default `SECTIONS`) in order."""
    instructions: dict[str, int] = {}
    viewer = [_episode_json(source, e, instructions) for source, e in data.viewer]
    for item, key in zip(viewer, _viewer_keys(data.viewer), strict=True):
        item["key"] = key
    payload = {"episodes": viewer, "instructions": list(instructions)}
    built = [section for build in (SECTIONS if sections is None else sections) if (section := build(data)) is not None]
    html_sections = [f'<section id="{s.id}"><h2>{html.escape(s.title)}</h2>{s.body}</section>' for s in built]
    nav = [f'<a href="#{s.id}">{html.escape(s.title)}</a>' for s in built]
    about = data.meta.get("about")
    about_html = f'<p class="about">{_inline_code(about)}</p>' if about else ""
    stamp = time.strftime("%Y-%m-%d %H:%M")
    summary = f"{data.meta.get('bench_episodes', 0)} bench episodes"
    if data.training:
        summary += f"; training: {', '.join(data.training)}"
    page = _TEMPLATE.read_text(encoding="utf-8")
    return (
        page.replace("{{title}}", html.escape(data.name))
        .replace("{{summary}}", html.escape(f"{summary}; written {stamp}"))
        .replace("{{nav}}", " ".join(nav))
        .replace("{{about}}", about_html)
        .replace("{{sections}}", "\n".join(html_sections) or "<p>This run folder holds nothing to report yet.</p>")
        .replace("{{data}}", _script_json(payload))
    )


def _inline_code(text: str) -> str:
    """Escaped text with `backticked` spans as <code> and blank lines as paragraph breaks."""
    parts = html.escape(text).split("`")
    body = "".join(f"<code>{p}</code>" if i % 2 else p for i, p in enumerate(parts))
    return body.replace("\n\n", "</p><p class=\"about\">").replace("\n", " ")


def _viewer_note(data: RunData) -> str:
    """What the viewer holds: a sample of the bench's episodes, the last ones of each training run."""
    bench = sum(1 for source, _ in data.viewer if source == "bench")
    parts = []
    if data.meta.get("bench_episodes"):
        parts.append(f"{bench} of the bench's {data.meta['bench_episodes']} episodes (up to "
                     f"{data.meta.get('per_group', 4)} "
                     "per agent, env and split, successes and failures alternately; episodes.jsonl holds them all)")
    trained = len(data.viewer) - bench
    if trained:
        parts.append(f"{trained} training episodes (the last {data.meta.get('per_method', 24)} per method, those with "
                     "recorded credit first)")
    return ("Shown: " + "; ".join(parts) + ".") if parts else ""


def write_report(run_dir: str | Path, out: str | Path | None = None, **load_kwargs: Any) -> Path:
    """Write `report.html` for a run folder (atomically); returns its path."""
    data = load_run(run_dir, **load_kwargs)
    path = Path(out) if out is not None else Path(run_dir) / "report.html"
    atomic_write_text(path, render_report(data))
    return path
