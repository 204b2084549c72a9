"""Retrieval speed: our server against a Search-R1-shaped server and the in-process ceiling, in one run.

One Lucene index of the whole ../shared/data/wiki folder (12,033 passages), the 1,805 NQ-open dev
questions, top-3. Contenders, each measured in every round (rounds interleaved, medians reported,
because other jobs share this machine's cores):

  in-process   `BM25Searcher.batch_search` in batches of 256 on 1 thread: no HTTP at all (the ceiling);
  ours         the retrieval server as `agentgym-opsd serve-retrieval` starts it (RetrievalServer);
  Search-R1    a Search-R1-shaped server written here: FastAPI + uvicorn (as Search-R1 installs them:
               `pip install fastapi uvicorn`), a pydantic request model and a sync endpoint that calls
               the same searcher one query at a time and reads each hit's raw stored record back to
               build `{title, text, contents}`, as the BM25 path of Search-R1's
               `search_r1/search/retrieval_server.py` does, with uvicorn's defaults (access log on,
               into a file). The row is skipped, with the install command, when fastapi or uvicorn
               is absent (`pip install fastapi uvicorn`: benchmark-only, not project dependencies);
  --also NAME  our Flask app under another WSGI server (granian, cheroot, gunicorn): how the options
               compared (each skipped when its package is absent).

Loads: 16 concurrent clients x 1 query per request, 16 x 8 queries per request, and 1 client sending 1
query per request sequentially. Clients are threads in 4 spawned processes with keep-alive
`http.client` connections (so the client side is not one GIL), each load bounded by `--seconds`.
Reported per load: queries/s, p50 and p99 request latency, errors, the server's CPU ms per query, and
its peak RSS. Goals: ours >= 0.5x in-process at 16 x 1, >= 0.9x at 16 x 8. Before the rounds every
server answers all questions once at top 3 and top 10, and the answers are compared with in-process
search (ids, order, scores). Each server warms up until the JVM's JIT compiler has settled.

    .venv/bin/python -m benchmarks.retrieval_speed [--rounds 9] [--seconds 4] [--page] [--also granian] \\
        [--out runs/retrieval_speed]

`--page` also writes the tables to docs/benchmarks/retrieval_speed.md.
"""

from __future__ import annotations

import argparse
import http.client
import importlib.util
import json
import os
import resource
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from agentgym_opsd.io import atomic_write_json, atomic_write_text, read_jsonl_numbered
from benchmarks.common import (REPO, SHARED_DATA, add_page_argument, benchmark_command, markdown_table,
                               write_results_page)
from benchmarks.retrieval_load import TOPK, peak_rss_mib, process_cpu_seconds, run_load, tree_cpu_seconds, warm_up
from retrieval_index.lucene import BM25Searcher
from retrieval_index.process import RetrievalServer
from retrieval_index.server import create_app

WIKI = SHARED_DATA / "wiki"
NQ = SHARED_DATA / "qa" / "nq_open_dev_part1.jsonl"
LOADS = {"16 clients x 1 query": (16, 1), "16 clients x 8 queries": (16, 8), "1 client, sequential": (1, 1)}
GOALS = {"16 clients x 1 query": 0.5, "16 clients x 8 queries": 0.9}
IN_PROCESS_BATCH = 256


# ------------------------------------------------------------------------------------------------
# The other servers, each run as `python -m benchmarks.retrieval_speed --serve KIND INDEX PORT_FILE`.


def _listening_socket() -> socket.socket:
    # IPPROTO_TCP named explicitly: asyncio turns Nagle off only on sockets whose proto says TCP, as the
    # ones uvicorn makes itself are (with proto 0 every keep-alive answer waited 40 ms for a delayed ACK).
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(1024)
    return sock


def search_r1_shaped_app(searcher):
    """What Search-R1's retrieval server does in BM25 mode, over our searcher (written for this benchmark):
    a pydantic request, a sync FastAPI endpoint, one search per query, each hit's raw record read back
    and split into title, text and contents."""
    from fastapi import FastAPI
    from pydantic import BaseModel

    class QueryRequest(BaseModel):
        queries: list[str]
        topk: int | None = None
        return_scores: bool = False

    app = FastAPI()

    def retrieve(request: QueryRequest) -> dict:
        topk = request.topk or TOPK
        result = []
        for query in request.queries:
            docs, scores = [], []
            for hit in searcher.search(query, topk):
                contents = json.loads(searcher.raw(hit.docid))["contents"]
                first, _, rest = contents.partition("\n")
                docs.append({"title": first.strip('"'), "text": rest, "contents": contents})
                scores.append(hit.score)
            result.append([{"document": d, "score": s} for d, s in zip(docs, scores)] if request.return_scores
                          else docs)
        return {"result": result}

    retrieve.__annotations__ = {"request": QueryRequest, "return": dict}  # this module postpones annotations
    app.post("/retrieve")(retrieve)
    return app


def serve_other(kind: str, index_dir: str, port_file: str) -> None:
    """Serve `index_dir` with the Search-R1-shaped app (kind "search-r1") or our Flask app under the WSGI
    server `kind`; write the port to `port_file` once listening."""
    if kind == "search-r1":
        import uvicorn

        searcher = BM25Searcher(index_dir)
        sock = _listening_socket()
        server = uvicorn.Server(uvicorn.Config(search_r1_shaped_app(searcher)))
        atomic_write_text(port_file, f"{sock.getsockname()[1]}\n")
        server.run(sockets=[sock])
        return

    if kind == "cheroot":
        from cheroot import wsgi

        sock = _listening_socket()
        port = sock.getsockname()[1]
        sock.close()
        server = wsgi.Server(("127.0.0.1", port), create_app(BM25Searcher(index_dir)), numthreads=32)
        server.prepare()
        atomic_write_text(port_file, f"{port}\n")
        server.serve()
    elif kind == "gunicorn":
        from gunicorn.app.base import BaseApplication

        sock = _listening_socket()
        port = sock.getsockname()[1]
        sock.close()

        class Gunicorn(BaseApplication):
            def load_config(self) -> None:
                for key, value in {"bind": f"127.0.0.1:{port}", "workers": 1, "threads": 32,
                                   "worker_class": "gthread"}.items():
                    self.cfg.set(key, value)

            def load(self):
                atomic_write_text(port_file, f"{port}\n")
                return create_app(BM25Searcher(index_dir))

        Gunicorn().run()
    elif kind == "granian":
        from granian import Granian
        from granian.constants import Interfaces

        sock = _listening_socket()
        port = sock.getsockname()[1]
        sock.close()
        os.environ.update(AGENTGYM_SPEED_INDEX=index_dir, AGENTGYM_SPEED_PORT_FILE=port_file,
                          AGENTGYM_SPEED_PORT=str(port))
        Granian("benchmarks.retrieval_speed:granian_app", address="127.0.0.1", port=port, interface=Interfaces.WSGI,
                workers=1, blocking_threads=32, factory=True, log_enabled=False).serve()  # fmt: skip
    else:
        raise SystemExit(f"unknown server {kind!r}")


def granian_app():
    """Granian's worker process imports this factory (the JVM must start in the worker)."""
    app = create_app(BM25Searcher(os.environ["AGENTGYM_SPEED_INDEX"]))
    atomic_write_text(os.environ["AGENTGYM_SPEED_PORT_FILE"], os.environ["AGENTGYM_SPEED_PORT"] + "\n")
    return app


class OtherServer:
    """`serve_other` in a child process (stopped on exit)."""

    def __init__(self, kind: str, index_dir: Path, work: Path) -> None:
        self.kind = kind
        self.port_file = work / f"{kind}.port"
        self.log = work / f"{kind}.log"
        self.port_file.unlink(missing_ok=True)
        with open(self.log, "wb") as log:
            self.process = subprocess.Popen([sys.executable, "-m", "benchmarks.retrieval_speed", "--serve", kind,
                                             str(index_dir), str(self.port_file)],
                                            stdout=log, stderr=subprocess.STDOUT, cwd=REPO,
                                            start_new_session=True)  # fmt: skip
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"the {kind} server exited: {self.log.read_text()[-2000:]}")
            if self.port_file.exists() and self._answers():
                return
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"the {kind} server did not answer within 180 s: {self.log.read_text()[-2000:]}")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{int(self.port_file.read_text())}"

    def _answers(self) -> bool:
        try:
            conn = http.client.HTTPConnection("127.0.0.1", int(self.port_file.read_text()), timeout=5)
            conn.request("POST", "/retrieve", body=b'{"queries": ["Paris"], "topk": 1}',
                         headers={"Content-Type": "application/json"})
            ok = conn.getresponse().status == 200
            conn.close()
            return ok
        except (OSError, ValueError, http.client.HTTPException):
            return False

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, 15)
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, 9)
                self.process.wait(15)


# ------------------------------------------------------------------------------------------------


def build(corpus: Path, out_dir: Path) -> dict:
    """Index `corpus` in a child process; wall time and the child's peak RSS."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "agentgym_app.cli", "index", "build", str(corpus), str(out_dir),
                    "--quiet", "--overwrite"],
                   check=True, stdout=subprocess.DEVNULL)  # fmt: skip
    seconds = time.perf_counter() - t0
    peak_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    info = json.loads((out_dir / "agentgym_index.json").read_text())
    return {"passages": info["num_docs"], "wall_seconds_with_jvm_start": round(seconds, 2),
            "indexing_seconds": info["seconds"],
            "peak_rss_mib": round(max(peak_kib, before) / 1024, 1),
            "index_mib": round(info["size_bytes"] / 2**20, 1)}  # fmt: skip


def in_process_pass(searcher, queries: list[str]) -> dict:
    """One pass of the query set through `batch_search` (batches of 256, 1 thread): queries/s and CPU."""
    cpu0, t0 = process_cpu_seconds(os.getpid()), time.perf_counter()
    for i in range(0, len(queries), IN_PROCESS_BATCH):
        searcher.batch_search(queries[i : i + IN_PROCESS_BATCH], TOPK, threads=1)
    wall = time.perf_counter() - t0
    return {"qps": round(len(queries) / wall, 1),
            "cpu_ms_per_query": round(1000 * (process_cpu_seconds(os.getpid()) - cpu0) / len(queries), 3)}


def fetch_answers(url: str, queries: list[str], topk: int, per_request: int = 64) -> list[list[tuple[str, float]]]:
    """Every query's (id, score) list from a server (Search-R1's documents carry no id: contents then)."""
    host, port = url.split("//")[1].split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=120)
    out = []
    for i in range(0, len(queries), per_request):
        body = json.dumps({"queries": queries[i : i + per_request], "topk": topk, "return_scores": True}).encode()
        conn.request("POST", "/retrieve", body=body, headers={"Content-Type": "application/json"})
        for row in json.loads(conn.getresponse().read())["result"]:
            out.append([(item["document"].get("id", item["document"]["contents"]), item["score"]) for item in row])
    conn.close()
    return out


def compare_answers(name: str, url: str, searcher, queries: list[str]) -> dict:
    """Compare a server's answers with in-process search at top 3 and top 10."""
    report = {}
    for k in (TOPK, 10):
        expected = searcher.batch_search(queries, k, threads=1)
        got = fetch_answers(url, queries, k)
        same_ids = same_scores = 0
        for hits, row in zip(expected, got, strict=True):
            keys = [h.docid
                    for h in hits] if row and row[0][0] in {h.docid for h in hits} else [h.contents for h in hits]
            if [key for key, _ in row] == keys:
                same_ids += 1
                same_scores += [score for _, score in row] == [h.score for h in hits]
        report[f"top{k}"] = {"same_ids_and_order": same_ids, "same_scores": same_scores, "queries": len(queries)}
    return report


def results_page_body(results: dict) -> str:
    """The results page's figures: per load and server the median queries/s, latencies, server CPU and errors;
    the ratios against Search-R1's server and in-process search with their goals; the in-process ceiling, peak
    RSS and the index build (`results` as results.json holds it)."""
    table = [[load, name, f"{r['qps']:,.0f}", f"{r['p50_ms']:.1f}", f"{r['p99_ms']:.1f}",
              f"{r['server_cpu_ms_per_query']:.2f}", r["errors"]]
             for name, loads in results["medians"].items() for load, r in loads.items()]
    ratios = []
    for load, r in results["ratios"].items():
        spread = r.get("ours_over_search_r1_shaped_per_round")
        ratios.append([load, f"{r['ours_over_search_r1_shaped']:.2f}x" if "ours_over_search_r1_shaped" in r else "-",
                       f"{spread[0]:.2f}-{spread[1]:.2f}x" if spread else "-", f"{r['ours_over_in_process']:.2f}x",
                       f">= {r['goal_over_in_process']}x" if "goal_over_in_process" in r else "-"])
    ceiling = results["in_process"]
    return (f"{results['queries']:,} NQ questions, top {results['topk']}, {results['rounds']} interleaved rounds of "
            f"{results['seconds']:g} s per load; medians.\n\n"
            + markdown_table(["load", "server", "queries/s", "p50 ms", "p99 ms", "server CPU ms/query", "errors"],
                             table)
            + "\n\n" + markdown_table(["load", "ours / Search-R1-shaped", "per round", "ours / in-process", "goal"],
                                       ratios)
            + f"\n\nIn-process batch_search: {ceiling['qps']:,.0f} queries/s (batches of {IN_PROCESS_BATCH}, "
            f"1 thread), {ceiling['cpu_ms_per_query']:.3f} CPU ms per query. Peak RSS, MiB: "
            + ", ".join(f"{n} {v}" for n, v in results["peak_rss_mib"].items())
            + f". Index build: {results['build']}.")


def main() -> int:
    if len(sys.argv) == 5 and sys.argv[1] == "--serve":
        serve_other(sys.argv[2], sys.argv[3], sys.argv[4])
        return 0
    work = Path(tempfile.mkdtemp(prefix="retrieval-speed-"))
    try:
        return run(work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def run(work: Path) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--queries", type=int, default=1805, help="NQ questions used (default: all 1,805)")
    parser.add_argument("--rounds", type=int, default=9,
                        help="interleaved rounds; medians are reported (default %(default)s)")
    parser.add_argument("--seconds", type=float, default=4.0,
                        help="length of each load in each round (default %(default)s)")
    parser.add_argument("--also", action="append", default=[], choices=["granian", "cheroot", "gunicorn"],
                        help="also measure our Flask app under this WSGI server (repeatable)")  # fmt: skip
    parser.add_argument("--out", default="runs/retrieval_speed", help="folder for results.json")
    add_page_argument(parser)
    args = parser.parse_args()
    command = benchmark_command("retrieval_speed")
    if not WIKI.is_dir() or not NQ.is_file():
        print(f"needs {WIKI} and {NQ} (the shared data folder beside the repo)", file=sys.stderr)
        return 2

    queries = [r["question"] for _, r in read_jsonl_numbered(NQ)][: args.queries]
    corpus = work / "wiki.jsonl"
    with open(corpus, "w") as f:  # the whole wiki folder as one corpus (ids are unique across files)
        for path in sorted(WIKI.glob("*.jsonl")):
            prefix = "wiki18-" if path.name.startswith("flashrag_wiki18") else ""
            for _, r in read_jsonl_numbered(path):
                f.write(json.dumps({"id": f"{prefix}{r['id']}", "contents": r["contents"]}) + "\n")
    index_dir = work / "index"
    results: dict = {"machine": {"cpus": os.cpu_count(), "load_average_at_start": os.getloadavg()}, "topk": TOPK,
                     "corpus": str(WIKI), "queries": len(queries), "rounds": args.rounds,
                     "seconds": args.seconds}  # fmt: skip
    print(f"building the index of {WIKI} ...", flush=True)
    results["build"] = build(corpus, index_dir)
    print(f"  {results['build']}", flush=True)

    servers: dict[str, object] = {}
    try:
        servers["ours"] = RetrievalServer(index_dir).start()
        if importlib.util.find_spec("fastapi") and importlib.util.find_spec("uvicorn"):
            servers["Search-R1-shaped"] = OtherServer("search-r1", index_dir, work)
        else:
            print("skipping the Search-R1-shaped server: it needs fastapi and uvicorn (`pip install fastapi uvicorn`, "
                  "as Search-R1's README installs them; benchmark-only)", flush=True)  # fmt: skip
        for kind in args.also:
            if importlib.util.find_spec(kind) is None:
                print(f"skipping ours under {kind}: `pip install {kind}` first", flush=True)
                continue
            servers[f"ours under {kind}"] = OtherServer(kind, index_dir, work)
        results["servers"] = {name: {"url": s.url} for name, s in servers.items()}  # type: ignore[attr-defined]
        code = measure(args, results, servers, queries, index_dir)
    finally:
        for s in servers.values():
            s.stop()  # type: ignore[attr-defined]
    if args.page:
        machine = results["machine"]
        page = write_results_page(
            "retrieval_speed", "BM25 retrieval server throughput and latency against in-process search",
            results_page_body(results), command=command,
            load=[round(machine["load_average_at_start"][0], 2), round(machine["load_average_at_end"][0], 2)])
        print(f"results page: {page}")
    return code


def measure(args, results: dict, servers: dict, queries: list[str], index_dir: Path) -> int:
    from tqdm.auto import tqdm

    pids = {name: s.process.pid for name, s in servers.items()}
    with BM25Searcher(index_dir) as searcher:
        print("warming up (until the JIT compilers settle) and checking answers ...", flush=True)
        results["in_process_warm_up_passes"] = warm_up(os.getpid(), lambda: in_process_pass(searcher, queries))
        results["answers"], results["warm_up_passes"] = {}, {}
        for name, server in servers.items():
            results["warm_up_passes"][name] = warm_up(
                pids[name], lambda: run_load(server.url, queries, clients=16, per_request=1, seconds=8))
            results["answers"][name] = compare_answers(name, server.url, searcher, queries)
            print(f"  {name}: {results['answers'][name]}", flush=True)
        rounds: dict[str, dict[str, list[dict]]] = {name: {load: [] for load in LOADS} for name in servers}
        in_process: list[dict] = []
        bodies = queries * 4
        for _ in tqdm(range(args.rounds), desc="rounds", unit="round"):
            in_process.append(in_process_pass(searcher, queries))
            for load, (clients, per_request) in LOADS.items():
                for name, server in servers.items():
                    cpu0 = tree_cpu_seconds(pids[name])
                    out = run_load(server.url, bodies, clients=clients, per_request=per_request, seconds=args.seconds)
                    out["server_cpu_ms_per_query"] = round(
                        1000 * (tree_cpu_seconds(pids[name]) - cpu0) / max(out["queries"], 1), 3)
                    rounds[name][load].append(out)
        for name in servers:
            results.setdefault("peak_rss_mib", {})[name] = peak_rss_mib(pids[name])

    def median(rows: list[dict], key: str) -> float:
        return round(statistics.median(r[key] for r in rows), 3)

    ceiling = median(in_process, "qps")
    results["in_process"] = {"qps": ceiling, "cpu_ms_per_query": median(in_process, "cpu_ms_per_query"),
                             "rounds": in_process}
    table = {}
    for name in servers:
        for load in LOADS:
            rows = rounds[name][load]
            table.setdefault(name, {})[load] = {key: median(rows, key)
                                                for key in ("qps", "p50_ms", "p99_ms", "server_cpu_ms_per_query")}
            table[name][load]["errors"] = sum(r["errors"] for r in rows)
    results["medians"], results["rounds_detail"] = table, rounds
    results["machine"]["load_average_at_end"] = os.getloadavg()

    ratios: dict = {}
    for load in LOADS:
        ours = table["ours"][load]["qps"]
        ratios[load] = {"ours_over_in_process": round(ours / ceiling, 3)}
        if "Search-R1-shaped" in table:
            ratios[load]["ours_over_search_r1_shaped"] = round(ours / table["Search-R1-shaped"][load]["qps"], 2)
        # The same comparison per round (both measured in that round), as a spread.
        if "Search-R1-shaped" in rounds:
            per_round = [a["qps"] / b["qps"] for a, b in zip(rounds["ours"][load], rounds["Search-R1-shaped"][load])
                         if b["qps"]]
            ratios[load]["ours_over_search_r1_shaped_per_round"] = [round(min(per_round), 2), round(max(per_round), 2)]
        if load in GOALS:
            ratios[load]["goal_over_in_process"] = GOALS[load]
    results["ratios"] = ratios

    print()
    names = list(servers)
    head = f"{'load':<24}" + "".join(f"{n[:22]:>24}"
                                     for n in names) + f"{'ours / Search-R1':>18}{'ours / in-process':>19}"
    print(head)
    print(f"{'':<24}" + "".join(f"{'q/s  p50  p99 ms':>24}" for _ in names))
    for load in LOADS:
        line = f"{load:<24}"
        for n in names:
            r = table[n][load]
            line += f"{r['qps']:>10,.0f} {r['p50_ms']:>5.1f} {r['p99_ms']:>6.1f}" + (
                f" E{r['errors']}" if r["errors"] else "   ")
        rr = ratios[load]
        line += f"{rr.get('ours_over_search_r1_shaped', float('nan')):>17.2f}x"
        goal = f" (goal {GOALS[load]})" if load in GOALS else ""
        line += f"{rr['ours_over_in_process']:>13.2f}x{goal}"
        print(line)
    print(f"{'in-process batch_search':<24}{ceiling:>10,.0f} q/s (batches of {IN_PROCESS_BATCH}, 1 thread), "
          f"{results['in_process']['cpu_ms_per_query']:.3f} CPU ms/query")  # fmt: skip
    print("server CPU ms per query: " + "; ".join(
        f"{n}: " + ", ".join(f"{table[n][load]['server_cpu_ms_per_query']:.2f}" for load in LOADS)
        for n in names))  # fmt: skip
    print("peak RSS MiB: " + ", ".join(f"{n} {results['peak_rss_mib'][n]}" for n in names))
    for n in names:
        a = results["answers"][n]
        print(f"answers of {n} against in-process search: " + "; ".join(
            f"{k}: {v['same_ids_and_order']}/{v['queries']} same ids and order, {v['same_scores']} same scores"
            for k, v in a.items()))  # fmt: skip
    for load, goal in GOALS.items():
        got = ratios[load]["ours_over_in_process"]
        print(f"goal ours >= {goal}x in-process at {load}: {got:.2f}x, {'met' if got >= goal else 'NOT met'}")
    print(f"{args.rounds} interleaved rounds of {args.seconds:g} s per load; medians. Load average (1, 5, 15 min) "
          f"at start {results['machine']['load_average_at_start']}, at end {results['machine']['load_average_at_end']}")
    print(f"index build: {results['build']}")
    out_dir = Path(args.out)
    atomic_write_json(out_dir / "results.json", results)
    print(f"wrote {out_dir / 'results.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
