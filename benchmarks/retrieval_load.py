"""The retrieval server's load generator and the /proc figures of a server process, shared by
benchmarks.retrieval_speed and benchmarks.scale (a module they import, not a benchmark).

- `run_load(url, queries, clients=, per_request=, seconds=)`: concurrent keep-alive clients (threads in
  spawned processes, so the client side is not one GIL) POST top-`TOPK` requests to `/retrieve`;
  queries/s, p50/p99 request latency and errors. `start_together` starts the client processes at
  once, when all have started (benchmarks.load's driver uses it too).
- `warm_up(pid, one_pass)`: repeats a pass until the JVM's JIT compiler has settled.
- `tree_cpu_seconds`, `jit_cpu_seconds`, `peak_rss_mib`: a process and its children, from /proc (Linux).
"""

from __future__ import annotations

import http.client
import json
import multiprocessing as mp
import os
import socket
import threading
import time
from pathlib import Path

from benchmarks.common import percentile

TOPK = 3


# ------------------------------------------------------------------------------------------------
# Load generator (runs in spawned child processes).


def _connect(host: str, port: int) -> http.client.HTTPConnection:
    """A keep-alive connection with Nagle's algorithm off, as `requests` (urllib3) opens them: http.client
    sends a request's headers and body in two writes, which Nagle would hold for a delayed ACK (40 ms)."""
    conn = http.client.HTTPConnection(host, port, timeout=60)
    conn.connect()
    conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return conn


def _client_thread(host: str, port: int, bodies: list[bytes], per_request: int, deadline: float, out: list) -> None:
    latencies, errors, answered = [], 0, 0
    conn = _connect(host, port)
    headers = {"Content-Type": "application/json"}
    for body in bodies:
        if time.perf_counter() > deadline:
            break
        t0 = time.perf_counter()
        try:
            conn.request("POST", "/retrieve", body=body, headers=headers)
            response = conn.getresponse()
            data = response.read()
            if response.status != 200:
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
            conn = _connect(host, port)
            continue
        latencies.append(time.perf_counter() - t0)
    conn.close()
    out.append((latencies, errors, answered, time.time()))


def _client_process(host: str, port: int, per_thread: list[list[bytes]], per_request: int, seconds: float,
                    ready, queue) -> None:
    ready.wait()  # all processes start together, once every one of them has started
    deadline = time.perf_counter() + seconds
    out: list = []
    threads = [threading.Thread(target=_client_thread, args=(host, port, b, per_request, deadline, out))
               for b in per_thread]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    queue.put(out)


def start_together(ready, procs: list) -> float:
    """Wait at `ready` (a barrier of the spawned client processes and this one) until every process has
    started (a spawned process imports its modules first, which takes longer on a busy machine), so that
    all send their first request at once; the common start, as `time.time()`."""
    try:
        ready.wait(timeout=120)
    except threading.BrokenBarrierError:
        for p in procs:
            p.kill()
        raise RuntimeError("the load's client processes did not all start within 120 s") from None
    return time.time()


def run_load(url: str, queries: list[str], *, clients: int, per_request: int, seconds: float,
             processes: int = 4) -> dict:
    """`clients` concurrent clients send `per_request` queries per request until every query is sent
    once or `seconds` pass. Returns queries/s, request latency p50/p99 (ms), errors."""
    host, port = url.split("//")[1].split(":")
    usable = len(queries) - len(queries) % per_request
    requests_ = [queries[i : i + per_request] for i in range(0, usable, per_request)]
    bodies = [json.dumps({"queries": r, "topk": TOPK, "return_scores": True}).encode() for r in requests_]
    per_client = [bodies[c::clients] for c in range(clients)]
    processes = max(1, min(processes, clients))
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    ready = ctx.Barrier(processes + 1)
    procs = [ctx.Process(target=_client_process,
                         args=(host, int(port), per_client[p::processes], per_request, seconds, ready, queue))
             for p in range(processes)]  # fmt: skip
    for p in procs:
        p.start()
    start_at = start_together(ready, procs)
    results = [queue.get(timeout=seconds + 120) for _ in procs]
    for p in procs:
        p.join(timeout=30)
    latencies = [x for r in results for (lat, _, _, _) in r for x in lat]
    errors = sum(e for r in results for (_, e, _, _) in r)
    answered = sum(a for r in results for (_, _, a, _) in r)
    wall = max(end for r in results for (_, _, _, end) in r) - start_at  # the common start to the last answer
    return {
        "queries": answered,
        "requests": len(latencies),
        "errors": errors,
        "seconds": round(wall, 3),
        "qps": round(answered / wall, 1),
        "p50_ms": round(1000 * percentile(latencies, 50), 2),
        "p99_ms": round(1000 * percentile(latencies, 99), 2),
    }


# ------------------------------------------------------------------------------------------------
# Process figures (Linux /proc).


def process_tree(pid: int) -> list[int]:
    """`pid` and its descendants (a server may run its app in a child process)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        for task in Path(f"/proc/{p}/task").glob("*"):
            try:
                todo.extend(int(c) for c in (task / "children").read_text().split())
            except OSError:
                pass
    return out


def process_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process so far."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def tree_cpu_seconds(pid: int) -> float:
    return sum(process_cpu_seconds(p) for p in process_tree(pid))


def jit_cpu_seconds(pid: int) -> float:
    """CPU seconds of the JVM's JIT compiler threads (`C1/C2 CompilerThread`) in process `pid` and its children."""
    total = 0.0
    for p in process_tree(pid):
        for task in Path(f"/proc/{p}/task").glob("*"):
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
        cpu0, jit0 = tree_cpu_seconds(pid), jit_cpu_seconds(pid)
        one_pass()
        cpu, jit = tree_cpu_seconds(pid) - cpu0, jit_cpu_seconds(pid) - jit0
        if cpu > 0 and jit / cpu < settled:
            return n
    return max_passes


def peak_rss_mib(pid: int) -> float | None:
    total = 0.0
    for p in process_tree(pid):
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    total += int(line.split()[1]) / 1024
        except OSError:
            pass
    return round(total, 1) if total else None
