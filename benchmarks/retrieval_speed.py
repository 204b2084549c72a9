"""Retrieval speed: in-process Lucene batch search vs. our HTTP server, with and without batching.

All on one index (the whole ../shared/data/wiki folder, 12,033 passages) and one query set (NQ-open
dev questions), top-3, in one run:

  (a) in-process BM25Searcher.batch_search (the limit: no HTTP at all);
  (b) our server, batching on, 16 concurrent loopback clients, 1 query per request;
  (c) the same with 8 queries per request;
  (d) our server with batching off (one Lucene call per query, as Search-R1's server does) under the
      loads of (b) and (c).

Each load is bounded by a query count and a time limit; it reports queries per second, p50 and p99
request latency, and errors. Also: index build time and peak memory (a child process running
`agentgym-opsd index build`). Targets: (c) >= 70% of (a); (b) >= 2x (d) at one query per request.
Every measurement starts once the JVM's JIT compiler has settled (it compiles for ~10k queries), and
also reports the server's CPU milliseconds per query, which a busy shared machine disturbs less than qps.

    .venv/bin/python benchmarks/retrieval_speed.py [--queries 1805] [--seconds 20] [--out runs/retrieval_speed]

The clients are 16 threads spread over 4 spawned processes using keep-alive `http.client`
connections, so the client side is not one Python interpreter's GIL.
"""

from __future__ import annotations

import argparse
import http.client
import json
import multiprocessing as mp
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
WIKI = REPO.parent / "shared" / "data" / "wiki"
NQ = REPO.parent / "shared" / "data" / "qa" / "nq_open_dev_part1.jsonl"
TOPK = 3


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    index = min(len(values) - 1, max(0, round(q / 100 * (len(values) - 1))))
    return values[index]


# ------------------------------------------------------------------------------------------------
# Load generator (runs in spawned child processes).


def _client_thread(host: str, port: int, bodies: list[bytes], per_request: int, deadline: float, out: list) -> None:
    latencies, errors, answered = [], 0, 0
    conn = http.client.HTTPConnection(host, port, timeout=30)
    headers = {"Content-Type": "application/json"}
    for body in bodies:
        if time.perf_counter() > deadline:
            break
        t0 = time.perf_counter()
        try:
            conn.request("POST", "/retrieve", body=body, headers=headers)
            response = conn.getresponse()
            data = response.read()
            if response.status != 200 or not data.startswith(b'{"result": ['):
                errors += 1
                continue
            if answered % 10 == 0:  # check some answers fully; parsing all would load the client side
                rows = json.loads(data)["result"]
                if len(rows) != per_request or any(len(r) != TOPK for r in rows):
                    errors += 1
                    continue
            answered += per_request
        except (OSError, http.client.HTTPException, ValueError, KeyError):
            errors += 1
            conn.close()
            conn = http.client.HTTPConnection(host, port, timeout=30)
            continue
        latencies.append(time.perf_counter() - t0)
    conn.close()
    out.append((latencies, errors, answered, time.time()))


def _client_process(host: str, port: int, per_thread: list[list[bytes]], per_request: int, seconds: float, start_at: float, queue) -> None:
    while time.time() < start_at:  # all processes start together
        time.sleep(0.001)
    deadline = time.perf_counter() + seconds
    out: list = []
    threads = [threading.Thread(target=_client_thread, args=(host, port, b, per_request, deadline, out)) for b in per_thread]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    queue.put(out)


def run_load(url: str, queries: list[str], *, clients: int, per_request: int, seconds: float, processes: int = 4) -> dict:
    """`clients` concurrent clients send `per_request` queries per request until every query is sent
    once or `seconds` pass. Returns qps, request latency p50/p99 (ms), errors."""
    host, port = url.split("//")[1].split(":")
    usable = len(queries) - len(queries) % per_request
    requests_ = [queries[i : i + per_request] for i in range(0, usable, per_request)]
    bodies = [json.dumps({"queries": r, "topk": TOPK, "return_scores": True}).encode() for r in requests_]
    per_client = [bodies[c::clients] for c in range(clients)]
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    start_at = time.time() + 1.0 + 0.3 * processes
    procs = []
    for p in range(processes):
        mine = per_client[p::processes]
        procs.append(ctx.Process(target=_client_process, args=(host, int(port), mine, per_request, seconds, start_at, queue)))
    for p in procs:
        p.start()
    results = [queue.get(timeout=seconds + 120) for _ in procs]
    for p in procs:
        p.join(timeout=30)
    latencies = [x for r in results for (lat, _, _, _) in r for x in lat]
    errors = sum(e for r in results for (_, e, _, _) in r)
    answered = sum(a for r in results for (_, _, a, _) in r)
    # Wall time: from the common start to the last client's last answer.
    wall = max(end for r in results for (_, _, _, end) in r) - start_at
    return {
        "clients": clients,
        "queries_per_request": per_request,
        "queries": answered,
        "requests": len(latencies),
        "errors": errors,
        "seconds": round(wall, 3),
        "qps": round(answered / wall, 1),
        "p50_ms": round(1000 * percentile(latencies, 50), 2),
        "p99_ms": round(1000 * percentile(latencies, 99), 2),
    }


# ------------------------------------------------------------------------------------------------


def build(corpus: Path, out_dir: Path) -> dict:
    """Index `corpus` in a child process; wall time and the child's peak RSS."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    t0 = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "agentgym_opsd.app.cli", "index", "build", str(corpus), str(out_dir), "--quiet", "--overwrite"],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    seconds = time.perf_counter() - t0
    peak_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    info = json.loads((out_dir / "agentgym_index.json").read_text())
    return {
        "passages": info["num_docs"],
        "wall_seconds_with_jvm_start": round(seconds, 2),
        "indexing_seconds": info["seconds"],
        "peak_rss_mib": round(max(peak_kib, before) / 1024, 1),
        "index_mib": round(info["size_bytes"] / 2**20, 1),
    }


def in_process(index_dir: Path, queries: list[str], threads: int, repeats: int = 3) -> dict:
    from retrieval_index.lucene import BM25Searcher

    with BM25Searcher(index_dir) as searcher:
        passes = warm_up(os.getpid(), lambda: searcher.batch_search(queries, TOPK, threads=threads))
        runs, latencies = [], []
        cpu0 = process_cpu_seconds(os.getpid())
        for _ in range(repeats):
            t0 = time.perf_counter()
            for i in range(0, len(queries), 256):  # the same query set, in batches of 256
                b0 = time.perf_counter()
                searcher.batch_search(queries[i : i + 256], TOPK, threads=threads)
                latencies.append(time.perf_counter() - b0)
            runs.append(time.perf_counter() - t0)
        cpu_ms = 1000 * (process_cpu_seconds(os.getpid()) - cpu0) / (repeats * len(queries))
        single = []
        for q in queries[:300]:
            t0 = time.perf_counter()
            searcher.search(q, TOPK)
            single.append(time.perf_counter() - t0)
    best = statistics.median(runs)
    return {
        "queries": len(queries),
        "qps": round(len(queries) / best, 1),
        "batch_of_256_p50_ms": round(1000 * percentile(latencies, 50), 2),
        "batch_of_256_p99_ms": round(1000 * percentile(latencies, 99), 2),
        "single_query_p50_ms": round(1000 * percentile(single, 50), 3),
        "cpu_ms_per_query": round(cpu_ms, 3),
        "lucene_threads": threads,
        "warm_up_passes": passes,
    }


def process_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def jit_cpu_seconds(pid: int) -> float:
    """CPU seconds of the JVM's JIT compiler threads (`C1/C2 CompilerThread`) in process `pid`."""
    total = 0.0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            stat = (task / "stat").read_text()
        except OSError:
            continue
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        if "CompilerThre" in name:
            fields = stat.rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def warm_up(pid: int, one_pass, max_passes: int = 15, settled: float = 0.05) -> int:
    """Run `one_pass()` until the JIT compiler uses under `settled` of the process's CPU during a pass
    (the JVM compiles hot code for ~10k queries; measuring before that measures the compiler)."""
    for n in range(1, max_passes + 1):
        cpu0, jit0 = process_cpu_seconds(pid), jit_cpu_seconds(pid)
        one_pass()
        cpu, jit = process_cpu_seconds(pid) - cpu0, jit_cpu_seconds(pid) - jit0
        if cpu > 0 and jit / cpu < settled:
            return n
    return max_passes


def server_rss_mib(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        pass
    return None


def main() -> int:
    work = Path(tempfile.mkdtemp(prefix=f"{Path(__file__).stem.replace('_', '-')}-"))
    try:
        return run(work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def run(work: Path) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--queries", type=int, default=1805, help="NQ questions used (default: all 1,805)")
    parser.add_argument("--seconds", type=float, default=20.0, help="time limit of each load (default %(default)s)")
    parser.add_argument("--passes", type=int, default=3, help="times each load sends the query set (default %(default)s)")
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--scale", type=int, default=1,
                        help="index N copies of the corpus: a larger index where each Lucene query costs more (default 1)")  # fmt: skip
    parser.add_argument("--lucene-threads", type=int, default=2)
    parser.add_argument("--out", default="runs/retrieval_speed", help="folder for results.json")
    args = parser.parse_args()
    if not WIKI.is_dir() or not NQ.is_file():
        print(f"needs {WIKI} and {NQ} (the shared data folder beside the repo)", file=sys.stderr)
        return 2

    from agentgym_opsd.io import atomic_write_json, read_jsonl_numbered
    from retrieval_index.process import RetrievalServer

    queries = [r["question"] for _, r in read_jsonl_numbered(NQ)][: args.queries]
    corpus = work / "wiki.jsonl"
    with open(corpus, "w") as f:  # the whole wiki folder as one corpus (ids are unique across files)
        for copy in range(args.scale):  # --scale N: N copies of every passage (a larger, duplicated corpus)
            for path in sorted(WIKI.glob("*.jsonl")):
                prefix = "wiki18-" if path.name.startswith("flashrag_wiki18") else ""
                suffix = f"#copy{copy}" if copy else ""
                for _, r in read_jsonl_numbered(path):
                    f.write(json.dumps({"id": f"{prefix}{r['id']}{suffix}", "contents": r["contents"]}) + "\n")
    index_dir = work / "index"
    results: dict = {"machine": {"cpus": os.cpu_count(), "load_average_at_start": os.getloadavg()}, "topk": TOPK,
                     "corpus": str(WIKI), "scale": args.scale}  # fmt: skip
    print(f"building the index of {WIKI} ...", flush=True)
    results["build"] = build(corpus, index_dir)
    print(f"  {results['build']}", flush=True)

    print("(a) in-process batch search ...", flush=True)
    results["a_in_process"] = in_process(index_dir, queries, args.lucene_threads)
    print(f"  {results['a_in_process']}", flush=True)

    loads = {"b_batching_1q": (True, 1), "c_batching_8q": (True, 8), "d_no_batching_1q": (False, 1), "d_no_batching_8q": (False, 8)}
    for name, (batching, per_request) in loads.items():
        extra = ["--lucene-threads", str(args.lucene_threads)]
        with RetrievalServer(index_dir, batching=batching, extra_args=extra) as server:
            pid = server.process.pid  # type: ignore[union-attr]
            passes = warm_up(pid, lambda: run_load(server.url, queries, clients=args.clients, per_request=per_request, seconds=10))
            print(f"({name[0]}) batching {'on' if batching else 'off'}, {per_request} query/request ...", flush=True)
            cpu0 = process_cpu_seconds(pid)
            out = run_load(server.url, queries * args.passes, clients=args.clients, per_request=per_request, seconds=args.seconds)
            # CPU per query is what batching can save; on a loaded machine it is steadier than qps.
            out["server_cpu_ms_per_query"] = round(1000 * (process_cpu_seconds(pid) - cpu0) / max(out["queries"], 1), 3)
            import requests

            health = requests.get(server.url + "/health", timeout=5).json()
            if batching and health.get("batches"):
                out["mean_batch_queries"] = round(health["queries"] / health["batches"], 1)
            out["server_peak_rss_mib"] = server_rss_mib(pid)
            out["warm_up_passes"] = passes
        results[name] = out
        print(f"  {out}", flush=True)

    # (a) once more after the loads: on a shared machine one short window can be unlucky; the limit is the better one.
    print("(a) in-process batch search, again ...", flush=True)
    results["a_in_process_again"] = in_process(index_dir, queries, args.lucene_threads)
    print(f"  {results['a_in_process_again']}", flush=True)
    if results["a_in_process_again"]["qps"] > results["a_in_process"]["qps"]:
        results["a_in_process"], results["a_in_process_again"] = results["a_in_process_again"], results["a_in_process"]
    a = results["a_in_process"]["qps"]
    b, c = results["b_batching_1q"]["qps"], results["c_batching_8q"]["qps"]
    d1, d8 = results["d_no_batching_1q"]["qps"], results["d_no_batching_8q"]["qps"]
    results["machine"]["load_average_at_end"] = os.getloadavg()
    results["ratios"] = {
        "c_over_a": round(c / a, 3),
        "c_over_a_target": 0.70,
        "b_over_d_1q": round(b / d1, 2),
        "b_over_d_1q_target": 2.0,
        "c_over_d_8q": round(c / d8, 2),
        # The same comparisons in CPU per query (the work each way costs; steadier on a busy machine).
        "c_over_a_cpu": round(results["a_in_process"]["cpu_ms_per_query"] / results["c_batching_8q"]["server_cpu_ms_per_query"], 3),
        "b_over_d_1q_cpu": round(results["d_no_batching_1q"]["server_cpu_ms_per_query"] / results["b_batching_1q"]["server_cpu_ms_per_query"], 2),
    }
    print()
    print(f"{'run':<26}{'qps':>9}{'p50 ms':>10}{'p99 ms':>10}{'errors':>8}{'server CPU ms/query':>22}")
    print(f"{'(a) in-process batch':<26}{a:>9.0f}{'':>10}{'':>10}{0:>8}{results['a_in_process']['cpu_ms_per_query']:>22.3f}")
    for name in loads:
        r = results[name]
        print(f"{name:<26}{r['qps']:>9.0f}{r['p50_ms']:>10.1f}{r['p99_ms']:>10.1f}{r['errors']:>8}{r['server_cpu_ms_per_query']:>22.3f}")
    r = results["ratios"]
    print(f"\n(c)/(a) = {r['c_over_a']:.2f} (target >= 0.70): {'met' if r['c_over_a'] >= 0.7 else 'NOT met'}")
    print(f"(b)/(d) at 1 query/request = {r['b_over_d_1q']:.2f} (target >= 2): {'met' if r['b_over_d_1q'] >= 2 else 'NOT met'}")
    print(f"(c)/(d) at 8 queries/request = {r['c_over_d_8q']:.2f}")
    print(f"in CPU per query: (a)/(c) = {r['c_over_a_cpu']:.2f}, (d)/(b) at 1 query/request = {r['b_over_d_1q_cpu']:.2f}")
    print(f"load average (1, 5, 15 min) at start {results['machine']['load_average_at_start']}, at end {results['machine']['load_average_at_end']}")
    print(f"index build: {results['build']}")
    out_dir = Path(args.out)
    atomic_write_json(out_dir / "results.json", results)
    print(f"wrote {out_dir / 'results.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
