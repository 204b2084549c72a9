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

__all__ = ["register", "DATASETS"]

# dataset -> (splits, default split)
DATASETS: dict[str, tuple[tuple[str, ...], str]] = {
    "nq": (("train", "dev", "test"), "test"),
    "triviaqa": (("train", "dev", "test"), "test"),
    "hotpotqa": (("train", "dev"), "dev"),
    "synthetic": (("train", "test"), "test"),
}

_IDS = {
    "agentgym/SearchQA-NQ-v0": ("nq", "Natural Questions (NQ-open) with a BM25 search tool"),
    "agentgym/SearchQA-TriviaQA-v0": ("triviaqa", "TriviaQA (all aliases count) with a BM25 search tool"),
    "agentgym/SearchQA-HotpotQA-v0": ("hotpotqa", "HotpotQA multi-hop questions with a BM25 search tool"),
    "agentgym/SearchQA-Synthetic-v0": ("synthetic", "SYNTHETIC fictional-world questions (1- and 2-hop), embedded corpus, no downloads"),
}


def _sizes(dataset: str):
    def size(split: str) -> int:
        if dataset == "synthetic":
            from environments.searchqa.synthetic import synthetic_questions

            return len(synthetic_questions(split))
        from environments.searchqa.data import default_data_file, load_questions

        path = default_data_file(dataset, split)
        if not path.is_file():
            raise FileNotFoundError("not fetched")
        return len(load_questions(path))

    return size


def register() -> None:
    """Register the Search-QA ids and agents (the `agentgym_opsd.envs` entry point)."""
    from agentgym_opsd.agents import register_agent
    from agentgym_opsd.registry import register_env

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
        )
    register_agent("searchqa-oracle", "environments.searchqa.agents:OracleAgent")
    register_agent("searchqa-baseline", "environments.searchqa.agents:RetrievalBaselineAgent")
