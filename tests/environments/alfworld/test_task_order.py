"""The task order of a multi-type ALFWorld id: any run of consecutive tasks mixes the types in proportion."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from environments.alfworld.data import GameEntry
from environments.alfworld.env import interleave_task_types
from environments.alfworld.expert import TASK_TYPES


def _games(counts: dict[str, int]) -> list[GameEntry]:
    """Games in task-id order, as `discover_games` gives them: each type's games in one block."""
    return [GameEntry(f"train/{t}-{i:03d}/trial", Path("game.tw-pddl"), t) for t in sorted(counts)
            for i in range(counts[t])]


def test_equal_types_are_a_round_robin_and_every_window_is_balanced() -> None:
    games = interleave_task_types(_games({t: 10 for t in TASK_TYPES}))
    assert [g.task_type for g in games[:6]] == list(TASK_TYPES)
    n = len(games)
    for start in range(n):  # any 12 consecutive tasks, wrapping around (seeds start..start+11)
        window = Counter(games[(start + k) % n].task_type for k in range(12))
        assert set(window.values()) == {2}, (start, window)
    # Within a type the task-id order is kept, and no game is lost or repeated.
    assert sorted(g.task_id for g in games) == sorted(g.task_id for g in _games({t: 10 for t in TASK_TYPES}))
    for t in TASK_TYPES:
        ids = [g.task_id for g in games if g.task_type == t]
        assert ids == sorted(ids)


def test_a_skewed_mix_keeps_its_proportions_in_every_prefix() -> None:
    counts = {"pick_and_place_simple": 79, "look_at_obj_in_light": 31, "pick_two_obj_and_place": 81,
              "pick_heat_then_place_in_recep": 46}
    games = interleave_task_types(_games(counts))
    total = sum(counts.values())
    for k in range(1, total + 1):
        seen = Counter(g.task_type for g in games[:k])
        for t, n in counts.items():
            assert abs(seen[t] - k * n / total) <= 1.0, (k, t, seen[t], k * n / total)


def test_alfworld_all_plays_every_type_in_its_first_episodes(make_env) -> None:
    env = make_env(split="train")  # the test panel: 2 train games per type
    try:
        assert env.num_tasks == 12
        first = [env.reset(seed=s)[1]["step"].task_type for s in range(6)]
        assert sorted(first) == sorted(["pick", "look", "clean", "heat", "cool", "picktwo"])
        later = Counter(env.reset(seed=100 + s)[1]["step"].task_type for s in range(12))
        assert set(later.values()) == {2}
    finally:
        env.close()
