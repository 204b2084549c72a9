"""Durable files: atomic writes and crash-safe JSONL appends.

Every result file of the suite goes through here. A write either completes or leaves the previous
file in place (temp file in the same folder, fsync, rename, fsync of the folder); an append is one
`write` of a whole line followed by fsync, and a reader drops a torn last line left by a crash.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

__all__ = [
    "atomic_write_bytes",
    "atomic_write_text",
    "atomic_write_json",
    "append_jsonl",
    "read_jsonl",
    "read_jsonl_numbered",
    "parse_json",
    "read_json_file",
    "iter_json_array",
    "read_config_file",
    "atomic_directory",
    "DataFileError",
]


class DataFileError(ValueError):
    """A data or result file could not be read; the message names the file and line."""


def parse_json(raw: bytes, path: str | os.PathLike[str], *, line: int = 1) -> Any:
    """`json.loads` of `raw` (a whole file, or one line of a JSONL file that starts at line `line`).

    Every way a corrupt file can fail (not UTF-8, not JSON, nested past Python's recursion limit,
    an integer past its digit limit) raises `DataFileError("{path}:{line}: invalid JSON: {reason}")`
    with the line where the problem is.
    """
    try:
        return json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as e:
        at, reason = raw.count(b"\n", 0, e.start), f"not UTF-8 ({e.reason} at byte {e.start})"
    except json.JSONDecodeError as e:
        at, reason = e.lineno - 1, f"{e.msg} (column {e.colno})"
    except RecursionError:
        at, reason = _deep_nesting_line(raw), "arrays or objects nested too deeply"
    except ValueError as e:  # an integer literal past Python's digit limit (sys.get_int_max_str_digits)
        digits = re.search(rb"\d{4000,}", raw)
        at, reason = (raw.count(b"\n", 0, digits.start()) if digits else 0), str(e).split(";")[0]
    raise DataFileError(f"{path}:{line + at}: invalid JSON: {reason}")


def _deep_nesting_line(raw: bytes, limit: int = 500) -> int:
    """The 0-based line where brackets (outside strings) first nest deeper than `limit`."""
    depth, in_string, escaped, newlines = 0, False, False, 0
    for byte in raw:
        if byte == 0x0A:
            newlines += 1
        if in_string:
            if escaped:
                escaped = False
            elif byte == 0x5C:  # backslash
                escaped = True
            elif byte == 0x22:  # quote
                in_string = False
        elif byte == 0x22:
            in_string = True
        elif byte in (0x5B, 0x7B):  # [ {
            depth += 1
            if depth > limit:
                return newlines
        elif byte in (0x5D, 0x7D):
            depth -= 1
    return 0


def read_file_bytes(path: str | os.PathLike[str], what: str = "file") -> bytes:
    """A whole file's bytes; a missing path or a folder raises `DataFileError` naming it
    (`what` says what was expected there: "JSON file", "config file", ...)."""
    path = Path(path)
    try:
        return path.read_bytes()
    except FileNotFoundError:
        raise DataFileError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise DataFileError(f"{path}: is a folder, not a {what}") from None


def read_json_file(path: str | os.PathLike[str]) -> Any:
    """Read a whole JSON file; a missing or corrupt file raises `DataFileError` naming the file (and line)."""
    return parse_json(read_file_bytes(path, "JSON file"), Path(path))


def iter_json_array(path: str | os.PathLike[str], *, chunk_bytes: int = 1 << 20) -> Iterator[Any]:
    """Yield the elements of a file holding one JSON array, parsing one element at a time.

    Memory stays at one element and one chunk of the file: `read_json_file` holds the file's bytes,
    their text and every parsed element at once (WebShop's 1.18M-product item file is gigabytes).
    A file that is not an array, or not valid JSON, raises `DataFileError` naming the file and line.
    """
    import codecs

    path = Path(path)
    decoder = json.JSONDecoder()
    utf8 = codecs.getincrementaldecoder("utf-8")()
    ws = re.compile(r"[ \t\n\r]*")
    try:
        f = open(path, "rb")
    except FileNotFoundError:
        raise DataFileError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise DataFileError(f"{path}: is a folder, not a JSON file") from None
    with f:
        buf, pos, eof = "", 0, False
        line = 1  # the line of buf[0]

        def more() -> bool:
            nonlocal buf, pos, eof, line
            if eof:
                return False
            raw = f.read(chunk_bytes)
            try:
                text = utf8.decode(raw, final=not raw)
            except UnicodeDecodeError as e:
                raise DataFileError(
                    f"{path}:{line + buf.count(chr(10), 0, pos)}: invalid JSON: not UTF-8 ({e.reason})") from None
            line += buf.count("\n", 0, pos)
            buf, pos = buf[pos:] + text, 0
            eof = not raw
            return True

        def skip_ws() -> None:
            nonlocal pos
            while True:
                pos = ws.match(buf, pos).end()
                if pos < len(buf) or not more():
                    return

        def fail(reason: str, at: int) -> DataFileError:
            return DataFileError(f"{path}:{line + buf.count(chr(10), 0, at)}: invalid JSON: {reason}")

        if buf.startswith("\ufeff") or (more() and buf.startswith("\ufeff")):
            pos = 1
        skip_ws()
        if pos >= len(buf) or buf[pos] != "[":
            raise fail(f"expected a JSON array, found {buf[pos:pos + 20]!r}" if pos < len(buf) else "the file is empty",
                       pos)
        pos += 1
        skip_ws()
        if pos < len(buf) and buf[pos] == "]":
            pos += 1
        else:
            while True:
                skip_ws()
                while True:
                    try:
                        element, end = decoder.raw_decode(buf, pos)
                    except json.JSONDecodeError as e:
                        if more():  # the element may go on in the next chunk
                            continue
                        raise fail(e.msg, e.pos) from None
                    except RecursionError:
                        raise fail("arrays or objects nested too deeply", pos) from None
                    if (end == len(buf) or buf[end] in "0123456789.eE+-") and more():  # a number cut by the chunk's end
                        continue
                    break
                pos = end
                yield element
                skip_ws()
                if pos < len(buf) and buf[pos] == ",":
                    pos += 1
                    continue
                if pos < len(buf) and buf[pos] == "]":
                    pos += 1
                    break
                raise fail("expected ',' or ']' after an element" if pos < len(buf)
                           else "the array is not closed (a truncated file?)", pos)
        skip_ws()
        if pos < len(buf):
            raise fail(f"extra data after the array: {buf[pos:pos + 20]!r}", pos)


def read_config_file(path: str | os.PathLike[str], kind: str | None = None) -> Any:
    """The content of a TOML, YAML or JSON config file (`kind` "toml", "yaml" or "json"; default:
    from the suffix). A missing or malformed file raises `DataFileError` naming the file and the
    line; YAML is read with `safe_load` (no object tags)."""
    path = Path(path)
    kind = kind or {".toml": "toml", ".yaml": "yaml", ".yml": "yaml", ".json": "json"}.get(path.suffix.lower())
    if kind not in ("toml", "yaml", "json"):
        raise DataFileError(f"{path}: a config file is .toml, .yaml, .yml or .json")
    raw = read_file_bytes(path, "config file")
    if kind == "json":
        return parse_json(raw, path)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw.count(b"\n", 0, e.start) + 1
        raise DataFileError(f"{path}:{line}: not UTF-8 ({e.reason} at byte {e.start})") from None

    def line_where(test: Any) -> int:
        return next((i for i, row in enumerate(text.split("\n"), 1) if test(row)), 1)

    try:
        if kind == "toml":
            import tomllib

            try:
                return tomllib.loads(text)
            except tomllib.TOMLDecodeError as e:
                at = re.search(r"at line (\d+)", str(e))
                raise DataFileError(
                    f"{path}:{at.group(1) if at else 1}: invalid TOML: {str(e).split(' (at ')[0]}") from None
        import yaml

        try:
            return yaml.safe_load(text)
        except yaml.YAMLError as e:
            mark = getattr(e, "problem_mark", None) or getattr(e, "context_mark", None)
            if mark is not None:
                line = mark.line + 1
            elif isinstance(getattr(e, "position", None), int):  # a ReaderError: a character YAML refuses
                line = text.count("\n", 0, e.position) + 1
            else:
                line = 1
            problem = getattr(e, "problem", None) or str(e).splitlines()[0]
            raise DataFileError(f"{path}:{line}: invalid YAML: {problem}") from None
    except RecursionError:
        line = line_where(lambda row: row.count("[") + row.count("{") > 100)
        raise DataFileError(f"{path}:{line}: invalid {kind.upper()}: brackets nested too deeply") from None
    except ValueError as e:  # an integer past Python's digit limit
        if isinstance(e, DataFileError):
            raise
        line = line_where(lambda row: sum(c.isdigit() for c in row) > 4000)
        raise DataFileError(f"{path}:{line}: invalid {kind.upper()}: {str(e).split(';')[0]}") from None


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> None:
    """Write `data` to `path` so that readers see the old file or the new one, never a mix."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    _fsync_dir(path.parent)


@contextmanager
def atomic_directory(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Fill a folder that appears whole or not at all: `with atomic_directory(out) as tmp: model.save_pretrained(tmp)`.

    The body writes into a hidden temporary folder beside `path`; on success its files are fsynced
    and it replaces `path` (an older `path` is renamed aside first and removed after). A crash leaves
    the old folder (or, in the instant between the two renames, the old one under a hidden name
    beside it and no `path`), never a half-written one; an exception removes the temporary folder.
    """
    import shutil

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o777 & ~umask)  # mkdtemp makes it private; the folder it becomes follows the umask
    try:
        yield tmp
        for folder, _, files in os.walk(tmp):
            for name in files:
                fd = os.open(os.path.join(folder, name), os.O_RDONLY)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
            _fsync_dir(Path(folder))
        old = None
        if path.exists():
            old = path.parent / f".{path.name}.old-{os.getpid()}"
            os.replace(path, old)
        os.replace(tmp, path)
        _fsync_dir(path.parent)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def atomic_write_text(path: str | os.PathLike[str], text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: str | os.PathLike[str], obj: Any, indent: int | None = 2) -> None:
    atomic_write_text(path, json.dumps(obj, indent=indent, ensure_ascii=False) + "\n")


def append_jsonl(path: str | os.PathLike[str], records: Iterable[dict[str, Any]]) -> None:
    """Append records as JSON lines, durably: each call ends with fsync."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records).encode("utf-8")
    if not data:
        return
    with open(path, "ab") as f:
        # A previous crash may have left a torn line without its newline: start on a fresh line.
        if f.tell() > 0:
            with open(path, "rb") as r:
                r.seek(-1, os.SEEK_END)
                if r.read(1) != b"\n":
                    data = b"\n" + data
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def read_jsonl(path: str | os.PathLike[str], *, skip_torn_lines: bool = False) -> Iterator[dict[str, Any]]:
    """Yield the JSON objects of a JSONL file (see `read_jsonl_numbered`)."""
    for _, obj in read_jsonl_numbered(path, skip_torn_lines=skip_torn_lines):
        yield obj


def read_jsonl_numbered(
    path: str | os.PathLike[str], *, skip_torn_lines: bool = False
) -> Iterator[tuple[int, dict[str, Any]]]:
    """Yield `(line number, object)` for each JSON object of a JSONL file.

    Args:
        skip_torn_lines: skip lines that are not valid JSON (what a crash during `append_jsonl`
            leaves) instead of raising. Otherwise a bad line raises `DataFileError` naming the file
            and the line.
    """
    path = Path(path)
    try:
        f = open(path, "rb")  # read line by line: a large file is never held whole
    except FileNotFoundError:
        raise DataFileError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise DataFileError(f"{path}: is a folder, not a JSONL file") from None
    with f:
        for number, line in enumerate(f, start=1):
            complete = line.endswith(b"\n")  # else the last line, without its newline: a torn append
            if complete:
                line = line[:-1]
            if not line.strip():
                continue
            try:
                obj = parse_json(line, path, line=number)
            except DataFileError as e:
                if skip_torn_lines:
                    continue
                if not complete:
                    raise DataFileError(str(e).replace(": invalid JSON:", ": truncated last line:", 1)) from None
                raise
            if not isinstance(obj, dict):
                raise DataFileError(f"{path}:{number}: expected a JSON object, got {type(obj).__name__}")
            yield number, obj
