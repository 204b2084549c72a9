"""Fixtures the benchmark scripts' tests share."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable

import pytest

from benchmarks.common import REPO


@pytest.fixture
def usage_errors(capsys) -> Callable:
    """`check(module, cases)`: each `(argv, says)` of `cases` is a usage error of `benchmarks.<module>`:
    exit 2, `says` in the message. The first case runs the real command line (a process: no traceback
    on stderr); the others go through the module's `parse_args` in this process, which is where every
    one of them stops (a process per case would import torch again, for no more checking)."""

    def check(module: str, cases) -> None:
        (argv, says), *rest = cases
        done = subprocess.run([sys.executable, "-m", f"benchmarks.{module}", *argv], capture_output=True, text=True,
                              timeout=120, cwd=REPO)
        assert done.returncode == 2, (argv, done.stderr)
        assert says in done.stderr and "Traceback" not in done.stderr, (argv, done.stderr)
        parse_args = __import__(f"benchmarks.{module}", fromlist=["parse_args"]).parse_args
        for argv, says in rest:
            capsys.readouterr()
            with pytest.raises(SystemExit) as stop:
                parse_args(argv)
            message = capsys.readouterr().err
            assert stop.value.code == 2, (argv, message)
            assert says in message, (argv, message)

    return check
