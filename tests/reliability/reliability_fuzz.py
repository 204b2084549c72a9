"""Shared hypothesis set-up of the reliability fuzzers (imported by name: conftest.py puts this folder on sys.path).

- `fuzz_settings(default)`: `default` examples per test (AGENTGYM_FUZZ_EXAMPLES=N overrides it for a
  longer local hunt), no deadline, and no shrinking phase: a failure is reported as found (with its
  seed) instead of minutes of shrinking against live servers. Under CI=true the examples are
  derandomized (the same on every run, so CI is reproducible); elsewhere each run explores new ones.
- `ANY_TEXT`: text from every Unicode category, lone surrogates and control characters included.
- `JSON_VALUES`: arbitrary JSON values; `json_bytes` serialises one the way a client would send it.
"""

from __future__ import annotations

import json
import os

from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st

__all__ = ["fuzz_settings", "ANY_TEXT", "JSON_VALUES", "json_bytes"]


def fuzz_settings(default: int) -> settings:
    return settings(
        max_examples=int(os.environ.get("AGENTGYM_FUZZ_EXAMPLES", str(default))),
        deadline=None,
        derandomize=os.environ.get("CI") == "true",
        phases=[Phase.explicit, Phase.reuse, Phase.generate],
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large],
    )


ANY_TEXT = st.text(st.characters(codec=None, exclude_categories=()), max_size=50)
_SCALARS = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | ANY_TEXT
JSON_VALUES = st.recursive(
    _SCALARS, lambda inner: st.lists(inner, max_size=5) | st.dictionaries(ANY_TEXT, inner, max_size=5), max_leaves=16)


def json_bytes(obj: object) -> bytes:
    """ASCII JSON (lone surrogates escaped as \\udXXX: valid JSON text, invalid Unicode once decoded)."""
    return json.dumps(obj).encode("ascii")
