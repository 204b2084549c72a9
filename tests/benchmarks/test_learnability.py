"""benchmarks/learnability.py: its usage errors and the paired before/after statistics."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from benchmarks import learnability
from trainer.recipes import PICK_REAL


def test_bad_arguments_are_usage_errors(tmp_path, usage_errors):
    usage_errors("learnability", ((["--games", "0"], "--games must be >= 1"),
                                  (["--group-size", "1"], "--group-size must be >= 2"),
                                  (["--temperature", "0"], "--temperature must be in (0, 2]"),
                                  (["--games", "5000"], "the training panel has"),
                                  (["--warm", str(tmp_path)], "no model folder there")))


def test_the_update_settings_default_to_the_learning_benchmarks_recipe(tmp_path):
    """Learnability asks whether the budget `benchmarks.learning` trains with lifts the policy, so a bare
    command must run that budget, not a second set of numbers."""
    (tmp_path / "config.json").write_text("{}")
    args = learnability.parse_args(["--warm", str(tmp_path)])
    ran = {name: getattr(args, name) for name in ("lr", "mini_batches", "ppo_epochs", "temperature", "group_size",
                                                  "kl_coef", "invalid_coef")}
    assert ran == {name: getattr(PICK_REAL, name) for name in ran}


def episodes(outcomes: dict[int, list[int]]) -> list:
    """game -> each episode's success, as the episodes the paired statistics read."""
    return [SimpleNamespace(episode_id=f"g{game}-{i}", group=game, success=bool(won), num_turns=4,
                            invalid_turns=0 if won else 1)
            for game, wins in outcomes.items() for i, won in enumerate(wins)]


def test_paired_change_pairs_episodes_by_id_and_counts_the_discordant_ones():
    before = episodes({0: [0, 0, 0, 0], 1: [1, 0, 0, 0], 2: [1, 1, 0, 0]})
    after = episodes({0: [1, 1, 0, 0], 1: [1, 1, 1, 0], 2: [1, 1, 0, 0]})[::-1]  # order must not matter
    change = learnability.paired_change(before, after)
    assert change["before"] == pytest.approx(3 / 12) and change["after"] == pytest.approx(7 / 12)
    assert change["difference"] == pytest.approx(4 / 12)  # the mean over games of each game's change
    assert (change["gained"], change["lost"], change["episodes"]) == (4, 0, 12)
    assert change["mcnemar_p"] == pytest.approx(2 / 2**4)  # exact: all 4 discordant episodes one way
    low, high = change["interval"]
    assert 0 <= low <= change["difference"] <= high <= 0.5  # games changed by 0, 1/4 and 1/2 of their episodes
    assert change["invalid_before"] == pytest.approx(9 / 48) and change["invalid_after"] == pytest.approx(5 / 48)


def test_no_change_is_a_zero_difference_with_p_one():
    same = episodes({0: [1, 0], 1: [0, 0], 2: [1, 1]})
    change = learnability.paired_change(same, same)
    assert change["difference"] == 0 and change["interval"] == [0.0, 0.0] and change["mcnemar_p"] == 1.0
