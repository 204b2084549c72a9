"""The layers of the code, as the README's layout section draws them, held against every import.

    benchmarks   benchmarks/              measures everything (run as `python -m benchmarks.NAME`)
    app          agentgym_app/            wires everything together (CLI, bench, report, demo, ...)
    trainer      trainer/                 credit, rows, teacher, local trainer, OpenRLHF bridge
    envs         environments/            one package per env family
    retrieval    retrieval_index/         Lucene index, Flask server, client (a library)
    contract     agentgym_opsd/           the env contract, registry, episodes, rollout

An arrow may only point down: the benchmarks may import anything and only the tests import them;
the app may import anything below it and only the benchmarks import it; the trainer
and the envs import the contract (and envs the retrieval library), never each other; the retrieval
library imports only the contract; the contract imports none of them. `trainer/credit/` is pure
tensor math: it imports torch, numpy, the standard library and itself. Every import counts, also one
inside a function (a lazy import is still an arrow). No module takes another module's underscore
names (`from x import _y`, `x._y`): what another module needs gets a public name.

Our own modules import each other at the top of the file, where these tests see the arrows: a
function may import a heavy third-party library (torch, transformers, pyserini, matplotlib, flask,
...) when it runs, but not one of our modules (`LAZY_ALLOWED` holds the exceptions, each with its
reason), and the imports at module level form no cycle. A command that must not load torch to
start is named in the CLI's command table and imported by name when it runs.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
OURS = ("agentgym_app", "agentgym_opsd", "environments", "retrieval_index", "trainer", "benchmarks")


def layer(module: str) -> str | None:
    """The layer of one of our modules, or None for a third-party or standard module."""
    if module == "agentgym_app" or module.startswith("agentgym_app."):
        return "app"
    top = module.split(".")[0]
    return {"agentgym_opsd": "contract", "environments": "envs", "retrieval_index": "retrieval",
            "trainer": "trainer", "benchmarks": "benchmarks"}.get(top)


# For each layer, the layers it may import (besides itself).
ALLOWED = {
    "benchmarks": {"app", "contract", "envs", "retrieval", "trainer"},
    "app": {"contract", "envs", "retrieval", "trainer"},
    "trainer": {"contract"},
    "envs": {"contract", "retrieval"},
    "retrieval": {"contract"},
    "contract": set(),
}


def imports(path: Path, package: str) -> list[tuple[int, str]]:
    """(line, module) of every import in a file, lazy ones included, relative ones resolved."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            out.append((node.lineno, imported_from(node, package)))
    return out


def imported_from(node: ast.ImportFrom, package: str) -> str:
    """The module a `from ... import` names, a relative one resolved against `package`."""
    if node.level:
        base = package.split(".")[: len(package.split(".")) - node.level + 1]
        return ".".join(base + ([node.module] if node.module else []))
    return node.module or ""


def source_files():
    for top in OURS:
        for path in sorted((REPO / top).rglob("*.py")):
            module = ".".join(path.relative_to(REPO).with_suffix("").parts)
            package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
            yield path, module.removesuffix(".__init__"), package


def test_no_import_points_up_a_layer():
    bad = []
    for path, module, package in source_files():
        mine = layer(module)
        for line, target in imports(path, package):
            theirs = layer(target)
            if theirs is not None and theirs != mine and theirs not in ALLOWED[mine]:
                bad.append(f"{path.relative_to(REPO)}:{line}: {mine} imports {target} ({theirs})")
    assert not bad, "imports that point up or across a layer:\n" + "\n".join(bad)


def test_the_credit_core_imports_only_torch_numpy_and_itself():
    stdlib = set(sys.stdlib_module_names) | {"__future__"}
    bad = []
    for path in sorted((REPO / "trainer" / "credit").rglob("*.py")):
        for line, target in imports(path, "trainer.credit"):
            top = target.split(".")[0]
            if not (target.startswith("trainer.credit") or top in ("torch", "numpy") or top in stdlib):
                bad.append(f"{path.relative_to(REPO)}:{line}: imports {target}")
    assert not bad, "\n".join(bad)


def reaches_by_path(source: str, siblings: set[str], outside: set[str]) -> list[tuple[int, str]]:
    """(line, what) for each way a benchmark module would find code by path rather than as a module of
    the package: editing `sys.path`, importing a sibling by its bare name (`import learning`), or
    importing a package that lives under tests/ (`outside`)."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and node.attr == "path" and isinstance(node.value, ast.Name) \
                and node.value.id == "sys":
            out.append((node.lineno, "sys.path"))
        names = ([alias.name for alias in node.names] if isinstance(node, ast.Import)
                 else [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
        for name in names:
            top = name.split(".")[0]
            if top in siblings:
                out.append((node.lineno, f"import {name} (a sibling by its bare name)"))
            elif top in outside:
                out.append((node.lineno, f"import {name} (from tests/)"))
    return out


def test_benchmarks_are_a_package_run_with_python_m():
    """`python -m benchmarks.NAME` puts the repository root on the path: a benchmark imports its
    siblings as `benchmarks.x`, touches no `sys.path`, and takes no code from tests/ (what it needs
    has a home in the project or in the package)."""
    siblings = {p.stem for p in (REPO / "benchmarks").glob("*.py")} - {"__init__"}
    outside = {p.name for p in (REPO / "tests").rglob("*") if p.is_dir() and (p / "__init__.py").is_file()}
    outside |= {p.stem for p in (REPO / "tests").rglob("*.py")}
    bad = [f"{path.relative_to(REPO)}:{line}: {what}" for path in sorted((REPO / "benchmarks").glob("*.py"))
           for line, what in reaches_by_path(path.read_text(encoding="utf-8"), siblings, outside)]
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize(
    "source,found",
    [("import sys\nsys.path.insert(0, 'x')", ["sys.path"]), ("from held_out_games import twin_free_seeds",
      ["import held_out_games (a sibling by its bare name)"]), ("from benchmarks.held_out_games import x", []),
     ("import agentgym_example_plugin", ["import agentgym_example_plugin (from tests/)"]), ("import os.path", [])],
)
def test_the_package_rule_itself(source, found):
    """The checker can fail: what it finds in a few lines of a benchmark."""
    assert [what for _, what in reaches_by_path(source, {"held_out_games"}, {"agentgym_example_plugin"})] == found


@pytest.mark.parametrize(
    "module,target,allowed",
    [("trainer.rows", "environments.alfworld", False), ("agentgym_opsd.contract", "agentgym_app.cli", False),
     ("agentgym_app.demo", "trainer.local", True), ("environments.searchqa.env", "retrieval_index.client", True),
     ("retrieval_index.cli", "agentgym_opsd.usage", True), ("environments.webshop", "trainer.teacher", False),
     ("agentgym_app.bench", "environments.alfworld.panel", True), ("trainer.local", "agentgym_app.cli", False),
     ("agentgym_opsd.registry", "agentgym_app", False), ("retrieval_index.server", "agentgym_app.report", False),
     ("benchmarks.learning", "trainer.local", True), ("trainer.local", "benchmarks.common", False),
     ("agentgym_app.demo", "benchmarks.learning", False)],
)
def test_the_rules_themselves(module, target, allowed):
    """The checker can fail: a few arrows and whether they are allowed."""
    assert (layer(target) == layer(module) or layer(target) in ALLOWED[layer(module)]) is allowed


# A name with one leading underscore is its module's own business: another module of the project
# that needs it should get a public name for it (dunders such as __version__ are public).
def private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def is_our_module(module: str) -> bool:
    """Is `module` (dotted) a module or package of the project, by its file?"""
    if layer(module) is None:
        return False
    path = REPO.joinpath(*module.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def private_uses(source: str, module: str, package: str) -> list[tuple[int, str]]:
    """(line, what) for each underscore name that `module`'s source takes from another project
    module: `from x import _y`, or `x._y` where x names a project module it imported."""
    tree = ast.parse(source)
    aliases: dict[str, str] = {}  # local name -> the project module it is bound to
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    aliases[alias.asname] = alias.name
                else:
                    top = alias.name.split(".")[0]
                    aliases[top] = top
        elif isinstance(node, ast.ImportFrom):
            source_module = imported_from(node, package)
            if layer(source_module) is None or source_module == module:
                continue
            for alias in node.names:
                if private(alias.name):
                    out.append((node.lineno, f"from {source_module} import {alias.name}"))
                elif is_our_module(f"{source_module}.{alias.name}"):
                    aliases[alias.asname or alias.name] = f"{source_module}.{alias.name}"
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Attribute) and private(node.attr)):
            continue
        parts, value = [], node.value
        while isinstance(value, ast.Attribute):
            parts.append(value.attr)
            value = value.value
        if not isinstance(value, ast.Name) or value.id not in aliases:
            continue
        target = ".".join([aliases[value.id], *reversed(parts)])
        if target != module and is_our_module(target):
            out.append((node.lineno, f"{target}.{node.attr}"))
    return out


def test_no_module_takes_another_modules_underscore_names():
    bad = []
    for path, module, package in source_files():
        for line, what in private_uses(path.read_text(encoding="utf-8"), module, package):
            bad.append(f"{path.relative_to(REPO)}:{line}: {what}")
    assert not bad, "underscore names used outside their module (give them a public name):\n" + "\n".join(bad)


@pytest.mark.parametrize(
    "source,found",
    [
        ("from trainer.rows import _records", ["from trainer.rows import _records"]),
        ("def f():\n    from .rows import _records", ["from trainer.rows import _records"]),
        ("import trainer.rows as r\nr._records(None)", ["trainer.rows._records"]),
        ("import trainer.rows\ntrainer.rows._records", ["trainer.rows._records"]),
        ("from trainer import rows\nrows._records", ["trainer.rows._records"]),
        ("from trainer.rows import build_rows\nx = build_rows._cache", []),  # a function's attribute
        ("import torch\ntorch._C", []),  # not ours
        ("from agentgym_opsd import __version__", []),  # a dunder is public
        ("def _own():\n    pass\n_own()", []),  # a module's own underscore names
    ],
)
def test_the_underscore_rule_itself(source, found):
    """The checker can fail: what it finds in a few lines of a module `trainer.teacher`."""
    assert [what for _, what in private_uses(source, "trainer.teacher", "trainer")] == found


# ---------------------------------------------------------------------------------------------
# Where an import stands: at module level, inside a function, or under `if TYPE_CHECKING:`.

# In-function imports of our own modules that stay, with the reason for each (path, imported module).
LAZY_ALLOWED: dict[tuple[str, str], str] = {
    ("trainer/openrlhf/launch.py", "trainer.openrlhf.ray_trainer"): "OpenRLHF's Ray trainer actor subclassed: it "
    "imports OpenRLHF and Ray (the [gpu] extra) at its top, so it loads only when a launch installs it",
}


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def placed_imports(source: str, package: str) -> list[tuple[int, str, str]]:
    """(line, module, place) of every import in `source`, place being "module" (runs on import, class
    bodies and `try`/`if` blocks included), "function" (runs when a function does) or "typing" (under
    `if TYPE_CHECKING:`, never runs)."""
    out: list[tuple[int, str, str]] = []

    def visit(node: ast.AST, place: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Import):
                out.extend((child.lineno, alias.name, place) for alias in child.names)
            elif isinstance(child, ast.ImportFrom):
                source_module = imported_from(child, package)
                for alias in child.names:  # `from pkg import module` imports pkg.module
                    whole = f"{source_module}.{alias.name}"
                    out.append((child.lineno, whole if is_our_module(whole) else source_module, place))
            elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                visit(child, "function")
            elif isinstance(child, ast.If) and _is_type_checking(child.test) and place == "module":
                for statement in child.body:
                    visit(ast.Module(body=[statement], type_ignores=[]), "typing")
                for statement in child.orelse:
                    visit(ast.Module(body=[statement], type_ignores=[]), place)
            else:
                visit(child, place)

    visit(ast.parse(source), "module")
    return out


def our_module(module: str) -> str | None:
    """The deepest of our modules that `module` names or lies in (a name imported from a module is that
    module), or None for a third-party or standard one."""
    while module and not is_our_module(module):
        module = module.rpartition(".")[0]
    return module or None


def module_graph() -> dict[str, set[str]]:
    """Module -> the modules of ours it imports at module level (importing `a.b` also runs package `a`
    first, but that is the package's own order, not an arrow of the importer)."""
    graph: dict[str, set[str]] = {}
    for path, module, package in source_files():
        targets = {our_module(target) for _, target, place in placed_imports(path.read_text(encoding="utf-8"), package)
                   if place == "module"}
        graph[module] = {t for t in targets if t is not None and t != module}
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle (a list of modules, the first repeated at the end) through each group of modules that
    import each other, directly or around a loop."""
    order: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[list[str]] = []

    def strong(v: str) -> None:  # Tarjan's strongly connected components
        order[v] = low[v] = len(order)
        stack.append(v)
        for w in sorted(graph.get(v, ())):
            if w not in order:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], order[w])
        if low[v] == order[v]:
            group = []
            while True:
                w = stack.pop()
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for v in sorted(graph):
        if v not in order:
            strong(v)
    cycles = []
    for group in groups:  # the shortest way from the group's first module back to it
        start, inside = group[0], set(group)
        paths = {start: [start]}
        frontier = [start]
        while frontier:
            nxt = []
            for v in frontier:
                for w in sorted(graph[v] & inside):
                    if w == start:
                        cycles.append(paths[v] + [start])
                        nxt = []
                        break
                    if w not in paths:
                        paths[w] = paths[v] + [w]
                        nxt.append(w)
                else:
                    continue
                break
            frontier = nxt
    return cycles


def test_no_import_cycles_at_module_level():
    cycles = import_cycles(module_graph())
    assert not cycles, "modules that import each other (move what both need into one of them, or below both):\n" + (
        "\n".join(" -> ".join(c) for c in cycles))


def test_our_modules_are_imported_at_the_top():
    bad, used = [], set()
    for path, _, package in source_files():
        name = path.relative_to(REPO).as_posix()
        for line, target, place in placed_imports(path.read_text(encoding="utf-8"), package):
            mine = our_module(target)
            if place != "function" or mine is None:
                continue
            if (name, mine) in LAZY_ALLOWED:
                used.add((name, mine))
            else:
                bad.append(f"{name}:{line}: imports {mine} inside a function")
    bad = list(dict.fromkeys(bad))  # one line per import statement
    assert not bad, ("imports of our own modules inside functions (move them to the top of the file; a command "
                     "that must start without torch is imported by name from the CLI's table):\n" + "\n".join(bad))
    assert used == set(LAZY_ALLOWED), f"allowed but no longer there: {sorted(set(LAZY_ALLOWED) - used)}"


@pytest.mark.parametrize(
    "source,found",
    [
        ("from trainer import rows", [(1, "trainer.rows", "module")]),
        ("def f():\n    import trainer.rows", [(2, "trainer.rows", "function")]),
        ("class A:\n    def f(self):\n        from . import rows", [(3, "trainer.rows", "function")]),
        ("f = lambda: __import__('x')\nfrom .rows import build_rows", [(2, "trainer.rows", "module")]),
        ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from trainer.local import LocalTrainer",
         [(1, "typing", "module"), (3, "trainer.local", "typing")]),
        ("try:\n    import torch\nexcept ImportError:\n    torch = None", [(2, "torch", "module")]),
    ],
)
def test_where_an_import_stands(source, found):
    """The checker can fail: where the imports of a few lines of a module of package `trainer` stand."""
    assert placed_imports(source, "trainer") == found


def test_the_cycle_finder_itself():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"e"}}
    assert import_cycles(graph) == [["a", "b", "c", "a"]]
    assert import_cycles({"a": {"b"}, "b": set()}) == []
