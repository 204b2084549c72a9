"""ALFWorld's text engine: TextWorld's PDDL machinery (fast-downward + the ALFRED grammar), compiled once per game.

An ALFWorld game is a `game.tw-pddl` file: the ALFRED PDDL domain, the ALFRED text grammar (with the task
sentence written in), the PDDL problem (the room), a `solvable` flag and a walkthrough. alfworld's
`AlfredTWEnv` plays it with TextWorld's `PddlEnv` wrapped in `AlfredDemangler` (object names such as
"potato 2"). That engine repeats a lot of work: every `reset` translates the PDDL again (twice), and every
step re-parses each command template and feedback rule with a PEG parser and deep-copies its contexts.

This module plays the same games on the same components and gives the same text, but does each piece
of per-game work once:

- the PDDL -> SAS translation (`fast_downward.pddl2sas`), the initial facts and the object names are
  computed once per game file and kept in a per-process cache (`compile_game`);
- the grammar is parsed once per process (games differ only by their task sentence);
- each step asks fast-downward's C library for the applicable operators and applies the chosen one,
  exactly as `PddlEnv` does, and renders the feedback with a small evaluator over TextWorld's parsed
  grammar symbols, whose conditions and list queries are answered by TextWorld's own
  `State.all_assignments` over the same facts;
- the command string of an operator depends only on static facts in the ALFRED grammar, so it is
  rendered once per operator and cached.

`tests/environments/alfworld/test_parity.py` plays real and generated games side by side with
alfworld's `AlfredTWEnv` / TextWorld's `PddlEnv` and checks the observations, admissible commands and
`won` are identical.
"""

from __future__ import annotations

import builtins
import gzip
import hashlib
import json
import os
import re
import sys
import threading
import zlib
from collections import Counter, OrderedDict, defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from agentgym_opsd.io import DataFileError, parse_json
from environments.alfworld.paths import alfworld_package_dir, cache_root, import_alfworld

__all__ = [
    "AlfredEngine",
    "CompiledGame",
    "GameFileError",
    "compile_game",
    "modernize_game_data",
    "read_game_file",
    "NOTHING_HAPPENS",
]

NOTHING_HAPPENS = "Nothing happens."

# Facts that record what the agent has looked at; no precondition, goal or sentence of the ALFRED domain
# and grammar reads them (tests/environments/alfworld/test_engine.py checks this), so they are left out of
# the state key: looking twice does not make a new state.
BOOKKEEPING_PREDICATES = frozenset({"checked", "examined"})

# TextWorld records an atom that an action deleted as a `not_<predicate>` fact. Most are history that
# nothing reads, but the grammar's text may: ALFRED's `look` lists the objects at the agent's location
# with `not_inreceptacle(o, r)` (an object taken from a receptacle there and put into another one there
# shows "Next to it, you see ..."), and `examine` says "This desklamp is off." on `not_istoggled`. The
# state key keeps exactly the `not_*` facts the game's grammar reads.
_NEGATED_READ = re.compile(r"\bnot_(\w+)\s*\(")


def negated_predicates_read(grammar_text: str) -> frozenset[str]:
    """The `not_<predicate>` facts a grammar's conditions and list queries read (e.g. `not_inreceptacle`)."""
    return frozenset(f"not_{name.lower()}" for name in _NEGATED_READ.findall(grammar_text))


class GameFileError(ValueError):
    """A game file cannot be read or played; the message names the file and the problem."""


# ---------------------------------------------------------------------------------------------------------
# Game files of the json_2.1.1 era.

# alfworld 0.4 renamed the put action ("put X in/on Y" -> "move X to Y"), fixed a typo in the go-to feedback
# and added a `help` action. Its hand-coded expert only knows the new names, so older game files are brought
# up to date when loaded (the same edits as alfworld's scripts/patch_tw-pddl.py, written here from the
# grammar itself).
_LEGACY_PUT_TEMPLATE = "put {o} in/on {r}"
_LEGACY_PUT_FEEDBACK = "You put the {o.name} in/on the {r.name}."
_LEGACY_GOTO_FEEDBACK = "You arrive at {lend.name}."
_HELP_ACTION_PDDL = "(:action help\n    :parameters (?a - agent)\n    :precondition\n        ()\n    :effect\n        (and\n            (checked ?a)\n        )\n)\n"


def _help_grammar_from(grammar_text: str) -> str:
    """The `help` action block of the alfred.twl2 that the alfworld wheel ships."""
    start = grammar_text.find("action help {")
    if start < 0:
        raise GameFileError("the shipped alfred.twl2 has no help action")
    return "\n" + grammar_text[start:]


def modernize_game_data(data: dict[str, Any], shipped_grammar: str | None = None) -> tuple[dict[str, Any], bool]:
    """Bring a json_2.1.1-era game up to alfworld 0.4's action names.

    Returns:
        `(data, changed)`: a new dict where the grammar uses "move X to Y", the go-to feedback names the
        receptacle, and the `help` action exists in the domain and grammar; `changed` says whether
        anything was rewritten (the input is never modified).
    """
    grammar = data["grammar"]
    domain = data["pddl_domain"]
    changed = False
    if _LEGACY_PUT_TEMPLATE in grammar or _LEGACY_PUT_FEEDBACK in grammar or _LEGACY_GOTO_FEEDBACK in grammar:
        grammar = (
            grammar.replace(_LEGACY_PUT_TEMPLATE, "move {o} to {r}")
            .replace(_LEGACY_PUT_FEEDBACK, "You move the {o.name} to the {r.name}.")
            .replace(_LEGACY_GOTO_FEEDBACK, "You arrive at {r.name}.")
        )
        changed = True
    if re.search(r"\(:action\s+help\b", domain) is None:
        body, _, tail = domain.rpartition(")")
        domain = f"{body}{_HELP_ACTION_PDDL}){tail}"
        changed = True
    if re.search(r"\baction\s+help\s*\{", grammar) is None:
        if shipped_grammar is None:
            shipped_grammar = (alfworld_package_dir() / "data" / "alfred.twl2").read_text()
        grammar = grammar.rstrip("\n") + "\n" + _help_grammar_from(shipped_grammar)
        changed = True
    if not changed:
        return data, False
    out = dict(data)
    out["grammar"] = grammar
    out["pddl_domain"] = domain
    return out, True


def read_game_file(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read a `game.tw-pddl` file, with a clear error when it is not one."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise GameFileError(f"{path}: no such game file") from None
    try:
        data = parse_json(raw, path)
    except DataFileError as e:  # names the file and the line
        raise GameFileError(str(e).replace(": invalid JSON: ", ": not a game.tw-pddl JSON file: ", 1)) from None
    if not isinstance(data, dict):
        raise GameFileError(f"{path}:1: a game file is a JSON object, got {type(data).__name__}")
    missing = [k for k in ("pddl_domain", "grammar", "pddl_problem") if not isinstance(data.get(k), str)]
    if missing:
        raise GameFileError(f"{path}: game file lacks {', '.join(missing)}")
    return data


# ---------------------------------------------------------------------------------------------------------
# TextWorld pieces (imported lazily: textworld and fast_downward are heavy).


class _TW:
    """TextWorld and fast-downward symbols, imported on first use."""

    loaded = False

    @classmethod
    def load(cls) -> type[_TW]:
        if cls.loaded:
            return cls
        try:
            import fast_downward
            import textworld.logic as tw_logic
            from textworld.envs.pddl import logic as pddl_logic
            from textworld.envs.pddl import textgen
            from textworld.generator.game import EntityInfo
        except ImportError as e:  # pragma: no cover - depends on the install
            raise GameFileError(
                f"ALFWorld needs textworld==1.7.0 with fast-downward ({e}); "
                "install it with `pip install alfworld==0.4.2 textworld==1.7.0` (the venv's bin on PATH)"
            ) from None
        cls.fast_downward = fast_downward
        cls.logic = tw_logic
        cls.pddl_logic = pddl_logic
        cls.textgen = textgen
        cls.EntityInfo = EntityInfo
        cls.Proposition = tw_logic.Proposition
        cls.Variable = tw_logic.Variable
        cls.Placeholder = tw_logic.Placeholder
        cls.Rule = tw_logic.Rule
        cls.loaded = True
        return cls


_TRANSLATE_LOCK = threading.Lock()


def _translate(domain: str, problem: str):
    """fast-downward's PDDL -> SAS translation, as TextWorld's PddlState calls it (unoptimised).

    `pddl2sas` overwrites `sys.argv` (its option module reads it) and keeps module-level options: it is
    serialised and `sys.argv` is put back."""
    tw = _TW.load()
    with _TRANSLATE_LOCK:
        argv = list(sys.argv)
        try:
            return tw.fast_downward.pddl2sas(domain, problem, verbose=False)
        except (Exception, SystemExit) as e:  # its parser may sys.exit() on bad input
            raise GameFileError(f"fast-downward could not translate the game's PDDL: {type(e).__name__}: {e}") from None
        finally:
            sys.argv[:] = argv


class _FactState:
    """Factory for TextWorld `State` objects over the pddl GameLogic (whose class TextWorld's State
    constructor does not accept), so that `all_assignments` answers grammar queries exactly as in
    TextWorld."""

    @staticmethod
    def empty(logic):
        tw = _TW.load()
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
# The grammar: parsed once, rendered by a small evaluator over TextWorld's symbols.

# TextWorld's grammar and logic parsers (tatsu) keep state in the parser object: two threads parsing at
# once fail ("pop from empty list", "expecting 'action'"). Every parse, and the caches they fill, go
# through this lock; once a game's grammar is parsed, playing it parses nothing more.
_PARSE_LOCK = threading.RLock()

_TASK_RULE = re.compile(r'("task"\s*:\s*\[\s*\{\s*"rhs"\s*:\s*)"((?:[^"\\]|\\.)*)"')
_TASK_PLACEHOLDER = "@@AGENTGYM-TASK@@"


@dataclass
class _Grammar:
    """One parsed ALFRED grammar: action templates and feedback rules, and the production rules."""

    logic: Any  # textworld.envs.pddl.logic.GameLogic
    rules: dict[str, list[tuple[Any, list[Any]]]]  # name -> [(condition Rule or None, rhs symbols)]
    templates: dict[str, list[Any]]  # action name -> symbols of its command template
    feedback: dict[str, list[Any]]  # action name -> symbols of its feedback rule
    parsed: dict[str, list[Any]] = field(default_factory=dict)  # start string -> symbols (cache)

    def symbols(self, text: str) -> list[Any]:
        """The grammar symbols of a start string such as "#intro#" (parsed once)."""
        out = self.parsed.get(text)
        if out is None:
            out = _parse_symbols(text)
            self.parsed[text] = out
        return out


def _parse_symbols(text: str) -> list[Any]:
    tw = _TW.load()
    with _PARSE_LOCK:
        grammar = tw.textgen.ContextSensitiveGrammar.parse(json.dumps({"x": [{"rhs": text}]}))
    return list(grammar._rules["x"][0].rhs)


_CONDITIONS: dict[str, Any] = {}


def _condition(text: str):
    """A grammar condition or list query, parsed once per process."""
    rule = _CONDITIONS.get(text)
    if rule is None:
        tw = _TW.load()
        with _PARSE_LOCK:
            rule = tw.Rule.parse_conjunctive_query(text)
        _CONDITIONS[text] = rule
    return rule


_GRAMMARS: dict[str, _Grammar] = {}


def _grammar_for(domain: str, grammar_text: str) -> tuple[_Grammar, list[Any] | None]:
    """The parsed grammar of a game, shared by every game whose grammar differs only by its task sentence.

    Returns:
        `(grammar, task_rule)`: `task_rule` is the game's own `task` production (rhs symbols) to use
        instead of the shared one, or None when the grammar was parsed whole.
    """
    with _PARSE_LOCK:
        try:
            return _grammar_for_locked(domain, grammar_text)
        finally:
            _release_parse_failures()


def _release_parse_failures() -> None:
    """Drop the furthest parse failure TextWorld's parsers (tatsu) keep after every parse, even a
    successful one: its traceback holds every frame of the caller, locals included, so the last game
    compiled (its translation, its JSON: about a MB) stayed in memory until the next parse."""
    for module in ("textworld.envs.pddl.textgen", "textworld.envs.pddl.logic", "textworld.logic"):
        parser = getattr(sys.modules.get(module), "_PARSER", None)
        if parser is not None and getattr(parser, "_furthest_exception", None) is not None:
            parser._furthest_exception = None


def _grammar_for_locked(domain: str, grammar_text: str) -> tuple[_Grammar, list[Any] | None]:
    match = _TASK_RULE.search(grammar_text)
    task_rhs: list[Any] | None = None
    if match is not None:
        key = grammar_text[: match.start(2)] + _TASK_PLACEHOLDER + grammar_text[match.end(2) :]
        tw = _TW.load()
        task_text = json.loads(f'"{match.group(2)}"')
        task_grammar = tw.textgen.ContextSensitiveGrammar.parse(json.dumps({"task": [{"rhs": task_text}]}))
        task_rhs = list(task_grammar._rules["task"][0].rhs)
    else:
        key = grammar_text
    cache_key = hashlib.sha1((domain + "\x00" + key).encode("utf-8")).hexdigest()
    grammar = _GRAMMARS.get(cache_key)
    if grammar is None:
        grammar = _parse_grammar(domain, key)
        _GRAMMARS[cache_key] = grammar
    return grammar, task_rhs


def _parse_grammar(domain: str, grammar_text: str) -> _Grammar:
    tw = _TW.load()
    try:
        logic = tw.pddl_logic.GameLogic(domain=domain, grammar=grammar_text)
    except Exception as e:
        raise GameFileError(f"TextWorld could not parse the game's grammar: {type(e).__name__}: {e}") from None
    rules: dict[str, list[tuple[Any, list[Any]]]] = {}
    for name, productions in logic.grammar._rules.items():
        rules[name] = [(_condition(p.condition) if p.condition else None, list(p.rhs)) for p in productions]
    templates = {name: _parse_symbols(a.template) for name, a in logic.actions.items()}
    feedback = {name: _parse_symbols(a.feedback_rule) for name, a in logic.actions.items()}
    return _Grammar(logic=logic, rules=rules, templates=templates, feedback=feedback)


class _Renderer:
    """Derives text from grammar symbols, with the semantics of TextWorld's ContextSensitiveGrammar.derive.

    A context is `(variables, mapping)`: `variables` maps placeholder names to EntityInfo (what `{r.name}`
    reads), `mapping` maps Placeholders to Variables (what conditions and list queries start from).
    A non-terminal takes its first production whose condition holds; a list `[{expr | query}]` renders
    `expr` for every assignment of the query, joined with the `list_separator`, `list_last_separator`
    and `list_empty` productions.
    """

    def __init__(self, grammar: _Grammar, task_rule: list[Any] | None, infos: Mapping[str, Any]) -> None:
        tw = _TW.load()
        self.rules = grammar.rules
        self.task_rule = task_rule
        self.infos = infos
        tg = tw.textgen
        self._Terminal, self._Nonterminal = tg.TerminalSymbol, tg.NonterminalSymbol
        self._Eval, self._Conditional, self._List = tg.EvalSymbol, tg.ConditionalSymbol, tg.ListSymbol
        self._code: dict[str, Any] = {}
        self._globals = {"__builtins__": builtins}

    def render(self, symbols: Iterable[Any], state, variables: dict[str, Any], mapping: dict[Any, Any]) -> str:
        return "".join(self._symbol(s, state, variables, mapping) for s in symbols)

    def _production(self, name: str, state, mapping) -> list[Any]:
        if name == "task" and self.task_rule is not None:
            return self.task_rule
        productions = self.rules.get(name)
        if not productions:
            raise GameFileError(f"the grammar has no production for '#{name}#'")
        for condition, rhs in productions:
            if condition is None or next(iter(state.all_assignments(condition, mapping)), None) is not None:
                return rhs
        raise GameFileError(f"no production of '#{name}#' applies")

    def _eval(self, expression: str, variables: dict[str, Any]) -> Any:
        code = self._code.get(expression)
        if code is None:
            code = compile(expression, "<alfred grammar>", "eval")
            self._code[expression] = code
        return eval(code, self._globals, variables)  # noqa: S307 - expressions come from the game's grammar

    def _contexts(self, given: str, state, variables, mapping):
        for assignment in state.all_assignments(_condition(given), mapping):
            new_vars = dict(variables)
            for ph, var in assignment.items():
                new_vars[ph.name] = self.infos[var.name]
            new_mapping = dict(mapping)
            new_mapping.update(assignment)
            yield new_vars, new_mapping

    def _items(self, symbol, state, variables, mapping) -> list[str]:
        """The rendered items of a list symbol's inner symbol."""
        if isinstance(symbol, self._Conditional):
            if not symbol.given:
                return [self._symbol(symbol.expression, state, variables, mapping)]
            return [self._symbol(symbol.expression, state, v, m) for v, m in self._contexts(symbol.given, state, variables, mapping)]
        return [self._symbol(symbol, state, variables, mapping)]

    def _symbol(self, symbol, state, variables, mapping) -> str:
        if isinstance(symbol, self._Terminal):
            return str(symbol.symbol)
        if isinstance(symbol, self._Nonterminal):
            return self.render(self._production(str(symbol.symbol), state, mapping), state, variables, mapping)
        if isinstance(symbol, self._Eval):
            return str(self._eval(symbol.expression, variables))
        if isinstance(symbol, self._Conditional):
            return "".join(self._items(symbol, state, variables, mapping))
        if isinstance(symbol, self._List):
            items = self._items(symbol.symbol, state, variables, mapping)
            if not items:
                return self._symbol(self._Nonterminal("list_empty"), state, variables, mapping)
            if len(items) == 1:
                return items[0]
            sep = self._symbol(self._Nonterminal("list_separator"), state, variables, mapping)
            last = self._symbol(self._Nonterminal("list_last_separator"), state, variables, mapping)
            return sep.join(items[:-1]) + last + items[-1]
        raise GameFileError(f"unknown grammar symbol {symbol!r}")


def _queries_in(symbols: Iterable[Any]) -> list[str]:
    """The list/conditional queries of a symbol sequence (to tell whether its text can change)."""
    tw = _TW.load()
    tg = tw.textgen
    out: list[str] = []
    stack = list(symbols)
    while stack:
        s = stack.pop()
        if isinstance(s, tg.ConditionalSymbol):
            if s.given:
                out.append(s.given)
            stack.append(s.expression)
        elif isinstance(s, tg.ListSymbol):
            stack.append(s.symbol)
        elif isinstance(s, tg.NonterminalSymbol):
            out.append("#nonterminal#")  # a production may have conditions: never cached
    return out


# ---------------------------------------------------------------------------------------------------------
# Compiled games.


@dataclass
class _Operator:
    """One fast-downward operator as a command: what the engine needs to apply it and describe it."""

    action: str
    command: str | None  # cached command text (None: rendered every time, its template reads fluents)
    variables: dict[str, Any]
    mapping: dict[Any, Any]


@dataclass
class CompiledGame:
    """Everything derived once from a game file (shared by every engine in the process).

    What a game keeps is what its resets and steps read: not the game file's JSON, and the SAS
    translation zlib-compressed (a few hundred kB as text, a tenth of that compressed; decompressing it
    at a reset costs well under a millisecond), so that a process can hold many games.

    Attributes:
        key: hash of the game's domain, grammar and problem (identifies the game's states).
        modernized: the legacy put grammar was rewritten on load.
        walkthrough: the game file's walkthrough (may be None).
        sas_compressed: fast-downward's SAS translation, zlib-compressed (`sas` gives it back).
    """

    key: str
    modernized: bool
    walkthrough: list[str] | None
    grammar: _Grammar
    task_rule: list[Any] | None
    sas_compressed: bytes
    action_params: dict[str, list[tuple[str, str]]]
    name2type: dict[str, str]
    init_facts: list[Any]
    static_predicates: frozenset[str]
    negated_read: frozenset[str] = frozenset()  # `not_*` facts the grammar's text reads (kept in the state key)
    infos: dict[str, Any] = field(default_factory=dict)  # entity id -> EntityInfo (demangled names)
    initial_facts: Any = None  # a TextWorld State, set on the first load
    intro: str | None = None
    initial_ops: list[tuple[int, int, str]] | None = None
    operators: dict[str, _Operator] = field(default_factory=dict)
    renderer: _Renderer | None = None
    first_load_lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    @property
    def names(self) -> dict[str, str]:
        """Entity id -> its name in the text ("potato 2")."""
        return {k: v.name for k, v in self.infos.items()}

    @property
    def sas(self) -> bytes:
        """fast-downward's SAS translation of the game (what its library loads at a reset)."""
        return zlib.decompress(self.sas_compressed)


_COMPILED: OrderedDict[str, CompiledGame] = OrderedDict()
_COMPILED_LOCK = threading.Lock()
COMPILED_CACHE_SIZE = int(os.environ.get("AGENTGYM_ALFWORLD_GAME_CACHE", "512"))
# (path, mtime, size, inode, modernize) -> the game's key: a reset of a game in memory reads no file.
_KEYS_OF_FILES: OrderedDict[tuple, str] = OrderedDict()
_KEYS_OF_FILES_SIZE = 65_536
MAX_INTERNED_PROPOSITIONS = 50_000
"""TextWorld interns every `Proposition` it makes in a process-wide table (the `mementos` package's
cache, never emptied): about 2,000 per game, 1 MB, so a process that plays ALFWorld's 3,553 games held
3.5 GB that no game used any more. Past this many, the interned propositions are forgotten (see
`bound_interned_propositions`)."""


def bound_interned_propositions(limit: int | None = None) -> int:
    """Forget TextWorld's interned propositions when there are more than `limit` (default
    `MAX_INTERNED_PROPOSITIONS`); returns how many were forgotten.

    Interning is a cache: `Proposition` compares and hashes by value, so propositions made later are
    equal to the forgotten ones, and the ones games hold stay alive through their own references. The
    table is copied (one C call, atomic under the GIL), filtered and put back in one assignment, so a
    thread that interns meanwhile at worst loses that one entry."""
    try:
        import mementos.core as mementos_core
    except ImportError:  # a TextWorld without it interns nothing
        return 0
    limit = MAX_INTERNED_PROPOSITIONS if limit is None else int(limit)
    table = mementos_core._memento_cache
    if len(table) <= limit:
        return 0
    proposition = _TW.load().Proposition

    def interned_proposition(key: Any) -> bool:
        return type(key) is tuple and bool(key) and isinstance(key[0], type) and issubclass(key[0], proposition)

    snapshot = dict(table)
    kept = {k: v for k, v in snapshot.items() if not interned_proposition(k)}
    mementos_core._memento_cache = kept
    return len(snapshot) - len(kept)


def _file_identity(path: Path, modernize: bool) -> tuple | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return (str(path.resolve()), st.st_mtime_ns, st.st_size, st.st_ino, modernize)


def compile_game(
    source: str | os.PathLike[str] | Mapping[str, Any],
    *,
    modernize: bool = True,
    disk_cache: bool = True,
    cache_dir: str | os.PathLike[str] | None = None,
) -> CompiledGame:
    """Parse and translate a game once (cached by content in this process, and on disk).

    A game already in memory, given by a path whose file has not changed (same modification time,
    size and inode), is returned without reading the file again.

    Args:
        source: a `game.tw-pddl` path, or its JSON content.
        modernize: rewrite json_2.1.1-era put actions to alfworld 0.4's "move X to Y" (see
            `modernize_game_data`).
        disk_cache: keep fast-downward's translation under `<cache>/compiled/<game hash>.json.gz`, so that
            a game is translated once per machine rather than once per process.
        cache_dir: `<cache>` (default `$AGENTGYM_OPSD_CACHE/alfworld` or `~/.cache/agentgym-opsd/alfworld`).
    """
    identity = None if isinstance(source, Mapping) else _file_identity(Path(source), modernize)
    if identity is not None:
        with _COMPILED_LOCK:
            known = _KEYS_OF_FILES.get(identity)
            game = _COMPILED.get(known) if known is not None else None
            if game is not None:
                _COMPILED.move_to_end(known)
                return game
    data = read_game_file(source) if not isinstance(source, Mapping) else dict(source)
    modernized = False
    if modernize:
        data, modernized = modernize_game_data(data)
    digest = hashlib.sha1()
    for part in (data["pddl_domain"], data["grammar"], data["pddl_problem"]):
        digest.update(part.encode("utf-8"))
        digest.update(b"\x00")
    key = digest.hexdigest()
    with _COMPILED_LOCK:
        if identity is not None:
            _KEYS_OF_FILES[identity] = key
            while len(_KEYS_OF_FILES) > _KEYS_OF_FILES_SIZE:
                _KEYS_OF_FILES.popitem(last=False)
        game = _COMPILED.get(key)
        if game is not None:
            _COMPILED.move_to_end(key)
            return game
    path = (Path(cache_dir).expanduser() if cache_dir is not None else cache_root()) / "compiled" / f"{key}.json.gz"
    translation = _load_translation(path) if disk_cache else None
    if translation is None:
        translation = _translation(data)
        if disk_cache:
            _save_translation(path, translation)
    game = _from_translation(key, data, modernized, translation)
    with _COMPILED_LOCK:
        _COMPILED[key] = game
        while len(_COMPILED) > COMPILED_CACHE_SIZE:
            _COMPILED.popitem(last=False)
    bound_interned_propositions()  # a new game: about 2,000 more interned propositions
    return game


TRANSLATION_FORMAT = 1


@lru_cache(maxsize=1)
def _engine_versions() -> dict[str, str]:
    """The format and engine versions a cached translation must match (read once per process: each
    `importlib.metadata` lookup scans the installed distributions, ~10 ms)."""
    from importlib import metadata

    out = {"format": str(TRANSLATION_FORMAT)}
    for dist in ("textworld", "fast-downward-textworld"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = "?"
    return out


def _load_translation(path: Path) -> dict[str, Any] | None:
    try:
        with gzip.open(path, "rt", encoding="utf-8") as f:
            translation = json.load(f)
    except (OSError, EOFError, ValueError):
        return None
    if translation.get("versions") != _engine_versions():
        return None
    return translation


def _save_translation(path: Path, translation: dict[str, Any]) -> None:
    from agentgym_opsd.io import atomic_write_bytes

    try:
        atomic_write_bytes(path, gzip.compress(json.dumps(translation).encode("utf-8"), compresslevel=5, mtime=0))
    except OSError:  # a read-only cache only costs speed
        pass


def _translation(data: Mapping[str, Any]) -> dict[str, Any]:
    """fast-downward's translation of a game, as plain JSON-able data (what PddlState computes at reset)."""
    tw = _TW.load()
    task, sas = _translate(data["pddl_domain"], data["pddl_problem"])
    name2type = {o.name: o.type_name for o in task.objects}
    init_facts: list[list[Any]] = []
    init_predicates: set[str] = set()
    translate = tw.fast_downward.translate
    for atom in task.init:
        if isinstance(atom, translate.pddl.conditions.Atom):
            if atom.predicate == "=":
                continue
            init_predicates.add(atom.predicate)
            init_facts.append([atom.predicate, list(atom.args)])
        elif isinstance(atom, translate.pddl.f_expression.Assign):
            name = f"{atom.expression.value}"
            if atom.fluent.symbol == "total-cost" or name.isdigit():
                continue
            init_facts.append([name, list(atom.fluent.args)])
    effect_predicates = {e.literal.predicate for a in task.actions for e in a.effects}
    return {
        "versions": _engine_versions(),
        "sas": sas,
        "types": [[t.name, list(t.supertype_names)] for t in task.types],
        "name2type": name2type,
        "action_params": {a.name: [[p.name.strip("?"), p.type_name] for p in a.parameters] for a in task.actions},
        "init_facts": init_facts,
        "static_predicates": sorted(init_predicates - effect_predicates),
    }


def _from_translation(key: str, data: dict[str, Any], modernized: bool, translation: Mapping[str, Any]) -> CompiledGame:
    tw = _TW.load()
    grammar, task_rule = _grammar_for(data["pddl_domain"], data["grammar"])
    with _PARSE_LOCK:  # the parsed logic is shared by every game with this grammar
        for name, supertypes in translation["types"]:  # as PddlState does: the types the grammar queries use
            try:
                grammar.logic.types.add(tw.logic.Type(name, supertypes))
            except ValueError:
                pass
    # Names are interned and one Variable per object is shared by its facts: the parsed JSON holds a
    # string per mention (thousands per game), which a game kept in memory would hold on to.
    intern = sys.intern
    name2type = {intern(k): intern(v) for k, v in translation["name2type"].items()}
    variables: dict[str, Any] = {}

    def variable(name: str) -> Any:
        var = variables.get(name)
        if var is None:
            name = intern(name)
            var = variables[name] = tw.Variable(name, name2type[name])
        return var

    init_facts = [tw.Proposition(intern(p), [variable(a) for a in args]) for p, args in translation["init_facts"]]
    walkthrough = data.get("walkthrough")
    return CompiledGame(
        key=key,
        modernized=modernized,
        walkthrough=list(walkthrough) if isinstance(walkthrough, list) else None,
        grammar=grammar,
        task_rule=task_rule,
        sas_compressed=zlib.compress(translation["sas"].encode("utf-8"), 1),
        action_params={intern(k): [(intern(p), intern(t)) for p, t in v] for k, v in translation["action_params"].items()},
        name2type=name2type,
        init_facts=init_facts,
        static_predicates=frozenset(intern(p) for p in translation["static_predicates"]),
        negated_read=negated_predicates_read(data["grammar"]),
    )


# ---------------------------------------------------------------------------------------------------------
# fast-downward libraries: each engine needs its own copy (the library holds one current state).


class _LibraryPool:
    """Loaded copies of fast-downward's library, reused across engines (loading one copies a 33 MB file)."""

    def __init__(self) -> None:
        self._free: list[Any] = []
        self._lock = threading.Lock()

    def acquire(self):
        with self._lock:
            if self._free:
                return self._free.pop()
        return _TW.load().fast_downward.load_lib()

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
        self._loaded_key: str | None = None
        self.facts = None
        self.won = False
        self.moves = 0
        self.last_feedback = ""
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
        self._loaded_key = None
        _LIBRARIES.release(lib)

    def __del__(self) -> None:  # an engine dropped without close() still returns its library
        try:
            self.close()
        except Exception:
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
        self._loaded_key = game.key
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
        self.last_feedback = game.intro
        return game.intro

    def step(self, command: str) -> str:
        """Play one command (TextWorld strips it and matches it exactly); returns the feedback text.

        A command that is not admissible changes nothing and gives "Nothing happens.", as in PddlEnv."""
        if self.facts is None:
            raise RuntimeError("AlfredEngine.step() before reset()")
        command = command.strip()
        entry = self._commands.get(command)
        if entry is None:
            self.last_feedback = NOTHING_HAPPENS
            return NOTHING_HAPPENS
        op_id, n_effects, op_name = entry
        tw = _TW.load()
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
        self.last_feedback = feedback
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
        tw = _TW.load()
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
        game.renderer = _Renderer(game.grammar, game.task_rule, infos)
        game.initial_facts = state
        self.facts = state
        game.intro = game.renderer.render(game.grammar.symbols("#intro#"), state, {}, {})
        game.initial_ops = self._applicable()

    def _applicable(self) -> list[tuple[int, int, str]]:
        tw = _TW.load()
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

    def _operator(self, name: str) -> _Operator:
        game = self.game
        op = game.operators.get(name)
        if op is not None:
            return op
        tw = _TW.load()
        action, *args = name.split()
        params = game.action_params[action]
        # fast-downward may add parameters for quantified variables (examineReceptacle's ?l); the operator
        # name lists only the declared ones, which zip pairs up, as in PddlState.all_applicable_actions.
        mapping = {tw.Placeholder(p, t): tw.Variable(a, t) for (p, t), a in zip(params, args)}
        variables = {ph.name: game.infos[var.name] for ph, var in mapping.items()}
        template = game.grammar.templates[action]
        queries = _queries_in(template)
        cacheable = all(q != "#nonterminal#" and _reads_only(q, game.static_predicates) for q in queries)
        op = _Operator(action=action, command=None, variables=variables, mapping=mapping)
        if cacheable:
            op.command = self._render_command(op)
        game.operators[name] = op
        return op

    def _command(self, name: str) -> str:
        op = self._operator(name)
        return op.command if op.command is not None else self._render_command(op)

    def _render_command(self, op: _Operator) -> str:
        game = self.game
        text = game.renderer.render(game.grammar.templates[op.action], self.facts, dict(op.variables), dict(op.mapping))
        if "{" in text:  # PddlEnv formats the derived template with every entity's name
            text = text.format(**{k: v.name for k, v in game.infos.items()})
        return text


def _reads_only(query: str, static_predicates: frozenset[str]) -> bool:
    rule = _condition(query)
    return all(p.name in static_predicates for p in rule.preconditions)
