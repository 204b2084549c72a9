"""The contract suite, run on every registered env id (ours and plug-ins): new envs get it by registering."""

from __future__ import annotations

import agentgym_opsd
from agentgym_opsd.contract import check_text_env
from agentgym_opsd.core import EnvUnavailable

import pytest


def test_contract(registered_env_id: str, env_options: dict) -> None:
    options = dict(env_options)
    # Short episodes keep the suite fast; the contract checks truncation at whatever max_turns is.
    options.setdefault("max_turns", 6)
    try:
        agentgym_opsd.make(registered_env_id, **options).close()
    except EnvUnavailable as e:
        pytest.skip(f"{registered_env_id} unavailable here: {e}")
    check_text_env(lambda: agentgym_opsd.make(registered_env_id, **options))
