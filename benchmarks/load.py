"""Load and fault figures: the retrieval server under sustained concurrent load, and the env worker pool.

(1) The retrieval server (waitress + Flask + Lucene, in its own process, as in production) over the
    whole ../shared/data/wiki folder. After a warm-up (the JVM's JIT settles), `--clients` concurrent
    loopback clients (keep-alive connections, one query per request, spread over `--processes`
    spawned processes so the client side is not one GIL) send NQ-open questions for `--seconds`.
    Every answer is checked against the hit ids the server gave for that query before the load.
    Printed: requests/s, p50/p99/max latency, failures (non-200, wrong or malformed answers,
    connection errors), and the server's resident memory (RSS, from /proc) after the warm-up and at
    the end, with its lowest and highest sample during the load. `--slow-clients` keeps the slow
    clients of `SlowClients` (stalled connections, byte-by-byte senders, clients that never read
    their answers) open during the load: the figures should not change much, and none may fail.
(2) The env worker pool (`run_episodes(..., workers=N)`), episodes/s at 1, 2 and 4 workers, through
    benchmarks/env_pool.py's measurement.

    .venv/bin/python -m benchmarks.load [--clients 64] [--seconds 60] [--slow-clients] [--skip-pool] [--page]

`--page` also writes the server's figures to docs/benchmarks/load.md (the pool's rows are env_pool's: its
own page, `python -m benchmarks.env_pool --page`).

The load driver (`run_server_load`, `SlowClients`, `rss_mb`) is also what tests/reliability uses for
its shorter, bounded run.
"""

from __future__ import annotations

import argparse
import http.client
import json
import multiprocessing as mp
import os
import socket
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from agentgym_opsd.io import atomic_write_json, read_jsonl
from benchmarks.common import (REPO, SHARED_DATA, add_page_argument, benchmark_command, load_average, markdown_table,
                               percentile, write_results_page)
from benchmarks.retrieval_load import start_together
from retrieval_index.lucene import build_index
from retrieval_index.process import RetrievalServer
from retrieval_index.testing import wiki_slice_records

TOPK = 3


# ------------------------------------------------------------------------------------------------
# Measurements.


def rss_mb(pid: int) -> float:
    """Resident memory of process `pid` in MiB (Linux /proc)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


class RssSampler:
    """Samples a process's RSS every `interval` seconds in a thread (`with RssSampler(pid) as s:`)."""

    def __init__(self, pid: int, interval: float = 0.5) -> None:
        self.pid, self.interval = pid, interval
        self.samples: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.samples.append(rss_mb(self.pid))
            except (OSError, RuntimeError):
                return
            self._stop.wait(self.interval)

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join(5)


@dataclass
class LoadResult:
    """What one load run measured (latencies in ms, memory in MiB)."""

    clients: int
    seconds: float
    requests: int = 0
    failures: int = 0
    failure_examples: list[str] = field(default_factory=list)
    requests_per_s: float = 0.0
    p50_ms: float = float("nan")
    p99_ms: float = float("nan")
    max_ms: float = float("nan")
    rss_start_mb: float | None = None
    rss_end_mb: float | None = None
    rss_min_mb: float | None = None
    rss_max_mb: float | None = None
    rss_samples: list[float] = field(default_factory=list)

    def summary(self) -> str:
        line = (
            f"{self.clients} clients, {self.seconds:.0f} s: {self.requests} requests, {self.requests_per_s:.0f} req/s, "
            f"p50 {self.p50_ms:.1f} ms, p99 {self.p99_ms:.1f} ms, max {self.max_ms:.0f} ms, failures {self.failures}"
        )
        if self.rss_start_mb is not None:
            line += (
                f"; server RSS {self.rss_start_mb:.0f} MiB -> {self.rss_end_mb:.0f} MiB "
                f"(min {self.rss_min_mb:.0f}, max {self.rss_max_mb:.0f})"
            )
        return line


def expected_answers(url: str, queries: list[str], topk: int = TOPK) -> dict[str, list[str]]:
    """The hit ids the server gives each distinct query, asked one at a time before any load."""
    host, port = _host_port(url)
    conn = http.client.HTTPConnection(host, port, timeout=60)
    out: dict[str, list[str]] = {}
    for q in dict.fromkeys(queries):
        conn.request("POST", "/retrieve", body=_body([q], topk), headers={"Content-Type": "application/json"})
        response = conn.getresponse()
        data = response.read()
        if response.status != 200:
            raise RuntimeError(f"{url}/retrieve answered {response.status} for {q!r}: {data[:200]!r}")
        out[q] = [item["document"]["id"] for item in json.loads(data)["result"][0]]
    conn.close()
    return out


def _host_port(url: str) -> tuple[str, int]:
    host, port = url.split("//", 1)[1].rstrip("/").rsplit(":", 1)
    return host.strip("[]"), int(port)


def _body(queries: list[str], topk: int) -> bytes:
    return json.dumps({"queries": queries, "topk": topk, "return_scores": True}).encode()


def _client(host: str, port: int, work: list[tuple[str, list[str]]], topk: int, deadline: float, out: list) -> None:
    """One keep-alive client: cycles through `work` (query, expected ids) until `deadline`."""
    latencies: list[float] = []
    failures: list[str] = []
    conn = http.client.HTTPConnection(host, port, timeout=60)
    headers = {"Content-Type": "application/json"}
    i = 0
    while time.perf_counter() < deadline:
        query, expected = work[i % len(work)]
        i += 1
        t0 = time.perf_counter()
        try:
            conn.request("POST", "/retrieve", body=_body([query], topk), headers=headers)
            response = conn.getresponse()
            data = response.read()
            latencies.append(time.perf_counter() - t0)
            if response.status != 200:
                failures.append(f"HTTP {response.status}: {data[:120]!r}")
                continue
            got = [item["document"]["id"] for item in json.loads(data)["result"][0]]
            if got != expected:
                failures.append(f"wrong answer for {query!r}: {got} != {expected}")
        except (OSError, http.client.HTTPException, ValueError, KeyError, IndexError, TypeError) as e:
            latencies.append(time.perf_counter() - t0)
            failures.append(f"{type(e).__name__}: {e}")
            conn.close()
            conn = http.client.HTTPConnection(host, port, timeout=60)
    conn.close()
    out.append((latencies, failures))


def _client_threads(host: str, port: int, works: list[list[tuple[str, list[str]]]], topk: int, seconds: float,
                    ready: Any = None, queue: Any = None) -> list:  # fmt: skip
    if ready is not None:
        ready.wait()  # every process starts at once, once all have started
    deadline = time.perf_counter() + seconds
    out: list = []
    threads = [threading.Thread(target=_client, args=(host, port, w, topk, deadline, out)) for w in works]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if queue is not None:
        queue.put(out)
    return out


def run_server_load(
    url: str,
    expected: dict[str, list[str]],
    *,
    clients: int = 64,
    seconds: float = 60.0,
    processes: int = 4,
    topk: int = TOPK,
    server_pid: int | None = None,
) -> LoadResult:
    """`clients` concurrent keep-alive clients send one query per request for `seconds` and check
    every answer against `expected` (query -> hit ids, from `expected_answers`).

    Args:
        processes: spawned client processes the clients are spread over (0: threads of this process).
        server_pid: sample this process's RSS during the run.
    """
    host, port = _host_port(url)
    items = list(expected.items())
    # Each client starts at its own place in the query list, so concurrent requests differ.
    works = [items[(c * 7) % len(items) :] + items[: (c * 7) % len(items)] for c in range(clients)]
    sampler = RssSampler(server_pid) if server_pid else None
    rss_start = rss_mb(server_pid) if server_pid else None
    if sampler:
        sampler.__enter__()
    try:
        if processes <= 0:
            outs = _client_threads(host, port, works, topk, seconds)
        else:
            ctx = mp.get_context("spawn")
            queue = ctx.Queue()
            ready = ctx.Barrier(processes + 1)
            procs = [ctx.Process(target=_client_threads,
                                 args=(host, port, works[p::processes], topk, seconds, ready, queue))
                     for p in range(processes)]  # fmt: skip
            for p in procs:
                p.start()
            start_together(ready, procs)
            outs = [o for _ in procs for o in queue.get(timeout=seconds + 120)]
            for p in procs:
                p.join(30)
    finally:
        if sampler:
            sampler.__exit__()
    latencies = [x for lat, _ in outs for x in lat]
    failures = [f for _, fs in outs for f in fs]
    result = LoadResult(clients, seconds, requests=len(latencies), failures=len(failures),
                        failure_examples=failures[:5])
    result.requests_per_s = len(latencies) / seconds
    result.p50_ms, result.p99_ms = 1000 * percentile(latencies, 50), 1000 * percentile(latencies, 99)
    result.max_ms = 1000 * max(latencies, default=float("nan"))
    if server_pid:
        result.rss_start_mb, result.rss_end_mb = rss_start, rss_mb(server_pid)
        samples = [rss_start] + (sampler.samples if sampler else []) + [result.rss_end_mb]
        result.rss_min_mb, result.rss_max_mb = min(samples), max(samples)
        result.rss_samples = samples
    return result


# ------------------------------------------------------------------------------------------------
# Slow clients.


class SlowClients:
    """Misbehaving clients kept open against a server while other clients are measured.

    - `stalled`: connections that send half a request line and then nothing (slowloris);
    - `dribblers`: clients that send a valid /retrieve request one byte every `byte_interval`
      seconds and then read the answer (kept in `dribbler_answers`: status line and body);
    - `non_readers`: clients that send a request whose answer is larger than the socket buffers
      (`non_reader_queries` queries at topk 100) and never read it.

    Use as a context manager; on exit every socket is closed.
    """

    def __init__(self, url: str, *, stalled: int = 50, dribblers: int = 4, non_readers: int = 4,
                 byte_interval: float = 0.02, non_reader_queries: int = 64) -> None:  # fmt: skip
        self.host, self.port = _host_port(url)
        self.counts = (stalled, dribblers, non_readers)
        self.byte_interval = byte_interval
        self.non_reader_queries = non_reader_queries
        self.sockets: list[socket.socket] = []
        self.dribbler_answers: list[bytes] = []
        self._threads: list[threading.Thread] = []
        self._stop = threading.Event()

    def _connect(self, small_receive_buffer: bool = False) -> socket.socket:
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if small_receive_buffer:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.settimeout(60)
        s.connect((self.host, self.port))
        self.sockets.append(s)
        return s

    @staticmethod
    def request_bytes(queries: list[str], topk: int) -> bytes:
        body = json.dumps({"queries": queries, "topk": topk}).encode()
        head = ("POST /retrieve HTTP/1.1\r\nHost: loopback\r\nContent-Type: application/json\r\nContent-Length: "
                f"{len(body)}\r\n\r\n")
        return head.encode() + body

    def _dribble(self, index: int) -> None:
        s = self._connect()
        payload = self.request_bytes([f"history of the river {index}"], 3)
        try:
            for i in range(len(payload)):
                if self._stop.is_set():
                    return
                s.sendall(payload[i : i + 1])
                time.sleep(self.byte_interval)
            self.dribbler_answers.append(_read_http_answer(s))
        except OSError as e:
            self.dribbler_answers.append(f"error: {e}".encode())

    def __enter__(self) -> SlowClients:
        stalled, dribblers, non_readers = self.counts
        for _ in range(stalled):
            self._connect().sendall(b"POST /retrieve HTTP/1.1\r\nHost: loop")
        big = self.request_bytes([f"the history of war {j}" for j in range(self.non_reader_queries)], 100)
        for _ in range(non_readers):
            self._connect(small_receive_buffer=True).sendall(big)
        for i in range(dribblers):
            t = threading.Thread(target=self._dribble, args=(i,), daemon=True)
            t.start()
            self._threads.append(t)
        return self

    def wait_for_dribblers(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(5)
        for s in self.sockets:
            try:
                s.close()
            except OSError:
                pass


def _read_http_answer(s: socket.socket) -> bytes:
    """Read one HTTP/1.1 answer with a Content-Length from a raw socket: the status line + body."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = s.recv(65536)
        if not chunk:
            return data
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next((int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                   if line.lower().startswith(b"content-length:")), 0)
    while len(body) < length:
        chunk = s.recv(65536)
        if not chunk:
            break
        body += chunk
    return head.split(b"\r\n", 1)[0] + b"\r\n" + body


# ------------------------------------------------------------------------------------------------
# The benchmark.


def _nq_questions(limit: int) -> list[str]:
    return [r["question"] for r, _ in zip(read_jsonl(SHARED_DATA / "qa" / "nq_open_dev_part1.jsonl"), range(limit))]


def server_figures(args: argparse.Namespace) -> dict | None:
    """The server under load: printed, and returned as {"passages", "queries", "warmup", "load" (LoadResult),
    "slow" (what the slow clients did, or None)}; None when the shared wiki is absent."""
    if not (SHARED_DATA / "wiki").is_dir():
        print(f"server load: skipped, {SHARED_DATA / 'wiki'} is absent")
        return None
    with tempfile.TemporaryDirectory(prefix="agentgym-load-") as tmp:
        sizes = {name: None for name in ("hotpotqa_distractor_paragraphs.jsonl", "flashrag_wiki18_sample_1000.jsonl",
                                         "wikipedia_vital_articles_summaries_en.jsonl")}  # fmt: skip
        records = list(wiki_slice_records(SHARED_DATA / "wiki", sizes))
        build_index(records, Path(tmp) / "index", progress=False)
        extra = ["--threads", str(max(32, args.clients + 8))]
        with RetrievalServer(Path(tmp) / "index", extra_args=extra) as server:
            pid = server.process.pid  # type: ignore[union-attr]
            queries = _nq_questions(args.queries)
            expected = expected_answers(server.url, queries)
            print(f"server: {len(records)} passages, {len(expected)} distinct queries, pid {pid}, "
                  f"{os.cpu_count()} cores "
                  f"(clients and server share them)")  # fmt: skip
            # Slow clients open before the warm-up: the memory their large answers take (a JVM heap that
            # grows once and stays) is in the starting figure, so the measured run shows growth, not size.
            slow = SlowClients(server.url) if args.slow_clients else None
            if slow:
                slow.__enter__()
            try:
                warm = run_server_load(server.url, expected, clients=args.clients, seconds=args.warmup,
                                       processes=args.processes)
                print(f"warm-up     {warm.summary()}")
                result = run_server_load(server.url, expected, clients=args.clients, seconds=args.seconds,
                                         processes=args.processes, server_pid=pid)  # fmt: skip
                if slow:
                    slow.wait_for_dribblers(60)
            finally:
                if slow:
                    slow.__exit__()
            label = "load+slow  " if slow else "load       "
            print(f"{label} {result.summary()}")
            for example in result.failure_examples:
                print(f"  failure: {example}")
            slow_line = None
            if slow:
                ok = sum(a.startswith(b"HTTP/1.1 200") for a in slow.dribbler_answers)
                slow_line = (f"slow clients: {slow.counts[0]} stalled connections, {slow.counts[1]} byte-by-byte "
                             f"senders ({ok} answered 200), {slow.counts[2]} clients never reading their answers")
                print(slow_line)
            quarters = [result.rss_samples[min(len(result.rss_samples) - 1, q * len(result.rss_samples) // 4)]
                        for q in range(5)]
            print("server RSS at 0/25/50/75/100% of the load: " + " / ".join(f"{x:.0f}" for x in quarters) + " MiB")
            growth = result.rss_end_mb - result.rss_start_mb  # type: ignore[operator]
            print(
                f"memory: RSS grew {growth:+.0f} MiB over {args.seconds:.0f} s of load "
                f"({100 * growth / result.rss_start_mb:+.1f}%)")  # type: ignore[operator]
            if args.out:
                atomic_write_json(args.out, {"warmup": asdict(warm), "load": asdict(result)})
    return {"passages": len(records), "queries": len(expected), "warmup": warm, "load": result, "slow": slow_line}


def results_page_body(figures: dict) -> str:
    """The results page's figures: the warm-up's and the load's requests/s, latencies, failures and server RSS,
    the failures' examples and what the slow clients did (`figures` as server_figures returns them)."""
    rows = []
    for label in ("warmup", "load"):
        r = figures[label]
        rss = "-" if r.rss_start_mb is None else (f"{r.rss_start_mb:.0f} -> {r.rss_end_mb:.0f} "
                                                   f"(min {r.rss_min_mb:.0f}, max {r.rss_max_mb:.0f})")
        rows.append([label, r.clients, f"{r.seconds:.0f}", r.requests, f"{r.requests_per_s:.0f}", f"{r.p50_ms:.1f}",
                     f"{r.p99_ms:.1f}", f"{r.max_ms:.0f}", r.failures, rss])
    failures = "".join(f"\n- failure: {e}" for e in figures["load"].failure_examples)
    return (f"The retrieval server over {figures['passages']:,} passages, {figures['queries']:,} distinct NQ-open "
            "queries, every answer checked.\n\n"
            + markdown_table(["run", "clients", "s", "requests", "req/s", "p50 ms", "p99 ms", "max ms", "failures",
                              "server RSS MiB"], rows)
            + ("\n" + failures if failures else "") + (f"\n\n{figures['slow']}" if figures["slow"] else ""))


def pool_figures(args: argparse.Namespace) -> None:
    import subprocess

    cmd = [sys.executable, "-m", "benchmarks.env_pool", "--episodes", str(args.episodes), "--workers", "1", "2", "4"]
    print("env pool:", " ".join(cmd[1:]), flush=True)
    subprocess.run(cmd, check=True, cwd=REPO)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--warmup", type=float, default=15.0, help="seconds of load before measuring (JIT, caches)")
    parser.add_argument("--processes", type=int, default=4, help="client processes")
    parser.add_argument("--queries", type=int, default=2000, help="distinct NQ-open questions cycled through")
    parser.add_argument("--slow-clients", action="store_true", help="keep slow clients open during the load")
    parser.add_argument("--episodes", type=int, default=160, help="episodes per env pool row")
    parser.add_argument("--skip-pool", action="store_true")
    parser.add_argument("--skip-server", action="store_true")
    parser.add_argument("--out", default=None, help="also write the server figures as JSON here")
    add_page_argument(parser)
    args = parser.parse_args()
    load_before = load_average()
    command = benchmark_command("load")
    figures = None if args.skip_server else server_figures(args)
    if args.page and figures:
        page = write_results_page(
            "load", "The retrieval server under sustained concurrent load: requests/s, latency, failures, memory",
            results_page_body(figures), command=command, load=[load_before[0], load_average()[0]])
        print(f"results page: {page}")
    if not args.skip_pool:
        pool_figures(args)


if __name__ == "__main__":
    main()
