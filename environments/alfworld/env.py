"""`AlfWorldEnv`: ALFWorld's household tasks as a TextEnv, on the real TextWorld PDDL engine.

The agent reads ALFWorld's observations (the intro with the room and "Your task is to: ...", then the
engine's feedback) and answers each turn with `<think>...</think><action>command</action>` (a bare
command line is accepted too, unless `allow_bare_action=False`). A malformed turn or a command the
engine does not admit gives ALFWorld's "Nothing happens." and leaves the state unchanged. The episode
ends with reward `reward_scale` when the task is solved, or is truncated after `max_turns` (50) turns.

Data (`source=`): `embedded` (default) plays the generated panel (see `panel.py`), built on first use;
`alfworld` plays ALFWorld's own `json_2.1.1` games from `data_dir=` or `$ALFWORLD_DATA`.

Privileged, for the trainer and reports: `expert_action()` (the planner expert's next command),
`hindsight()` (goal, task type, the expert's plan from the current state and from the start, success),
`state_key()` (a hash of the engine's current facts).

Turn labels (`turn_labels=True`; privileged, for evaluating credit): `hindsight().details["turn_labels"]`
holds one dict per turn: `delta`, the change the turn made to the length of the expert's plan (-1 for
each of the expert's own commands, 0 for a wasted turn such as `look` and for every invalid turn, > 0
for a turn that undid progress, < -1 only for a shortcut the greedy planner missed); `progress`
(`delta < 0`); `expert_action`, the expert's next command in the state the turn was taken in;
`plan_length_before` and `plan_length_after`. Where the expert has no plan, `delta` is None and
`progress` says whether the turn solved the task. It costs one expert plan per new state, paid only
when the labels are on.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from agentgym_opsd.contract import EnvUnavailable, Hindsight, TextEnv, Transition, hash_state
from agentgym_opsd.parsing import ParsedAction
from environments.alfworld.compiled import compile_game
from environments.alfworld.data import GameEntry, discover_games, read_task_params, resolve_data_root
from environments.alfworld.engine import NOTHING_HAPPENS, AlfredEngine
from environments.alfworld.expert import SUBSET_OF_TYPE, SUBSETS, TASK_TYPES, ExpertError, TaskSpec, World, plan
from environments.alfworld.grammar import GameFileError
from environments.alfworld.panel import SPLITS, PanelSpec, ensure_panel

__all__ = ["AlfWorldEnv", "SUBSETS", "SUBSET_OF_TYPE", "INSTRUCTIONS", "interleave_task_types"]


INSTRUCTIONS = """You are an agent in a household, played through ALFWorld's text interface. The first observation describes the room and ends with your task ("Your task is to: ..."). Each turn you send one command and read what happens.

Commands:
  look                              look around your current location
  inventory                         check what you are carrying
  go to (receptacle)                move to a receptacle, e.g. go to countertop 1
  open (receptacle) / close (receptacle)
  take (object) from (receptacle)   pick an object up (you can carry one object)
  move (object) to (receptacle)     put the object you carry in or on a receptacle
  examine (something)               look at a receptacle or an object
  use (object)                      turn a lamp on or off
  heat (object) with (receptacle)   heat what you carry with a microwave
  clean (object) with (receptacle)  clean what you carry in a sink basin
  cool (object) with (receptacle)   cool what you carry with a fridge
Name objects and receptacles exactly as the observations do ("apple 1", "cabinet 3"). A command that cannot be done right now gives "Nothing happens."

Answer every turn with your reasoning inside <think>...</think>, then exactly one command inside <action>...</action>, for example:
<think>Apples are often in the fridge.</think><action>go to fridge 1</action>
You have {max_turns} turns."""  # noqa: E501 (the prompt the model reads: one paragraph a line, by design)

_WS = re.compile(r"\s+")
_TASK_LINE = re.compile(r"Your task is to: (.*)")
_NAMED = re.compile(r"\b(?:an?|some) ([a-z]+ \d+)")  # "a drawer 2", "an apple 1" -> "drawer 2", "apple 1"
_ROOM_LIST = re.compile(r"you see (.*?)\.\s*$", re.M)  # the first observation's receptacles, in order
_START_PLANS: dict[str, list[str] | None] = {}


def _as_task_types(task_types: str | Sequence[str] | None) -> tuple[str, ...]:
    if task_types is None or task_types == "all":
        return TASK_TYPES
    items = [task_types] if isinstance(task_types, str) else list(task_types)
    out = []
    for item in items:
        name = SUBSETS.get(str(item).lower(), str(item))
        if name not in TASK_TYPES:
            raise ValueError(f"unknown ALFWorld task type {item!r}: use {', '.join(SUBSETS)} or the full names")
        out.append(name)
    return tuple(dict.fromkeys(out))


def interleave_task_types(games: Iterable[GameEntry]) -> tuple[GameEntry, ...]:
    """The task order: the task types interleaved, so that every prefix of the order (the first
    12 episodes of `ALFWorld-All-v0`, or 12 from seed 100 on, wrapping around) holds each type in
    proportion to its share of the games.

    A type's j-th of its n games (in task-id order) sits at (j + 1/2) / n of the order, ties
    broken by `TASK_TYPES` order: equal counts give a round robin (pick, look, clean, heat, cool,
    picktwo, pick, ...); a skewed mix keeps its proportions in every prefix. One task type keeps
    its task-id order."""
    by_type: dict[str, list[GameEntry]] = {}
    for game in games:
        by_type.setdefault(game.task_type, []).append(game)
    rank = {t: i for i, t in enumerate(TASK_TYPES)}
    keyed = [
        ((j + 0.5) / len(group), rank.get(task_type, len(rank)), task_type, j, game)
        for task_type, group in by_type.items()
        for j, game in enumerate(group)
    ]
    return tuple(k[-1] for k in sorted(keyed, key=lambda k: k[:4]))


class AlfWorldEnv(TextEnv):
    """ALFWorld on the real engine; one game per episode, chosen by the seed.

    Args:
        task_types: the task types to play (`pick`, `look`, `clean`, `heat`, `cool`, `picktwo`, or ALFWorld's
            full names); None or "all" for all six.
        split: `train`, `valid_seen` or `valid_unseen`.
        source: `embedded` (the generated panel) or `alfworld` (ALFWorld's json_2.1.1 games).
        data_dir: the folder holding json_2.1.1/ for `source="alfworld"` (default `$ALFWORLD_DATA`);
            giving it implies `source="alfworld"`.
        panel_seed: the seed the embedded panel is generated from: another seed gives other games (the
            k-th game of a type is the same file for one seed and room whatever the panel's size).
        room: how much of each floor plan an embedded game keeps: `full` (every receptacle of the
            room; episodes of up to 40 expert commands) or `small` (at most 6 receptacles and 5 kinds
            of distractor objects: short episodes, 3-12 expert commands, for fast RL).
        panel_size: embedded games per task type: one number for every split, or a dict per split,
            e.g. {"train": 200, "valid_unseen": 200} (default 20 train, 10 valid_seen, 10
            valid_unseen); games are generated once, on first use, and cached in `cache_dir`.
        max_receptacles: cap the embedded rooms at this many receptacles (None: no cap).
        panel_own_types: generate an embedded panel of this env's task types only (ALFWorld-Pick-v0
            at panel_size 1000: 1,000 Pick games instead of 6,000 of six types); its games are the same
            files as the six-type panel's games of those types.
        mix: `uniform` (the same number of games of every type) or `alfworld` (all six types in the
            proportions of ALFWorld's training set; only with all six types, e.g. ALFWorld-All-v0).
        progress: show a progress bar while an embedded panel is generated (false: quiet).
        cache_dir: where panels and engine translations are cached (default `$AGENTGYM_OPSD_CACHE/alfworld` or
            `~/.cache/agentgym-opsd/alfworld`).
        reward_scale: the reward for solving the task.
        admissible_in_observation: append the admissible commands to every observation.
        normalize_commands: match commands case- and whitespace-insensitively ("Go to  Desk 1").
        expert_searches: the expert (`expert_action`) looks for an object no observation has shown
            yet receptacle by receptacle, in the order the room lists them (opening closed ones),
            instead of going straight to where the game put it; once it has seen one it plans as
            usual. Its demonstrations use only what the agent can read, so a policy can imitate them;
            the hindsight plan and turn labels stay the planner's. Off by default. Meant for small
            rooms: in a full kitchen (50 receptacles) a search can outlast the turn limit.
        turn_labels: label every turn by the change in the expert's remaining plan length, in
            `hindsight().details["turn_labels"]` (see the module docstring; off by default).
        max_turns, allow_bare_action, render_mode: see `TextEnv`.
    """

    action_tags = ("action",)
    allow_bare_action = True
    max_turns = 50
    invalid_observation = NOTHING_HAPPENS

    def __init__(
        self,
        task_types: str | Sequence[str] | None = None,
        *,
        split: str = "train",
        source: str | None = None,
        data_dir: str | None = None,
        panel_seed: int = 0,
        room: str = "full",
        panel_size: int | dict[str, int] | None = None,
        max_receptacles: int | None = None,
        panel_own_types: bool = False,
        mix: str = "uniform",
        cache_dir: str | None = None,
        reward_scale: float = 1.0,
        admissible_in_observation: bool = False,
        normalize_commands: bool = True,
        progress: bool = True,
        expert_searches: bool = False,
        turn_labels: bool = False,
        max_turns: int | None = None,
        allow_bare_action: bool | None = None,
        render_mode: str | None = None,
    ) -> None:
        super().__init__(
            max_turns=max_turns, allow_bare_action=allow_bare_action, render_mode=render_mode, turn_labels=turn_labels
        )
        if split not in SPLITS:
            raise ValueError(f"split={split!r}: use one of {', '.join(SPLITS)}")
        self.task_types = _as_task_types(task_types)
        self.split = split
        if source is None:
            source = "alfworld" if data_dir is not None else "embedded"
        if source not in ("embedded", "alfworld"):
            raise ValueError(f"source={source!r}: use 'embedded' (generated panel) or 'alfworld' (json_2.1.1 games)")
        if source == "embedded" and data_dir is not None:
            raise ValueError("data_dir is read with source='alfworld'; the embedded panel lives in cache_dir")
        self.source = source
        self.cache_dir = cache_dir
        self.reward_scale = float(reward_scale)
        self.admissible_in_observation = bool(admissible_in_observation)
        self.normalize_commands = bool(normalize_commands)
        self.expert_searches = bool(expert_searches)
        self._search: _Search | None = None  # what the agent has read, kept only for the searching expert
        self.instructions = INSTRUCTIONS.format(max_turns=self.max_turns)
        if mix != "uniform" and set(self.task_types) != set(TASK_TYPES):
            raise ValueError(f"mix={mix!r} shares games out over all six task types; use it with ALFWorld-All-v0")
        if source == "embedded":
            types = self.task_types if panel_own_types else None
            self.panel = PanelSpec.make(panel_seed, room, panel_size, mix=mix, max_receptacles=max_receptacles,
                                        task_types=types)
            self.data_root = ensure_panel(self.panel, cache_dir, splits=(split,), progress=progress) / "json_2.1.1"
        else:
            if max_receptacles is not None:
                raise ValueError("max_receptacles shapes the embedded panel's rooms; ALFWorld's own games keep theirs")
            if panel_own_types:
                raise ValueError("panel_own_types shapes the embedded panel; ALFWorld's own games are read as they are")
            self.panel = None
            self.data_root = resolve_data_root(data_dir)
        wanted = set(self.task_types)
        self.games: tuple[GameEntry, ...] = interleave_task_types(
            e for e in discover_games(self.data_root, split) if e.task_type in wanted)
        if not self.games:
            where = f"the {source} data at {self.data_root}"
            raise EnvUnavailable(f"ALFWorld: no playable {'/'.join(self.task_types)} games in {where} (split {split})")
        self._index = {e.task_id: i for i, e in enumerate(self.games)}
        self.engine = AlfredEngine()
        self.entry: GameEntry | None = None
        self.task_spec: TaskSpec | None = None
        self.goal = ""
        self._plans: dict[str, list[str] | None] = {}

    # -- TextEnv -----------------------------------------------------------------------------------

    @property
    def num_tasks(self) -> int:
        return len(self.games)

    def task_index(self, task_id: str) -> int:
        try:
            return self._index[task_id]
        except KeyError:
            raise KeyError(f"no ALFWorld game {task_id!r} in {self.data_root} ({self.split})") from None

    def _load_task(self, index: int, options: dict[str, Any]) -> str:
        entry = self.games[index]
        try:
            game = compile_game(entry.game_file, cache_dir=self.cache_dir)
        except GameFileError as e:
            raise EnvUnavailable(f"ALFWorld game {entry.task_id}: {e}") from None
        _, pddl_params = read_task_params(entry.folder)
        try:
            self.task_spec = TaskSpec.from_pddl_params(entry.task_type, pddl_params)
        except ExpertError:
            self.task_spec = None  # the game plays; only the expert and its hindsight plan are unavailable
        self.entry = entry
        self.task_id = entry.task_id
        self.task_type = SUBSET_OF_TYPE[entry.task_type]
        self.engine.load(game)
        intro = self.engine.reset()
        match = _TASK_LINE.search(intro)
        self.goal = match.group(1).strip() if match else ""
        self._plans = {}
        if self.expert_searches:
            listed = _ROOM_LIST.search(intro)
            self._search = _Search(_NAMED.findall(listed.group(1)) if listed else [])
        if game.key not in _START_PLANS:
            _START_PLANS[game.key] = self._expert_plan()
        return self._observe(intro)

    def _apply(self, action: ParsedAction) -> Transition:
        command = self._command(action.content or "")
        if not self.engine.command_for(command):
            return Transition(self._observe(NOTHING_HAPPENS), 0.0, False, admissible=False, info={"won": False})
        feedback = self.engine.step(command)
        if self._search is not None:
            self._search.saw(command, feedback)
        won = self.engine.won
        return Transition(
            self._observe(feedback),
            self.reward_scale if won else 0.0,
            bool(won),
            admissible=True,
            info={"won": bool(won)},
        )

    def _invalid(self, parsed: ParsedAction) -> str:
        return self._observe(NOTHING_HAPPENS)

    def state_key(self) -> str:
        game_key, fluents = self.engine.state_key_parts()
        return hash_state("alfworld", game_key, fluents)

    def admissible_actions(self) -> list[str] | None:
        return list(self.engine.admissible_commands)

    def expert_action(self) -> str | None:
        commands = self._expert_plan()
        if not commands:
            return None
        if self._search is not None:
            return self.format_action(self._search.next_command(commands, self.engine.admissible_commands))
        return self.format_action(commands[0])

    def hindsight(self) -> Hindsight:
        won = bool(self.engine.won)
        game = self.engine.game
        remaining = self._expert_plan()
        from_start = _START_PLANS.get(game.key) if game is not None else None
        lines = [f"Goal: {self.goal}", f"Task type: {self.entry.task_type if self.entry else ''}"]
        if from_start:
            lines.append("Expert plan from the start: " + "; ".join(from_start))
        if won:
            lines.append("The task was solved.")
        elif remaining:
            lines.append("Expert plan from the current state: " + "; ".join(remaining))
        details = {
            "goal": self.goal,
            "task_type": self.entry.task_type if self.entry else "",
            "pddl_params": dict(self.task_spec.__dict__) if self.task_spec else None,
            "expert_plan": remaining,
            "expert_plan_from_start": from_start,
            "walkthrough": game.walkthrough if game is not None else None,
            "moves": self.engine.moves,
            "won": won,
        }
        if self.turn_labels is not None:
            details["turn_labels"] = [dict(label) for label in self.turn_labels]
        return Hindsight(won, 1.0 if won else 0.0, "\n".join(lines), details)

    def _label_context(self) -> list[str] | None:
        return self._expert_plan()

    def _label_turn(self, parsed: ParsedAction, transition: Transition, before: list[str] | None) -> dict[str, Any]:
        if not transition.admissible:
            after = before  # "Nothing happens.": the state did not change
        elif self.engine.won:
            after = []
        else:
            after = self._expert_plan()
        delta = None if before is None or after is None else len(after) - len(before)
        return {
            "progress": bool(self.engine.won and transition.admissible) if delta is None else delta < 0,
            "delta": delta,
            "expert_action": before[0] if before else None,
            "plan_length_before": None if before is None else len(before),
            "plan_length_after": None if after is None else len(after),
        }

    def close(self) -> None:
        self.engine.close()
        super().close()

    # -- helpers -----------------------------------------------------------------------------------

    def _command(self, text: str) -> str:
        if self.normalize_commands:
            return _WS.sub(" ", text).strip().lower()
        return text

    def _observe(self, text: str) -> str:
        if not self.admissible_in_observation:
            return text
        return f"{text}\n\nAdmissible actions: " + ", ".join(self.engine.admissible_commands)

    def _expert_plan(self) -> list[str] | None:
        """The planner expert's commands from the current state (cached per state), None if it has none."""
        if self.task_spec is None or self.engine.game is None or self.engine.facts is None:
            return None
        key = self.state_key()
        if key not in self._plans:
            try:
                world = World.from_facts(self.engine.facts.facts, self.engine.game.names)
                self._plans[key] = plan(world, self.task_spec)
            except ExpertError:
                self._plans[key] = None
        commands = self._plans[key]
        return list(commands) if commands is not None else None

    @property
    def game_file(self) -> Path | None:
        return self.entry.game_file if self.entry else None


class _Search:
    """What the agent has read in this episode, for the searching expert (`expert_searches=True`):
    the receptacles in the order the first observation lists them, those it went to, where it is,
    whether that receptacle is closed, and every "a/an/some <name> <n>" an observation showed."""

    def __init__(self, receptacles: list[str]) -> None:
        self.order = list(dict.fromkeys(receptacles))
        self.visited: set[str] = set()
        self.here: str | None = None
        self.closed_here = False
        self.seen: set[str] = set()

    def saw(self, command: str, feedback: str) -> None:
        """Record an admissible command and the observation it gave."""
        if command.startswith("go to "):
            self.here = command[len("go to "):]
            self.visited.add(self.here)
            self.closed_here = "is closed" in feedback
        elif command.startswith("examine "):
            self.visited.add(command[len("examine "):])
        elif self.here is not None and command == f"open {self.here}":
            self.closed_here = False
        self.seen.update(name.rsplit(" ", 1)[0] for name in _NAMED.findall(feedback))

    def next_command(self, plan: list[str], admissible: Sequence[str]) -> str:
        """The planner's next command, unless it heads for an object of a kind no observation has
        shown yet: then open the receptacle here if it is closed, else go to the next unvisited one
        (or examine it when it stands where the agent is, so that `go to` it is not admissible)."""
        target = next((c.split(" ", 1)[1].split(" from ", 1)[0] for c in plan if c.startswith("take ")), None)
        if target is None or target.rsplit(" ", 1)[0] in self.seen:
            return plan[0]
        if self.closed_here and self.here is not None and f"open {self.here}" in admissible:
            return f"open {self.here}"
        for receptacle in self.order:
            if receptacle in self.visited or receptacle == self.here:
                continue
            for command in (f"go to {receptacle}", f"examine {receptacle}"):
                if command in admissible:
                    return command
        return plan[0]  # nothing left to look at: the planner knows where it is
