"""Turn labels are optional in the contract: an env without `_label_turn` refuses `turn_labels=True`
with a clear error (each family's own tests cover its labels)."""

from __future__ import annotations

import pytest

import agentgym_opsd


def test_an_env_without_labels_refuses_the_option() -> None:
    with pytest.raises(ValueError, match=r"turn_labels=True: GuessNumberEnv cannot label turns"):
        agentgym_opsd.make("example/GuessNumber-v0", turn_labels=True)

