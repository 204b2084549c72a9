"""Function size in benchmarks/ and trainer/: none is over 120 lines.

A benchmark's main that runs, analyses and formats in one body (300 lines) cannot be read or tested in
parts; it is split into run / analyse / format functions instead. The count is the lines from a
function's `def` to its last line (docstring and comments included), nested functions and methods
too.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
FOLDERS = ("benchmarks", "trainer")
MAX_LINES = 120


def long_functions(source: str, limit: int = MAX_LINES) -> list[tuple[str, int, int]]:
    """(name, first line, lines) of every function in `source` longer than `limit` lines."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            lines = node.end_lineno - node.lineno + 1
            if lines > limit:
                out.append((node.name, node.lineno, lines))
    return out


def test_no_function_in_benchmarks_or_the_trainer_is_over_120_lines():
    bad = [f"{path.relative_to(REPO)}:{line}: {name} has {lines} lines"
           for folder in FOLDERS for path in sorted((REPO / folder).rglob("*.py"))
           for name, line, lines in long_functions(path.read_text(encoding="utf-8"))]
    assert not bad, f"split these into run / analyse / format functions (at most {MAX_LINES} lines):\n" + "\n".join(bad)


@pytest.mark.parametrize(
    "source,found",
    [
        ("def f():\n" + "    x = 1\n" * 3, []),  # 4 lines: at the limit
        ("def f():\n" + "    x = 1\n" * 4, [("f", 1, 5)]),
        ("class C:\n    def m(self):\n        def g():\n" + "            x = 1\n" * 3, [("m", 2, 5)]),
        ("async def h():\n" + "    await x\n" * 5, [("h", 1, 6)]),
    ],
)
def test_the_rule_itself(source, found):
    """The checker can fail: functions, methods and nested functions against a limit of 4 lines."""
    assert long_functions(source, limit=4) == found
