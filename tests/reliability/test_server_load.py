"""The retrieval server under concurrent load, next to slow clients, and at its request-size limits.

All against the real server (waitress + Flask + Lucene in a child process) over the session's wiki
slice index. The loads are short and bounded (seconds); benchmarks/load.py runs the long version
(64 clients for 60 s) and reports throughput, latency percentiles and memory.
"""

from __future__ import annotations

import json
import socket
import time

import pytest
import requests

from retrieval_index.process import RetrievalServer

NQ = ("qa", "nq_open_dev_part1.jsonl")


@pytest.fixture(scope="module")
def expected(retrieval_server: RetrievalServer, shared_data, load_tools) -> dict[str, list[str]]:
    """NQ-open questions -> the hit ids the server gives each one when asked alone."""
    from agentgym_opsd.io import read_jsonl

    questions = [r["question"] for r, _ in zip(read_jsonl(shared_data(*NQ)), range(120))]
    return load_tools.expected_answers(retrieval_server.url, questions)


def test_concurrent_load_loses_no_request_and_answers_every_client_correctly(
    retrieval_server: RetrievalServer, expected: dict[str, list[str]], load_tools
) -> None:
    before = requests.get(f"{retrieval_server.url}/health", timeout=10).json()
    result = load_tools.run_server_load(
        retrieval_server.url, expected, clients=24, seconds=4.0, processes=0, server_pid=retrieval_server.process.pid
    )
    assert result.failures == 0, result.failure_examples
    assert result.requests >= 200, result.summary()  # the load really ran (about 1,000 requests on 2 cores)
    after = requests.get(f"{retrieval_server.url}/health", timeout=10).json()
    # Every request reached Lucene exactly once (nothing dropped or repeated), and under this load the
    # batcher coalesced concurrent requests (fewer Lucene calls than queries).
    assert after["queries"] - before["queries"] == result.requests
    assert after["batches"] - before["batches"] < result.requests
    assert result.rss_start_mb and result.rss_end_mb  # sampled (the figures live in benchmarks/load.py)


def test_slow_clients_do_not_block_the_others(
    retrieval_server: RetrievalServer, expected: dict[str, list[str]], load_tools
) -> None:
    """50 stalled connections, 3 clients sending their request a byte at a time and 4 that never read
    a multi-MB answer: meanwhile 8 normal clients are all answered correctly, at a rate comparable to
    the same 8 clients' run without slow clients just before, and the byte-by-byte clients get their
    own answers in the end.

    No absolute rate or latency floor (another job may be using both cores): the comparison is with
    the baseline run in this test, and the latency bound is what blocking would look like. A worker
    thread held by a slow client would hold the requests queued behind it until the server's 120 s
    channel timeout (or for good), so blocked clients would answer almost nothing in the window and
    their slowest request would wait tens of seconds; a busy machine slows both runs alike.
    """
    url = retrieval_server.url
    baseline = load_tools.run_server_load(url, expected, clients=8, seconds=3.0, processes=0)
    assert baseline.failures == 0, baseline.failure_examples
    queries_before = requests.get(f"{url}/health", timeout=10).json()["queries"]
    with load_tools.SlowClients(url, stalled=50, dribblers=3, non_readers=4, byte_interval=0.01) as slow:
        # The never-reading clients' requests (4 x 64 queries at top 100) are searched and their answers
        # written into socket buffers no one reads; wait for that work, so that both runs measure the
        # same 8 clients and not the machine catching up with a one-off burst.
        non_reader_queries = 4 * slow.non_reader_queries
        deadline = time.monotonic() + 120
        while requests.get(f"{url}/health", timeout=10).json()["queries"] < queries_before + non_reader_queries:
            assert time.monotonic() < deadline, "the server did not search the never-reading clients' requests"
            time.sleep(0.05)
        result = load_tools.run_server_load(url, expected, clients=8, seconds=3.0, processes=0)
        slow.wait_for_dribblers(60)
        assert len(slow.dribbler_answers) == 3
        for answer in slow.dribbler_answers:
            status, _, body = answer.partition(b"\r\n")
            assert status.startswith(b"HTTP/1.1 200"), answer[:200]
            assert len(json.loads(body)["result"][0]) == 3
    assert result.failures == 0, result.failure_examples
    assert result.requests >= 0.25 * baseline.requests, (f"with slow clients: {result.summary()}; without: "
                                                         f"{baseline.summary()}")
    assert result.max_ms < 30_000, result.summary()  # blocked: a request waits for the 120 s channel timeout


def _raw_exchange(url: str, data: bytes, timeout: float = 30.0) -> tuple[int, bytes]:
    """Send raw bytes on a fresh connection; return the answer's status code and body."""
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    with socket.create_connection((parts.hostname, parts.port), timeout=timeout) as s:
        s.sendall(data)
        received = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            received += chunk
            head, sep, body = received.partition(b"\r\n\r\n")
            if sep:
                length = [int(v) for k, _, v in (line.partition(b":") for line in head.split(b"\r\n")[1:])
                          if k.strip().lower() == b"content-length"]  # fmt: skip
                if length and len(body) >= length[0]:
                    break
    status = int(received.split(b" ", 2)[1])
    return status, received.partition(b"\r\n\r\n")[2]


def _chunked(body: bytes, size: int = 65536) -> bytes:
    return b"".join(b"%x\r\n" % len(body[i : i + size]) + body[i : i + size] + b"\r\n"
                    for i in range(0, len(body), size)) + b"0\r\n\r\n"


def test_request_size_limits_hold_for_every_way_of_sending_a_body(retrieval_server: RetrievalServer) -> None:
    url = retrieval_server.url
    limit = requests.get(f"{url}/health", timeout=10).json()["limits"]["max_body_bytes"]
    head = b"POST /retrieve HTTP/1.1\r\nHost: loopback\r\nContent-Type: application/json\r\nConnection: close\r\n"
    query = "paris " * 600
    over = json.dumps({"queries": [query] * (limit // (len(query) + 4) + 20)}).encode()
    assert limit < len(over) < limit + 2**20  # over the app's limit, under waitress's backstop
    # A declared length over the limit, a chunked body over it (no length declared), a huge declared length.
    status, body = _raw_exchange(url, head + b"Content-Length: %d\r\n\r\n" % len(over) + over)
    assert status == 413 and "larger than" in json.loads(body)["error"]
    status, body = _raw_exchange(url, head + b"Transfer-Encoding: chunked\r\n\r\n" + _chunked(over))
    assert status == 413 and "larger than" in json.loads(body)["error"]
    status, _ = _raw_exchange(url, head + b"Content-Length: 99999999999\r\n\r\n")
    assert status == 413
    # A small chunked body is fine.
    small = json.dumps({"queries": ["Paris"], "topk": 2}).encode()
    status, body = _raw_exchange(url, head + b"Transfer-Encoding: chunked\r\n\r\n" + _chunked(small))
    assert status == 200 and len(json.loads(body)["result"][0]) == 2
    # Headers and URLs have their own limit (431), malformed framing is a 400.
    status, _ = _raw_exchange(url, b"GET /health HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"a" * 300_000 + b"\r\n\r\n")
    assert status == 431
    status, _ = _raw_exchange(url, b"GET /health?" + b"a" * 300_000 + b" HTTP/1.1\r\nHost: x\r\n\r\n")
    assert status == 431
    for bad in (b"Content-Length: -5\r\n\r\n", b"Content-Length: abc\r\n\r\n",
                b"Transfer-Encoding: chunked\r\n\r\nzz\r\nabc\r\n0\r\n\r\n"):
        status, _ = _raw_exchange(url, head + bad)
        assert status == 400, bad
    status, _ = _raw_exchange(url, b"\x00\xff\xfe not http\r\n\r\n")
    assert status == 400
    assert requests.get(f"{url}/health", timeout=10).status_code == 200  # still serving


def test_a_stalled_server_gives_a_clear_error_in_bounded_time_and_recovers(retrieval_server: RetrievalServer) -> None:
    """The server process frozen (SIGSTOP: what a stuck JVM or a swapped-out machine looks like): the
    client's read timeout ends the wait with an error saying so, and the next request after the
    server resumes succeeds on the same client."""
    import os
    import signal
    import time

    from retrieval_index.client import RetrievalClient, RetrievalServerDown

    client = RetrievalClient(retrieval_server.url, read_timeout=1.0, retries=1, backoff=0.05)
    assert client.search("Paris", 1)
    pid = retrieval_server.process.pid
    os.kill(pid, signal.SIGSTOP)
    try:
        t0 = time.perf_counter()
        with pytest.raises(RetrievalServerDown, match="no answer within 1 s"):
            client.search("capital of France", 1)
        assert time.perf_counter() - t0 < 5
    finally:
        os.kill(pid, signal.SIGCONT)
    assert [h.docid for h in client.search("capital of France", 2)]
    assert requests.get(f"{retrieval_server.url}/health", timeout=10).status_code == 200
