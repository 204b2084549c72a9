"""ALFWorld game files, and what is derived once from each game: `compile_game` -> `CompiledGame`.

- `read_game_file(path) -> dict`: a `game.tw-pddl` file: `pddl_domain` (ALFRED's PDDL domain), `grammar` (ALFRED's
  text grammar, the task sentence written in), `pddl_problem` (the room), `solvable`, `walkthrough`.
- `modernize_game_data(data) -> (data, changed)`: a json_2.1.1-era game brought up to alfworld 0.4's actions.
- `compile_game(path | data) -> CompiledGame`: fast-downward's PDDL -> SAS translation, the objects' types, the
  initial facts and the parsed grammar of a game, shared by every engine of the process.
- `GameFileError` (from `grammar`): a game that cannot be read, translated or played; the message names it.

Why: TextWorld's `PddlEnv` translates the PDDL again (twice) at every reset. Here a game is translated once per
machine (the translation is kept under `<cache>/compiled/<game hash>.json.gz`) and compiled once per process
(kept by content, and found by an unchanged file's identity without reading it). A process keeps
`COMPILED_CACHE_SIZE` games ($AGENTGYM_ALFWORLD_GAME_CACHE, default 512) and bounds TextWorld's table of interned
propositions (`bound_interned_propositions`), so that cycling through ALFWorld's 3,553 games holds its memory.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import re
import sys
import threading
import zlib
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from agentgym_opsd.io import DataFileError, atomic_write_bytes, parse_json
from environments.alfworld.grammar import GameFileError, Grammar, Renderer, TextWorldImports, grammar_for
from environments.alfworld.paths import alfworld_package_dir, cache_root

__all__ = [
    "COMPILED_CACHE_SIZE",
    "MAX_INTERNED_PROPOSITIONS",
    "CompiledGame",
    "bound_interned_propositions",
    "compile_game",
    "forget_compiled_games",
    "modernize_game_data",
    "negated_predicates_read",
    "read_game_file",
]

# TextWorld records an atom that an action deleted as a `not_<predicate>` fact. Most are history that
# nothing reads, but the grammar's text may: ALFRED's `look` lists the objects at the agent's location
# with `not_inreceptacle(o, r)` (an object taken from a receptacle there and put into another one there
# shows "Next to it, you see ..."), and `examine` says "This desklamp is off." on `not_istoggled`. The
# state key keeps exactly the `not_*` facts the game's grammar reads.
_NEGATED_READ = re.compile(r"\bnot_(\w+)\s*\(")


def negated_predicates_read(grammar_text: str) -> frozenset[str]:
    """The `not_<predicate>` facts a grammar's conditions and list queries read (e.g. `not_inreceptacle`)."""
    return frozenset(f"not_{name.lower()}" for name in _NEGATED_READ.findall(grammar_text))


# ---------------------------------------------------------------------------------------------------------
# Game files of the json_2.1.1 era.

# alfworld 0.4 renamed the put action ("put X in/on Y" -> "move X to Y"), fixed a typo in the go-to feedback
# and added a `help` action. Its hand-coded expert only knows the new names, so older game files are brought
# up to date when loaded (the same edits as alfworld's scripts/patch_tw-pddl.py, written here from the
# grammar itself).
_LEGACY_PUT_TEMPLATE = "put {o} in/on {r}"
_LEGACY_PUT_FEEDBACK = "You put the {o.name} in/on the {r.name}."
_LEGACY_GOTO_FEEDBACK = "You arrive at {lend.name}."
_HELP_ACTION_PDDL = (
    "(:action help\n    :parameters (?a - agent)\n    :precondition\n        ()\n"
    "    :effect\n        (and\n            (checked ?a)\n        )\n)\n"
)


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


_TRANSLATE_LOCK = threading.Lock()


def _translate(domain: str, problem: str):
    """fast-downward's PDDL -> SAS translation, as TextWorld's PddlState calls it (unoptimised).

    `pddl2sas` overwrites `sys.argv` (its option module reads it) and keeps module-level options: it is
    serialised and `sys.argv` is put back."""
    tw = TextWorldImports.load()
    with _TRANSLATE_LOCK:
        argv = list(sys.argv)
        try:
            return tw.fast_downward.pddl2sas(domain, problem, verbose=False)
        except (Exception, SystemExit) as e:  # noqa: BLE001 - any failure is the game's; its parser may sys.exit()
            raise GameFileError(f"fast-downward could not translate the game's PDDL: {type(e).__name__}: {e}") from None
        finally:
            sys.argv[:] = argv


# ---------------------------------------------------------------------------------------------------------
# Compiled games.


@dataclass
class Operator:
    """One fast-downward operator as a command: what the engine needs to apply it and describe it."""

    action: str
    command: str | None  # cached command text (None: rendered every time, its template reads fluents)
    variables: dict[str, Any]
    mapping: dict[Any, Any]


@dataclass
class CompiledGame:
    """Everything derived once from a game file (shared by every engine in the process).

    What a game keeps is what its resets and steps read: not the game file's JSON, and the SAS
    translation zlib-compressed (a fraction of the text, decompressed at each reset), so that a process
    can hold many games.

    Attributes set by `compile_game`:
        key: hash of the game's domain, grammar and problem (identifies the game's states).
        modernized: the legacy put grammar was rewritten on load.
        walkthrough: the game file's walkthrough (may be None).
        grammar: the parsed grammar, shared by every game whose grammar differs only by its task sentence.
        task_rule: this game's own `#task#` production (None: the grammar's).
        sas_compressed: fast-downward's SAS translation, zlib-compressed (`sas` gives it back).
        action_params: action name -> its declared parameters `(name, type)`, in order.
        name2type: object name -> its PDDL type.
        init_facts: the problem's initial facts (TextWorld Propositions).
        static_predicates: the predicates no action changes.
        negated_read: the `not_*` facts the grammar's text reads (kept in the state key).

    Attributes set by the first engine that resets the game (under `first_load_lock`; `initial_ops` last):
        infos: object name -> TextWorld EntityInfo, named as ALFWorld names it ("potato 2").
        initial_facts: the TextWorld State of the true facts at the start.
        intro: the intro text.
        initial_ops: the operators applicable at the start, `(id, number of effects, name)`.
        renderer: the Renderer of the game's text.
        operators: operator name -> Operator, filled as the engines first meet each operator.
    """

    key: str
    modernized: bool
    walkthrough: list[str] | None
    grammar: Grammar
    task_rule: list[Any] | None
    sas_compressed: bytes
    action_params: dict[str, list[tuple[str, str]]]
    name2type: dict[str, str]
    init_facts: list[Any]
    static_predicates: frozenset[str]
    negated_read: frozenset[str] = frozenset()
    infos: dict[str, Any] = field(default_factory=dict)
    initial_facts: Any = None
    intro: str | None = None
    initial_ops: list[tuple[int, int, str]] | None = None
    operators: dict[str, Operator] = field(default_factory=dict)
    renderer: Renderer | None = None
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
cache, never emptied): each game compiled adds its own, so a process that plays ALFWorld's 3,553 games
held every game's long after it stopped playing them. Past this many, the interned propositions are
forgotten (see `bound_interned_propositions`)."""


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
    proposition = TextWorldImports.load().Proposition

    def interned_proposition(key: Any) -> bool:
        return type(key) is tuple and bool(key) and isinstance(key[0], type) and issubclass(key[0], proposition)

    snapshot = dict(table)
    kept = {k: v for k, v in snapshot.items() if not interned_proposition(k)}
    mementos_core._memento_cache = kept
    return len(snapshot) - len(kept)


def forget_compiled_games() -> None:
    """Empty this process's cache of compiled games, as in a new process (translations on disk stay)."""
    with _COMPILED_LOCK:
        _COMPILED.clear()
        _KEYS_OF_FILES.clear()


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
    bound_interned_propositions()  # a new game: its interned propositions
    return game


TRANSLATION_FORMAT = 1


@lru_cache(maxsize=1)
def _engine_versions() -> dict[str, str]:
    """The format and engine versions a cached translation must match (read once per process: each
    `importlib.metadata` lookup scans the installed distributions)."""
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
    try:
        atomic_write_bytes(path, gzip.compress(json.dumps(translation).encode("utf-8"), compresslevel=5, mtime=0))
    except OSError:  # a read-only cache only costs speed
        pass


def _translation(data: Mapping[str, Any]) -> dict[str, Any]:
    """fast-downward's translation of a game, as plain JSON-able data (what PddlState computes at reset)."""
    tw = TextWorldImports.load()
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
    tw = TextWorldImports.load()
    grammar, task_rule = grammar_for(data["pddl_domain"], data["grammar"])
    grammar.add_types(translation["types"])
    # Names are interned and one Variable per object is shared by its facts: the parsed JSON holds a
    # string per mention, which a game kept in memory would hold on to.
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
        action_params={
            intern(k): [(intern(p), intern(t)) for p, t in v] for k, v in translation["action_params"].items()
        },
        name2type=name2type,
        init_facts=init_facts,
        static_predicates=frozenset(intern(p) for p in translation["static_predicates"]),
        negated_read=negated_predicates_read(data["grammar"]),
    )
