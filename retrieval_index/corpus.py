"""Corpus records: reading them, checking them, and the `"Title"\\ntext` passage convention.

A corpus is JSON lines, one passage per line, in either of two shapes:

- `{"id": ..., "contents": "\\"Title\\"\\ntext"}`: the FlashRAG and Search-R1 format (the title on the
  first line, usually in double quotes);
- `{"id": ..., "title": ..., "text": ...}`: turned into the first shape.

This module is light (stdlib only): the env and the client import `split_title` without Java.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

from agentgym_opsd.io import DataFileError, parse_json

__all__ = ["Hit", "CorpusRecord", "normalize_record", "iter_corpus", "split_title", "join_title"]

CorpusRecord = dict[str, str]


class Hit(NamedTuple):
    """One retrieved passage: the corpus id, the BM25 score, and the stored `"Title"\\ntext` contents."""

    docid: str
    score: float
    contents: str


def join_title(title: str, text: str) -> str:
    """`"Title"\\ntext`, the contents string of the FlashRAG/Search-R1 corpora."""
    return f'"{title}"\n{text}'


def split_title(contents: str) -> tuple[str, str]:
    """Split a `"Title"\\ntext` contents string into (title, text); the surrounding quotes go.

    A contents string without a newline has no title: ("", contents).
    """
    head, sep, body = contents.partition("\n")
    if not sep:
        return "", contents.strip()
    title = head.strip()
    if len(title) >= 2 and title[0] == '"' and title[-1] == '"':
        title = title[1:-1]
    return title, body.strip()


def normalize_record(record: Any, where: str) -> CorpusRecord:
    """Check one corpus record and return it as `{"id": str, "contents": str}`.

    Args:
        record: a parsed JSON object.
        where: `file:line` (or `record N`) for error messages.

    Raises:
        DataFileError: naming `where` and what is wrong.
    """
    if not isinstance(record, dict):
        raise DataFileError(f"{where}: expected a JSON object, got {type(record).__name__}")
    docid = record.get("id", record.get("_id", record.get("docid")))
    if isinstance(docid, bool) or not isinstance(docid, (str, int)) or str(docid) == "":
        raise DataFileError(f"{where}: missing or empty 'id' (a string or an integer)")
    contents = record.get("contents")
    if contents is None:
        title, text = record.get("title"), record.get("text")
        if not isinstance(text, str):
            raise DataFileError(f"{where}: needs 'contents' (\"Title\"\\ntext) or 'title' and 'text' strings")
        contents = join_title(title, text) if isinstance(title, str) and title else text
    if not isinstance(contents, str):
        raise DataFileError(f"{where}: 'contents' must be a string, got {type(contents).__name__}")
    return {"id": str(docid), "contents": contents}


def iter_corpus(source: str | os.PathLike[str] | Iterable[dict[str, Any]]) -> Iterator[tuple[CorpusRecord, int]]:
    """Yield `(record, bytes read so far)` from a JSONL path, or `(record, 0)` from an iterable of dicts.

    The byte count drives a progress bar without reading a large file twice. Blank lines are
    skipped; a bad line raises `DataFileError` naming the file and the line.
    """
    if isinstance(source, (str, os.PathLike)):
        path = Path(source)
        if not path.is_file():
            raise DataFileError(f"{path}: no such corpus file")
        read = 0
        with open(path, "rb") as f:
            for number, line in enumerate(f, start=1):
                read += len(line)
                if not line.strip():
                    continue
                obj = parse_json(line, path, line=number)
                yield normalize_record(obj, f"{path}:{number}"), read
    else:
        for number, obj in enumerate(source, start=1):
            yield normalize_record(obj, f"record {number}"), 0
