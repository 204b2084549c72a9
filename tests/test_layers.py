"""The layers of the code, as the README's layout section draws them, held against every import.

    app          agentgym_opsd/app        wires everything together (CLI, bench, report, demo, ...)
    trainer      trainer/                 credit, rows, teacher, local trainer, OpenRLHF bridge
    envs         environments/            one package per env family
    retrieval    retrieval_index/         Lucene index, Flask server, client (a library)
    contract     agentgym_opsd/           the env contract, registry, episodes, rollout

An arrow may only point down: the app may import anything; the trainer and the envs import the
contract (and envs the retrieval library), never each other; the retrieval library imports only the
contract; the contract imports none of them. `trainer/credit/` is pure tensor math: it imports
torch, numpy, the standard library and itself. Every import counts, also one inside a function (a
lazy import is still an arrow).
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
OURS = ("agentgym_opsd", "environments", "retrieval_index", "trainer")


def layer(module: str) -> str | None:
    """The layer of one of our modules, or None for a third-party or standard module."""
    if module == "agentgym_opsd.app" or module.startswith("agentgym_opsd.app."):
        return "app"
    top = module.split(".")[0]
    return {"agentgym_opsd": "contract", "environments": "envs", "retrieval_index": "retrieval",
            "trainer": "trainer"}.get(top)


# For each layer, the layers it may import (besides itself).
ALLOWED = {
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
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            out.append((node.lineno, module))
    return out


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


@pytest.mark.parametrize(
    "module,target,allowed",
    [("trainer.rows", "environments.alfworld", False), ("agentgym_opsd.core", "agentgym_opsd.app.cli", False),
     ("agentgym_opsd.app.demo", "trainer.local", True), ("environments.searchqa.env", "retrieval_index.client", True),
     ("retrieval_index.cli", "agentgym_opsd.usage", True), ("environments.webshop", "trainer.teacher", False)],
)
def test_the_rules_themselves(module, target, allowed):
    """The checker can fail: a few arrows and whether they are allowed."""
    assert (layer(target) == layer(module) or layer(target) in ALLOWED[layer(module)]) is allowed
