"""benchmarks.learning: usage errors in one line, and its statistics (pure functions) doing what the
table says they do."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from benchmarks import learning
from benchmarks.common import REPO


def test_bad_counts_are_usage_errors(usage_errors):
    usage_errors("learning", ((["--jobs", "0"], "--jobs must be >= 1"), (["--jobs", "-2"], "--jobs must be >= 1"),
                              (["--jobs", "two"], "invalid int value"), (["--seeds", "0"], "--seeds must be >= 1"),
                              (["--model", "no/such/folder"], "not a named model"),
                              (["--device", "tpu"], "invalid choice: 'tpu'"),
                              (["--ppo-epochs", "0"], "--ppo-epochs must be >= 1"),
                              (["--temperature", "0"], "--temperature must be in (0, 2]"),
                              (["--kl-coef", "-0.1"], "--kl-coef must be >= 0"),
                              (["--kl-coef", "nan"], "--kl-coef must be >= 0"),
                              (["--threads", "0"], "--threads must be >= 1"),
                              (["--invalid-coef", "-1"], "--invalid-coef must be a number >= 0"),
                              (["--credit", "invalid_coef=many"], "--invalid-coef must be a number >= 0"),
                              (["--credit", "lam_mix"], "--credit 'lam_mix': write it as KEY=VALUE"),
                              (["--invalid-coef", "0", "--credit", "invalid_coef=0.1"], "set the same penalty"),
                              (["--warm-starts", "3", "--only-warm-starts", "3"], "among 0..2"),
                              (["--only-warm-starts", "one"], "among 0..0"),
                              (["--warm-starts", "2", "--only-warm-starts", ","], "among 0..1")))


def rl_fields(monkeypatch, tmp_path, argv: list[str]) -> tuple[list[dict], int | None]:
    """The fields of every RL run (GRPO and GiGPO) that `argv` would start, and their threads."""
    seen = {}

    def capture(todo, jobs, progress, run=None, threads=None, done=None):
        seen.update(todo=todo, threads=threads)
        return {}

    monkeypatch.setattr(learning, "run_jobs", capture)
    learning.run_rl(learning.parse_args([*argv, "--out", str(tmp_path)]), tmp_path, ["grpo", "gigpo"], {})
    return list(seen["todo"].values()), seen["threads"]


def test_kl_coef_and_threads_reach_every_rl_run(monkeypatch, tmp_path):
    runs, threads = rl_fields(monkeypatch, tmp_path, ["--kl-coef", "0.05", "--threads", "1"])
    assert {fields["kl_coef"] for fields in runs} == {0.05}
    assert threads == 1 and len(runs) == 2
    bare, _ = rl_fields(monkeypatch, tmp_path, [])
    assert {fields["kl_coef"] for fields in bare} == {learning.PICK_REAL.kl_coef}


def test_only_warm_starts_trains_and_runs_from_those_alone(monkeypatch, tmp_path):
    """`--only-warm-starts 2` of three: warm start 2 is trained and its runs started, 0 and 1 are left alone."""
    argv = ["--warm-starts", "3", "--seeds", "2", "--only-warm-starts", "2"]
    runs, _ = rl_fields(monkeypatch, tmp_path, argv)
    assert sorted((Path(f["model"]).parent.name, f["method"], f["seed"]) for f in runs) == [
        ("warm2", m, s) for m in ("gigpo", "grpo") for s in (0, 1)]
    started = {}
    monkeypatch.setattr(learning, "run_jobs", lambda todo, *a, **k: started.update(todo) or {})
    learning.run_warm_starts(learning.parse_args([*argv, "--out", str(tmp_path)]), tmp_path, {}, ["grpo"])
    assert list(started) == [("warm start", 2)]
    everything, _ = rl_fields(monkeypatch, tmp_path, ["--warm-starts", "3"])
    assert {Path(f["model"]).parent.name for f in everything} == {"warm0", "warm1", "warm2"}


def test_the_invalid_turn_penalty_is_the_recipes_unless_a_flag_says_otherwise(monkeypatch, tmp_path):
    """The real recipe trains without the penalty; `--invalid-coef` and `--credit invalid_coef=` are one setting,
    and a tiny run keeps the family's default (no override at all)."""
    penalties = {}
    for name, argv in (("bare", []), ("flag", ["--invalid-coef", "0.1"]), ("credit", ["--credit", "invalid_coef=0.2"]),
                       ("tiny", ["--model", "tiny"])):
        runs, _ = rl_fields(monkeypatch, tmp_path, [*argv, "--credit", "lam_mix=0.3"])
        assert all(fields["credit"]["lam_mix"] == 0.3 for fields in runs)  # other settings pass through
        penalties[name] = {fields["credit"].get("invalid_coef", "family default") for fields in runs}
    assert penalties == {"bare": {learning.PICK_REAL.invalid_coef}, "flag": {0.1}, "credit": {0.2},
                         "tiny": {"family default"}}


def test_each_model_kind_gets_its_own_defaults_and_flags_override_them():
    real = learning.parse_args([])
    assert (real.model, real.train_layers, real.eval_split, real.out) == ("smollm2-135m", 8, "valid_unseen",
                                                                           "runs/learning-smollm2-135m")
    tiny = learning.parse_args(["--model", "tiny", "--steps", "3", "--quick"])
    assert (tiny.train_layers, tiny.eval_split, tiny.steps,
            tiny.out) == (0, "valid_seen", 3, "runs/learning-tiny-quick")
    cooler = learning.parse_args(["--temperature", "0.7", "--ppo-epochs", "3"])
    assert (cooler.temperature, cooler.ppo_epochs, cooler.lr) == (0.7, 3, real.lr)  # the rest stays the recipe's


def test_the_interval_holds_the_run_to_run_spread_not_only_games():
    rng = np.random.default_rng(0)
    games = rng.random(100) < 0.3
    # two warm starts x three seeds whose runs differ a lot (the same games won or lost as a block)
    shift = np.array([[0.0, 0.2, -0.2], [0.3, -0.1, 0.1]])
    table = np.clip(games[None, None, :] + shift[:, :, None], 0, 1)
    spread = learning.hierarchical_bootstrap(table, 2000, np.random.default_rng(1))
    games_only = learning.hierarchical_bootstrap(table.mean(axis=(0, 1), keepdims=True), 2000, np.random.default_rng(1))
    assert np.percentile(spread, 97.5) - np.percentile(spread, 2.5) > \
        1.3 * (np.percentile(games_only, 97.5) - np.percentile(games_only, 2.5))
    # one run: games alone, the same draws as a plain bootstrap over games
    one = learning.hierarchical_bootstrap(table[:1, :1], 500, np.random.default_rng(2))
    plain_rng = np.random.default_rng(2)
    plain = []
    for _ in range(500):
        plain_rng.integers(0, 1, size=1), plain_rng.integers(0, 1, size=(1, 1))
        plain.append(table[0, 0, plain_rng.integers(0, 100, size=100)].mean())
    assert np.allclose(one, plain)
    mean, low, high = learning.mean_interval(table, 1000, np.random.default_rng(3))
    assert low < mean < high and mean == pytest.approx(table.mean())


def test_warm_starts_with_different_seed_counts_weigh_the_same_and_keep_their_spread():
    games = (np.random.default_rng(4).random(60) < 0.4).astype(float)
    # warm start 0: three seeds near 0.2; warm start 1: one seed at 0.6 (a stopped invocation)
    low = np.stack([np.clip(games * 0 + 0.2 + d, 0, 1) for d in (-0.05, 0.0, 0.05)])
    high = np.full((1, 60), 0.6)
    assert learning.hierarchical_mean([low, high]) == pytest.approx(0.4)  # not (3 * 0.2 + 0.6) / 4
    means = learning.hierarchical_bootstrap([low, high], 2000, np.random.default_rng(5))
    # resampling warm starts reaches both all-low and all-high draws: the interval spans the warm starts
    assert means.min() == pytest.approx(0.15, abs=0.03) and means.max() == pytest.approx(0.6)
    assert np.percentile(means, 97.5) - np.percentile(means, 2.5) > 0.3
    # a balanced array is the same as its list of warm starts
    table = np.stack([low, low[::-1] + 0.1])
    assert np.allclose(learning.hierarchical_bootstrap(table, 300, np.random.default_rng(6)),
                       learning.hierarchical_bootstrap(list(table), 300, np.random.default_rng(6)))


def test_the_table_covers_every_finished_run_on_the_warm_starts_every_method_reached(tmp_path):
    def finish(*parts):
        (tmp_path.joinpath(*parts)).mkdir(parents=True, exist_ok=True)
        (tmp_path.joinpath(*parts) / "report.json").write_text("{}")

    finish("warm0")
    finish("warm1")
    for seed in (0, 1, 2):
        finish("warm0", "grpo", f"seed{seed}")
    for seed in (0, 2):
        finish("warm0", "gigpo", f"seed{seed}")
    finish("warm1", "grpo", "seed0")
    finish("warm1", "gigpo", "seed0")
    finish("warm2", "grpo", "seed0")  # a warm start that was never evaluated: left out
    (tmp_path / "warm0" / "gigpo" / "seed1").mkdir()  # stopped mid-run: no report.json
    assert learning.finished_design(tmp_path, ["grpo", "gigpo"], None, None) == {
        "grpo": {0: [0, 1, 2], 1: [0]}, "gigpo": {0: [0, 2], 1: [0]}}
    assert learning.finished_design(tmp_path, ["grpo", "gigpo"], 1, 2) == {"grpo": {0: [0, 1]}, "gigpo": {0: [0]}}
    assert learning.finished_design(tmp_path, ["grpo"], None, None) == {"grpo": {0: [0, 1, 2], 1: [0]}}
    # a warm start where one method has no finished run leaves the table for every method
    finish("warm2")
    assert learning.warm_starts_of(learning.finished_design(tmp_path, ["grpo", "gigpo"], None, None)) == [0, 1]
    assert learning.warm_starts_of(learning.finished_design(tmp_path, ["grpo"], None, None)) == [0, 1, 2]
    assert learning.finished_design(tmp_path, ["stepopsd"], None, None) == {}
    done = subprocess.run([sys.executable, "-m", "benchmarks.learning", "--table-only", "--out",
                           str(tmp_path / "none"), "--quick"],
                          capture_output=True, text=True, timeout=300, cwd=REPO)
    assert done.returncode == 1 and "no warm start under" in done.stderr and "without --table-only" in done.stderr


def test_with_two_or_more_warm_starts_the_interval_is_a_cluster_t_over_them():
    """Warm starts are the clusters: mean +- t(W-1) x sd(per-warm-start means) / sqrt(W), wider than a bootstrap
    that resamples just three warm starts (which cannot show more spread than three values hold)."""
    games = (np.random.default_rng(7).random(50) < 0.3).astype(float)
    shift = np.array([0.0, 0.15, -0.1])  # three warm starts that differ, two seeds each
    tables = [np.clip(np.stack([games, games]) + s, 0, 1) for s in shift]
    mean, low, high = learning.mean_interval(tables, 2000, np.random.default_rng(0))
    means = [t.mean() for t in tables]
    half = 4.303 * np.std(means, ddof=1) / np.sqrt(3)
    assert mean == pytest.approx(np.mean(means)) and (low, high) == pytest.approx((mean - half, mean + half))
    boot = learning.hierarchical_bootstrap(tables, 2000, np.random.default_rng(0))
    assert high - low > 1.2 * (np.percentile(boot, 97.5) - np.percentile(boot, 2.5))
    assert learning.t_975(1) == pytest.approx(12.706) and learning.t_975(11) == learning.t_975(10)
    assert learning.t_975(10_000) == 1.96


def test_runs_needed_uses_the_intervals_variance_model():
    one_run = [np.array([[0.05] * 10])]
    assert learning.runs_needed(one_run, 0.02) is None  # one run: no spread to go on
    # one warm start, five seeds: seeds needed, from the per-seed spread (normal approximation)
    per_seed = np.array([0.0, 0.1, -0.1, 0.05, -0.05])
    one_warm = [np.repeat(per_seed[:, None], 4, axis=1)]
    assert learning.runs_needed(one_warm, 0.02) == int(np.ceil((1.96 * np.std(per_seed, ddof=1) / 0.02) ** 2))
    assert learning.runs_needed(one_warm, 1.0) == 5  # never fewer than were run
    # three warm starts: warm starts needed, the smallest W whose cluster t half-width is within the target
    warm = [np.full((2, 4), v) for v in (0.0, 0.06, -0.03)]
    need = learning.runs_needed(warm, 0.02)
    sd = np.std([0.0, 0.06, -0.03], ddof=1)
    assert learning.t_975(need - 1) * sd / np.sqrt(need) <= 0.02 < learning.t_975(need - 2) * sd / np.sqrt(need - 1)
    _, low, high = learning.mean_interval(warm, 100, np.random.default_rng(0))
    assert (high - low) / 2 > 0.02 and need > 3  # the interval seen is wider than the target: more are needed


def test_wilson_and_step_costs():
    low, high = learning.wilson(13, 200)
    assert (round(100 * low, 1), round(100 * high, 1)) == (3.8, 10.8)  # the demo's figures
    metrics = [{"kind": "train", "time/step_s": s, "time/rollout_s": 1, "time/update_s": 2, "time/scoring_s": 3}
               for s in (10, 30, 20)] + [{"kind": "eval", "time/step_s": 99}]
    costs = learning.step_costs(metrics)
    assert costs["step"] == 20 and costs["teacher"] == 0.0 and costs["update"] == 2
    assert costs["peak_gb"] is None  # runs from before the peak was logged
    metrics[1]["memory/peak_gb"], metrics[2]["memory/peak_gb"] = 7.5, 6.0
    assert learning.step_costs(metrics)["peak_gb"] == 7.5  # the largest an update reached
    assert learning.step_costs(metrics)["peak_phase"] is None  # logged before the phases were
    metrics[1].update({"memory/rollout_peak_gb": 5.0, "memory/scoring_peak_gb": 7.5, "memory/update_peak_gb": 6.0})
    metrics[2].update({"memory/rollout_peak_gb": 6.0, "memory/scoring_peak_gb": 2.0, "memory/update_peak_gb": 3.0})
    assert learning.step_costs(metrics)["peak_phase"] == "scoring"  # the phase of the largest update's peak


def _die(fields: dict, progress: bool) -> float:
    """A run whose process is killed (as the kernel's OOM killer does) instead of returning."""
    import os

    os._exit(9)


def test_a_run_whose_process_dies_stops_the_benchmark_with_a_message_that_says_how_to_resume():
    with pytest.raises(SystemExit) as stopped:
        learning.run_jobs({("grpo", 0, 0): {}, ("gigpo", 0, 0): {}}, jobs=2, progress=False, run=_die)
    message = str(stopped.value.code)
    assert "died" in message and "run the same command again to resume" in message


def test_warm_only_trains_and_scores_the_warm_start_and_runs_no_rl(tmp_path):
    def warm_only(out, *extra):
        return subprocess.run(
            [sys.executable, "-m", "benchmarks.learning", "--model", "tiny", "--quick", "--warm-only",
             "--out", str(out), "--jobs", "1", *extra,
             "--train-games", "20", "--eval-games", "3", "--sft-episodes", "8", "--sft-epochs", "1", "--max-turns",
             "4", "--tiny-hidden", "32", "--tiny-layers", "1", "--vocab-size", "300", "--no-progress"],
            capture_output=True, text=True, timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1"}, cwd=REPO)

    out, ledger = tmp_path / "learning", tmp_path / "ledger.jsonl"
    done = warm_only(out, "--ledger", str(ledger))
    assert done.returncode == 0, done.stderr[-2000:]
    assert "warm start 0: held-out" in done.stdout and "/3 = " in done.stdout
    assert (out / "warm0" / "report.json").is_file() and (out / "warm0" / "model" / "config.json").is_file()
    assert not any((out / "warm0" / m).exists() for m in learning.DEFAULT_METHODS)
    assert not (out / "learning.txt").exists()
    # the ledger's premise: the same warm start trained again (same seed, CPU and threads) has the same weights
    (record,) = [json.loads(line) for line in ledger.read_text().splitlines()]
    assert record["warm"] == 0 and record["threads"] == 1 and len(record["outcomes"]) == 3
    again = warm_only(tmp_path / "again")
    assert again.returncode == 0, again.stderr[-2000:]
    assert learning.weights_sha256(tmp_path / "again" / "warm0" / "model") == record["weights_sha256"]


def _finished_out(monkeypatch, out, weights: bytes, runs: dict, start: list[int], outcomes: dict) -> None:
    """An OUT holding warm start 0 (its weights `weights`) and GRPO runs {seed: outcomes}, as finished runs leave
    them; `outcomes` (path -> per-game success) is what `final_outcomes` reads back."""
    (out / "warm0" / "model").mkdir(parents=True)
    (out / "warm0" / "model" / "model.safetensors").write_bytes(weights)
    (out / "warm0" / "report.json").write_text("{}")
    (out / "warm0" / "config.json").write_text('{"cpu_threads": 1}')
    outcomes[str(out / "warm0")] = start
    for seed, run in runs.items():
        run_dir = learning.rl_run_dir(out, 0, "grpo", seed)
        run_dir.mkdir(parents=True)
        (run_dir / "report.json").write_text('{"steps": 3}')
        outcomes[str(run_dir)] = run
    monkeypatch.setattr(learning, "final_outcomes", lambda path, step: outcomes[str(path)])
    monkeypatch.setattr(learning, "read_jsonl", lambda path: [
        {"kind": "train", "time/step_s": 10.0, "time/rollout_s": 5.0, "time/update_s": 4.0}])


def _fake_runs(monkeypatch, tmp_path, start, runs):
    """An OUT with warm start 0 and GRPO seeds 0..len(runs)-1 finished, held-out outcomes as given."""
    _finished_out(monkeypatch, tmp_path, b"weights", dict(enumerate(runs)), start, {})
    args = learning.parse_args(["--out", str(tmp_path), "--bootstrap", "500"])
    return learning.analyse(args, tmp_path, ["grpo"], {"grpo": {0: list(range(len(runs)))}}, {})

def test_the_gain_over_the_warm_start_is_paired_game_by_game(monkeypatch, tmp_path):
    start = [1, 1, 0, 0, 0, 0, 0, 0, 0, 0]
    gained = _fake_runs(monkeypatch, tmp_path / "a", start, [[1, 1, 1, 1, 0, 0, 0, 0, 0, 0],
                                                             [1, 0, 1, 0, 0, 0, 0, 0, 0, 0]])["results"]["grpo"]
    assert gained["vs_start"]["difference"] == pytest.approx(0.1)
    assert gained["vs_start"]["per_run"] == pytest.approx([0.2, 0.0])
    low, high = gained["vs_start"]["interval"]
    assert low <= 0.1 <= high and high > low
    # a run that wins exactly the warm start's games gains 0 with no spread: the pairing removes the
    # games' own variance, which an unpaired interval (success after RL alone) still has
    level = _fake_runs(monkeypatch, tmp_path / "b", start, [start, start])["results"]["grpo"]
    assert level["vs_start"]["interval"] == [0.0, 0.0]
    assert level["interval"][1] > level["interval"][0]


def test_warm_starts_that_wrap_past_the_panel_are_named_with_the_fix():
    # 400 SFT games each on a 1,000-game panel: warm starts 0 and 1 are disjoint, warm start 2 wraps onto 0
    assert learning.shared_sft_games(2, 400, 1000) == []
    assert learning.shared_sft_games(3, 400, 1000) == [(0, 2, 200)]
    assert learning.shared_sft_games(3, 333, 1000) == []
    assert learning.shared_sft_games(4, 400, 1000) == [(0, 2, 200), (0, 3, 200), (1, 3, 200)]
    note = learning.shared_sft_note(3, 400, 1000)
    assert "0 and 2 share 200" in note and "--train-games >= 1200" in note and "--sft-episodes <= 333" in note
    assert learning.shared_sft_note(2, 400, 1000) is None


def test_a_method_keeps_its_extra_seeds_and_is_paired_to_grpo_on_the_seeds_both_ran(monkeypatch, tmp_path):
    # two warm starts; GRPO ran seeds 0-1 from each, GiGPO seed 0 only
    start = {0: [0, 0, 0, 0], 1: [1, 1, 0, 0]}
    runs = {("grpo", 0, 0): [1, 0, 0, 0], ("grpo", 0, 1): [1, 1, 1, 0],
            ("grpo", 1, 0): [1, 1, 1, 0], ("grpo", 1, 1): [1, 1, 1, 1],
            ("gigpo", 0, 0): [1, 1, 0, 0], ("gigpo", 1, 0): [1, 1, 1, 1]}
    outcomes = {str(tmp_path / f"warm{w}"): v for w, v in start.items()}
    for (m, w, s), v in runs.items():
        run_dir = learning.rl_run_dir(tmp_path, w, m, s)
        run_dir.mkdir(parents=True)
        (run_dir / "report.json").write_text('{"steps": 3}')
        outcomes[str(run_dir)] = v
    for w in start:
        (tmp_path / f"warm{w}" / "report.json").write_text("{}")
    monkeypatch.setattr(learning, "final_outcomes", lambda path, step: outcomes[str(path)])
    monkeypatch.setattr(learning, "read_jsonl", lambda path: [
        {"kind": "train", "time/step_s": 10.0, "time/rollout_s": 5.0, "time/update_s": 4.0}])
    args = learning.parse_args(["--out", str(tmp_path), "--bootstrap", "200"])
    design = learning.finished_design(tmp_path, ["grpo", "gigpo"], None, None)
    assert design == {"grpo": {0: [0, 1], 1: [0, 1]}, "gigpo": {0: [0], 1: [0]}}
    figures = learning.analyse(args, tmp_path, ["grpo", "gigpo"], design, {})
    grpo, gigpo = figures["results"]["grpo"], figures["results"]["gigpo"]
    # GRPO's own figures use all four runs: warm start 0 (0.25 + 0.75) / 2, warm start 1 (0.75 + 1) / 2
    assert grpo["success"] == pytest.approx((0.5 + 0.875) / 2)
    assert grpo["per_run"] == [[0.25, 0.75], [0.75, 1.0]]
    # against GRPO, GiGPO is paired on seed 0 only: +0.25 on both warm starts, so no spread
    assert gigpo["vs_grpo"]["per_run"] == pytest.approx([0.25, 0.25])
    assert gigpo["vs_grpo"]["difference"] == pytest.approx(0.25)
    assert gigpo["vs_grpo"]["interval"] == pytest.approx([0.25, 0.25])
    assert gigpo["vs_grpo"]["paired_runs"] == {"0": [0], "1": [0]}
    lines = learning.table_lines(args, ["grpo", "gigpo"], design, figures, "panel")
    assert "2 warm start(s); seeds per warm start: grpo 2+2, gigpo 1+1" in lines[0]
    assert any("paired on the seeds both methods ran" in line for line in lines)
    # where every method ran the same seeds the header says so in one count
    same = {"grpo": {0: [0], 1: [0]}, "gigpo": {0: [0], 1: [0]}}
    lines = learning.table_lines(args, ["grpo", "gigpo"], same,
                                 learning.analyse(args, tmp_path, ["grpo", "gigpo"], same, {}), "panel")
    assert "2 warm start(s) x 1 seed(s)" in lines[0]
    assert not any("paired on the seeds both methods ran" in line for line in lines)
    # one seed per warm start: the cluster t's spread holds seed variance too; it is not "game sampling only"
    caption = next(line for line in lines if line.startswith("After RL"))
    assert "cluster t" in caption and "game sampling only" not in caption
    assert "seed variance too" in caption
    one = {"grpo": {0: [0]}, "gigpo": {0: [0]}}
    caption = next(line for line in learning.table_lines(
        args, ["grpo", "gigpo"], one, learning.analyse(args, tmp_path, ["grpo", "gigpo"], one, {}), "panel")
        if line.startswith("After RL"))
    assert "game sampling only" in caption and "cluster t" not in caption


def test_the_ledger_carries_finished_runs_into_a_new_checkout(monkeypatch, tmp_path, capsys):
    """Runs recorded in the ledger count as finished where their folders are gone: the next invocation runs
    only what is missing, the table reads them back, and a retrained warm start with other weights stops it."""
    rng = np.random.default_rng(1)
    start = [int(x) for x in rng.random(50) < 0.2]
    runs = {0: [int(x) for x in rng.random(50) < 0.3], 1: [int(x) for x in rng.random(50) < 0.35]}
    outcomes: dict = {}
    old = tmp_path / "old-checkout"
    _finished_out(monkeypatch, old, b"warm start weights", runs, start, outcomes)
    argv = ["--methods", "grpo", "--bootstrap", "200"]
    args = learning.parse_args([*argv, "--out", str(old)])
    settings = learning.ledger_settings(args, list(range(50)))
    path = tmp_path / "ledger.jsonl"
    ledger = learning.RunLedger(path, settings)
    assert learning.record_finished(ledger, old, ["grpo"]) == 3
    assert learning.record_finished(ledger, old, ["grpo"]) == 0  # recorded once
    before = learning.analyse(args, old, ["grpo"], learning.finished_design(old, ["grpo"], None, None), {})

    new = tmp_path / "new-checkout"
    new.mkdir()
    reread = learning.RunLedger(path, settings)
    design = learning.finished_design(new, ["grpo"], None, None, reread)
    assert design == {"grpo": {0: [0, 1]}}
    after = learning.analyse(args, new, ["grpo"], design, {}, reread)
    assert after["results"]["grpo"]["vs_start"] == before["results"]["grpo"]["vs_start"]
    assert after["results"]["grpo"]["step_seconds"]["step"] == 10.0
    # a third seed: only it runs, and the warm start it needs is trained again; with two seeds nothing runs
    started = {}
    monkeypatch.setattr(learning, "run_jobs", lambda todo, *a, **k: started.update(todo) or {})
    learning.run_rl(learning.parse_args([*argv, "--seeds", "3", "--out", str(new)]), new, ["grpo"], {}, reread)
    assert list(started) == [("grpo", 0, 2)]
    started.clear()
    learning.run_warm_starts(learning.parse_args([*argv, "--seeds", "3", "--out", str(new)]), new, {}, ["grpo"],
                             reread)
    assert list(started) == [("warm start", 0)]
    started.clear()
    _, starts = learning.run_warm_starts(learning.parse_args([*argv, "--seeds", "2", "--out", str(new)]), new, {},
                                         ["grpo"], reread)
    assert started == {} and starts == {0: start}
    # another design (another learning rate) shares nothing with these records
    other = learning.RunLedger(path, learning.ledger_settings(learning.parse_args([*argv, "--lr", "1e-4"]),
                                                              list(range(50))))
    assert other.records == [] and other.other_designs == 3
    # a warm start retrained to other weights (another CPU, another thread count) cannot take new runs
    _finished_out(monkeypatch, new, b"other weights", {}, start, outcomes)
    with pytest.raises(learning.LedgerMismatch, match="Train it where the ledger's was"):
        learning.record_finished(reread, new, ["grpo"])


def test_the_table_reads_a_ledger_alone(monkeypatch, tmp_path, capsys):
    """`--table-only --ledger` in a checkout with no runs prints the ledger's table, its figures the runs', also on
    a machine with another CPU (which names the runs' CPU); there, runs to do do not count the other CPU's."""
    rng = np.random.default_rng(2)
    start = [int(x) for x in rng.random(50) < 0.2]
    runs = {0: [int(x) for x in rng.random(50) < 0.4], 1: [int(x) for x in rng.random(50) < 0.4]}
    old = tmp_path / "old"
    _finished_out(monkeypatch, old, b"weights", runs, start, {})
    argv = ["--methods", "grpo", "--bootstrap", "200", "--table-only", "--ledger", str(tmp_path / "ledger.jsonl")]
    ledger = learning.RunLedger(tmp_path / "ledger.jsonl",
                                learning.ledger_settings(learning.parse_args(argv), list(range(50)), "Other CPU x 64"))
    learning.record_finished(ledger, old, ["grpo"])
    training = learning.parse_args([a for a in argv if a != "--table-only"])
    assert learning.open_ledger(training, list(range(50))).records == []  # not this CPU's runs
    assert learning.main([*argv, "--out", str(tmp_path / "empty")]) == 0
    table = capsys.readouterr().out
    assert "the table is of those on Other CPU x 64" in table
    mean = 100 * np.mean([runs[0], runs[1]])
    assert f"warm start: {100 * np.mean(start):.1f}%" in table
    assert f"{'grpo':<10} {mean:>8.1f}%" in table
    assert "ledger" in table and "1 warm start(s) and 2 run(s) of this design" in table
    # the results page names the runs' CPU and threads, not this machine's
    tabled = learning.parse_args([*argv, "--threads", "3"])
    found = learning.open_ledger(tabled, list(range(50)))
    assert learning.measured_on(tabled, found) == {"cpu": "Other CPU x 64", "threads": "1"}  # warm start's config
    assert learning.measured_on(training, learning.open_ledger(training, list(range(50)))) == {
        "threads": learning.threads_per_run(training)}  # an invocation that trains: its own


def test_two_invocations_sharing_a_ledger_keep_each_others_records(tmp_path):
    """Each holds the file as it read it at start; a record added by one is not lost when the other writes."""
    path, settings = tmp_path / "ledger.jsonl", {"lr": 2e-5}
    first, second = learning.RunLedger(path, settings), learning.RunLedger(path, settings)
    first.add({"warm": 0, "outcomes": "01", "weights_sha256": "a"})
    second.add({"warm": 1, "outcomes": "11", "weights_sha256": "b"})
    second.add({"warm": 0, "outcomes": "01", "weights_sha256": "a"})  # both recorded warm start 0: kept once
    first.add({"warm": 0, "method": "grpo", "seed": 0, "outcomes": "10", "costs": {}})
    assert sorted((r["warm"], r.get("method", "")) for r in learning.RunLedger(path, settings).records) == [
        (0, ""), (0, "grpo"), (1, "")]


def test_a_ledger_that_is_not_one_is_a_usage_error(tmp_path, capsys):
    junk = tmp_path / "ledger.jsonl"
    junk.write_text("not json\n")
    assert learning.main(["--table-only", "--ledger", str(junk), "--out", str(tmp_path / "out")]) == 2
    assert "cannot be read" in capsys.readouterr().err
    assert junk.read_text() == "not json\n"  # left as it was


def test_a_resumed_runs_ledger_seconds_are_the_whole_runs(monkeypatch, tmp_path):
    """A run resumed after update 2 is recorded with every update's and evaluation's seconds, not only those of
    the invocation that finished it; a warm start keeps the invocation's wall seconds."""
    from agentgym_opsd.io import read_jsonl
    _finished_out(monkeypatch, tmp_path, b"weights", {0: [1, 0]}, [0, 0], {})
    monkeypatch.setattr(learning, "read_jsonl", read_jsonl)
    first = [{"kind": "train", "step": s, "time/step_s": 100.0} for s in (1, 2)]  # before the resume
    second = [{"kind": "train", "step": 3, "time/step_s": 80.0}, {"kind": "eval", "step": 3, "eval/seconds": 30.0}]
    run_dir = learning.rl_run_dir(tmp_path, 0, "grpo", 0)
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in first + second))
    assert learning.run_seconds(first + second) == 310.0
    assert learning.run_seconds([{"kind": "sft", "loss": 1.0}]) is None
    ledger = learning.RunLedger(tmp_path / "ledger.jsonl", {"lr": 2e-5})
    learning.record_finished(ledger, tmp_path, ["grpo"], seconds={("grpo", 0, 0): 95.0, ("warm start", 0): 40.0})
    by_kind = {r.get("method", "warm"): r["seconds"] for r in ledger.records}
    assert by_kind == {"grpo": 310.0, "warm": 40.0}
