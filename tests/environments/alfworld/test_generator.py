"""The embedded game set: reproducible, faithful to ALFRED's rooms and splits, solvable, cached."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from environments.alfworld.data import discover_games, read_traj_data
from environments.alfworld.engine import AlfredEngine, compile_game
from environments.alfworld.expert import TASK_TYPES, TaskSpec, World
from environments.alfworld.generator import ROOMS, draft_game, game_rng, generate_game, load_layout, scenes_for
from environments.alfworld.panel import PanelSpec, ensure_panel, panel_dir, read_manifest
from environments.alfworld.paths import import_alfworld


@pytest.fixture(scope="module")
def engine():
    e = AlfredEngine()
    yield e
    e.close()


def test_same_arguments_same_game_other_seed_other_game(engine) -> None:
    a, wa = generate_game(0, "small", "train", "pick_cool_then_place_in_recep", 3, engine)
    b, wb = generate_game(0, "small", "train", "pick_cool_then_place_in_recep", 3, engine)
    c, _ = generate_game(1, "small", "train", "pick_cool_then_place_in_recep", 3, engine)
    assert a.problem == b.problem and a.task_desc == b.task_desc and wa == wb and a.trial == b.trial
    assert c.problem != a.problem


def test_splits_use_alfreds_scenes_and_valid_room_kinds() -> None:
    constants = import_alfworld("alfworld.gen.constants")
    for task_type in TASK_TYPES:
        train, unseen = scenes_for("train", task_type), scenes_for("valid_unseen", task_type)
        assert train and unseen
        assert set(train) <= set(constants.TRAIN_SCENE_NUMBERS)
        assert set(unseen) <= set(constants.TEST_SCENE_NUMBERS)
        assert scenes_for("valid_seen", task_type) == train
        kinds = {load_layout(s).kind for s in train + unseen}
        assert kinds <= constants.GOALS_VALID[task_type]
    assert {load_layout(s).kind for s in scenes_for("train", "pick_heat_then_place_in_recep")} == {"Kitchen"}
    with pytest.raises(ValueError, match="unknown split"):
        scenes_for("test", "pick_and_place_simple")


@pytest.mark.parametrize("task_type", TASK_TYPES)
def test_every_type_starts_unsolved_and_the_walkthrough_wins(task_type: str, engine) -> None:
    draft, walkthrough = generate_game(7, "full", "valid_unseen", task_type, 0, engine)
    layout = load_layout(draft.scene)
    game = compile_game(draft.game_data())
    engine.load(game)
    intro = engine.reset()
    assert not engine.won
    assert intro.startswith("-= Welcome to TextWorld, ALFRED! =-\n\nYou are in the middle of a room.")
    assert intro.endswith(f"Your task is to: {draft.task_desc}.")
    # the room is the floor plan's: its listed receptacles keep their ALFRED ids
    listed = {rid.split("|")[0].lower() for rid in layout.receptacles}
    world = World.from_facts(engine.facts.facts, game.names)
    assert len(world.recep_loc) <= ROOMS["full"].max_receptacles
    assert {r.split("_bar_")[0] for r in world.recep_loc} & listed
    # no target starts inside a goal receptacle
    spec = TaskSpec.from_pddl_params(task_type, draft.params)
    for obj, recep in world.in_recep.items():
        if world.obj_type[obj] == spec.object_type and spec.parent_type:
            assert world.recep_type[recep] != spec.parent_type
    for command in walkthrough:
        assert command in engine.admissible_commands
        engine.step(command)
    assert engine.won


def test_small_rooms_are_small(engine) -> None:
    for task_type in TASK_TYPES:
        draft, walkthrough = generate_game(0, "small", "train", task_type, 1, engine)
        world = World.from_facts(compile_game(draft.game_data()).init_facts, {})
        assert len(world.recep_loc) <= ROOMS["small"].max_receptacles
        assert len({t for t in world.obj_type.values()}) <= ROOMS["small"].max_distractor_classes + 2  # + target, lamp
        assert len(walkthrough) <= 12


def test_drafts_never_crash_and_mostly_succeed() -> None:
    made = 0
    for k in range(60):
        task_type = TASK_TYPES[k % 6]
        draft = draft_game("train", task_type, game_rng(3, "full", "train", task_type, k, 0), ROOMS["full"])
        made += draft is not None
    assert made >= 45


def test_panel_splits_are_built_once_on_first_use_in_alfworld_layout(tmp_path: Path) -> None:
    spec = PanelSpec.make(seed=5, room="small", sizes={"train": 1, "valid_seen": 0, "valid_unseen": 1})
    folder = ensure_panel(spec, tmp_path, splits=("train",), progress=False)
    assert folder == panel_dir(spec, tmp_path) and folder.name == "g1-5-small-n1-0-1"
    assert read_manifest(folder, "train") is not None
    assert read_manifest(folder, "valid_unseen") is None  # not needed yet, not generated
    assert ensure_panel(spec, tmp_path, progress=False) == folder
    root = folder / "json_2.1.1"
    for split, n in (("train", 6), ("valid_seen", 0), ("valid_unseen", 6)):
        manifest = read_manifest(folder, split)
        assert manifest["games_per_type"] == n // 6 and manifest["split"] == split
        games = discover_games(root, split)
        assert len(games) == n
        assert sorted(e.task_type for e in games) == (sorted(TASK_TYPES) if n else [])
        for entry in games:
            traj = read_traj_data(entry.folder)
            data = json.loads(entry.game_file.read_text())
            assert data["solvable"] is True and data["walkthrough"]
            assert (entry.folder / "initial_state.pddl").read_text() == data["pddl_problem"]
            assert entry.folder.parent.name.startswith(traj["task_type"] + "-" + traj["pddl_params"]["object_target"])
            assert entry.task_id in manifest["games"][entry.task_type]
    stamp = (folder / "train.json").stat().st_mtime_ns
    assert ensure_panel(spec, tmp_path, progress=False) == folder
    assert (folder / "train.json").stat().st_mtime_ns == stamp  # cached, not generated again
    assert not list(folder.glob(".staging*"))


def test_alfworlds_own_env_plays_the_generated_games(make_env, alfred_tw_env) -> None:
    """The panel is ALFWorld data: AlfredTWEnv loads it, and the stored walkthrough wins its game there."""
    env = make_env(split="valid_unseen")
    root = env.data_root / "valid_unseen"
    env.close()
    tw = alfred_tw_env(root)
    try:
        random.seed(0)
        for _ in range(2):
            _, infos = tw.reset()
            walkthrough = json.loads(Path(infos["extra.gamefile"][0]).read_text())["walkthrough"]
            for command in walkthrough:
                _, _, dones, infos = tw.step([command])
            assert infos["won"][0] and dones[0]
    finally:
        tw.close()
