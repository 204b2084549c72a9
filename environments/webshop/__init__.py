"""WebShop: buy what an instruction asks for on WebShop's text pages, scored by WebShop's reward.

A faithful, light version of WebShop (Yao et al., 2022; princeton-nlp/WebShop): its catalog file
formats, goals, splits, pages (text observation mode) and reward, with BM25 search through the
project's Lucene index. Without a catalog path the env plays an embedded SYNTHETIC catalog made by
this project (see `builtin.py`); real catalogs load from WebShop's own files (`catalog=PATH`).

This module stays light: `register()` only records the Gymnasium id; the env class is imported
when an env is made.
"""

from __future__ import annotations

from pathlib import Path

from agentgym_opsd.registry import notes_folder, register_env
from environments.webshop.world import get_world

__all__ = ["register", "ENV_ID"]

ENV_ID = "agentgym/WebShop-v0"


def _split_size(split: str) -> int:
    return len(get_world().splits[split])


# What a trainer reads about the family: the clicked or searched action block is the scored span, 0.1
# per invalid turn, mixing strength 0.2, and WebShop's graded reward (its score) enters R.
CREDIT_DEFAULTS = {"span_mode": "action_only", "invalid_coef": 0.1, "lam_mix": 0.2, "score_coef": 1.0}

# AgentOPSD's strategy notes (skills/<category>.txt); WebShop's other category names.
SKILL_ALIASES = {"food": "grocery", "furniture": "garden", "home": "garden", "kitchen": "garden"}


def register() -> None:
    """Register `agentgym/WebShop-v0` (entry point of the `agentgym_opsd.envs` group)."""
    register_env(
        ENV_ID,
        "environments.webshop.env:WebShopEnv",
        family="WebShop",
        subset="all",
        splits=("test", "eval", "train", "all"),
        description="WebShop shopping (pages and reward as WebShop); built-in SYNTHETIC catalog unless catalog=PATH",
        sizes=_split_size,
        credit_defaults=CREDIT_DEFAULTS,
        skill_notes=notes_folder(Path(__file__).with_name("skills"), SKILL_ALIASES),
    )
