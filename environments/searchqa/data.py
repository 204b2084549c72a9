"""Question sets for Search-QA: the real formats, read into one record type.

Formats (the file's first record decides; every record must then fit it):

- NQ-open jsonl: `{"question", "answer": [...]}`;
- TriviaQA: `{"question" or "context": "Question: ...\\nAnswer:", "answer", "aliases": [...]}` (the
  llm-foundry/`triviaqa_sm_sub` form) or `{"question", "answer": {"value", "aliases"}}` (the HF form);
  every alias is a gold answer;
- HotpotQA simplified (ReAct's `hotpot_dev_v1_simplified.json`, a JSON list): `{"question", "answer", "type"}`;
- HotpotQA distractor: `{"id", "question", "answer", "type", "level", "supporting_facts", "context"}`, in
  the HF form (`supporting_facts: {"title": [...], "sent_id": [...]}`, `context: {"title", "sentences"}`)
  or the original one (`supporting_facts: [[title, sent_id], ...]`, `context: [[title, [sentences]], ...]`);
- FlashRAG jsonl: `{"id", "question", "golden_answers": [...], "metadata": {...}}` (HotpotQA metadata
  carries type, level, supporting facts and context as above).

A bad file raises `DataFileError` naming the file and the line (or the record of a JSON list).
"""

from __future__ import annotations

import codecs
import functools
import os
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from agentgym_opsd.io import DataFileError, parse_json, read_file_bytes
from agentgym_opsd.paths import cache_dir

__all__ = ["DATASETS", "QAExample", "load_questions", "detect_format", "data_home", "default_data_file", "FORMATS"]

# dataset -> (splits, default split)
DATASETS: dict[str, tuple[tuple[str, ...], str]] = {
    "nq": (("train", "dev", "test"), "test"),
    "triviaqa": (("train", "dev", "test"), "test"),
    "hotpotqa": (("train", "dev"), "dev"),
    "synthetic": (("train", "test"), "test"),
}

FORMATS = ("nq_open", "triviaqa", "hotpotqa_simplified", "hotpotqa_distractor", "flashrag")


@dataclass
class QAExample:
    """One question with its gold answers.

    Attributes:
        id: stable task id (the record's own id, else `<dataset>-<index in file>`).
        question: the question text.
        answers: gold answers (aliases included); an answer matching any of them is correct.
        dataset: `nq`, `triviaqa`, `hotpotqa`, `synthetic`, or a FlashRAG set's name.
        question_type: HotpotQA `bridge`/`comparison`, synthetic `single-hop`/`two-hop`, else `factoid`.
        level: HotpotQA difficulty (`easy`/`medium`/`hard`) where given.
        supporting: the supporting facts `{"title", "sentence"}` (HotpotQA, synthetic).
        source: `file:line` the record came from.
    """

    id: str
    question: str
    answers: list[str]
    dataset: str
    question_type: str = "factoid"
    level: str | None = None
    supporting: list[dict[str, str]] = field(default_factory=list)
    source: str = ""

    @property
    def supporting_titles(self) -> list[str]:
        seen: list[str] = []
        for fact in self.supporting:
            if fact["title"] not in seen:
                seen.append(fact["title"])
        return seen

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def data_home() -> Path:
    """Where fetched data, corpora and indexes live: the suite's cache root (`agentgym_opsd.paths`)."""
    return cache_dir()


def default_data_file(dataset: str, split: str) -> Path:
    """Where `agentgym-opsd searchqa-data fetch DATASET --split SPLIT` puts a question set."""
    return data_home() / "searchqa" / dataset / f"{split}.jsonl"


# ------------------------------------------------------------------------------------------------


def detect_format(record: dict[str, Any]) -> str | None:
    """The format a record is in (one of `FORMATS`), or None."""
    if "golden_answers" in record:
        return "flashrag"
    if "supporting_facts" in record and "context" in record:
        return "hotpotqa_distractor"
    answer = record.get("answer")
    if "aliases" in record or (isinstance(answer, dict) and ("aliases" in answer or "value" in answer)):
        return "triviaqa"
    if isinstance(answer, list):
        return "nq_open"
    if isinstance(answer, str) and "question" in record:
        return "hotpotqa_simplified"
    return None


_DATASET_OF_FORMAT = {
    "nq_open": "nq",
    "triviaqa": "triviaqa",
    "hotpotqa_simplified": "hotpotqa",
    "hotpotqa_distractor": "hotpotqa",
}


def _strings(value: Any, where: str, name: str) -> list[str]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
        raise DataFileError(f"{where}: {name!r} must be a non-empty list of strings")
    out: list[str] = []
    for v in value:
        if v.strip() and v not in out:
            out.append(v)
    if not out:
        raise DataFileError(f"{where}: {name!r} holds only empty strings")
    return out


def _question(record: dict[str, Any], where: str) -> str:
    q = record.get("question")
    if q is None and isinstance(record.get("context"), str):  # llm-foundry TriviaQA: "Question: ...\nAnswer:"
        q = record["context"].strip()
        if q.startswith("Question:"):
            q = q[len("Question:") :]
        if q.endswith("Answer:"):
            q = q[: -len("Answer:")]
    if not isinstance(q, str) or not q.strip():
        raise DataFileError(f"{where}: missing or empty 'question'")
    return " ".join(q.split())


def _supporting(record: dict[str, Any], where: str) -> list[dict[str, str]]:
    """HotpotQA supporting facts with their sentences, in either layout."""
    facts, context = record.get("supporting_facts"), record.get("context")
    try:
        if isinstance(facts, dict):
            pairs = list(zip(facts["title"], facts["sent_id"], strict=True))
        else:
            pairs = [(t, s) for t, s in facts]
        if isinstance(context, dict):
            paragraphs = dict(zip(context["title"], context["sentences"], strict=True))
        else:
            paragraphs = {t: s for t, s in context}
    except (KeyError, TypeError, ValueError) as e:
        raise DataFileError(f"{where}: malformed 'supporting_facts' or 'context' ({type(e).__name__}: {e})") from None
    out = []
    for title, sent_id in pairs:
        sentences = paragraphs.get(title) or []
        sentence = sentences[sent_id] if isinstance(sent_id, int) and 0 <= sent_id < len(sentences) else ""
        out.append({"title": str(title), "sentence": str(sentence).strip()})
    return out


def _example(record: Any, fmt: str, index: int, dataset: str | None, where: str) -> QAExample:
    if not isinstance(record, dict):
        raise DataFileError(f"{where}: expected a JSON object, got {type(record).__name__}")
    got = detect_format(record)
    if got != fmt:
        raise DataFileError(f"{where}: record is in {got or 'an unknown'} format, the file is {fmt}")
    question = _question(record, where)
    kwargs: dict[str, Any] = {}
    if fmt == "flashrag":
        answers = _strings(record["golden_answers"], where, "golden_answers")
        meta = record.get("metadata") if isinstance(record.get("metadata"), dict) else {}
        if "type" in meta:
            kwargs["question_type"] = str(meta["type"])
        if "level" in meta:
            kwargs["level"] = str(meta["level"])
        if "supporting_facts" in meta and "context" in meta:
            kwargs["supporting"] = _supporting(meta, where)
    elif fmt == "nq_open":
        answers = _strings(record.get("answer"), where, "answer")
    elif fmt == "triviaqa":
        answer = record.get("answer")
        if isinstance(answer, dict):
            answers = _strings([answer.get("value", "")] + list(answer.get("aliases") or []), where, "answer")
        else:
            answers = _strings([answer] + list(record.get("aliases") or []) if isinstance(answer, str)
                               else record.get("aliases"), where, "aliases")
    else:  # hotpotqa
        answers = _strings(record.get("answer"), where, "answer")
        kwargs["question_type"] = str(record.get("type") or "factoid")
        if record.get("level"):
            kwargs["level"] = str(record["level"])
        if fmt == "hotpotqa_distractor":
            kwargs["supporting"] = _supporting(record, where)
    name = dataset or _DATASET_OF_FORMAT.get(fmt, "flashrag")
    rid = next((record[k] for k in ("id", "_id", "qid", "question_id") if isinstance(record.get(k), (str, int))), None)
    task_id = str(rid) if rid is not None and str(rid) else f"{name}-{index:05d}"
    return QAExample(task_id, question, answers, name, source=where, **kwargs)


def _records(path: Path) -> Iterator[tuple[str, Any]]:
    """`(where, record)` of a JSONL file or a JSON list file."""
    raw = read_file_bytes(path, "question file")
    if raw.startswith(codecs.BOM_UTF8):  # a UTF-8 byte-order mark (files saved by some editors): not data
        raw = raw[len(codecs.BOM_UTF8) :]
    head = raw.lstrip()[:1]
    if head == b"[":
        items = parse_json(raw, path)
        for i, item in enumerate(items):
            yield f"{path}: record {i + 1}", item
        return
    lines = raw.split(b"\n")
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = parse_json(line, path, line=number)
        except DataFileError as e:
            if number == len(lines):
                raise DataFileError(str(e).replace(": invalid JSON:", ": truncated last line:", 1)) from None
            raise
        yield f"{path}:{number}", record


@functools.lru_cache(maxsize=32)
def _load_cached(path: str, mtime_ns: int, size: int, dataset: str | None) -> tuple[QAExample, ...]:
    examples: list[QAExample] = []
    fmt: str | None = None
    seen: dict[str, str] = {}
    for index, (where, record) in enumerate(_records(Path(path))):
        if fmt is None:
            fmt = detect_format(record) if isinstance(record, dict) else None
            if fmt is None:
                keys = sorted(record)[:8] if isinstance(record, dict) else type(record).__name__
                raise DataFileError(
                    f"{where}: unknown question format (keys {keys}); "
                    "expected NQ-open, TriviaQA, HotpotQA or FlashRAG records"
                )
        example = _example(record, fmt, index, dataset, where)
        if example.id in seen:
            raise DataFileError(f"{where}: duplicate id {example.id!r} (first at {seen[example.id]})")
        seen[example.id] = where
        examples.append(example)
    if not examples:
        raise DataFileError(f"{path}: no questions in the file")
    return tuple(examples)


def load_questions(path: str | os.PathLike[str], *, dataset: str | None = None,
                   limit: int | None = None) -> list[QAExample]:
    """Read a question file in any of the supported formats (cached by path and modification time).

    Args:
        dataset: the name to give the examples (default: from the format; FlashRAG files: `flashrag`).
        limit: keep the first `limit` questions.
    """
    p = Path(path)
    try:
        st = p.stat()
    except FileNotFoundError:
        raise DataFileError(f"{p}: no such file") from None
    examples = list(_load_cached(str(p.resolve()), st.st_mtime_ns, st.st_size, dataset))
    return examples[:limit] if limit is not None else examples
