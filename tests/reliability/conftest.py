"""Reliability tests: load, slow clients, fuzzing, corrupt files, crash-safety and security defaults.

`load_tools` is benchmarks/load.py (the load driver the benchmark uses), imported by path: benchmarks
are scripts, not an installed package.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _import_benchmark(name: str):
    module_name = f"agentgym_benchmark_{name}"
    if module_name in sys.modules:
        return sys.modules[module_name]
    spec = importlib.util.spec_from_file_location(module_name, REPO / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def load_tools():
    return _import_benchmark("load")
