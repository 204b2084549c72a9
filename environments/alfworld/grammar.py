"""The ALFRED text grammar of a game: parsed once per process, rendered into text as TextWorld renders it.

- `grammar_for(domain, grammar_text) -> (Grammar, task_rule)`: the parsed grammar, shared by every game whose
  grammar differs only by its task sentence; `task_rule` is that game's own `#task#` production (or None).
- `Renderer(grammar, task_rule, infos).render(symbols, state, variables, mapping) -> str`: text with the semantics
  of TextWorld's `ContextSensitiveGrammar.derive`; conditions and list queries are answered by TextWorld's
  `State.all_assignments` over `state`'s facts.
- `text_reads_only(symbols, predicates) -> bool`: whether a text can change only with facts of `predicates`.
- `TextWorldImports.load()`: textworld and fast-downward, imported on first use (they are heavy); and
  `GameFileError`, raised by every module of the engine for a game that cannot be read or played.

Why: TextWorld's `PddlEnv` re-parses each command template and feedback rule with a PEG parser, and deep-copies
its contexts, at every step; here the parsed symbols are rendered directly. TextWorld's parsers keep state in the
parser object, so every parse goes through one lock; once a game's grammar is parsed, playing it parses nothing.
"""

from __future__ import annotations

import builtins
import hashlib
import json
import re
import sys
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["GameFileError", "Grammar", "Renderer", "TextWorldImports", "grammar_for", "text_reads_only"]


class GameFileError(ValueError):
    """A game file cannot be read or played; the message names the file and the problem."""


# ---------------------------------------------------------------------------------------------------------
# TextWorld pieces (imported lazily: textworld and fast_downward are heavy).


class TextWorldImports:
    """TextWorld and fast-downward symbols, imported on first use."""

    loaded = False

    @classmethod
    def load(cls) -> type[TextWorldImports]:
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


# ---------------------------------------------------------------------------------------------------------
# The grammar: parsed once, rendered by a small evaluator over TextWorld's symbols.

# TextWorld's grammar and logic parsers (tatsu) keep state in the parser object: two threads parsing at
# once fail ("pop from empty list", "expecting 'action'"). Every parse, and the caches they fill, go
# through this lock; once a game's grammar is parsed, playing it parses nothing more.
_PARSE_LOCK = threading.RLock()

_TASK_RULE = re.compile(r'("task"\s*:\s*\[\s*\{\s*"rhs"\s*:\s*)"((?:[^"\\]|\\.)*)"')
_TASK_PLACEHOLDER = "@@AGENTGYM-TASK@@"


@dataclass
class Grammar:
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

    def add_types(self, types: Iterable[tuple[str, list[str]]]) -> None:
        """Add a game's PDDL types `(name, supertypes)` to the logic, as PddlState does: the grammar's queries
        use them. The logic is shared by every game with this grammar; a type already there stays."""
        tw = TextWorldImports.load()
        with _PARSE_LOCK:
            for name, supertypes in types:
                try:
                    self.logic.types.add(tw.logic.Type(name, supertypes))
                except ValueError:
                    pass


def _parse_symbols(text: str) -> list[Any]:
    tw = TextWorldImports.load()
    with _PARSE_LOCK:
        grammar = tw.textgen.ContextSensitiveGrammar.parse(json.dumps({"x": [{"rhs": text}]}))
    return list(grammar._rules["x"][0].rhs)


_CONDITIONS: dict[str, Any] = {}


def _condition(text: str):
    """A grammar condition or list query, parsed once per process."""
    rule = _CONDITIONS.get(text)
    if rule is None:
        tw = TextWorldImports.load()
        with _PARSE_LOCK:
            rule = tw.Rule.parse_conjunctive_query(text)
        _CONDITIONS[text] = rule
    return rule


_GRAMMARS: dict[str, Grammar] = {}


def grammar_for(domain: str, grammar_text: str) -> tuple[Grammar, list[Any] | None]:
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
    compiled (its translation, its JSON) stayed in memory until the next parse."""
    for module in ("textworld.envs.pddl.textgen", "textworld.envs.pddl.logic", "textworld.logic"):
        parser = getattr(sys.modules.get(module), "_PARSER", None)
        if parser is not None and getattr(parser, "_furthest_exception", None) is not None:
            parser._furthest_exception = None


def _grammar_for_locked(domain: str, grammar_text: str) -> tuple[Grammar, list[Any] | None]:
    match = _TASK_RULE.search(grammar_text)
    task_rhs: list[Any] | None = None
    if match is not None:
        key = grammar_text[: match.start(2)] + _TASK_PLACEHOLDER + grammar_text[match.end(2) :]
        tw = TextWorldImports.load()
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


def _parse_grammar(domain: str, grammar_text: str) -> Grammar:
    tw = TextWorldImports.load()
    try:
        logic = tw.pddl_logic.GameLogic(domain=domain, grammar=grammar_text)
    except Exception as e:  # noqa: BLE001 - whatever TextWorld's parser raises, the game's grammar is at fault
        raise GameFileError(f"TextWorld could not parse the game's grammar: {type(e).__name__}: {e}") from None
    rules: dict[str, list[tuple[Any, list[Any]]]] = {}
    for name, productions in logic.grammar._rules.items():
        rules[name] = [(_condition(p.condition) if p.condition else None, list(p.rhs)) for p in productions]
    templates = {name: _parse_symbols(a.template) for name, a in logic.actions.items()}
    feedback = {name: _parse_symbols(a.feedback_rule) for name, a in logic.actions.items()}
    return Grammar(logic=logic, rules=rules, templates=templates, feedback=feedback)


class Renderer:
    """Derives text from grammar symbols, with the semantics of TextWorld's ContextSensitiveGrammar.derive.

    A context is `(variables, mapping)`: `variables` maps placeholder names to EntityInfo (what `{r.name}`
    reads), `mapping` maps Placeholders to Variables (what conditions and list queries start from).
    A non-terminal takes its first production whose condition holds; a list `[{expr | query}]` renders
    `expr` for every assignment of the query, joined with the `list_separator`, `list_last_separator`
    and `list_empty` productions.
    """

    def __init__(self, grammar: Grammar, task_rule: list[Any] | None, infos: Mapping[str, Any]) -> None:
        tw = TextWorldImports.load()
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
        return eval(code, self._globals, variables)  # the expressions come from the game's grammar

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
            contexts = self._contexts(symbol.given, state, variables, mapping)
            return [self._symbol(symbol.expression, state, v, m) for v, m in contexts]
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
    tw = TextWorldImports.load()
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


def _reads_only(query: str, static_predicates: frozenset[str]) -> bool:
    rule = _condition(query)
    return all(p.name in static_predicates for p in rule.preconditions)


def text_reads_only(symbols: Iterable[Any], predicates: frozenset[str]) -> bool:
    """Whether the text of `symbols` depends on facts of `predicates` alone: it has no non-terminal (a
    production may have conditions) and each of its list and conditional queries reads only those predicates.
    Such a text is the same in every state of a game whose `predicates` no action changes."""
    return all(q != "#nonterminal#" and _reads_only(q, predicates) for q in _queries_in(symbols))
