"""trainer.plots.plot_paired_runs: the figure benchmarks/learning.py writes (each run beside its warm start)."""

import pytest

from trainer.plots import plot_paired_runs

REFERENCE = {"warm start 0": 0.16, "warm start 1": 0.30}
RUNS = {"grpo": {"warm start 0": [0.26, 0.24], "warm start 1": [0.36]},
        "agentopsd": {"warm start 0": [0.30, 0.28], "warm start 1": [0.42]}}


def test_the_same_runs_give_the_same_bytes_and_a_changed_run_changes_them(tmp_path):
    first = plot_paired_runs(REFERENCE, RUNS, tmp_path / "a.png").read_bytes()
    again = plot_paired_runs(REFERENCE, RUNS, tmp_path / "b.png").read_bytes()
    moved = {**RUNS, "agentopsd": {"warm start 0": [0.30, 0.28], "warm start 1": [0.20]}}
    changed = plot_paired_runs(REFERENCE, moved, tmp_path / "c.png").read_bytes()
    assert first.startswith(b"\x89PNG") and first == again
    assert changed != first


def test_a_method_without_runs_in_a_group_is_drawn_without_them(tmp_path):
    partial = {"grpo": RUNS["grpo"], "gigpo": {"warm start 0": [0.24]}}
    written = plot_paired_runs(REFERENCE, partial, tmp_path / "p.png")
    assert written.read_bytes() != plot_paired_runs(REFERENCE, RUNS, tmp_path / "q.png").read_bytes()


def test_a_group_without_a_reference_value_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match=r"warm start 2.*no warm start value"):
        plot_paired_runs(REFERENCE, {"grpo": {"warm start 2": [0.3]}}, tmp_path / "x.png")
    assert not (tmp_path / "x.png").exists()
