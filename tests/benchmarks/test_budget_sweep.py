"""benchmarks/budget_sweep.py: its usage errors, each setting's command line, which runs it reads back
(resuming), and the row it makes of a run's results."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import budget_sweep, learnability


@pytest.fixture
def warm(tmp_path):
    folder = tmp_path / "warm"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    return folder


def test_bad_arguments_are_usage_errors(tmp_path, warm, usage_errors):
    usage_errors("budget_sweep", ((["--settings", "base", "fast"], "unknown fast"),
                                  (["--warm", str(warm), "--jobs", "0"], "--jobs must be >= 1"),
                                  (["--warm", str(warm), "--steps", "0"], "--steps must be >= 1"),
                                  (["--warm", str(warm), "--temperature", "3"], "--temperature must be in (0, 2]"),
                                  (["--warm", str(tmp_path)], "no model folder there")))


def test_each_setting_is_a_learnability_run_that_changes_one_thing_from_base(tmp_path, warm):
    args = budget_sweep.parse_args(["--warm", str(warm), "--out", str(tmp_path / "sweep"), "--steps", "2"])
    base = vars(learnability.parse_args(budget_sweep.learnability_argv(args, "base")))
    for name in budget_sweep.SETTINGS:
        ran = vars(learnability.parse_args(budget_sweep.learnability_argv(args, name)))
        changed = {k for k in ran if ran[k] != base[k]} - {"out"}
        assert changed == set(budget_sweep.SETTINGS[name][1]), name  # exactly the setting's own change
        assert ran["out"].endswith(name) and ran["steps"] == 2 and ran["threads"] == 1 and ran["games"] == 4
    assert base["lr"] == 5e-5 and base["invalid_coef"] == 0.1 and (base["mini_batches"], base["ppo_epochs"]) == (2, 2)
    assert base["kl_coef"] == 0.0  # measured before the recipe's KL penalty: its page stays true


def write_run(args, name: str, steps: int, kls: list[float]) -> None:
    """A learnability.json as `benchmarks.learnability` writes it, for setting `name`."""
    ran = vars(learnability.parse_args(budget_sweep.learnability_argv(args, name)))
    ran["steps"] = steps
    updates = [{"step": i + 1, "kl_old_new": kl, "kl_floor": 1e-6, "clip_frac": 0.01 * (i + 1), "grad_norm": 0.2,
                "train/success": 0.125 * (i + 1), "time/step_s": 150.0} for i, kl in enumerate(kls)]
    change = {"before": 0.125, "after": 0.25, "difference": 0.125, "interval": [-0.05, 0.3], "gained": 5,
              "lost": 1, "mcnemar_p": 0.2, "episodes": 32, "invalid_before": 0.3, "invalid_after": 0.1}
    folder = Path(args.out) / name
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "learnability.json").write_text(json.dumps({"args": ran, "updates": updates, "change": change,
                                                          "seconds": 300.0}))


def test_a_finished_setting_is_read_back_only_with_the_same_settings_and_updates(tmp_path, warm):
    args = budget_sweep.parse_args(["--warm", str(warm), "--out", str(tmp_path / "sweep"), "--steps", "2"])
    assert budget_sweep.finished(args, "base") is None  # not run yet
    write_run(args, "base", steps=1, kls=[0.1])
    assert budget_sweep.finished(args, "base") is None  # one update of two: the sweep runs it on (it resumes)
    write_run(args, "base", steps=2, kls=[0.1, 0.02])
    assert budget_sweep.finished(args, "base")["updates"][1]["kl_old_new"] == 0.02
    write_run(args, "lr-2e-4", steps=2, kls=[0.3, 0.1])
    other_lr = tmp_path / "sweep" / "lr-2e-4" / "learnability.json"
    result = json.loads(other_lr.read_text())
    result["args"]["lr"] = 1e-4  # a run of another setting in its folder is not this setting's
    other_lr.write_text(json.dumps(result))
    assert budget_sweep.finished(args, "lr-2e-4") is None


def test_a_row_averages_the_updates_and_keeps_the_paired_change(tmp_path, warm):
    args = budget_sweep.parse_args(["--warm", str(warm), "--out", str(tmp_path / "sweep"), "--steps", "2"])
    write_run(args, "eight-steps", steps=2, kls=[0.1, 0.02])
    row = budget_sweep.summarise("eight-steps", budget_sweep.finished(args, "eight-steps"))
    assert row["optimizer_steps"] == 8 and row["kl"] == pytest.approx(0.06) and row["clip_frac"] == pytest.approx(0.015)
    assert row["train_success"] == [0.125, 0.25] and row["minutes"] == pytest.approx(5.0)
    assert (row["invalid_before"], row["invalid_after"], row["difference"]) == (0.3, 0.1, 0.125)
    cells = budget_sweep.table_rows([row])[0]
    assert len(cells) == len(budget_sweep.HEADER)
    assert cells[0] == "eight-steps" and cells[2] == "4x2" and cells[11] == "+12.5 [-5.0, +30.0]"
    text = budget_sweep.format_text(args, [row], (1.0, 2.0), 600.0)
    assert "eight-steps" in text and "10.0 min" in text
