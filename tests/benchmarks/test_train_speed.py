"""benchmarks.train_speed: its arguments (bad ones are one usage line), and the helpers its table and
recommendation rest on: the speed ratios, the turn exact-match count, the paired NLL difference and the
choice of the fastest at equal quality."""

from __future__ import annotations


import numpy as np
import pytest
import torch

from benchmarks import train_speed


def test_bad_arguments_are_usage_errors(usage_errors):
    usage_errors("train_speed", (
        (["--rounds", "0"], "--rounds must be >= 1"), (["--episodes", "1"], "--episodes must be >= 2"),
        (["--choices", "full,top-3"], "--choices 'full,top-3'"), (["--choices", ","], "--choices"),
        (["--precisions", "fp16"], "--precisions 'fp16'"), (["--rates", "3"], "invalid choice"),
        (["--batch-tokens", "10"], "--batch-tokens must be >= 256"), (["--held-out", "-1"], "--held-out must be >= 1")))


def test_quick_sizes_and_explicit_numbers():
    quick = train_speed.parse_args(["--quick"])
    assert (quick.episodes, quick.rounds, quick.quality_episodes, quick.held_out) == (4, 2, 24, 8)
    full = train_speed.parse_args([])
    assert (full.episodes, full.rounds, full.quality_episodes, full.held_out) == (12, 2, 120, 40)
    mixed = train_speed.parse_args(["--quick", "--rounds", "5", "--held-out", "3"])
    assert (mixed.episodes, mixed.rounds, mixed.held_out) == (4, 5, 3)


def test_choices_always_start_with_the_full_fine_tune_baseline():
    args = train_speed.parse_args(["--choices", "lora16-top8, top-4"])
    assert args.choices == ["full", "top-4", "lora16-top8"]  # the baseline first, then the table's order
    assert train_speed.parse_args([]).choices == list(train_speed.CHOICES)


def test_speed_table_ratios_are_the_baseline_time_over_each_cases():
    samples = {"full": [{"cpu_s": 12.0, "wall_s": 20.0}, {"cpu_s": 10.0, "wall_s": 30.0},
                        {"cpu_s": 11.0, "wall_s": 25.0}],
               "top-4": [{"cpu_s": 4.0, "wall_s": 5.0}, {"cpu_s": 6.0, "wall_s": 9.0}]}
    summary = {case: train_speed.summarize_times(s, tokens=1000) for case, s in samples.items()}
    assert summary["full"]["cpu_s_min"] == 10.0 and summary["full"]["cpu_s_median"] == 11.0
    assert summary["full"]["wall_s_min"] == 20.0
    assert summary["full"]["tok_s_min_time"] == pytest.approx(100.0)
    assert summary["top-4"]["tok_s_median"] == pytest.approx(200.0)
    table = {r["case"]: r for r in train_speed.speed_table(summary, "full")}
    assert table["full"]["x_baseline"] == pytest.approx(1.0)
    assert table["top-4"]["x_baseline"] == pytest.approx(2.5)
    with pytest.raises(KeyError, match="baseline"):
        train_speed.speed_table(summary, "lora16-all")


def test_a_turn_matches_only_when_every_target_token_is_the_argmax():
    # two rows; row 0 has turns 0 and 1, row 1 has turn 0 (a turn of another row: counted apart)
    turn_id = torch.tensor([[-1, 0, 0, 0, -1, 1, 1, -1],
                            [-1, -1, 0, 0, 0, -1, -1, -1]])
    target = turn_id >= 0
    target[0, 6] = False  # a token left out of the targets (a detour's, say): its miss does not count
    hit = torch.tensor([[False, True, True, True, True, True, False, False],
                        [True, False, True, False, True, False, False, False]])
    assert train_speed.turn_exact_match(hit, turn_id, target) == (2, 3)
    hit[1, 3] = True
    assert train_speed.turn_exact_match(hit, turn_id, target) == (3, 3)
    hit[0, 2] = False
    assert train_speed.turn_exact_match(hit, turn_id, target) == (2, 3)
    none = torch.zeros_like(target)
    assert train_speed.turn_exact_match(hit, turn_id, none) == (0, 0)


def test_paired_nll_difference_is_per_token_and_its_interval_holds_it():
    count = [10, 30, 20, 40]
    b = [5.0, 12.0, 9.0, 20.0]
    a = [x + 0.1 * n for x, n in zip(b, count, strict=True)]  # 0.1 nats worse on every token
    d, low, high = train_speed.paired_nll_difference(a, count, b, draws=500)
    assert d == pytest.approx(0.1) and low == pytest.approx(0.1) and high == pytest.approx(0.1)
    rng = np.random.default_rng(1)
    noisy = [x + n * (0.05 + 0.2 * rng.standard_normal()) for x, n in zip(b, count, strict=True)]
    d, low, high = train_speed.paired_nll_difference(noisy, count, b, draws=500)
    assert low < d < high
    assert d == pytest.approx((sum(noisy) - sum(b)) / sum(count))
    with pytest.raises(ValueError):
        train_speed.paired_nll_difference([1.0], [1, 2], [1.0, 2.0])


def test_the_recommendation_is_the_fastest_of_equal_quality():
    assert train_speed.equal_quality(best_nll=0.5, low=0.009)  # within 2% of 0.5
    assert not train_speed.equal_quality(best_nll=0.5, low=0.011)
    speed = {"full": 100.0, "top-8": 40.0, "top-4": 30.0, "lora16-top8": 35.0}
    quality = {"full": True, "top-8": True, "top-4": False, "lora16-top8": True}
    assert train_speed.recommend(speed, quality) == "lora16-top8"  # top-4 is faster but worse
    assert train_speed.recommend(speed, dict.fromkeys(speed, False)) is None
