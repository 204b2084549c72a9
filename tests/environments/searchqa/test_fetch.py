"""The data-fetch command, offline: a local mirror with the FlashRAG layout and a gzipped corpus (FlashRAG's
16-question NQ test file and its 1,000-passage wiki-2018 sample, both shipped in tests/data)."""

from __future__ import annotations

import gzip
import shutil
from pathlib import Path

import pytest

from agentgym_app.cli import main as cli_main
from agentgym_opsd.io import DataFileError
from environments.searchqa.data import default_data_file, load_questions
from environments.searchqa.fetch import FetchError, corpus_path, fetch_corpus, fetch_questions, index_path
from retrieval_index.lucene import BM25Searcher

NQ_TEST = Path(__file__).resolve().parents[2] / "data" / "qa" / "flashrag_nq_test_16.jsonl"


@pytest.fixture
def wiki18(wiki_slice_dir: Path) -> Path:
    return wiki_slice_dir / "flashrag_wiki18_sample_1000.jsonl"


@pytest.fixture
def home(tmp_path: Path, monkeypatch) -> Path:
    monkeypatch.setenv("AGENTGYM_OPSD_CACHE", str(tmp_path / "home"))
    return tmp_path / "home"


@pytest.fixture
def mirror(tmp_path: Path, wiki18: Path) -> Path:
    root = tmp_path / "mirror"
    (root / "nq").mkdir(parents=True)
    shutil.copy(NQ_TEST, root / "nq" / "test.jsonl")
    (root / "hotpotqa").mkdir()
    (root / "hotpotqa" / "dev.jsonl").write_text(
        '{"id": "a", "question": "q?", "golden_answers": ["x"]}\n{"id": "b", "question": 7}\n')
    with open(wiki18, "rb") as src, gzip.open(root / "wiki-18.jsonl.gz", "wb") as dst:
        shutil.copyfileobj(src, dst)
    return root


def test_fetch_questions_from_a_mirror(home: Path, mirror: Path) -> None:
    path = fetch_questions("nq", "test", base_url=str(mirror), progress=False)
    assert path == default_data_file("nq", "test") and path.is_relative_to(home)
    assert path.read_bytes() == NQ_TEST.read_bytes()
    assert len(load_questions(path, dataset="nq")) == 17
    # The NQ env now finds it without data_file.
    from environments.searchqa.env import SearchQAEnv

    assert SearchQAEnv(dataset="nq", check_server=False).num_tasks == 17


def test_bad_downloads_leave_nothing(home: Path, mirror: Path) -> None:
    with pytest.raises(DataFileError, match=r"dev\.jsonl.*:2"):
        fetch_questions("hotpotqa", "dev", base_url=str(mirror), progress=False)
    with pytest.raises(FetchError, match="--base-url"):
        fetch_questions("triviaqa", "test", base_url=str(mirror), progress=False)
    with pytest.raises(ValueError, match="no split"):
        fetch_questions("hotpotqa", "test", base_url=str(mirror))
    leftovers = [p for p in home.rglob("*") if p.is_file()]
    assert leftovers == []


def test_fetch_corpus_gunzips_and_indexes(home: Path, mirror: Path, wiki18: Path) -> None:
    path = fetch_corpus("wiki-18", url=str(mirror / "wiki-18.jsonl.gz"), build=True, progress=False)
    assert path == corpus_path("wiki-18")
    assert path.read_bytes() == wiki18.read_bytes()
    with BM25Searcher(index_path("wiki-18")) as s:
        assert s.num_docs == 1000


def test_cli(home: Path, mirror: Path, capsys) -> None:
    assert cli_main(["searchqa-data", "fetch", "nq", "--split", "test", "--base-url", str(mirror), "--quiet"]) == 0
    assert "nq test: 17 questions" in capsys.readouterr().out
    assert cli_main(["searchqa-data", "list"]) == 0
    out = capsys.readouterr().out
    assert "test (here)" in out and "wiki-18" in out
    assert cli_main(["searchqa-data", "fetch", "triviaqa", "--base-url", str(mirror), "--quiet"]) == 2
    assert "could not download" in capsys.readouterr().err
