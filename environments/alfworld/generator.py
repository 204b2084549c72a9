"""The embedded ALFWorld game set: seeded games over the real ALFRED rooms that the alfworld wheel ships.

ALFWorld's own games (1.4 GB) come from ALFRED: each is a THOR scene with objects placed by ALFRED's
generator, turned into PDDL. The alfworld wheel ships, for each of ALFRED's 120 floor plans
(`alfworld/gen/layouts/FloorPlan<N>-*`), the object classes present in the room, the receptacles an
agent can open or reach with their ALFRED object ids and interaction poses, and the room's reachable
positions. This module builds ALFWorld games from those rooms:

1. Pick a floor plan of a kind the task type is valid for (ALFRED's `GOALS_VALID`: heating happens in
   kitchens, looking at something under a lamp in bedrooms and living rooms, ...), from ALFRED's train
   scenes for `train`/`valid_seen` and its test scenes for `valid_unseen`, as ALFRED splits them.
2. Receptacles: the room's listed receptacles with their real ids and poses (their location is
   ALFRED's `loc|x|z|rotation|horizon` of the pose), plus one or more instances of each receptacle class
   present but not listed (a stove's burners, the toaster), placed at reachable positions.
3. Task: object, receptacle (and lamp) classes valid together: the receptacle can hold the object
   (ALFRED's `VAL_RECEPTACLE_OBJECTS`), the object can be cleaned/heated/cooled (`VAL_ACTION_OBJECTS`),
   the room has the sink basin/microwave/fridge/lamp.
4. Objects: 1-3 instances of each object class of the room (2-4 of the target for pick-two), each
   inside a receptacle that can hold it; targets never start inside a goal receptacle.
5. The PDDL problem in ALFRED's form (mangled ids such as `Potato_bar__plus_01_dot_01_...`), the goal
   from ALFRED's `goal_library`, and a `game.tw-pddl` with the shipped `alfred.pddl` and `alfred.twl2`
   (task sentence from the goal library's templates), plus `traj_data.json` (`task_type`,
   `pddl_params`) that alfworld's hand-coded expert reads.
6. The game is played on the engine by the expert (`expert.plan`): it is kept only if the expert wins
   within `MAX_WALKTHROUGH` commands; the expert's commands are the walkthrough.

Every game is a function of `(GENERATOR_VERSION, seed, room size, split, task type, index, attempt)`:
the same arguments give the same file on every machine.

Room sizes (`room=`): `full` keeps every receptacle and object class of the floor plan (ALFWorld's
rooms: the real game in ../shared/data has 20 receptacles; ALFRED's floor plans list up to 47);
`small` keeps the receptacles the task needs plus random others up to 6, and at most 5 object classes
besides the target: short episodes for fast RL. `max_receptacles=N` caps a `full` room at N
receptacles (what the task needs, then random others).

Lamps (look tasks) stand where ALFRED's scenes put them: a desk lamp or floor lamp on a desk, side
table or dresser of the room (never on a bed, sofa, armchair or ottoman). ALFRED's floor lamps stand
on the floor beside that furniture; here they stand on it, so that the text shows them.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from environments.alfworld.compiled import compile_game
from environments.alfworld.engine import AlfredEngine
from environments.alfworld.expert import TASK_TYPES, ExpertError, TaskSpec, World, plan
from environments.alfworld.grammar import GameFileError
from environments.alfworld.paths import alfworld_package_dir, import_alfworld

__all__ = [
    "GENERATOR_VERSION",
    "ROOMS",
    "RoomSettings",
    "LAMP_HOLDERS",
    "room_settings",
    "GameDraft",
    "draft_game",
    "solve_draft",
    "generate_game",
    "scenes_for",
    "MAX_WALKTHROUGH",
]

# g2: full rooms keep every receptacle (g1 capped them at 20); lamps only on desks, side tables, dressers.
GENERATOR_VERSION = "g2"
MAX_WALKTHROUGH = 40  # the expert must win within this many commands (episodes allow 50 turns)


@dataclass(frozen=True)
class RoomSettings:
    """How much of the floor plan goes into a game (None: all of it)."""

    max_receptacles: int | None = None
    max_distractor_classes: int | None = None
    max_instances: int = 3


ROOMS: dict[str, RoomSettings] = {
    "full": RoomSettings(max_receptacles=None, max_instances=2),
    "small": RoomSettings(max_receptacles=6, max_distractor_classes=5, max_instances=2),
}

# Receptacles a lamp stands on: ALFRED's scenes have desk and floor lamps on (or, floor lamps, beside)
# desks, side tables and dressers; its receptacle lists leave lamps out.
LAMP_HOLDERS = ("Desk", "SideTable", "Dresser")
_LAMPS = ("DeskLamp", "FloorLamp")
# The appliance each treatment needs, and goals the parent receptacle must not be (trivial or odd tasks).
_APPLIANCE = {
    "pick_clean_then_place_in_recep": ("Cleanable", "SinkBasin"),
    "pick_heat_then_place_in_recep": ("Heatable", "Microwave"),
    "pick_cool_then_place_in_recep": ("Coolable", "Fridge"),
}
_NOT_PARENT = {
    "pick_clean_then_place_in_recep": {"SinkBasin", "BathtubBasin"},
    "pick_heat_then_place_in_recep": {"Microwave"},
    "pick_cool_then_place_in_recep": {"Fridge"},
}
# Receptacle classes with several instances in real rooms, when the layout lists none of them.
_SYNTH_COUNTS = {"StoveBurner": (2, 4), "Cabinet": (1, 3), "Drawer": (1, 3), "Shelf": (1, 3)}


# ---------------------------------------------------------------------------------------------------------
# ALFRED's tables (from the alfworld wheel).


@lru_cache(maxsize=1)
def _alfred() -> dict[str, Any]:
    constants = import_alfworld("alfworld.gen.constants")
    goals = import_alfworld("alfworld.gen.goal_library")
    movable = set(constants.MOVABLE_RECEPTACLES)
    val = {r: set(objs) for r, objs in constants.VAL_RECEPTACLE_OBJECTS.items()}
    static_receptacles = {r for r in val if r not in movable}
    pickupable = set().union(*val.values()) - {o for o in set().union(*val.values()) if o.endswith("Sliced")}
    return {
        "val": val,
        "actions": {k: set(v) for k, v in constants.VAL_ACTION_OBJECTS.items()},
        "movable": movable,
        "static_receptacles": static_receptacles,
        "pickupable": pickupable,
        "openable": set(constants.OPENABLE_CLASS_LIST),
        "goals_valid": {k: set(v) for k, v in constants.GOALS_VALID.items()},
        "scene_type": {k: set(v) for k, v in constants.SCENE_TYPE.items()},
        "train_scenes": list(constants.TRAIN_SCENE_NUMBERS),
        "test_scenes": list(constants.TEST_SCENE_NUMBERS),
        "gdict": goals.gdict,
    }


@dataclass(frozen=True)
class Layout:
    """One ALFRED floor plan as the alfworld wheel ships it."""

    scene: int
    kind: str
    classes: tuple[str, ...]
    receptacles: dict[str, tuple[float, float, int, int]]  # ALFRED id -> pose (x, z, rotation, horizon)
    points: tuple[tuple[float, float], ...]  # reachable (x, z) positions


@lru_cache(maxsize=256)
def load_layout(scene: int) -> Layout:
    import numpy as np

    folder = alfworld_package_dir() / "gen" / "layouts"
    classes = tuple(json.loads((folder / f"FloorPlan{scene}-objects.json").read_text()))
    receptacles = {
        rid: (float(p[0]), float(p[1]), int(p[2]), int(p[3]))
        for rid, p in json.loads((folder / f"FloorPlan{scene}-openable.json").read_text()).items()
    }
    points = tuple((float(x), float(z)) for x, z in np.load(folder / f"FloorPlan{scene}-layout.npy").tolist())
    kind = next((k for k, scenes in _alfred()["scene_type"].items() if scene in scenes), "Kitchen")
    return Layout(scene, kind, classes, receptacles, points)


def scenes_for(split: str, task_type: str) -> list[int]:
    """ALFRED's scenes of `split` (train/valid_seen: train scenes; valid_unseen: test scenes) where the
    task type is valid."""
    a = _alfred()
    if split in ("train", "valid_seen"):
        scenes = a["train_scenes"]
    elif split == "valid_unseen":
        scenes = a["test_scenes"]
    else:
        raise ValueError(f"unknown split {split!r}: use train, valid_seen or valid_unseen")
    kinds = a["goals_valid"][task_type]
    return [s for s in scenes if load_layout(s).kind in kinds]


# ---------------------------------------------------------------------------------------------------------
# Drafting a game.


def mangle(alfred_id: str) -> str:
    """ALFRED's PDDL spelling of an object id ("Potato|+01.01|..." -> "Potato_bar__plus_01_dot_01_...")."""
    return (
        alfred_id.replace("|", "_bar_").replace("+", "_plus_").replace("-", "_minus_").replace(".", "_dot_").replace(
            ",", "_comma_")
    )


def _receptacle_class(alfred_id: str) -> str:
    parts = alfred_id.split("|")
    return parts[4] if len(parts) == 5 else parts[0]


def _location(x: float, z: float, rotation: int, horizon: int) -> str:
    return f"loc|{int(round(x / 0.25))}|{int(round(z / 0.25))}|{int(rotation) // 90 % 4}|{int(horizon)}"


def _synth_id(cls: str, x: float, y: float, z: float) -> str:
    head = {"SinkBasin": "Sink", "BathtubBasin": "Bathtub"}.get(cls, cls)
    tail = f"|{cls}" if cls in ("SinkBasin", "BathtubBasin") else ""
    return f"{head}|{x:+06.2f}|{y:+06.2f}|{z:+06.2f}{tail}"


@dataclass
class _Receptacle:
    rid: str
    cls: str
    loc: str
    xyz: tuple[float, float, float]


@dataclass
class GameDraft:
    """A game before it is checked: its room, task and files."""

    split: str
    task_type: str
    scene: int
    params: dict[str, Any]
    task_desc: str
    problem: str
    folder: str  # "<task_type>-<Object>-None-<Parent or Lamp>-<scene>"
    trial: str
    provenance: dict[str, Any] = field(default_factory=dict)

    def game_data(self) -> dict[str, Any]:
        pkg = alfworld_package_dir() / "data"
        grammar = (pkg / "alfred.twl2").read_text().replace("UNKNOWN GOAL", self.task_desc)
        return {
            "pddl_domain": (pkg / "alfred.pddl").read_text(),
            "grammar": grammar,
            "pddl_problem": self.problem,
            "solvable": None,
            "walkthrough": None,
        }

    def traj_data(self) -> dict[str, Any]:
        return {
            "task_type": self.task_type,
            "task_id": self.trial,
            "pddl_params": dict(self.params),
            "scene": {"floor_plan": f"FloorPlan{self.scene}", "scene_num": self.scene},
            "turk_annotations": {"anns": [{"task_desc": self.task_desc[:1].upper() + self.task_desc[1:] + "."}]},
            "agentgym_generator": dict(self.provenance),
        }


def _choose_task(task_type: str, layout: Layout, rng: random.Random) -> dict[str, str] | None:
    a = _alfred()
    present = set(layout.classes)
    receptacle_classes = sorted(c for c in present if c in a["static_receptacles"])
    objects = sorted(c for c in present if c in a["pickupable"])
    if task_type == "look_at_obj_in_light":
        lamps = [c for c in _LAMPS if c in present]
        holders = [c for c in receptacle_classes if c in LAMP_HOLDERS]
        if not lamps or not holders or not objects:
            return None
        return {"object_target": rng.choice(objects), "parent_target": "", "toggle_target": rng.choice(lamps)}
    if task_type in _APPLIANCE:
        action, appliance = _APPLIANCE[task_type]
        if appliance not in present:
            return None
        objects = [o for o in objects if o in a["actions"][action]]
    pairs = [
        (o, r)
        for o in objects
        for r in receptacle_classes
        if o in a["val"][r] and r not in _NOT_PARENT.get(task_type, ())
        # the object must also fit somewhere that is not a goal receptacle, to start away from the goal
        and any(o in a["val"][other] and other != r for other in receptacle_classes)
    ]
    if not pairs:
        return None
    obj = rng.choice(sorted({o for o, _ in pairs}))
    parent = rng.choice([r for o, r in pairs if o == obj])
    return {"object_target": obj, "parent_target": parent, "toggle_target": ""}


def _build_receptacles(layout: Layout, rng: random.Random) -> list[_Receptacle]:
    a = _alfred()
    present = set(layout.classes)
    out: list[_Receptacle] = []
    listed = set()
    for rid, (x, z, rot, hor) in sorted(layout.receptacles.items()):
        cls = _receptacle_class(rid)
        if cls not in a["static_receptacles"]:
            continue
        listed.add(cls)
        parts = rid.split("|")
        xyz = (float(parts[1]), float(parts[2]), float(parts[3]))
        out.append(_Receptacle(rid, cls, _location(x, z, rot, hor), xyz))
    points = sorted(layout.points)
    for cls in sorted(c for c in present if c in a["static_receptacles"] and c not in listed):
        lo, hi = _SYNTH_COUNTS.get(cls, (1, 1))
        for _ in range(rng.randint(lo, hi)):
            px, pz = rng.choice(points)
            x, y, z = px + rng.uniform(-0.6, 0.6), rng.uniform(0.0, 1.6), pz + rng.uniform(-0.6, 0.6)
            rid = _synth_id(cls, x, y, z)
            loc = _location(px, pz, rng.choice((0, 90, 180, 270)), rng.choice((0, 15, 30, 45, 60)))
            out.append(_Receptacle(rid, cls, loc, (x, y, z)))
    return out


def draft_game(split: str, task_type: str, rng: random.Random, room: RoomSettings, *,
               scenes: list[int] | None = None) -> GameDraft | None:
    """One candidate game (None when the drawn room cannot host the task type)."""
    a = _alfred()
    scene = rng.choice(scenes if scenes is not None else scenes_for(split, task_type))
    layout = load_layout(scene)
    task = _choose_task(task_type, layout, rng)
    if task is None:
        return None
    obj_cls, parent_cls, lamp_cls = task["object_target"], task["parent_target"], task["toggle_target"]
    receptacles = _build_receptacles(layout, rng)

    # Which receptacles the game keeps (small rooms: what the task needs, then random others).
    needed: list[_Receptacle] = []
    if parent_cls:
        parents = [r for r in receptacles if r.cls == parent_cls]
        needed += rng.sample(parents, min(len(parents), 2 if room.max_receptacles else len(parents)))
    if task_type in _APPLIANCE:
        needed += [rng.choice([r for r in receptacles if r.cls == _APPLIANCE[task_type][1]])]
    lamp_holder = None
    if lamp_cls:
        holders = [r for r in receptacles if r.cls in LAMP_HOLDERS and r.cls not in a["openable"]]
        if not holders:
            return None
        lamp_holder = rng.choice(holders)
        needed.append(lamp_holder)
    # somewhere the target can start that is not a goal receptacle
    starts = [r for r in receptacles if obj_cls in a["val"][r.cls] and r.cls != parent_cls]
    if not starts:
        return None
    needed.append(rng.choice(starts))
    kept = list({r.rid: r for r in needed}.values())
    kept_ids = {r.rid for r in kept}
    others = [r for r in receptacles if r.rid not in kept_ids]
    rng.shuffle(others)
    if room.max_receptacles is None:
        kept += others
    else:
        kept += others[: max(0, room.max_receptacles - len(kept))]
    kept.sort(key=lambda r: r.rid)

    # Objects: the target class and distractors, each instance inside a receptacle that can hold it.
    classes = sorted(c for c in set(layout.classes) if c in a["pickupable"] and c != obj_cls)
    rng.shuffle(classes)
    if room.max_distractor_classes is not None:
        classes = classes[: room.max_distractor_classes]
    counts = {c: rng.randint(1, room.max_instances) for c in sorted(classes)}
    counts[obj_cls] = rng.randint(2, max(
        2, room.max_instances + 1)) if task_type == "pick_two_obj_and_place" else rng.randint(1, room.max_instances)
    placed: list[tuple[str, str, _Receptacle]] = []  # (alfred id, class, receptacle)
    used_ids = {r.rid for r in kept}
    for cls in sorted(counts):
        holders = [r for r in kept if cls in a["val"][r.cls]]
        if cls == obj_cls:
            holders = [r for r in holders if r.cls != parent_cls]
        if not holders:
            if cls == obj_cls:
                return None
            continue
        for _ in range(counts[cls]):
            r = rng.choice(holders)
            for _try in range(20):
                x, y, z = (r.xyz[0] + rng.uniform(-0.4, 0.4), r.xyz[1] + rng.uniform(0.0, 0.3),
                           r.xyz[2] + rng.uniform(-0.4, 0.4))
                oid = _synth_id(cls, x, y, z)
                if oid not in used_ids:
                    break
            used_ids.add(oid)
            placed.append((oid, cls, r))
    if lamp_cls:
        x, y, z = lamp_holder.xyz[0] + rng.uniform(-0.3, 0.3), lamp_holder.xyz[1] + 0.5, lamp_holder.xyz[
            2] + rng.uniform(-0.3, 0.3)
        placed.append((_synth_id(lamp_cls, x, y, z), lamp_cls, lamp_holder))

    # The agent starts in the middle of the room, away from every receptacle.
    taken = {r.loc for r in kept}
    for _try in range(50):
        px, pz = rng.choice(sorted(layout.points))
        agent_loc = _location(px, pz, rng.choice((0, 90, 180, 270)), 30)
        if agent_loc not in taken:
            break
    else:
        return None

    params = {**task, "mrecep_target": "", "object_sliced": False}
    template = rng.choice(a["gdict"][task_type]["templates"])
    task_desc = template.format(obj=obj_cls.lower(), recep=parent_cls.lower(), toggle=lamp_cls.lower(), mrecep="")
    problem = _problem_text(task_type, params, kept, placed, agent_loc, f"agentgym_{split}_{scene}")
    folder = f"{task_type}-{obj_cls}-None-{parent_cls or lamp_cls}-{scene}"
    return GameDraft(split, task_type, scene, params, task_desc, problem, folder, trial="")


def _problem_text(task_type: str, params: dict[str, Any], receptacles: list[_Receptacle],
                  placed: list[tuple[str, str, _Receptacle]], agent_loc: str, name: str) -> str:
    a = _alfred()
    actions = a["actions"]
    obj_classes = sorted({cls for _, cls, _ in placed} | {"Knife", "ButterKnife"} | {params["object_target"]})
    rec_classes = sorted({r.cls for r in receptacles} | {"SinkBasin", "Microwave",
                                                         "Fridge"} | ({params["parent_target"]} - {""}))
    locations = sorted({r.loc for r in receptacles} | {agent_loc})
    lines = [f"(define (problem plan_{name})", "(:domain alfred)", "(:objects", "agent1 - agent"]
    lines += [f"        {c}Type - otype" for c in obj_classes]
    lines += [f"        {c}Type - rtype" for c in rec_classes]
    lines += [f"        {mangle(oid)} - object" for oid, _, _ in sorted(placed)]
    lines += [f"        {mangle(r.rid)} - receptacle" for r in receptacles]
    lines += [f"        {mangle(loc)} - location" for loc in locations]
    lines += [")", "(:init", ""]
    init: list[str] = []
    init += [f"(receptacleType {mangle(r.rid)} {r.cls}Type)" for r in receptacles]
    init += [f"(objectType {mangle(oid)} {cls}Type)" for oid, cls, _ in sorted(placed)]
    present_objects = {cls for _, cls, _ in placed}
    init += [
        f"(canContain {rc}Type {oc}Type)"
        for rc in sorted({r.cls for r in receptacles})
        for oc in sorted(present_objects)
        if oc in a["val"].get(rc, ())
    ]
    for oid, cls, _ in sorted(placed):
        m = mangle(oid)
        if cls in _LAMPS:
            init.append(f"(toggleable {m})")
            continue
        init.append(f"(pickupable {m})")
        if cls in a["movable"]:
            init.append(f"(isReceptacleObject {m})")
        for prop, key in (("cleanable", "Cleanable"), ("heatable", "Heatable"), ("coolable", "Coolable"),
                          ("sliceable", "Sliceable")):
            if cls in actions[key]:
                init.append(f"({prop} {m})")
    init += [f"(openable {mangle(r.rid)})" for r in receptacles if r.cls in a["openable"]]
    init.append(f"(atLocation agent1 {mangle(agent_loc)})")
    init += [f"(inReceptacle {mangle(oid)} {mangle(r.rid)})" for oid, _, r in sorted(placed, key=lambda t: t[0])]
    init += [f"(receptacleAtLocation {mangle(r.rid)} {mangle(r.loc)})" for r in receptacles]
    init += [f"(objectAtLocation {mangle(oid)} {mangle(r.loc)})" for oid, _, r in sorted(placed, key=lambda t: t[0])]
    lines += [f"        {fact}" for fact in init]
    lines += ["        )", ""]
    goal = a["gdict"][task_type]["pddl"].format(
        obj=params["object_target"], recep=params["parent_target"], toggle=params["toggle_target"], mrecep=""
    )
    goal = goal.replace(" # ", " - ")
    lines.append(goal.rstrip())
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------------------
# Checking: the expert must win on the engine.


def solve_draft(draft: GameDraft, engine=None, *, max_steps: int = MAX_WALKTHROUGH, cache_dir=None) -> list[str] | None:
    """Play the expert on the real engine; its commands if it wins within `max_steps`, else None."""
    own = engine is None
    engine = engine or AlfredEngine()
    try:
        game = compile_game(draft.game_data(), cache_dir=cache_dir)
        engine.load(game)
        engine.reset()
        if engine.won:
            return None  # already solved: not a task
        spec = TaskSpec.from_pddl_params(draft.task_type, draft.params)
        walkthrough: list[str] = []
        while not engine.won and len(walkthrough) < max_steps:
            commands = plan(World.from_facts(engine.facts.facts, game.names), spec, max_length=max_steps)
            if not commands or commands[0] not in engine.admissible_commands:
                return None
            engine.step(commands[0])
            walkthrough.append(commands[0])
        return walkthrough if engine.won else None
    except (GameFileError, ExpertError):  # a draft the engine or the expert rejects is not kept
        return None
    finally:
        if own:
            engine.close()


def game_rng(seed: int, room: str, split: str, task_type: str, index: int, attempt: int) -> random.Random:
    """The random stream of one game (a string seed: reproducible on every machine and Python)."""
    return random.Random(f"{GENERATOR_VERSION}|{seed}|{room}|{split}|{task_type}|{index}|{attempt}")


def room_settings(room: str, max_receptacles: int | None = None) -> tuple[str, RoomSettings]:
    """`(label, settings)` of a room size with an optional receptacle cap; the label names the game
    stream ("full", "full-r20")."""
    if room not in ROOMS:
        raise ValueError(f"room={room!r}: use one of {', '.join(ROOMS)}")
    settings = ROOMS[room]
    if max_receptacles is None:
        return room, settings
    if int(max_receptacles) < 1:
        raise ValueError(f"max_receptacles must be >= 1, got {max_receptacles}")
    cap = int(max_receptacles) if settings.max_receptacles is None else min(
        int(max_receptacles), settings.max_receptacles)
    return f"{room}-r{cap}", RoomSettings(cap, settings.max_distractor_classes, settings.max_instances)


def generate_game(
    seed: int, room: str, split: str, task_type: str, index: int, engine=None, *, max_attempts: int = 200,
    cache_dir=None, max_receptacles: int | None = None,
) -> tuple[GameDraft, list[str]]:
    """The `index`-th kept game of (seed, room, split, task type): drafts until the expert wins one."""
    if task_type not in TASK_TYPES:
        raise ValueError(f"unknown task type {task_type!r}")
    room, settings = room_settings(room, max_receptacles)
    scenes = scenes_for(split, task_type)
    for attempt in range(max_attempts):
        rng = game_rng(seed, room, split, task_type, index, attempt)
        draft = draft_game(split, task_type, rng, settings, scenes=scenes)
        if draft is None:
            continue
        walkthrough = solve_draft(draft, engine, cache_dir=cache_dir)
        if walkthrough is None:
            continue
        draft.trial = f"trial_G{GENERATOR_VERSION}_s{seed}_{index:04d}_a{attempt}"
        draft.provenance = {
            "version": GENERATOR_VERSION,
            "seed": seed,
            "room": room,
            "split": split,
            "index": index,
            "attempt": attempt,
        }
        return draft, walkthrough
    raise RuntimeError(f"no solvable {task_type} game in {max_attempts} attempts (seed {seed}, {split}, #{index})")
