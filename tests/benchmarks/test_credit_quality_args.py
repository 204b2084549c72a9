"""benchmarks.credit_quality answers bad arguments with one usage line, not a traceback."""

from __future__ import annotations

import subprocess
import sys

from benchmarks.common import REPO


def test_bad_arguments_are_usage_errors(tmp_path):
    cases = (
        (["--train-games", "0"], "--train-games must be >= 1"),
        (["--train-games", "many"], "invalid int value"),
        (["--tasks", "0"], "--tasks must be >= 1"),
        (["--detour", "1.5"], "--detour is a probability"),
        (["--model", str(tmp_path)], "no config.json"),
        (["--model", "tiny", "--family", "webshop"], "ALFWorld Pick only"),
        (["--family", "all", "--env", "agentgym/WebShop-v0"], "not both"),
        (["--env", "agentgym/Nope-v0"], "no env registered"),
    )
    for args, says in cases:
        done = subprocess.run([sys.executable, "-m", "benchmarks.credit_quality", *args], capture_output=True,
                              text=True, timeout=120, cwd=REPO)
        assert done.returncode == 2, (args, done.stderr)
        assert says in done.stderr and "Traceback" not in done.stderr, (args, done.stderr)
