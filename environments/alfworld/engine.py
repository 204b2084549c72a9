"""`AlfredEngine`: plays a compiled ALFWorld game on fast-downward, with ALFWorld's text.

- `engine.load(game)`: the `CompiledGame` (`compiled.compile_game`) that the next `reset` starts.
- `engine.reset() -> str`: the game's intro; `engine.step(command) -> str`: the feedback, or `NOTHING_HAPPENS`
  (and no change) for a command that is not admissible.
- After each: `admissible_commands` (sorted), `won`, `moves`, `facts` (TextWorld `State` of the true facts);
  `state_key_parts()` (what decides the text the agent can see and the commands it can give).
- `engine.close()`: gives its copy of fast-downward's library back to the process's pool.

The text, the admissible commands and `won` are those of alfworld's `AlfredTWEnv` (TextWorld's `PddlEnv` in
`AlfredDemangler`) for the same game and commands; tests/environments/alfworld/test_parity.py plays them side by
side. As `PddlEnv`, a step asks fast-downward's C library for the operators applicable in the new state and
never caches admissible commands. Unlike it, a step parses nothing: the feedback is rendered from the grammar
parsed once per process (`grammar.Renderer`), and a command whose text reads only facts no action changes is
rendered once per operator.
"""

from __future__ import annotations

import threading
from collections import Counter, defaultdict
from typing import Any

from environments.alfworld.compiled import CompiledGame, Operator
from environments.alfworld.grammar import Renderer, TextWorldImports, text_reads_only
from environments.alfworld.paths import import_alfworld

__all__ = ["NOTHING_HAPPENS", "AlfredEngine"]

NOTHING_HAPPENS = "Nothing happens."

# Facts that record what the agent has looked at; no precondition, goal or sentence of the ALFRED domain
# and grammar reads them (tests/environments/alfworld/test_engine.py checks this), so they are left out of
# the state key: looking twice does not make a new state.
BOOKKEEPING_PREDICATES = frozenset({"checked", "examined"})


class _FactState:
    """Factory for TextWorld `State` objects over the pddl GameLogic (whose class TextWorld's State
    constructor does not accept), so that `all_assignments` answers grammar queries exactly as in
    TextWorld."""

    @staticmethod
    def empty(logic):
        tw = TextWorldImports.load()
        state = tw.logic.State.__new__(tw.logic.State)
        state._logic = logic
        state._facts = defaultdict(set)
        state._vars_by_name = {}
        state._vars_by_type = defaultdict(set)
        state._var_counts = Counter()
        return state

    @staticmethod
    def clone(state):
        copy = _FactState.empty(state._logic)
        for sig, facts in state._facts.items():
            copy._facts[sig] = set(facts)
        copy._vars_by_name = dict(state._vars_by_name)
        for k, v in state._vars_by_type.items():
            copy._vars_by_type[k] = set(v)
        copy._var_counts = Counter(state._var_counts)
        return copy


# ---------------------------------------------------------------------------------------------------------
# fast-downward libraries: each engine needs its own copy (the library holds one current state).


class _LibraryPool:
    """Loaded copies of fast-downward's library, reused across engines (loading one copies the library's file)."""

    def __init__(self) -> None:
        self._free: list[Any] = []
        self._lock = threading.Lock()

    def acquire(self):
        with self._lock:
            if self._free:
                return self._free.pop()
        return TextWorldImports.load().fast_downward.load_lib()

    def release(self, lib) -> None:
        if lib is not None:
            with self._lock:
                self._free.append(lib)


_LIBRARIES = _LibraryPool()


class AlfredEngine:
    """Plays one ALFWorld game at a time on fast-downward, with ALFWorld's text.

    Usage: `engine.load(compile_game(path)); text = engine.reset(); text = engine.step("go to desk 1")`.
    After each call: `engine.admissible_commands` (sorted), `engine.won`, `engine.facts` (the TextWorld
    State of true facts), `engine.moves`.
    """

    def __init__(self) -> None:
        self.game: CompiledGame | None = None
        self._lib = None
        self.facts = None
        self.won = False
        self.moves = 0
        self._commands: dict[str, tuple[int, int, str]] = {}
        self.admissible_commands: list[str] = []
        self._fluents: set[tuple[str, tuple[str, ...]]] = set()

    # -- lifecycle ---------------------------------------------------------------------------------------

    def load(self, game: CompiledGame) -> None:
        """Use `game` from the next `reset`."""
        self.game = game

    def close(self) -> None:
        """Give the fast-downward library back to the pool."""
        lib, self._lib = self._lib, None
        _LIBRARIES.release(lib)

    def __del__(self) -> None:  # an engine dropped without close() still returns its library
        try:
            self.close()
        except Exception:  # noqa: BLE001, S110 - a finaliser must not raise
            pass

    # -- playing -----------------------------------------------------------------------------------------

    def reset(self) -> str:
        """Start the loaded game from its initial state; returns ALFWorld's intro text."""
        game = self.game
        if game is None:
            raise RuntimeError("AlfredEngine.reset() before load()")
        if self._lib is None:
            self._lib = _LIBRARIES.acquire()
        self._lib.load_sas(game.sas)  # decompressed here: a game in memory keeps it compressed
        if game.initial_ops is None:  # set last by _first_load: when it is there, everything is
            with game.first_load_lock:
                if game.initial_ops is None:
                    self._first_load(game)
        self.facts = _FactState.clone(game.initial_facts)
        self._fluents = {
            (f.name, tuple(a.name for a in f.arguments))
            for f in game.initial_facts.facts
            if f.name not in game.static_predicates
        }
        self.moves = 0
        self.won = bool(self._lib.check_goal())
        self._set_operators(game.initial_ops)
        return game.intro

    def step(self, command: str) -> str:
        """Play one command (TextWorld strips it and matches it exactly); returns the feedback text.

        A command that is not admissible changes nothing and gives "Nothing happens.", as in PddlEnv."""
        if self.facts is None:
            raise RuntimeError("AlfredEngine.step() before reset()")
        command = command.strip()
        entry = self._commands.get(command)
        if entry is None:
            return NOTHING_HAPPENS
        op_id, n_effects, op_name = entry
        tw = TextWorldImports.load()
        effects = (tw.pddl_logic.Atom * n_effects)()
        self._lib.apply_operator(op_id, effects)
        name2type = self.game.name2type
        for effect in effects:
            prop = effect.get_fact(name2type)
            negation = prop.negate()
            self.facts.remove_fact(negation)
            self.facts.add_fact(prop)
            self._fluents.discard((negation.name, tuple(a.name for a in negation.arguments)))
            self._fluents.add((prop.name, tuple(a.name for a in prop.arguments)))
        self.moves += 1
        op = self._operator(op_name)
        feedback = self.game.renderer.render(
            self.game.grammar.feedback[op.action], self.facts, dict(op.variables), dict(op.mapping)
        )
        self.won = bool(self._lib.check_goal())
        self._set_operators(self._applicable())
        return feedback

    def state_key_parts(self) -> tuple[str, tuple]:
        """The game and the facts that decide what the agent can see and do, sorted: two states with
        equal parts give the same text for every command and the same admissible commands.

        Kept: the true atoms that actions change, and the `not_*` records of deleted atoms that the
        grammar's text reads (`not_inreceptacle`, `not_istoggled` in ALFRED's grammar; see
        `negated_predicates_read`). Left out: atoms no action changes (the same in every state of the
        game, identified by its key), the other `not_*` records (history no text or precondition reads,
        e.g. `not_atlocation`), and the `checked`/`examined` bookkeeping of what was looked at."""
        read = self.game.negated_read
        fluents = tuple(
            sorted(
                f
                for f in self._fluents
                if f[0] not in BOOKKEEPING_PREDICATES and (not f[0].startswith("not_") or f[0] in read)
            )
        )
        return self.game.key, fluents

    def command_for(self, command: str) -> bool:
        """Whether `command` (stripped) is admissible now."""
        return command.strip() in self._commands

    # -- internals ---------------------------------------------------------------------------------------

    def _first_load(self, game: CompiledGame) -> None:
        """Initial facts, names, intro and initial commands of a game (once per process, under the
        game's `first_load_lock`; `initial_ops`, which other threads check, is set last)."""
        tw = TextWorldImports.load()
        state = _FactState.empty(game.grammar.logic)
        state.add_facts(game.init_facts)
        size = self._lib.get_state_size()
        atoms = (tw.pddl_logic.Atom * size)()
        self._lib.get_state(atoms)
        for atom in atoms:
            fact = atom.get_fact(game.name2type)
            if not fact.is_negation:
                state.add_fact(fact)
        infos = {}
        for fact in state.facts:
            for var in fact.arguments:
                info = tw.EntityInfo(var.name, var.type)
                info.name = var.name
                info.definite = "the"
                info.indefinite = "a"
                infos[var.name] = info
        # ALFWorld's names ("cabinet 3") from the mangled ALFRED ids, as AlfredDemangler does. An id
        # without ALFRED's "_bar_" parts ("desk", "book1" in a hand-written problem) keeps its own name,
        # as TextWorld's PddlEnv names it: the demangler would make it "desk " (a trailing space that no
        # stripped command matches, and "a desk ," in the text).
        misc = import_alfworld("alfworld.agents.utils.misc")
        demangler = misc.Demangler(game_infos=infos, shuffle=False)
        for info in infos.values():
            info.name = demangler.demangle_alfred_name(info.id) if "_bar_" in info.id else info.id
        game.infos = infos
        game.renderer = Renderer(game.grammar, game.task_rule, infos)
        game.initial_facts = state
        self.facts = state
        game.intro = game.renderer.render(game.grammar.symbols("#intro#"), state, {}, {})
        game.initial_ops = self._applicable()

    def _applicable(self) -> list[tuple[int, int, str]]:
        tw = TextWorldImports.load()
        count = self._lib.get_applicable_operators_count()
        ops = (tw.fast_downward.Operator * count)()
        self._lib.get_applicable_operators(ops)
        return [(op.id, op.nb_effect_atoms, op.name) for op in ops]

    def _set_operators(self, ops: list[tuple[int, int, str]]) -> None:
        commands: dict[str, tuple[int, int, str]] = {}
        seen: set[str] = set()
        for op_id, n_effects, name in ops:
            if name in seen:  # PddlEnv keeps the first operator of each name
                continue
            seen.add(name)
            command = self._command(name)
            commands.setdefault(command, (op_id, n_effects, name))  # ... and the first one of each command
        self._commands = commands
        self.admissible_commands = sorted(commands)

    def _operator(self, name: str) -> Operator:
        game = self.game
        op = game.operators.get(name)
        if op is not None:
            return op
        tw = TextWorldImports.load()
        action, *args = name.split()
        params = game.action_params[action]
        # fast-downward may add parameters for quantified variables (examineReceptacle's ?l); the operator
        # name lists only the declared ones, which zip pairs up, as in PddlState.all_applicable_actions.
        mapping = {tw.Placeholder(p, t): tw.Variable(a, t) for (p, t), a in zip(params, args)}
        variables = {ph.name: game.infos[var.name] for ph, var in mapping.items()}
        op = Operator(action=action, command=None, variables=variables, mapping=mapping)
        if text_reads_only(game.grammar.templates[action], game.static_predicates):
            op.command = self._render_command(op)
        game.operators[name] = op
        return op

    def _command(self, name: str) -> str:
        op = self._operator(name)
        return op.command if op.command is not None else self._render_command(op)

    def _render_command(self, op: Operator) -> str:
        game = self.game
        text = game.renderer.render(game.grammar.templates[op.action], self.facts, dict(op.variables), dict(op.mapping))
        if "{" in text:  # PddlEnv formats the derived template with every entity's name
            text = text.format(**{k: v.name for k, v in game.infos.items()})
        return text
