"""The env checker (agentgym_opsd/env_checker.py), run on every registered env id (ours and plug-ins): new envs
get it by registering."""

from __future__ import annotations

import pytest

import agentgym_opsd
from agentgym_opsd.contract import EnvUnavailable
from agentgym_opsd.env_checker import check_text_env


def test_env_passes_the_env_checker(registered_env_id: str, env_options: dict) -> None:
    options = dict(env_options)
    # Short episodes keep the suite fast; the contract checks truncation at whatever max_turns is.
    options.setdefault("max_turns", 6)
    try:
        agentgym_opsd.make(registered_env_id, **options).close()
    except EnvUnavailable as e:
        pytest.skip(f"{registered_env_id} unavailable here: {e}")
    check_text_env(lambda: agentgym_opsd.make(registered_env_id, **options))
