"""Question loaders on the real samples in ../shared/data/qa, and clear errors on corrupt files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agentgym_opsd.io import DataFileError
from environments.searchqa.data import detect_format, load_questions


def test_nq_open(shared_data) -> None:
    path = shared_data("qa", "nq_open_dev_part1.jsonl")
    examples = load_questions(path)
    lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    assert len(examples) == len(lines)
    assert examples[0].question == lines[0]["question"] and examples[0].answers == lines[0]["answer"]
    assert examples[0].dataset == "nq" and examples[0].id == "nq-00000" and examples[
        -1].id == f"nq-{len(lines) - 1:05d}"
    assert examples[0].source.endswith("nq_open_dev_part1.jsonl:1")


def test_triviaqa_aliases_are_gold_answers(shared_data) -> None:
    path = shared_data("qa", "triviaqa_sm_sub_part1.jsonl")
    examples = load_questions(path)
    first = json.loads(path.read_text().splitlines()[0])
    assert examples[0].question == first["context"].removeprefix("Question:").removesuffix("Answer:").strip()
    assert examples[0].answers[0] == first["answer"]
    assert set(first["aliases"]) <= set(examples[0].answers)
    assert all(e.dataset == "triviaqa" for e in examples)


def test_hotpotqa_simplified_and_distractor(shared_data) -> None:
    simple = load_questions(shared_data("qa", "hotpot_dev_v1_simplified_part1.json"))
    raw = json.loads(shared_data("qa", "hotpot_dev_v1_simplified_part1.json").read_text())
    assert len(simple) == len(raw)
    assert {e.question_type for e in simple} == {"bridge", "comparison"}
    assert simple[0].answers == [raw[0]["answer"]]

    path = shared_data("qa", "hotpotqa_distractor_dev_sample_100.jsonl")
    dis = load_questions(path)
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    assert len(dis) == len(records)
    for example, record in zip(dis, records, strict=True):
        assert example.id == record["id"] and example.level == record["level"]
        facts = record["supporting_facts"]
        assert [f["title"] for f in example.supporting] == facts["title"]
        context = dict(zip(record["context"]["title"], record["context"]["sentences"], strict=True))
        for fact, sent_id in zip(example.supporting, facts["sent_id"], strict=True):
            sentences = context[fact["title"]]
            assert fact["sentence"] == (sentences[sent_id].strip() if sent_id < len(sentences) else "")
    assert sum(bool(f["sentence"]) for e in dis for f in e.supporting) > 0.95 * sum(len(e.supporting) for e in dis)


def test_flashrag_and_original_hotpot_layouts(shared_data, tmp_path: Path) -> None:
    fr = load_questions(shared_data("qa", "flashrag_nq_test_16.jsonl"), dataset="nq")
    assert fr[0].id == "test_0" and fr[0].answers == ["Wilhelm Conrad Röntgen"] and fr[0].dataset == "nq"
    # A FlashRAG HotpotQA record: metadata in the HF layout; and an original-layout distractor record.
    meta = {"type": "bridge", "level": "hard", "supporting_facts": {"title": ["A", "B"], "sent_id": [1, 0]},
            "context": {"title": ["A", "B"], "sentences": [["a0", "a1"], ["b0"]]}}  # fmt: skip
    f = tmp_path / "hotpot_flashrag.jsonl"
    f.write_text(json.dumps({"id": "h1", "question": "q?", "golden_answers": ["x"], "metadata": meta}) + "\n")
    (ex,) = load_questions(f)
    assert ex.question_type == "bridge" and ex.supporting == [{"title": "A", "sentence": "a1"},
                                                              {"title": "B", "sentence": "b0"}]
    g = tmp_path / "hotpot_original.json"
    g.write_text(json.dumps([{"_id": "h2", "question": "q?", "answer": "x", "type": "comparison",
                              "supporting_facts": [["A", 0], ["B", 5]],
                              "context": [["A", ["a0"]], ["B", ["b0"]]]}]))  # fmt: skip
    (ex,) = load_questions(g)
    assert ex.id == "h2" and ex.supporting == [{"title": "A", "sentence": "a0"}, {"title": "B", "sentence": ""}]
    assert detect_format({"question": "q", "answer": {"value": "v", "aliases": ["w"]}}) == "triviaqa"


@pytest.mark.parametrize(
    "content,message",
    [
        ('{"question": "q", "answer": ["a"]}\n{"question": "q2", "answer": ["b"]',
         r"bad\.jsonl:2: truncated last line"),
        ('{"question": "q", "answer": ["a"]}\nnot json\n{"question": "q3", "answer": ["c"]}\n',
         r"bad\.jsonl:2: invalid JSON"),
        ('{"question": "q", "answer": ["a"]}\n{"question": "", "answer": ["b"]}\n',
         r"bad\.jsonl:2: missing or empty 'question'"),
        ('{"question": "q", "answer": ["a"]}\n{"question": "q2", "answer": []}\n',
         r"bad\.jsonl:2: 'answer' must be a non-empty list"),
        ('{"question": "q", "answer": ["a"]}\n{"question": "q2", "answer": "b"}\n',
         r"bad\.jsonl:2: record is in hotpotqa_simplified format, the file is nq_open"),
        ('{"id": "x", "question": "q", "golden_answers": ["a"]}\n{"id": "x", "question": "q", "golden_answers": '
         '["b"]}\n', r"bad\.jsonl:2: duplicate id 'x'"),
        ('{"foo": 1}\n', r"bad\.jsonl:1: unknown question format"),
        ('[1, 2]\n', r"bad\.jsonl"),
        ('[{"question": "q", "answer": "a"},\n {"question": "q" "answer": "b"}]\n', r"bad\.jsonl:2: invalid JSON"),
        ("\n\n", r"no questions"),
    ],
)
def test_corrupt_files_name_the_file_and_line(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(content)
    with pytest.raises(DataFileError, match=message):
        load_questions(path)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(DataFileError, match="no such file"):
        load_questions(tmp_path / "nope.jsonl")


@pytest.mark.parametrize("shape", ["jsonl", "json list"])
def test_a_utf8_byte_order_mark_is_not_an_error(tmp_path: Path, shape: str) -> None:
    rows = [{"question": "where is the eiffel tower", "answer": ["Paris"]},
            {"question": "who wrote hamlet", "answer": ["Shakespeare"]}]
    text = "\n".join(json.dumps(r) for r in rows) if shape == "jsonl" else json.dumps(rows)
    path = tmp_path / "bom.jsonl"
    path.write_bytes(text.encode("utf-8-sig"))  # what Windows editors save
    examples = load_questions(path)
    assert [e.question for e in examples] == [r["question"] for r in rows]
    assert examples[0].answers == ["Paris"] and examples[0].source.endswith(
        "bom.jsonl:1" if shape == "jsonl" else "record 1")
    # a byte-order mark anywhere else is still not JSON
    path.write_bytes(text.encode("utf-8") + b"\n\xef\xbb\xbf" + json.dumps(rows[0]).encode())
    with pytest.raises(DataFileError):
        load_questions(path)
