"""The embedded synthetic set: deterministic, labelled, answerable from its passages, two-hop for real."""

from __future__ import annotations

from pathlib import Path

import pytest

from environments.searchqa.metrics import normalize_answer
from environments.searchqa.synthetic import (
    _generate,
    ensure_synthetic_index,
    synthetic_corpus,
    synthetic_questions,
    synthetic_world,
)
from retrieval_index.corpus import split_title
from retrieval_index.lucene import BM25Searcher


@pytest.fixture(scope="module")
def synthetic_index(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return ensure_synthetic_index(tmp_path_factory.mktemp("synthetic"))


def test_deterministic_and_labelled_synthetic() -> None:
    again = _generate()
    world = synthetic_world()
    assert [q.to_dict() for q in again.questions] == [q.to_dict() for q in world.questions]
    corpus = synthetic_corpus()
    assert len({d["id"] for d in corpus}) == len(corpus)
    assert all(d["id"].startswith("synthetic-") and "fictional" in d["contents"] for d in corpus)
    questions = synthetic_questions("all")
    assert all(q.id.startswith("synthetic-") and q.dataset == "synthetic" for q in questions)
    assert len({q.id for q in questions}) == len(questions) == len({q.question for q in questions})
    train, test = synthetic_questions("train"), synthetic_questions("test")
    assert not {q.id for q in train} & {q.id for q in test} and len(train) + len(test) == len(questions)
    assert {q.question_type for q in test} == {"single-hop", "two-hop"}
    with pytest.raises(ValueError):
        synthetic_questions("dev")


def test_every_answer_is_in_its_supporting_sentences() -> None:
    passages = {split_title(d["contents"])[0]: d["contents"] for d in synthetic_corpus()}
    for q in synthetic_questions("all"):
        assert q.supporting and all(f["sentence"] in passages[f["title"]] for f in q.supporting)
        last = q.supporting[-1]["sentence"]
        assert normalize_answer(q.answers[0]) in normalize_answer(last), q


def test_two_hop_questions_need_two_passages() -> None:
    passages = {split_title(d["contents"])[0]: d["contents"] for d in synthetic_corpus()}
    two_hop = [q for q in synthetic_questions("all") if q.question_type == "two-hop"]
    assert len(two_hop) > 100
    for q in two_hop:
        first, second = q.supporting[0]["title"], q.supporting[1]["title"]
        assert first != second
        answer = normalize_answer(q.answers[0])
        # The passage named in the question does not hold the answer, and no passage holds both the
        # question's subject and the answer.
        assert answer not in normalize_answer(passages[first]), q.question
        subject = normalize_answer(first)
        assert not any(subject in normalize_answer(p) and answer in normalize_answer(p)
                       for p in passages.values()), q.question


def test_the_index_is_cached_and_retrieves_the_supporting_passage(synthetic_index: Path) -> None:
    assert ensure_synthetic_index(synthetic_index.parent) == synthetic_index  # second call: the cache
    single = [q for q in synthetic_questions("all") if q.question_type == "single-hop"]
    with BM25Searcher(synthetic_index) as searcher:
        assert searcher.num_docs == len(synthetic_corpus())
        results = searcher.batch_search([q.question for q in single], k=3, threads=2)
    found = sum(any(split_title(h.contents)[0] == q.supporting[0]["title"] for h in hits)
                for q, hits in zip(single, results, strict=True))
    assert found >= 0.9 * len(single), f"{found}/{len(single)}"


def test_serve_synthetic_starts_and_stops(synthetic_index: Path) -> None:
    from environments.searchqa.synthetic import serve_synthetic
    from retrieval_index.client import RetrievalClient

    question = next(q for q in synthetic_questions("test") if q.question_type == "single-hop")
    with serve_synthetic(synthetic_index.parent) as server:
        hits = RetrievalClient(server.url).search(question.question, 3)
        assert question.supporting[0]["title"] in [split_title(h.contents)[0] for h in hits]
    assert not server.running


def test_agentopsd_reads_a_skill_note_for_the_synthetic_questions_as_for_nq_triviaqa_and_hotpotqa():
    # The env's task type is its questions' data set; AgentOPSD's teacher reads the family's note for it
    # after the general note (trainer.env_knowledge.skill_text). The synthetic set had none: its teacher
    # read the general note alone.
    from agentgym_opsd.registry import entry, registered_envs
    from environments.searchqa.synthetic import synthetic_questions
    from trainer.env_knowledge import SKILLS_DIR, skill_text

    general = (SKILLS_DIR / "general.txt").read_text(encoding="utf-8").strip()
    ids = [e.id for e in registered_envs() if e.family == "SearchQA"]
    assert "agentgym/SearchQA-Synthetic-v0" in ids and len(ids) >= 4
    for env_id in ids:
        task_types = ({q.dataset for q in synthetic_questions("train") + synthetic_questions("test")}
                      if entry(env_id).subset == "synthetic" else {entry(env_id).subset})
        for task_type in task_types:
            note = entry(env_id).skill_notes(task_type)
            assert note, (env_id, task_type)
            assert skill_text(env_id, task_type) == general + "\n\n" + note
    synthetic = entry("agentgym/SearchQA-Synthetic-v0").skill_notes("synthetic")
    assert "two-hop" in synthetic and synthetic != entry("agentgym/SearchQA-NQ-v0").skill_notes("nq")
