"""Large data files read a record at a time: `iter_json_array` (one JSON array: WebShop's item files are
gigabytes) and `read_jsonl_numbered` (JSONL: WebShop's documents.jsonl, corpora, episodes)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from agentgym_opsd.io import DataFileError, iter_json_array, read_jsonl_numbered


def _values(rng: random.Random, depth: int = 0):
    kind = rng.randrange(8 if depth < 2 else 6)
    if kind == 0:
        return rng.randint(-(10**15), 10**15)
    if kind == 1:
        return rng.random() * 10 ** rng.randint(-8, 12) * rng.choice([1, -1])
    if kind == 2:
        return "".join(rng.choice("ab é€\n\"\\/") for _ in range(rng.randrange(12)))
    if kind == 3:
        return rng.choice([None, True, False])
    if kind in (4, 5):
        return rng.choice([0, 1.5e-7, -0.0, 12345678901234567890])
    if kind == 6:
        return [_values(rng, depth + 1) for _ in range(rng.randrange(4))]
    return {f"k{i}": _values(rng, depth + 1) for i in range(rng.randrange(4))}


@pytest.mark.parametrize("chunk", [1, 2, 3, 7, 64, 1 << 20])
def test_every_chunk_size_gives_what_json_loads_gives(tmp_path: Path, chunk: int) -> None:
    """Elements, numbers and multi-byte characters cut anywhere by a chunk's end come out whole."""
    rng = random.Random(chunk)
    path = tmp_path / "a.json"
    for case in range(60):
        value = [_values(rng) for _ in range(rng.randrange(6))]
        text = json.dumps(value, indent=rng.choice([None, 1]), ensure_ascii=rng.random() < 0.5)
        path.write_text(text + rng.choice(["", "\n", "  \n"]), encoding="utf-8")
        assert list(iter_json_array(path, chunk_bytes=chunk)) == json.loads(text), text


def test_elements_come_before_the_file_is_read_to_its_end(tmp_path: Path, monkeypatch) -> None:
    """The first element is yielded after one chunk, not after the whole file."""
    path = tmp_path / "big.json"
    path.write_text(json.dumps([{"i": i, "text": "x" * 200} for i in range(5000)]))
    reads: list[int] = []
    real_open = open

    class Counting:
        def __init__(self, f):
            self.f = f

        def read(self, n=-1):
            data = self.f.read(n)
            reads.append(len(data))
            return data

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

    monkeypatch.setattr("builtins.open", lambda p, mode="r", *a, **k: Counting(real_open(p, mode, *a, **k)))
    items = iter_json_array(path, chunk_bytes=4096)
    assert next(items) == {"i": 0, "text": "x" * 200}
    assert sum(reads) <= 4096 < path.stat().st_size
    assert sum(1 for _ in items) == 4999


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", ":1: invalid JSON: the file is empty"),
        ('{"a": 1}', ":1: invalid JSON: expected a JSON array"),
        ("[1, 2", ":1: invalid JSON: the array is not closed"),
        ("[1 2]", ":1: invalid JSON: expected ',' or ']'"),
        ('[\n{"a": 1},\n{"b": tru}\n]', ":3: invalid JSON: Expecting value"),
        ("[1]\nx", ":2: invalid JSON: extra data after the array"),
        ("[1,]", ":1: invalid JSON: Expecting value"),
    ],
)
def test_bad_files_name_the_file_and_line(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "bad.json"
    path.write_text(text)
    for chunk in (1, 1 << 20):
        with pytest.raises(DataFileError, match=f"bad.json{message}"):
            list(iter_json_array(path, chunk_bytes=chunk))


def test_missing_file_and_not_utf8(tmp_path: Path) -> None:
    with pytest.raises(DataFileError, match="no such file"):
        list(iter_json_array(tmp_path / "missing.json"))
    (tmp_path / "latin.json").write_bytes(b'["caf\xe9"]')
    with pytest.raises(DataFileError, match="latin.json:1: invalid JSON: not UTF-8"):
        list(iter_json_array(tmp_path / "latin.json"))


def test_jsonl_records_come_before_the_file_is_read_to_its_end(tmp_path: Path, monkeypatch) -> None:
    """read_jsonl_numbered holds one line, not the file (it used to read the whole file first)."""
    path = tmp_path / "big.jsonl"
    path.write_text("".join(json.dumps({"i": i, "text": "x" * 200}) + "\n" for i in range(5000)))
    opened = []
    real_open = open

    def tracking_open(p, mode="r", *a, **k):
        f = real_open(p, mode, *a, **k)
        opened.append(f)
        return f

    monkeypatch.setattr("builtins.open", tracking_open)
    monkeypatch.setattr(Path, "read_bytes", lambda self: pytest.fail("the whole file was read"))
    records = read_jsonl_numbered(path)
    assert next(records) == (1, {"i": 0, "text": "x" * 200})
    assert opened and opened[0].tell() < path.stat().st_size
    assert sum(1 for _ in records) == 4999
