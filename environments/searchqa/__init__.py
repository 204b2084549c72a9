"""Search-QA: open-domain question answering with a BM25 search tool (Search-R1 style).

Ids (`agentgym-opsd list` shows them):

- `agentgym/SearchQA-NQ-v0`, `agentgym/SearchQA-TriviaQA-v0`, `agentgym/SearchQA-HotpotQA-v0`: the real
  sets, read from `data_file=` (or from where `agentgym-opsd searchqa-data fetch` puts them), searching
  the server at `server_url=` (or over `index_dir=`);
- `agentgym/SearchQA-Synthetic-v0`: the embedded default, a SYNTHETIC set of questions about fictional
  entities with its own corpus and index, served automatically: it needs no downloads.

Light at import (the entry point runs at `import agentgym_opsd`): the env module loads when an env is made.
"""

from __future__ import annotations

from pathlib import Path

from agentgym_opsd.agents import register_agent
from agentgym_opsd.registry import notes_folder, register_env
from environments.searchqa.data import DATASETS, default_data_file, load_questions
from environments.searchqa.synthetic import synthetic_questions

__all__ = ["register", "DATASETS"]

_IDS = {
    "agentgym/SearchQA-NQ-v0": ("nq", "Natural Questions (NQ-open) with a BM25 search tool"),
    "agentgym/SearchQA-TriviaQA-v0": ("triviaqa", "TriviaQA (all aliases count) with a BM25 search tool"),
    "agentgym/SearchQA-HotpotQA-v0": ("hotpotqa", "HotpotQA multi-hop questions with a BM25 search tool"),
    "agentgym/SearchQA-Synthetic-v0": (
        "synthetic", "SYNTHETIC fictional-world questions (1- and 2-hop), embedded corpus, no downloads"),
}


def _sizes(dataset: str):
    def size(split: str) -> int:
        if dataset == "synthetic":
            return len(synthetic_questions(split))
        path = default_data_file(dataset, split)
        if not path.is_file():
            raise FileNotFoundError("not fetched")
        return len(load_questions(path))

    return size


# What a trainer reads about the family (docs/credit.md#outcome-reward): the whole turn is scored
# (reasoning and query go together), 0.01 per invalid turn, mixing strength 0.1 (0.05 to 0.2 is
# reasonable). The reward is exact match alone, as in Search-R1 (F1 stays in `info`), so the score
# does not enter R.
CREDIT_DEFAULTS = {"span_mode": "clean_step", "invalid_coef": 0.01, "lam_mix": 0.1}

# AgentOPSD's strategy notes (skills/<kind>.txt), by the kind of question each data set asks.
SKILL_ALIASES = {
    "nq": "single_hop", "nq_open": "single_hop", "triviaqa": "single_hop", "popqa": "single_hop",
    "single": "single_hop", "hotpotqa": "multi_hop", "hotpot": "multi_hop", "2wikimultihopqa": "multi_hop",
    "2wiki": "multi_hop", "musique": "multi_hop", "bamboogle": "multi_hop", "bridge": "multi_hop",
    "comparison": "multi_hop", "two_hop": "multi_hop", "multi": "multi_hop",
}


def register() -> None:
    """Register the Search-QA ids and agents (the `agentgym_opsd.envs` entry point)."""
    notes = notes_folder(Path(__file__).with_name("skills"), SKILL_ALIASES)

    for env_id, (dataset, description) in _IDS.items():
        splits, _ = DATASETS[dataset]
        register_env(
            env_id,
            "environments.searchqa.env:SearchQAEnv",
            family="SearchQA",
            subset=dataset,
            splits=splits,
            description=description,
            kwargs={"dataset": dataset},
            sizes=_sizes(dataset),
            credit_defaults=CREDIT_DEFAULTS,
            skill_notes=notes,
        )
    register_agent("searchqa-oracle", "environments.searchqa.scripted_agents:OracleAgent")
    register_agent("searchqa-baseline", "environments.searchqa.scripted_agents:RetrievalBaselineAgent")
