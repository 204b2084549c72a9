"""The "Adding an environment" example (docs/adding-an-environment.md, linked from the EXAMPLE_PAGE) is real code: it
passes the contract check."""

from __future__ import annotations

import re
from pathlib import Path

import gymnasium as gym

from agentgym_opsd.env_checker import check_text_env

EXAMPLE_PAGE = Path(__file__).resolve().parents[1] / "docs" / "adding-an-environment.md"


def test_the_readme_env_example_follows_the_contract() -> None:
    blocks = re.findall(r"```python\n(.*?)```", EXAMPLE_PAGE.read_text(encoding="utf-8"), flags=re.S)
    example = next(b for b in blocks if "class GuessNumberEnv(TextEnv)" in b)
    # Registered from this module instead of the example's package `mypkg`.
    namespace: dict = {}
    exec(compile(example.replace('"mypkg:GuessNumberEnv"', "GuessNumberEnv"), str(EXAMPLE_PAGE), "exec"), namespace)
    namespace["register"]()
    check_text_env(lambda: gym.make("mypkg/GuessNumber-v0"))
    env = gym.make("mypkg/GuessNumber-v0")
    env.reset(seed=4)  # task 4: the number is 5
    *_, info = env.step("no tags at all")
    assert info["step"].format_ok is False
    _, reward, terminated, _, info = env.step("<action>guess 7</action>")
    assert (reward, terminated) == (0.0, False)
    _, reward, terminated, _, info = env.step("<think>lower</think><action>guess 5</action>")
    assert (reward, terminated) == (1.0, True) and info["hindsight"].success
