"""benchmarks/learning.py answers a bad --jobs with one usage line, not a traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "learning.py"


def test_jobs_below_one_is_a_usage_error():
    for bad, says in (("0", "--jobs must be >= 1"), ("-2", "--jobs must be >= 1"), ("two", "invalid int value")):
        done = subprocess.run([sys.executable, str(SCRIPT), "--jobs", bad], capture_output=True, text=True, timeout=120)
        assert done.returncode == 2
        assert says in done.stderr and "Traceback" not in done.stderr
