"""The layers of the code, as the README's layout section draws them, held against every import.

    benchmarks   benchmarks/              measures everything (run as `python -m benchmarks.NAME`)
    app          agentgym_opsd/app        wires everything together (CLI, bench, report, demo, ...)
    trainer      trainer/                 credit, rows, teacher, local trainer, OpenRLHF bridge
    envs         environments/            one package per env family
    retrieval    retrieval_index/         Lucene index, Flask server, client (a library)
    contract     agentgym_opsd/           the env contract, registry, episodes, rollout

An arrow may only point down: the benchmarks and the app may import anything (nothing but the tests
imports a benchmark); the trainer and the envs import the
contract (and envs the retrieval library), never each other; the retrieval library imports only the
contract; the contract imports none of them. `trainer/credit/` is pure tensor math: it imports
torch, numpy, the standard library and itself. Every import counts, also one inside a function (a
lazy import is still an arrow). And no module takes another module's underscore names (`from x import
_y`, `x._y`): what another module needs gets a public name.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
OURS = ("agentgym_opsd", "environments", "retrieval_index", "trainer", "benchmarks")


def layer(module: str) -> str | None:
    """The layer of one of our modules, or None for a third-party or standard module."""
    if module == "agentgym_opsd.app" or module.startswith("agentgym_opsd.app."):
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
    [("trainer.rows", "environments.alfworld", False), ("agentgym_opsd.core", "agentgym_opsd.app.cli", False),
     ("agentgym_opsd.app.demo", "trainer.local", True), ("environments.searchqa.env", "retrieval_index.client", True),
     ("retrieval_index.cli", "agentgym_opsd.usage", True), ("environments.webshop", "trainer.teacher", False),
     ("benchmarks.learning", "trainer.local", True), ("trainer.local", "benchmarks.common", False),
     ("agentgym_opsd.app.demo", "benchmarks.learning", False)],
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
