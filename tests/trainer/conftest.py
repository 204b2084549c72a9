"""Trainer tests: the helper modules of this folder (credit_reference.py) are importable by name."""

from __future__ import annotations

import sys
from pathlib import Path

HERE = str(Path(__file__).resolve().parent)
if HERE not in sys.path:
    sys.path.insert(0, HERE)
