"""Small real indexes for tests and quick checks (no fakes: the same builder and searcher as production)."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from agentgym_opsd.io import read_jsonl_numbered
from retrieval_index.lucene import build_index

__all__ = ["WIKI_FILES", "wiki_slice_records", "build_wiki_slice_index"]

# The three corpora of ../shared/data/wiki, and how many passages of each a test slice takes.
WIKI_FILES: dict[str, int | None] = {
    "hotpotqa_distractor_paragraphs.jsonl": None,  # all 1,000: the HotpotQA sample's own paragraphs
    "flashrag_wiki18_sample_1000.jsonl": None,  # all 1,000 DPR wiki-2018 passages
    "wikipedia_vital_articles_summaries_en.jsonl": 2000,  # the first 2,000 of 10,033 summaries
}


def wiki_slice_records(wiki_dir: str | Path, sizes: dict[str, int | None] | None = None) -> Iterator[dict[str, Any]]:
    """The passages of a slice of the shared wiki corpora (ids prefixed where a file's ids are bare numbers)."""
    wiki_dir = Path(wiki_dir)
    for name, limit in (sizes or WIKI_FILES).items():
        path = wiki_dir / name
        prefix = "wiki18-" if name.startswith("flashrag_wiki18") else ""
        for _, record in itertools.islice(read_jsonl_numbered(path), limit):
            yield {"id": f"{prefix}{record['id']}", "contents": record["contents"]}


def build_wiki_slice_index(wiki_dir: str | Path, out_dir: str | Path, **kwargs: Any) -> Path:
    """Build a Lucene index of `wiki_slice_records(wiki_dir)` at `out_dir` and return its path."""
    records = list(wiki_slice_records(wiki_dir, kwargs.pop("sizes", None)))
    build_index(records, out_dir, progress=False, **kwargs)
    return Path(out_dir)
