"""Fixtures of the ALFWorld tests: the small embedded panel (session-wide), the real game, AlfredTWEnv."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def panel_options(contract_options_alfworld: dict) -> dict:
    """Options that make every env of these tests play the one small test panel."""
    return dict(contract_options_alfworld)


@pytest.fixture(scope="session")
def make_env(panel_options: dict):
    """`make_env(**options)`: an AlfWorldEnv on the small test panel."""
    from environments.alfworld.env import AlfWorldEnv

    def make(**options):
        return AlfWorldEnv(**{**panel_options, **options})

    return make


@pytest.fixture(scope="session")
def real_data(shared_data) -> Path:
    """../shared/data/alfworld: the folder holding json_2.1.1/ with one real ALFWorld game (skips if absent)."""
    return shared_data("alfworld", "json_2.1.1").parent


@pytest.fixture(scope="session")
def real_game(real_data: Path) -> Path:
    return next((real_data / "json_2.1.1" / "train").glob("*/*/game.tw-pddl"))


@pytest.fixture(scope="session")
def alfred_tw_env():
    """`alfred_tw_env(data_path, training_method)`: alfworld's own AlfredTWEnv gym env (batch of 1) over the
    games under `data_path`; `dagger` adds alfworld's hand-coded expert (infos["extra.expert_plan"])."""
    from alfworld.agents.environment.alfred_tw_env import AlfredTWEnv

    def make(data_path: Path, training_method: str = "dqn"):
        config = {
            "env": {
                "goal_desc_human_anns_prob": 0,
                "task_types": [1, 2, 3, 4, 5, 6],
                "domain_randomization": False,
                "expert_type": "handcoded",
            },
            "dataset": {
                "data_path": str(data_path),
                "eval_id_data_path": str(data_path),
                "eval_ood_data_path": str(data_path),
                "num_train_games": -1,
                "num_eval_games": -1,
            },
            "logic": {"domain": "", "grammar": ""},
            "general": {"training_method": training_method},
            "rl": {"training": {"max_nb_steps_per_episode": 100}},
            "dagger": {"training": {"max_nb_steps_per_episode": 100}},
        }
        return AlfredTWEnv(config, train_eval="train").init_env(batch_size=1)

    return make
