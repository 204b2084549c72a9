"""The embedded game set: reproducible, faithful to ALFRED's rooms and splits, solvable, cached."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from environments.alfworld.compiled import compile_game
from environments.alfworld.data import discover_games, read_traj_data
from environments.alfworld.engine import AlfredEngine
from environments.alfworld.expert import TASK_TYPES, TaskSpec, World
from environments.alfworld.generator import (
    room_settings,
    GENERATOR_VERSION,
    LAMP_HOLDERS,
    ROOMS,
    _alfred,
    _receptacle_class,
    draft_game,
    game_rng,
    generate_game,
    load_layout,
    mangle,
    scenes_for,
)
from environments.alfworld.panel import (
    ALFWORLD_TRAIN_COUNTS,
    PanelSpec,
    _jobs,
    ensure_panel,
    mixed_counts,
    panel_dir,
    read_manifest,
)
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
    assert folder == panel_dir(spec, tmp_path) and folder.name == f"{GENERATOR_VERSION}-5-small-n1-0-1"
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


def _static_receptacle_ids(scene: int) -> set[str]:
    static = _alfred()["static_receptacles"]
    return {mangle(rid).lower() for rid in load_layout(scene).receptacles if _receptacle_class(rid) in static}


def test_full_rooms_keep_every_receptacle_of_the_layout() -> None:
    """`full` keeps every receptacle the floor plan lists (some list more than 20); a cap is an option."""
    big = [s for s in scenes_for("train", "pick_and_place_simple") if len(_static_receptacle_ids(s)) > 20]
    assert big  # ALFRED's floor plans do have rooms with more than 20 receptacles
    for k, scene in enumerate(big[:6]):
        rng = game_rng(0, "full", "train", "pick_and_place_simple", k, 0)
        draft = draft_game("train", "pick_and_place_simple", rng, ROOMS["full"], scenes=[scene])
        if draft is None:
            continue
        problem = draft.problem.lower()
        missing = [r for r in _static_receptacle_ids(scene) if f"{r} - receptacle" not in problem]
        assert not missing, f"FloorPlan{scene}: {len(missing)} receptacles dropped"
    capped = draft_game("train", "pick_and_place_simple",
                        game_rng(0, "full-r20", "train", "pick_and_place_simple", 0, 0),
                        room_settings("full", 20)[1], scenes=[big[0]])  # fmt: skip
    assert capped is not None
    assert sum(1 for line in capped.problem.splitlines() if line.strip().endswith(" - receptacle")
               and "?" not in line) == 20


def test_lamps_stand_where_alfreds_scenes_put_them() -> None:
    """Desk and floor lamps on desks, side tables and dressers; never on beds, sofas, armchairs, ottomans."""
    holders = []
    for k in range(40):
        split = "valid_unseen" if k % 2 else "train"
        draft = draft_game(split, "look_at_obj_in_light", game_rng(9, "full", split, "look_at_obj_in_light", k, 0),
                           ROOMS["full"])
        if draft is None:
            continue
        lamp = draft.params["toggle_target"]
        for line in draft.problem.splitlines():
            line = line.strip()
            if line.startswith(f"(inReceptacle {lamp}_bar_"):
                holders.append(line.split()[2].split("_bar_")[0])
    assert len(holders) >= 20
    assert set(holders) <= {"Desk", "SideTable", "Dresser"}, sorted(set(holders))
    assert set(LAMP_HOLDERS) == {"Desk", "SideTable", "Dresser"}


def test_alfworld_mix_shares_each_split_out_as_alfworlds_training_set() -> None:
    counts = mixed_counts(120)
    assert sum(counts.values()) == 120
    assert counts == {"pick_and_place_simple": 27, "look_at_obj_in_light": 10, "pick_clean_then_place_in_recep": 22,
                      "pick_heat_then_place_in_recep": 16, "pick_cool_then_place_in_recep": 18,
                      "pick_two_obj_and_place": 27}  # fmt: skip
    for t, n in mixed_counts(3553).items():
        assert n == ALFWORLD_TRAIN_COUNTS[t]
    spec = PanelSpec.make(mix="alfworld")
    uniform = PanelSpec.make()
    assert spec.name != uniform.name and spec.name.endswith("mixalfworld")  # its own cache folder
    jobs = _jobs(spec, ["train", "valid_seen"], Path("/staging"), Path("/cache"))
    by_type = {t: sorted(j[6] for j in jobs if j[4] == "train" and j[5] == t) for t in TASK_TYPES}
    assert {t: len(v) for t, v in by_type.items()} == counts
    assert all(v == list(range(len(v))) for v in by_type.values())  # the k-th game of a type, as in the uniform panel
    assert sum(1 for j in jobs if j[4] == "valid_seen") == 60
    with pytest.raises(ValueError, match="mix="):
        PanelSpec.make(mix="skewed")


def test_mix_is_for_all_six_types(make_env) -> None:
    with pytest.raises(ValueError, match="ALFWorld-All-v0"):
        make_env(task_types="heat", mix="alfworld")


def test_a_panel_of_some_types_holds_the_six_type_panels_games_of_those_types(tmp_path: Path, make_env) -> None:
    """`panel_own_types=True` (PanelSpec.task_types): ALFWorld-Pick at 3 train games per type generates
    3 games, not 18; they are the same files, byte for byte, as the six-type panel's Pick games, and
    the env plays exactly them."""
    sizes = {"train": 3, "valid_seen": 0, "valid_unseen": 0}
    pick = PanelSpec.make(seed=2, room="small", sizes=sizes, task_types=["pick_and_place_simple"])
    full = PanelSpec.make(seed=2, room="small", sizes=sizes)
    assert pick.name == full.name + "-only-pick"
    assert len(_jobs(pick, ["train"], Path("/s"),
                     Path("/c"))) == 3 and len(_jobs(full, ["train"], Path("/s"), Path("/c"))) == 18
    only = ensure_panel(pick, tmp_path, splits=("train",), progress=False) / "json_2.1.1"
    every = ensure_panel(full, tmp_path, splits=("train",), progress=False) / "json_2.1.1"
    assert read_manifest(only.parent, "train")["task_types"] == ["pick_and_place_simple"]
    games = discover_games(only, "train")
    assert sorted(g.task_type for g in games) == ["pick_and_place_simple"] * 3
    full_pick = {g.task_id: g for g in discover_games(every, "train") if g.task_type == "pick_and_place_simple"}
    assert sorted(full_pick) == sorted(g.task_id for g in games)
    for g in games:
        assert g.game_file.read_bytes() == full_pick[g.task_id].game_file.read_bytes()
    env = make_env(task_types="pick", split="train", panel_seed=2, room="small", panel_size=sizes, panel_own_types=True,
                   cache_dir=str(tmp_path))
    try:
        assert env.data_root == only and {g.task_id for g in env.games} == set(full_pick)
    finally:
        env.close()
    with pytest.raises(ValueError, match="task_types"):
        PanelSpec.make(task_types=["pick"])  # the full names
    with pytest.raises(ValueError, match="mix="):
        PanelSpec.make(mix="alfworld", task_types=["pick_and_place_simple"])
    with pytest.raises(ValueError, match="panel_own_types shapes the embedded panel"):
        make_env(source="alfworld", data_dir=str(tmp_path), panel_own_types=True)
