"""The retrieval server: a Flask app over a Lucene BM25 index, served by waitress.

API (a drop-in for Search-R1's retrieval server: its training loop's client runs against it unchanged):

    POST /retrieve  {"queries": ["q1", ...], "topk": 3, "return_scores": true}
        -> {"result": [[{"document": {"id": ..., "title": ..., "text": ..., "contents": "\\"Title\\"\\ntext"},
                         "score": 7.1}, ...], ...]}
           one list per query, best first; with "return_scores": false each item is the bare document.
           `title` and `text` are there when the passage has a title line (`"Title"\\ntext`), split
           as Search-R1's server splits them. An empty "queries" list gets {"result": []} (Search-R1's
           loop sends one when no rollout searched in a turn).
    GET /health     -> {"status": "ok", "num_docs": ..., "batching": true, ...}

Bad requests (malformed JSON, wrong types, a missing "queries", too many queries, topk out of bounds,
more passages than one answer may hold) get HTTP 400 with `{"error": "..."}` saying what is wrong;
bodies over the size limit get 413.

Over-long queries are answered, not refused: one long query must not fail a batch (Search-R1's
client reads `["result"]` of any answer, so a 400 for the batch kills its training step). A query over
the limits is searched in a cut form, and its answer is that form's (`BM25Searcher.cut_query`):

  1. a query longer than `max_query_chars` (4,096) characters keeps its first 4,096, less the word
     that the cut splits (a word: a run of non-whitespace);
  2. then, if the index's analyzer (lower-cased, stopwords dropped, Porter-stemmed) finds more than
     `max_query_terms` (1,024) distinct terms in it, it ends just before its 1,025th distinct term:
     it keeps its first 1,024 distinct terms. 1,024 is Lucene's default clause limit (one clause per
     distinct term), so the cut form runs on any Lucene searcher, Search-R1's included.

Queries within both limits are searched as they are. `/health` counts the cut queries
(`cut_queries`) and the server logs one line per request that had any (how many, which, how cut).

Throughput comes from batching: concurrent requests are not searched one by one. While one Lucene
search runs, the requests that arrive wait in line; the next search takes the whole line (up to
`max_batch_queries`) in one hold of the JVM lock (see `Batcher`); a larger request is searched in
slices of that size. Batches grow with the load, and no time is spent waiting for a batch to fill.
With batching off (`--no-batching`) each request's thread takes the JVM lock for its own queries
(for comparisons).

One process, one JVM: waitress serves the requests on threads, and every Lucene call holds the
process-wide JVM lock (see lucene.py). Waitress reads whole requests in its event loop before a
thread sees them, so clients that send slowly, stall or never read hold no thread. (Granian, a Rust
front end, answered one-query requests faster in benchmarks/retrieval_speed.py `--also granian`, but
it hands a request to a Python thread before the body has arrived: a few dozen slow uploads stall
it.) The server binds 127.0.0.1 unless told otherwise; it has no authentication, so bind other
addresses only on trusted networks.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentgym_opsd.io import atomic_write_text
from retrieval_index.corpus import Hit
from retrieval_index.lucene import BM25Searcher

__all__ = ["ServerLimits", "Batcher", "create_app", "serve", "add_server_arguments", "main"]

DEFAULT_PORT = 8000
DEFAULT_TOPK = 3

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ServerLimits:
    """What one request may ask for (anything beyond is HTTP 400, or 413 for the body size), and
    where over-long queries are cut (they are searched in their cut form, not refused)."""

    # Search-R1's GRPO scripts send up to 512 prompts x 5 rollouts = 2,560 queries in one request.
    max_queries: int = 4096
    max_topk: int = 100
    # A longer query is cut to its first max_query_chars characters (whole words), then to its first
    # max_query_terms distinct analysed terms (Lucene's default clause limit): BM25Searcher.cut_query.
    max_query_chars: int = 4096
    max_query_terms: int = 1024
    max_body_bytes: int = 16 * 1024 * 1024
    # Passages in one answer (queries x topk): 2,560 x 3 is 7,680; 4,096 x 100 would be ~1 GB of JSON.
    max_passages: int = 65_536


class BadRequest(ValueError):
    """A request the server refuses with HTTP 400; the message says why."""


@dataclass
class _Job:
    queries: list[str]
    topk: int
    wake: threading.Event = field(default_factory=threading.Event)
    lead: bool = False  # set (before `wake`) when this job's thread is to run the next batch
    finished: bool = False
    result: list[list[Hit]] | None = None
    error: BaseException | None = None

    def outcome(self) -> list[list[Hit]]:
        if self.error is not None:
            raise self.error
        assert self.result is not None
        return self.result


class Batcher:
    """Coalesces the queries of concurrent requests into Lucene batch searches.

    Leader and followers, no dedicated thread and no timer: a request that finds no search running
    searches at once (it leads), taking every query waiting at that moment; requests arriving while
    a search runs wait in line; when the leader is done it wakes the first waiting request, which
    runs the whole line as the next batch. At low load a request is searched immediately, as without
    batching; under load batches grow with the load. Each batch is one `batch_search` call: one
    hold of the JVM lock for many queries, instead of one contended hand-over of the lock (and of
    the GIL) per request.

    Args:
        searcher: a `BM25Searcher` (anything with `batch_search(queries, k, threads)`).
        lucene_threads: `threads` of each `batch_search` call.
        max_batch_queries: the most queries one `batch_search` call takes; a larger request runs
            alone, in slices of this size.
    """

    def __init__(self, searcher: Any, lucene_threads: int = 2, max_batch_queries: int = 256) -> None:
        self.searcher = searcher
        self.lucene_threads = int(lucene_threads)
        self.max_batch_queries = int(max_batch_queries)
        self._lock = threading.Lock()
        self._waiting: list[_Job] = []
        self._running = False
        # Statistics for /health and the benchmarks.
        self.batches = 0
        self.queries = 0
        self.largest_batch = 0

    def search(self, queries: list[str], topk: int, timeout: float = 120.0) -> list[list[Hit]]:
        """Search `queries` (alone or in a batch with other requests'); blocks the calling thread."""
        job = _Job(list(queries), int(topk))
        with self._lock:
            self._waiting.append(job)
            if not self._running:
                self._running = job.lead = True
        if not job.lead:
            job.wake.wait(timeout)
            with self._lock:
                if not job.lead and not job.finished and job in self._waiting:
                    self._waiting.remove(job)  # never started: give up
                    raise TimeoutError(f"the search did not start within {timeout:g} s")
            if not job.lead:
                job.wake.wait()  # taken into a running batch, which ends in bounded time
                return job.outcome()
        self._lead()
        return job.outcome()

    def _lead(self) -> None:
        """Run one batch of waiting jobs, then pass the lead on (or stop leading)."""
        with self._lock:
            batch, size = [], 0
            while self._waiting and (not batch or size + len(self._waiting[0].queries) <= self.max_batch_queries):
                job = self._waiting.pop(0)
                batch.append(job)
                size += len(job.queries)
        try:
            self._run(batch)
        finally:
            with self._lock:
                successor = self._waiting[0] if self._waiting else None
                if successor is not None:
                    successor.lead = True
                else:
                    self._running = False
                for job in batch:
                    job.finished = True
            for job in batch:
                job.wake.set()
            if successor is not None:
                successor.wake.set()

    def _run(self, jobs: list[_Job]) -> None:
        flat = [q for j in jobs for q in j.queries]
        k = max(j.topk for j in jobs)  # the top-k of a top-K list (K >= k) is the top-k
        hits: list[list[Hit]] = []
        try:
            for start in range(0, len(flat), self.max_batch_queries):
                piece = flat[start : start + self.max_batch_queries]
                hits.extend(self.searcher.batch_search(piece, k, threads=self.lucene_threads))
                self.batches += 1
                self.largest_batch = max(self.largest_batch, len(piece))
        except BaseException as e:  # every request of the batch gets the error
            for j in jobs:
                j.error = e
            return
        self.queries += len(flat)
        start = 0
        for j in jobs:
            j.result = [h[: j.topk] for h in hits[start : start + len(j.queries)]]
            start += len(j.queries)


def parse_retrieve_request(body: bytes, limits: ServerLimits) -> tuple[list[str], int, bool]:
    """Check a /retrieve body; return (queries, topk, return_scores) or raise `BadRequest`."""
    try:
        payload = json.loads(body.decode("utf-8"))
    except RecursionError:
        raise BadRequest(
            "the body is JSON nested too deeply to read; send {\"queries\": [\"...\"], \"topk\": 3}") from None
    except ValueError as e:  # JSONDecodeError, UnicodeDecodeError, and integers past Python's digit limit
        raise BadRequest(f"the body is not valid JSON ({e}); send {{\"queries\": [\"...\"], \"topk\": 3}}") from None
    if not isinstance(payload, dict):
        raise BadRequest(f"the body must be a JSON object, got {type(payload).__name__}")
    queries = payload.get("queries")
    if queries is None:
        raise BadRequest('missing "queries": a list of query strings')
    if not isinstance(queries, list):
        raise BadRequest(f'"queries" must be a list of strings, got {type(queries).__name__}')
    if len(queries) > limits.max_queries:
        raise BadRequest(f'"queries" has {len(queries)} items; at most {limits.max_queries} per request')
    for i, q in enumerate(queries):
        if not isinstance(q, str):
            raise BadRequest(f'"queries"[{i}] must be a string, got {type(q).__name__}')
        if not q.isascii():
            try:
                q.encode("utf-8")
            except UnicodeEncodeError:
                raise BadRequest(
                    f'"queries"[{i}] holds an unpaired surrogate (\\ud800-\\udfff); send valid Unicode') from None
    topk = payload.get("topk", DEFAULT_TOPK)
    if topk is None:
        topk = DEFAULT_TOPK
    if isinstance(topk, bool) or not isinstance(topk, int):
        raise BadRequest(f'"topk" must be an integer, got {type(topk).__name__}')
    if not 1 <= topk <= limits.max_topk:
        raise BadRequest(f'"topk" must be between 1 and {limits.max_topk}, got {topk}')
    if len(queries) * topk > limits.max_passages:
        raise BadRequest(
            f'{len(queries)} queries x topk {topk} = {len(queries) * topk} passages; at most {limits.max_passages} '
            "per request: send fewer queries or a smaller topk"
        )
    return_scores = payload.get("return_scores", False)
    if not isinstance(return_scores, bool):
        raise BadRequest(f'"return_scores" must be true or false, got {type(return_scores).__name__}')
    return queries, topk, return_scores


def document(hit: Hit) -> dict[str, str]:
    """A hit as Search-R1's server returns a document: `title` (the first line without its quotes)
    and `text` (the lines after it) beside the `contents` they come from, and our `id`.

    The split is Search-R1's, not `corpus.split_title` (which also trims whitespace), so that a
    client reading `title` or `text` sees what Search-R1's own server would send. A passage without
    a title line has no `title` and `text`.
    """
    head, newline, rest = hit.contents.partition("\n")
    if not newline:
        return {"id": hit.docid, "contents": hit.contents}
    return {"id": hit.docid, "title": head.strip('"'), "text": rest, "contents": hit.contents}


def cut_long_queries(searcher: Any, queries: list[str], limits: ServerLimits) -> tuple[list[str], dict[int, str]]:
    """The queries to search: each over-long one in its cut form (`searcher.cut_query`, see the
    module docstring), the others as sent. Also returns {index: cut form} of the cut ones."""
    cut: dict[int, str] = {}
    shortest_to_check = min(limits.max_query_chars, limits.max_query_terms)  # a term is >= 1 character
    for i, q in enumerate(queries):
        if len(q) > shortest_to_check:
            form = searcher.cut_query(q, limits.max_query_chars, limits.max_query_terms)
            if form != q:
                cut[i] = form
    if not cut:
        return queries, cut
    return [cut.get(i, q) for i, q in enumerate(queries)], cut


def describe_cuts(queries: list[str], cut: dict[int, str], limits: ServerLimits, shown: int = 3) -> str:
    """One log line for a request whose over-long queries were cut."""
    details = [f"[{i}] {len(queries[i])} -> {len(form)} characters" for i, form in list(cut.items())[:shown]]
    more = f" and {len(cut) - shown} more" if len(cut) > shown else ""
    return (f"cut {len(cut)} of {len(queries)} queries of a request to the query limits "
            f"({limits.max_query_chars} characters, {limits.max_query_terms} distinct terms): "
            f"{', '.join(details)}{more}")  # fmt: skip


def format_results(hits: list[list[Hit]], return_scores: bool) -> list[list[dict[str, Any]]]:
    """Search-R1's response shape: documents with scores, or bare documents."""
    if return_scores:
        return [[{"document": document(h), "score": h.score} for h in row] for row in hits]
    return [[document(h) for h in row] for row in hits]


def create_app(
    searcher: Any,
    *,
    batching: bool = True,
    lucene_threads: int = 2,
    max_batch_queries: int = 256,
    limits: ServerLimits = ServerLimits(),
):
    """The Flask app over `searcher` (a `BM25Searcher`). See the module docstring for the API."""
    import orjson
    from flask import Flask, Response, request

    app = Flask("agentgym_opsd_retrieval")
    app.config["MAX_CONTENT_LENGTH"] = limits.max_body_bytes
    app.json.sort_keys = False  # type: ignore[attr-defined]
    batcher = Batcher(searcher, lucene_threads, max_batch_queries) if batching else None
    started = time.time()
    app.extensions["agentgym_batcher"] = batcher
    cut_counter_lock = threading.Lock()
    cut_counts = {"cut_queries": 0, "requests_with_cut_queries": 0}

    def reply(obj: Any, status: int = 200) -> Response:
        try:
            body = orjson.dumps(obj)
        except TypeError:  # a message quoting text that is not valid Unicode (orjson refuses it)
            body = json.dumps(obj).encode()
        return Response(body, status=status, mimetype="application/json")

    @app.post("/retrieve")
    def retrieve() -> Response:
        try:
            queries, topk, return_scores = parse_retrieve_request(request.get_data(cache=False), limits)
        except BadRequest as e:
            return reply({"error": str(e)}, 400)
        if not queries:  # Search-R1's loop asks with no queries when no rollout searched in a turn
            return reply({"result": []})
        try:
            searched, cut = cut_long_queries(searcher, queries, limits)
            if cut:
                with cut_counter_lock:
                    cut_counts["cut_queries"] += len(cut)
                    cut_counts["requests_with_cut_queries"] += 1
                log.info(describe_cuts(queries, cut, limits))
            queries = searched
            if batcher is not None:
                hits = batcher.search(queries, topk)
            else:  # each request takes the JVM lock for its own queries (--no-batching, for comparisons)
                hits = searcher.batch_search(queries, topk, threads=1)
        except (ValueError, TypeError) as e:
            return reply({"error": str(e)}, 400)
        except TimeoutError as e:
            return reply({"error": str(e)}, 503)
        except Exception as e:
            return reply({"error": f"search failed: {type(e).__name__}: {e}"}, 500)
        return reply({"result": format_results(hits, return_scores)})

    @app.get("/health")
    def health() -> Response:
        body: dict[str, Any] = {
            "status": "ok",
            "index": getattr(searcher, "index_dir", None),
            "num_docs": getattr(searcher, "num_docs", None),
            "batching": batcher is not None,
            "uptime_s": round(time.time() - started, 3),
            "limits": limits.__dict__,
            **cut_counts,
        }
        if batcher is not None:
            body["batches"] = batcher.batches
            body["queries"] = batcher.queries
            body["largest_batch"] = batcher.largest_batch
        return reply(body)

    @app.errorhandler(404)
    def not_found(e: Any) -> Response:
        return reply({"error": f"no such endpoint {request.method} {request.path}; use POST /retrieve or GET /health"},
                     404)

    @app.errorhandler(405)
    def bad_method(e: Any) -> Response:
        return reply({"error": f"{request.method} is not allowed on {request.path}"}, 405)

    @app.errorhandler(413)
    def too_large(e: Any) -> Response:
        return reply({"error": f"the body is larger than {limits.max_body_bytes} bytes"}, 413)

    @app.errorhandler(500)
    def internal(e: Any) -> Response:
        return reply({"error": "internal server error"}, 500)

    return app


def _is_loopback(host: str) -> bool:
    return host in ("127.0.0.1", "localhost", "::1") or host.startswith("127.")


def serve(
    index_dir: str | os.PathLike[str],
    *,
    host: str = "127.0.0.1",
    port: int = DEFAULT_PORT,
    batching: bool = True,
    threads: int = 32,
    lucene_threads: int = 2,
    max_batch_queries: int = 256,
    limits: ServerLimits = ServerLimits(),
    k1: float = 0.9,
    b: float = 0.4,
    port_file: str | os.PathLike[str] | None = None,
    quiet: bool = False,
) -> None:
    """Serve `index_dir` with waitress until interrupted.

    Args:
        threads: waitress worker threads: the number of requests handled at once (each waits for
            its batch), so at least the number of concurrent clients.
        port: 0 picks a free port; `port_file` then receives the port actually bound (for parents
            that start the server in a child process).
    """
    from waitress.server import create_server

    if not log.handlers:  # the server's own lines (cut queries) go to stderr, with the time
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s retrieval server: %(message)s"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)
    searcher = BM25Searcher(index_dir, k1=k1, b=b)
    app = create_app(searcher, batching=batching, lucene_threads=lucene_threads,
                     max_batch_queries=max_batch_queries, limits=limits)  # fmt: skip
    server = create_server(
        app,
        host=host,
        port=int(port),
        threads=int(threads),
        connection_limit=max(100, 4 * int(threads)),
        # Flask answers bodies over the limit with a JSON 413; waitress's own cap is a backstop.
        max_request_body_size=limits.max_body_bytes + 2**20,
        channel_timeout=120,
        ident="agentgym-opsd-retrieval",
    )
    bound = int(server.effective_port)  # type: ignore[union-attr]
    if not quiet:
        print(
            f"retrieval server: {searcher.num_docs} passages from {index_dir}, "
            f"batching {'on' if batching else 'off'}, listening on http://{host}:{bound}",
            flush=True,
        )
        if not _is_loopback(host):
            print(f"warning: bound to {host}: the server has no authentication; expose it only on trusted networks",
                  file=sys.stderr, flush=True)  # fmt: skip
    if port_file is not None:
        atomic_write_text(port_file, f"{bound}\n")
    try:
        server.run()
    finally:
        searcher.close()


def add_server_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of `agentgym-opsd serve-retrieval` (also `python -m retrieval_index.server`)."""
    parser.add_argument("--index", required=True, help="index folder (from `agentgym-opsd index build`)")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help="port (0: any free port; default %(default)s)")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default %(default)s: this machine only)")
    parser.add_argument("--no-batching", dest="batching", action="store_false",
                        help="one Lucene call per query, no coalescing (for comparisons)")  # fmt: skip
    parser.add_argument("--threads", type=int, default=32, help="HTTP worker threads (default %(default)s)")
    parser.add_argument("--lucene-threads", type=int, default=2,
                        help="threads per Lucene batch search (default %(default)s)")
    parser.add_argument("--max-batch-queries", type=int, default=256,
                        help="queries per coalesced batch (default %(default)s)")
    parser.add_argument("--max-queries", type=int, default=ServerLimits.max_queries,
                        help="queries per request (default %(default)s)")
    parser.add_argument("--max-topk", type=int, default=ServerLimits.max_topk,
                        help="largest topk (default %(default)s)")
    parser.add_argument("--k1", type=float, default=0.9, help="BM25 k1 (default %(default)s)")
    parser.add_argument("--b", type=float, default=0.4, help="BM25 b (default %(default)s)")
    parser.add_argument("--port-file", default=None, help="write the bound port to this file once listening")
    parser.add_argument("--exit-with-parent", type=int, default=None, metavar="PID",
                        help="exit when process PID (the parent) is gone: a child server never outlives its owner")


def _exit_with_parent(parent_pid: int) -> None:
    """Exit this process (a server started by another one) as soon as its parent is gone."""

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(0.5)
        os._exit(0)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def run_from_args(args: argparse.Namespace) -> int:
    for name in ("threads", "lucene_threads", "max_batch_queries", "max_queries", "max_topk"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1")
    if not 0 <= args.port <= 65535:
        raise ValueError(f"--port must be in [0, 65535], got {args.port}")
    if getattr(args, "exit_with_parent", None):
        _exit_with_parent(args.exit_with_parent)
    limits = ServerLimits(max_queries=args.max_queries, max_topk=args.max_topk)
    serve(
        Path(args.index),
        host=args.host,
        port=args.port,
        batching=args.batching,
        threads=args.threads,
        lucene_threads=args.lucene_threads,
        max_batch_queries=args.max_batch_queries,
        limits=limits,
        k1=args.k1,
        b=args.b,
        port_file=args.port_file,
    )
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m retrieval_index.server",
                                     description="Serve a Lucene BM25 index over HTTP.")
    add_server_arguments(parser)
    args = parser.parse_args(argv)
    try:
        return run_from_args(args)
    except KeyboardInterrupt:
        return 0
    except (OSError, ValueError) as e:
        print(f"retrieval server: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
