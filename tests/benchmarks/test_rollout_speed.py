"""benchmarks/rollout_speed.py: its usage errors and how a round's measurements become its figures."""

from __future__ import annotations

import pytest

from benchmarks import rollout_speed


def test_bad_arguments_are_usage_errors(tmp_path, usage_errors):
    usage_errors("rollout_speed", ((["--episodes", "6"], "must be a positive multiple of 4"),
                                   (["--episodes", "0"], "must be a positive multiple of 4"),
                                   (["--threads", "0"], "--threads and --rounds must be >= 1"),
                                   (["--model", str(tmp_path)], "no config.json")))


def run(wall: float, tokens: int, cpu: float, replay: dict, **extra) -> dict:
    return {"wall_s": wall, "new_tokens": tokens, "tokens_per_s": tokens / wall, "cpu_s": cpu,
            "tokens_per_cpu_s": tokens / cpu, "replay_s": replay, "stock_step_ms": 9.0, "slot_step_ms": 3.0,
            "prefill_tokens_per_s": 900.0, **extra}


def test_share_is_the_replays_forward_time_over_the_rollouts_wall_and_speedups_pair_rounds():
    runs = [run(100.0, 2000, 90.0, {"prefill": 20.0, "decode": 40.0}),
            run(80.0, 2000, 75.0, {"prefill": 20.0, "decode": 28.0})]
    baseline = [{"tokens_per_s": 5.0, "tokens_per_cpu_s": 8.0}, {"tokens_per_s": 4.0, "tokens_per_cpu_s": 10.0}]
    out = rollout_speed.summarize(runs, baseline)
    assert out["share"]["min"] == pytest.approx(0.6) and out["share"]["median"] == pytest.approx(0.6)
    assert out["ceiling_tokens_per_s"]["min"] == pytest.approx(2000 / 60)
    assert out["ceiling_tokens_per_s"]["median"] == pytest.approx((2000 / 60 + 2000 / 48) / 2)
    # round 1 against round 1 of the baseline, round 2 against round 2 (each pair ran on the same load)
    assert out["speedup"]["min"] == pytest.approx(4.0) and out["speedup"]["median"] == pytest.approx((4.0 + 6.25) / 2)
    assert out["cpu_speedup"]["min"] == pytest.approx(2000 / 75 / 10)


def test_an_old_baseline_without_cpu_seconds_gives_no_cpu_speedup():
    out = rollout_speed.summarize([run(50.0, 1000, 40.0, {"prefill": 10.0, "decode": 20.0})], [{"tokens_per_s": 5.0}])
    assert out["speedup"]["min"] == pytest.approx(4.0) and "cpu_speedup" not in out
