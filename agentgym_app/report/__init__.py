"""The HTML report of a run folder: results tables, plots, training curves and a trajectory viewer.

`write_report(run_dir)` reads what a bench or a training run left in the folder and writes one
self-contained `report.html` (images inlined, no network). What it reads (each part is optional):

- `results.json`, `plots/*.png`, `config.json`: a bench's results, charts and config
  (`agentgym_app.bench`, `agentgym_app.bench_config`); a config with a `headline` gets it first, with
  its eval command.
- `episodes.jsonl`: the bench's episodes; a few per agent, env and split go to the viewer.
- `training/<method>/metrics.jsonl`: one JSON object per update (`update`, then numbers such as
  `success_rate`, `mean_reward`, `loss`); the methods are drawn side by side.
- `training/<method>/episodes.jsonl`: episodes the trainer updated on, with per-turn credit in
  `Episode.meta["credit"]` (format: `agentgym_app.report.credit`), and `credit.jsonl` files (in
  the run folder or a method's folder) with the same records kept apart from the episodes;
  `training/<method>/config.json`: the trainer's config (how large its in-training evaluation is).

The page is a list of sections (`SECTIONS`: headline, results, training, trajectories), each a
function of the run's data that returns a `Section` or None; `render_report(data, sections)` takes
another list, so a new section is one more function.
"""

from __future__ import annotations

from agentgym_app.report.credit import CREDIT_KEY, check_credit, credit_record, episode_credit, merge_credit_file
from agentgym_app.report.html import SECTIONS, RunData, Section, load_run, render_report, write_report

__all__ = [
    "CREDIT_KEY",
    "RunData",
    "SECTIONS",
    "Section",
    "check_credit",
    "credit_record",
    "episode_credit",
    "load_run",
    "merge_credit_file",
    "render_report",
    "write_report",
]
