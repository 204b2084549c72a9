"""benchmarks/credit_quality.py answers a bad --train-games with one usage line, not a traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "credit_quality.py"


def test_train_games_below_one_is_a_usage_error():
    for bad, says in (("0", "--train-games must be >= 1"), ("many", "invalid int value")):
        done = subprocess.run([sys.executable, str(SCRIPT), "--train-games", bad], capture_output=True, text=True, timeout=120)
        assert done.returncode == 2
        assert says in done.stderr and "Traceback" not in done.stderr
