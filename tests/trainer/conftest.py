"""Trainer tests: the helper modules of this folder (credit_reference.py) are importable by name, and
`qwen3` is the session's real Qwen3 tokenizer (`qwen3_tokenizer`, shipped in tests/data) by a short name."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

HERE = str(Path(__file__).resolve().parent)
if HERE not in sys.path:
    sys.path.insert(0, HERE)


@pytest.fixture(scope="session")
def qwen3(qwen3_tokenizer):
    return qwen3_tokenizer
