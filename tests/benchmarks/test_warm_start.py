"""benchmarks.warm_start: a warm start evaluated on its training games, held-out twins, twin-free and
unseen games, at the smallest size; bad arguments give one usage line."""

from __future__ import annotations

import json
import subprocess
import sys

from benchmarks.common import REPO

COMMAND = [sys.executable, "-m", "benchmarks.warm_start"]


def test_bad_arguments_are_usage_errors(tmp_path, usage_errors):
    usage_errors("warm_start", ((["--episodes", "0"], "--episodes must be >= 1"),
                                (["--expert", "oracle"], "invalid choice"),
                                (["--model", str(tmp_path)], "no config.json")))
    # the expert cannot win in one turn: nothing to warm-start on, said in one line (after its rollout)
    done = subprocess.run([*COMMAND, "--max-turns", "1", "--train-games", "2", "--sft-episodes", "2", "--episodes", "1",
                           "--out", str(tmp_path / "w")], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert done.returncode == 2, done.stderr
    assert "nothing to warm-start on" in done.stderr and "Traceback" not in done.stderr


def test_every_panel_is_played_once_per_game(tmp_path):
    out = tmp_path / "ws"
    done = subprocess.run(
        [*COMMAND, "--train-games", "3", "--sft-episodes", "6", "--sft-epochs", "1", "--episodes",
         "3", "--max-turns", "15", "--tiny-hidden", "32", "--expert", "searching", "--out", str(out), "--no-progress"],
        capture_output=True, text=True, timeout=600, cwd=REPO,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    results = json.loads((out / "warm_start.json").read_text())["results"]
    seen = [results["valid_seen, twin in training"], results["valid_seen, twin-free"]]
    # the three valid_seen games are shared out between the twin and twin-free panels, no game twice
    assert sum(r["games"] for r in seen) == 3
    assert sorted(s for r in seen for s in r.get("seeds", [])) == [0, 1, 2]
    for label in ("train (its own games)", "valid_unseen (unseen floor plans)"):
        r = results[label]
        assert r["games"] == 3 and 0 <= r["wins"] <= 3 and r["ci95"][0] <= r["success"] <= r["ci95"][1]
    assert "valid_seen, twin-free" in done.stdout and (out / "model" / "config.json").exists()
    config = json.loads((out / "config.json").read_text())
    assert config["env_options"]["expert_searches"] is True and config["env_options"]["panel_own_types"] is True
