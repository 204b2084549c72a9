"""`agentgym-opsd eval` and `list` on the ALFWorld ids: success per task type, sizes without generating."""

from __future__ import annotations

import json
from pathlib import Path

from agentgym_app.cli import main


def test_eval_reports_expert_success_per_task_type(tmp_path: Path, panel_options: dict, capsys) -> None:
    options = [f"panel_size={json.dumps(panel_options['panel_size'])}", "progress=false"]
    args = ["eval", "agentgym/ALFWorld-All-v0", "--agent", "expert", "--episodes", "12", "--out", str(tmp_path)]
    for option in options:
        args += ["--option", option]
    assert main(args) == 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    by_type = summary["by_task_type"]
    assert set(by_type) == {"pick", "look", "clean", "heat", "cool", "picktwo"}
    assert all(v["episodes"] == 2 and v["success_rate"] == 1.0 for v in by_type.values())
    out = capsys.readouterr().out
    assert "picktwo" in out and "100.0%" in out


def test_list_shows_the_alfworld_ids_with_sizes(capsys) -> None:
    assert main(["list"]) == 0
    lines = capsys.readouterr().out.splitlines()

    def block(env_id: str) -> str:  # the id's row and the lines it wraps onto (splits, description)
        start = next(i for i, line in enumerate(lines) if line.startswith(env_id + " "))
        end = next((i for i in range(start + 1, len(lines)) if not lines[i].startswith(" ")), len(lines))
        return " ".join(" ".join(line.split()) for line in lines[start:end])

    assert "train (20), valid_seen (10), valid_unseen (10)" in block("agentgym/ALFWorld-Heat-v0")
    assert "train (120)" in block("agentgym/ALFWorld-All-v0")
