"""The ALFWorld expert: a planner over the engine's true facts, for all six task types.

ALFWorld ships two experts: a hand-coded one that explores like a player (it reads observations and the
task parameters, and re-plans from what it has seen) and fast-downward's planner. This one reads the
privileged state instead (where every object is, what is open, what is held) and writes a complete plan
from any state, so that it can act from the middle of someone else's episode and so that hindsight can
show the teacher the whole remaining plan.

The plan is a greedy simulation: at each step it picks the cheapest next move toward the goal (one
command = one step; walking to a receptacle costs nothing when the agent already stands at its
location; a closed receptacle costs one `open`), applies it to a copy of the facts, and repeats until
the goal of the task type holds. The ALFRED domain is reversible (nothing is ever lost), so from any
state of a solvable game the plan reaches the goal. Ties are broken by names: the plan is deterministic.

Task types and their goals (ALFRED's `goal_library`):

| type | goal |
|---|---|
| pick_and_place_simple | an object of type O is in a receptacle of type R |
| look_at_obj_in_light | the agent holds an O, stands at a toggled lamp of type T |
| pick_clean_then_place_in_recep | a clean O is in an R (cleaned in a sink basin) |
| pick_heat_then_place_in_recep | a hot O is in an R (heated in a microwave) |
| pick_cool_then_place_in_recep | a cool O is in an R (cooled in a fridge) |
| pick_two_obj_and_place | two different O are in the same R |
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

__all__ = ["TaskSpec", "World", "plan", "TASK_TYPES", "SUBSETS", "SUBSET_OF_TYPE", "ExpertError"]

TASK_TYPES = (
    "pick_and_place_simple",
    "look_at_obj_in_light",
    "pick_clean_then_place_in_recep",
    "pick_heat_then_place_in_recep",
    "pick_cool_then_place_in_recep",
    "pick_two_obj_and_place",
)
# subset name (gym id part, StepInfo.task_type) -> ALFWorld task type
SUBSETS: dict[str, str] = {
    "pick": "pick_and_place_simple",
    "look": "look_at_obj_in_light",
    "clean": "pick_clean_then_place_in_recep",
    "heat": "pick_heat_then_place_in_recep",
    "cool": "pick_cool_then_place_in_recep",
    "picktwo": "pick_two_obj_and_place",
}
SUBSET_OF_TYPE = {v: k for k, v in SUBSETS.items()}

# state change -> (property predicate, property the goal also requires, appliance type)
_TREATMENT = {
    "pick_clean_then_place_in_recep": ("isclean", "cleanable", "sinkbasintype", "clean"),
    "pick_heat_then_place_in_recep": ("ishot", "heatable", "microwavetype", "heat"),
    "pick_cool_then_place_in_recep": ("iscool", "coolable", "fridgetype", "cool"),
}

MAX_PLAN_LENGTH = 200


class ExpertError(RuntimeError):
    """The expert found no plan (the game is not solvable from here, or its facts are not ALFRED's)."""


@dataclass(frozen=True)
class TaskSpec:
    """What the task asks, in the engine's (lower-case) type names.

    Attributes:
        task_type: one of TASK_TYPES.
        object_type: e.g. "potatotype".
        parent_type: the receptacle type, e.g. "sinkbasintype" ("" for look tasks).
        toggle_type: the lamp type for look tasks, e.g. "desklamptype" ("" otherwise).
    """

    task_type: str
    object_type: str
    parent_type: str = ""
    toggle_type: str = ""

    @classmethod
    def from_pddl_params(cls, task_type: str, params: Mapping[str, object]) -> TaskSpec:
        """From ALFRED's traj_data `pddl_params` (object_target "Potato", parent_target "SinkBasin", ...)."""
        if task_type not in TASK_TYPES:
            raise ExpertError(f"unknown ALFWorld task type {task_type!r}; expected one of {', '.join(TASK_TYPES)}")

        def as_type(key: str) -> str:
            value = str(params.get(key) or "").strip()
            return f"{value.lower()}type" if value else ""

        spec = cls(task_type, as_type("object_target"), as_type("parent_target"), as_type("toggle_target"))
        if not spec.object_type:
            raise ExpertError("the task has no object_target")
        if task_type == "look_at_obj_in_light" and not spec.toggle_type:
            raise ExpertError("a look_at_obj_in_light task needs a toggle_target")
        if task_type != "look_at_obj_in_light" and not spec.parent_type:
            raise ExpertError(f"a {task_type} task needs a parent_target")
        return spec


@dataclass
class World:
    """The facts the expert reads, as plain sets and maps of entity ids."""

    names: Mapping[str, str]
    agent_loc: str = ""
    holding: str | None = None
    recep_loc: dict[str, str] = field(default_factory=dict)
    recep_type: dict[str, str] = field(default_factory=dict)
    obj_type: dict[str, str] = field(default_factory=dict)
    in_recep: dict[str, str] = field(default_factory=dict)
    openable: set[str] = field(default_factory=set)
    opened: set[str] = field(default_factory=set)
    can_contain: set[tuple[str, str]] = field(default_factory=set)
    props: dict[str, set[str]] = field(default_factory=dict)  # predicate -> objects

    @classmethod
    def from_facts(cls, facts: Iterable, names: Mapping[str, str]) -> World:
        """From TextWorld propositions (`fact.name`, `fact.arguments[i].name`)."""
        w = cls(names=names)
        for fact in facts:
            p = fact.name
            args = [a.name for a in fact.arguments]
            if p == "atlocation":
                w.agent_loc = args[1]
            elif p == "holds":
                w.holding = args[1]
            elif p == "receptacleatlocation":
                w.recep_loc[args[0]] = args[1]
            elif p == "receptacletype":
                w.recep_type[args[0]] = args[1]
            elif p == "objecttype":
                w.obj_type[args[0]] = args[1]
            elif p == "inreceptacle":
                w.in_recep[args[0]] = args[1]
            elif p == "openable":
                w.openable.add(args[0])
            elif p == "opened":
                w.opened.add(args[0])
            elif p == "cancontain":
                w.can_contain.add((args[0], args[1]))
            elif len(args) == 1:
                w.props.setdefault(p, set()).add(args[0])
        return w

    def copy(self) -> World:
        return World(
            names=self.names,
            agent_loc=self.agent_loc,
            holding=self.holding,
            recep_loc=self.recep_loc,
            recep_type=self.recep_type,
            obj_type=self.obj_type,
            in_recep=dict(self.in_recep),
            openable=self.openable,
            opened=set(self.opened),
            can_contain=self.can_contain,
            props={k: set(v) for k, v in self.props.items()},
        )

    def has(self, prop: str, entity: str) -> bool:
        return entity in self.props.get(prop, ())

    def name(self, entity: str) -> str:
        return self.names.get(entity, entity).strip()

    # costs -------------------------------------------------------------------------------------

    def reach(self, recep: str, from_loc: str | None = None) -> int:
        return 0 if (from_loc or self.agent_loc) == self.recep_loc.get(recep) else 1

    def access(self, recep: str, from_loc: str | None = None) -> int:
        closed = recep in self.openable and recep not in self.opened
        return self.reach(recep, from_loc) + (1 if closed else 0)

    def receptacles_of(self, rtype: str) -> list[str]:
        return sorted((r for r, t in self.recep_type.items() if t == rtype and r in self.recep_loc), key=self.name)

    def can_hold(self, recep: str, obj: str) -> bool:
        return (self.recep_type.get(recep), self.obj_type.get(obj)) in self.can_contain


@dataclass(frozen=True)
class _Move:
    verb: str  # go, open, take, move, heat, cool, clean, use
    obj: str = ""
    recep: str = ""

    def text(self, w: World) -> str:
        if self.verb == "go":
            return f"go to {w.name(self.recep)}"
        if self.verb == "open":
            return f"open {w.name(self.recep)}"
        if self.verb == "take":
            return f"take {w.name(self.obj)} from {w.name(self.recep)}"
        if self.verb == "move":
            return f"move {w.name(self.obj)} to {w.name(self.recep)}"
        if self.verb == "use":
            return f"use {w.name(self.obj)}"
        return f"{self.verb} {w.name(self.obj)} with {w.name(self.recep)}"


def _apply(w: World, m: _Move) -> None:
    if m.verb == "go":
        w.agent_loc = w.recep_loc[m.recep]
    elif m.verb == "open":
        w.opened.add(m.recep)
    elif m.verb == "take":
        w.in_recep.pop(m.obj, None)
        w.holding = m.obj
    elif m.verb == "move":
        w.in_recep[m.obj] = m.recep
        w.holding = None
    elif m.verb == "heat":
        w.props.setdefault("ishot", set()).add(m.obj)
        w.props.get("iscool", set()).discard(m.obj)
    elif m.verb == "cool":
        w.props.setdefault("iscool", set()).add(m.obj)
        w.props.get("ishot", set()).discard(m.obj)
    elif m.verb == "clean":
        w.props.setdefault("isclean", set()).add(m.obj)
    elif m.verb == "use":
        w.props.setdefault("istoggled", set()).add(m.obj)


def _goto_then(w: World, recep: str, then: _Move) -> _Move:
    """Walk to `recep` if needed, open it if closed (for put/take), else do `then`."""
    if w.reach(recep):
        return _Move("go", recep=recep)
    if then.verb in ("take", "move") and recep in w.openable and recep not in w.opened:
        return _Move("open", recep=recep)
    return then


class _Planner:
    def __init__(self, spec: TaskSpec) -> None:
        self.spec = spec
        self.treatment = _TREATMENT.get(spec.task_type)

    # -- goal ------------------------------------------------------------------------------------

    def _is_target(self, w: World, o: str) -> bool:
        if w.obj_type.get(o) != self.spec.object_type:
            return False
        if self.treatment is not None:
            return w.has(self.treatment[1], o)
        return True

    def _done(self, w: World, o: str) -> bool:
        """Object `o` needs nothing more (treated if the task treats)."""
        return self.treatment is None or w.has(self.treatment[0], o)

    def _parents(self, w: World) -> list[str]:
        return [r for r in w.receptacles_of(self.spec.parent_type)]

    def goal_reached(self, w: World) -> bool:
        t = self.spec.task_type
        if t == "look_at_obj_in_light":
            holding_ok = w.holding is not None and w.obj_type.get(w.holding) == self.spec.object_type
            return holding_ok and any(
                w.has("istoggled", lamp) and w.reach(w.in_recep[lamp]) == 0 for lamp in self._lamps(w)
            )
        if t == "pick_two_obj_and_place":
            return any(len(self._targets_in(w, r)) >= 2 for r in self._parents(w))
        return any(self._targets_in(w, r) for r in self._parents(w))

    def _targets_in(self, w: World, recep: str) -> list[str]:
        return [o for o, r in w.in_recep.items() if r == recep and self._is_target(w, o) and self._done(w, o)]

    def _lamps(self, w: World) -> list[str]:
        return sorted(
            (o for o, t in w.obj_type.items() if t == self.spec.toggle_type and w.has("toggleable", o)
             and o in w.in_recep),
            key=w.name,
        )

    # -- choices ---------------------------------------------------------------------------------

    def _tail_cost(self, w: World, o: str, from_loc: str) -> int:
        """Steps after holding `o` at `from_loc` until it is delivered."""
        t = self.spec.task_type
        if t == "look_at_obj_in_light":
            return min((w.reach(w.in_recep[lamp], from_loc) + (0 if w.has("istoggled", lamp) else 1)
                        for lamp in self._lamps(w)), default=99)
        loc = from_loc
        cost = 0
        if self.treatment is not None and not w.has(self.treatment[0], o):
            appliance = self._appliance(w, from_loc)
            if appliance is None:
                return 99
            cost += w.reach(appliance, from_loc) + 1
            loc = w.recep_loc[appliance]
        parents = [r for r in self._parents(w) if w.can_hold(r, o)]
        return cost + min((w.access(r, loc) + 1 for r in parents), default=99)

    def _appliance(self, w: World, from_loc: str | None = None) -> str | None:
        options = w.receptacles_of(self.treatment[2])
        if not options:
            return None
        return min(options, key=lambda r: (w.reach(r, from_loc), w.name(r)))

    def _fetch(self, w: World, exclude: set[str]) -> _Move | None:
        """Go and take the cheapest target object (not in `exclude`)."""
        best = None
        for o, r in w.in_recep.items():
            if o in exclude or not self._is_target(w, o) or not w.has("pickupable", o):
                continue
            cost = w.access(r) + 1 + self._tail_cost(w, o, w.recep_loc.get(r, ""))
            key = (cost, w.name(o))
            if best is None or key < best[0]:
                best = (key, o, r)
        if best is None:
            return None
        _, o, r = best
        return _goto_then(w, r, _Move("take", obj=o, recep=r))

    def _put_down(self, w: World) -> _Move | None:
        """Put a held object the task does not need into the cheapest receptacle that takes it."""
        o = w.holding
        options = [r for r in sorted(w.recep_loc, key=w.name) if w.can_hold(r, o)]
        if not options:
            return None
        r = min(options, key=lambda r: (w.access(r), w.name(r)))
        return _goto_then(w, r, _Move("move", obj=o, recep=r))

    def _deliver(self, w: World, o: str, recep: str | None = None) -> _Move | None:
        """With target `o` in hand: treat it if needed, then put it in a parent receptacle."""
        if self.treatment is not None and not w.has(self.treatment[0], o):
            appliance = self._appliance(w)
            if appliance is None:
                return None
            if w.reach(appliance):
                return _Move("go", recep=appliance)
            return _Move(self.treatment[3], obj=o, recep=appliance)
        if recep is None:
            parents = [r for r in self._parents(w) if w.can_hold(r, o)]
            if not parents:
                return None
            recep = min(parents, key=lambda r: (w.access(r), w.name(r)))
        return _goto_then(w, recep, _Move("move", obj=o, recep=recep))

    def next_move(self, w: World) -> _Move | None:
        t = self.spec.task_type
        held = w.holding
        held_is_target = held is not None and self._is_target(w, held)
        if t == "look_at_obj_in_light":
            if held is not None and w.obj_type.get(held) == self.spec.object_type:
                lamps = self._lamps(w)
                if not lamps:
                    return None
                lamp = min(lamps,
                           key=lambda x: (w.reach(w.in_recep[x]) + (0 if w.has("istoggled", x) else 1), w.name(x)))
                if w.reach(w.in_recep[lamp]):
                    return _Move("go", recep=w.in_recep[lamp])
                return _Move("use", obj=lamp)
            if held is not None:
                return self._put_down(w)
            return self._fetch_any(w)
        if t == "pick_two_obj_and_place":
            target = self._pick_two_target(w, held if held_is_target else None)
            if target is None:
                return None
            if held_is_target:
                return _goto_then(w, target, _Move("move", obj=held, recep=target))
            if held is not None:
                return self._put_down(w)
            already = set(self._targets_in(w, target))
            return self._fetch(w, exclude=already)
        if held_is_target:
            return self._deliver(w, held)
        if held is not None:
            return self._put_down(w)
        return self._fetch(w, exclude=set())

    def _fetch_any(self, w: World) -> _Move | None:
        """Look tasks: any object of the type will do (no treatment)."""
        return self._fetch(w, exclude=set())

    def _pick_two_target(self, w: World, held: str | None) -> str | None:
        parents = self._parents(w)
        if held is not None:
            parents = [r for r in parents if w.can_hold(r, held)]
        else:
            parents = [r for r in parents if any(w.can_hold(r, o) for o in w.obj_type if self._is_target(w, o))]
        if not parents:
            return None
        return min(parents, key=lambda r: (-len(self._targets_in(w, r)), w.access(r), w.name(r)))


def plan(world: World, spec: TaskSpec, *, max_length: int = MAX_PLAN_LENGTH) -> list[str]:
    """The expert's commands from `world` to the goal of `spec` (empty when the goal already holds).

    Raises:
        ExpertError: no plan within `max_length` commands.
    """
    planner = _Planner(spec)
    w = world.copy()
    commands: list[str] = []
    while not planner.goal_reached(w):
        if len(commands) >= max_length:
            raise ExpertError(f"no plan within {max_length} commands")
        move = planner.next_move(w)
        if move is None:
            raise ExpertError(f"no move toward the goal of this {spec.task_type} task from here")
        commands.append(move.text(w))
        _apply(w, move)
    return commands
