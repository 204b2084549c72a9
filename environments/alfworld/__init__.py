"""ALFWorld: household tasks in text, on the real alfworld/TextWorld PDDL engine (all six task types).

Gymnasium ids `agentgym/ALFWorld-{Pick,Look,Clean,Heat,Cool,PickTwo,All}-v0`; keyword options (see
`env.AlfWorldEnv`): `split` (train, valid_seen, valid_unseen), `source` (`embedded`: a generated panel
over ALFRED's rooms, the default; `alfworld`: ALFWorld's json_2.1.1 games from `data_dir` or
`$ALFWORLD_DATA`), `room` (`full` or `small`), `panel_size`, `panel_seed`, `panel_own_types`, `reward_scale`,
`admissible_in_observation`, `max_turns`, `allow_bare_action`.

This module stays light: registering imports nothing heavy; the engine loads when an env is made.
"""

from __future__ import annotations

from pathlib import Path

from agentgym_opsd.registry import notes_folder, register_env
from environments.alfworld.expert import (
    TASK_TYPES,  # a light module (no engine imports)
)

__all__ = ["register", "IDS"]

# id part -> (subset, ALFWorld task types)
IDS: dict[str, tuple[str, tuple[str, ...]]] = {
    "Pick": ("pick", ("pick_and_place_simple",)),
    "Look": ("look", ("look_at_obj_in_light",)),
    "Clean": ("clean", ("pick_clean_then_place_in_recep",)),
    "Heat": ("heat", ("pick_heat_then_place_in_recep",)),
    "Cool": ("cool", ("pick_cool_then_place_in_recep",)),
    "PickTwo": ("picktwo", ("pick_two_obj_and_place",)),
    "All": ("all", TASK_TYPES),
}
SPLITS = ("train", "valid_seen", "valid_unseen")
_DEFAULT_SIZES = {"train": 20, "valid_seen": 10, "valid_unseen": 10}


def _sizes(task_types: tuple[str, ...]):
    """Games in the default embedded panel (known without generating it: every type gets its quota)."""

    def size(split: str) -> int:
        return _DEFAULT_SIZES[split] * len(task_types)

    return size


# What a trainer reads about the family (docs/credit.md#outcome-reward): the action block is the scored span, 0.1
# per invalid turn, StepOPSD's mixing strength 0.2.
CREDIT_DEFAULTS = {"span_mode": "action_only", "invalid_coef": 0.1, "lam_mix": 0.2}

# AgentOPSD's strategy notes (skills/<type>.txt), under the names ALFWorld's data uses too.
SKILL_ALIASES = {
    "pick_and_place_simple": "pick",
    "look_at_obj_in_light": "look",
    "pick_clean_then_place_in_recep": "clean",
    "pick_heat_then_place_in_recep": "heat",
    "pick_cool_then_place_in_recep": "cool",
    "pick_two_obj_and_place": "pick_two",
    "picktwo": "pick_two",
    "pick2": "pick_two",
    "pick_and_place": "pick",
    "examine": "look",
}


def register() -> None:
    """Register the ALFWorld ids (the `agentgym_opsd.envs` entry point)."""
    notes = notes_folder(Path(__file__).with_name("skills"), SKILL_ALIASES)

    for name, (subset, task_types) in IDS.items():
        what = "all six task types" if subset == "all" else task_types[0]
        register_env(
            f"agentgym/ALFWorld-{name}-v0",
            "environments.alfworld.env:AlfWorldEnv",
            family="ALFWorld",
            subset=subset,
            splits=SPLITS,
            description=f"ALFWorld household tasks ({what}) on the TextWorld PDDL engine; embedded panel or json_2.1.1",
            kwargs={"task_types": task_types},
            sizes=_sizes(task_types),
            credit_defaults=CREDIT_DEFAULTS,
            skill_notes=notes,
        )
