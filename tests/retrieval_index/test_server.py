"""The retrieval server and its client, over HTTP on loopback, on a real index."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest
import requests

from agentgym_app.cli import main as cli_main
from retrieval_index.client import RetrievalClient, RetrievalRequestError, RetrievalServerDown
from retrieval_index.lucene import BM25Searcher
from retrieval_index.process import RetrievalServer
from retrieval_index.corpus import Hit
from retrieval_index.server import Batcher, ServerLimits, document

QUERIES = ["capital of France", "who wrote the origin of species", "VIVA Media new name", "Evan Morris lobbyist"]


@pytest.fixture(scope="module")
def searcher(wiki_index: Path):
    with BM25Searcher(wiki_index) as s:
        yield s


def test_retrieve_returns_what_lucene_finds(retrieval_server: RetrievalServer, searcher: BM25Searcher) -> None:
    r = requests.post(f"{retrieval_server.url}/retrieve", json={"queries": QUERIES, "topk": 4, "return_scores": True},
                      timeout=30)
    assert r.status_code == 200
    result = r.json()["result"]
    assert len(result) == len(QUERIES)
    for query, row in zip(QUERIES, result, strict=True):
        expected = searcher.search(query, 4)
        assert [item["document"]["id"] for item in row] == [h.docid for h in expected]
        assert [item["document"]["contents"] for item in row] == [h.contents for h in expected]
        assert [item["score"] for item in row] == pytest.approx([h.score for h in expected], rel=1e-6)
        for item in row:  # Search-R1's split of "Title"\ntext: the first line without quotes, and the rest
            first_line, rest = item["document"]["contents"].split("\n", 1)
            assert item["document"]["title"] == first_line.strip('"') and item["document"]["text"] == rest
    assert document(Hit("x", 1.0, "no title line")) == {"id": "x", "contents": "no title line"}
    assert document(Hit("y", 1.0, '"Dune"\n"Dune" is a novel.\n')) == {
        "id": "y", "title": "Dune", "text": '"Dune" is a novel.\n', "contents": '"Dune"\n"Dune" is a novel.\n'}
    # return_scores false: the bare documents (Search-R1's shape), same order.
    bare = requests.post(f"{retrieval_server.url}/retrieve",
                         json={"queries": QUERIES[:2], "topk": 2, "return_scores": False}, timeout=30)
    assert bare.status_code == 200
    assert bare.json()["result"] == [[item["document"] for item in row[:2]] for row in result[:2]]
    # Defaults: topk 3, no scores.
    default = requests.post(f"{retrieval_server.url}/retrieve", json={"queries": QUERIES[:1]},
                            timeout=30).json()["result"]
    assert default == [[item["document"] for item in result[0][:3]]]


def test_client_round_trip_and_health(retrieval_server: RetrievalServer, searcher: BM25Searcher) -> None:
    with RetrievalClient(retrieval_server.url + "/retrieve") as client:  # a Search-R1 style URL works too
        health = client.health()
        assert health["status"] == "ok" and health["num_docs"] == searcher.num_docs and health["batching"] is True
        hits = client.search(QUERIES[0], topk=3)
        assert [h.docid for h in hits] == [h.docid for h in searcher.search(QUERIES[0], 3)]
        assert client.batch_search(["", "the"], topk=3) == [[], []]  # nothing to match: empty lists, not errors
        with pytest.raises(RetrievalRequestError, match="topk"):
            client.search("Paris", topk=0)


BAD_BODIES = [
    (b"{", "not valid JSON"),
    (b"[1, 2]", "must be a JSON object"),
    (b"{}", 'missing "queries"'),
    (b'{"queries": "Paris"}', "must be a list"),
    (b'{"queries": ["Paris", 3]}', '"queries"[1] must be a string'),
    (b'{"queries": ["Paris"], "topk": 0}', "between 1 and"),
    (b'{"queries": ["Paris"], "topk": 101}', "between 1 and"),
    (b'{"queries": ["Paris"], "topk": "3"}', "must be an integer"),
    (b'{"queries": ["Paris"], "topk": true}', "must be an integer"),
    (b'{"queries": ["Paris"], "return_scores": "yes"}', "true or false"),
    (json.dumps({"queries": ["Paris"] * (ServerLimits.max_queries + 1)}).encode(),
     f"at most {ServerLimits.max_queries}"),
    (json.dumps({"queries": ["Paris"] * 1000, "topk": 100}).encode(), "100000 passages; at most 65536"),
    ("{\"queries\": [\"\udcff\"]}".encode("utf-8", "surrogatepass"), "not valid JSON"),
    (b'{"queries": ["\\udcff"]}', "unpaired surrogate"),
]


@pytest.mark.parametrize("body,message", BAD_BODIES, ids=[m for _, m in BAD_BODIES])
def test_bad_requests_get_400_with_a_reason(retrieval_server: RetrievalServer, body: bytes, message: str) -> None:
    r = requests.post(f"{retrieval_server.url}/retrieve", data=body, headers={"Content-Type": "application/json"},
                      timeout=30)
    assert r.status_code == 400
    assert message in r.json()["error"]


def test_queries_at_the_limits_are_searched_as_sent_and_one_past_them_are_cut(
    retrieval_server: RetrievalServer, searcher: BM25Searcher
) -> None:
    """4,096 characters and 1,024 distinct terms are searched as they are; one character or one
    distinct term more is searched in its cut form and counted in /health. Repeated terms count
    once: 1,500 tokens of 10 distinct terms are searched as sent."""
    han = "".join(chr(0x4E00 + i) for i in range(1100))  # CJK ideographs: one term each
    head = "capital France history " * 40  # 3 distinct terms (capit, franc, histori), 960 characters
    at_chars = ("capital " * 512).strip() + "s"  # 4,096 characters
    over_chars = at_chars + "x"  # 4,097: the cut splits the last word ("capitalsx"), so it goes
    at_terms = head + han[:1021]  # 1,024 distinct terms in 1,981 characters
    over_terms = head + han[:1022]
    repeats = "river " * 2000  # 12,000 characters, 1 distinct term
    cases = [  # (query, the form searched)
        (at_chars, at_chars),
        (over_chars, ("capital " * 511).strip()),
        (at_terms, at_terms),
        (over_terms, at_terms),
        ("Paris " + "music " * 300 + han[:1100], "Paris " + "music " * 300 + han[:1022]),
        (han[:10] * 150, han[:10] * 150),
        (repeats, ("river " * 682).strip()),  # 4,092 characters: the split word ("rive|r") goes
    ]
    before = requests.get(f"{retrieval_server.url}/health", timeout=10).json()
    r = requests.post(f"{retrieval_server.url}/retrieve", json={"queries": [q for q, _ in cases], "topk": 3,
                                                                 "return_scores": True}, timeout=60)  # fmt: skip
    assert r.status_code == 200
    for (query, searched), row in zip(cases, r.json()["result"], strict=True):
        assert [item["document"]["id"] for item in row] == [h.docid for h in searcher.search(searched, 3)], query[:40]
        assert [item["score"] for item in row] == [h.score for h in searcher.search(searched, 3)]
    after = requests.get(f"{retrieval_server.url}/health", timeout=10).json()
    assert after["cut_queries"] - before["cut_queries"] == sum(q != searched for q, searched in cases) == 4


def test_size_limits_and_unknown_routes_answer_json(retrieval_server: RetrievalServer) -> None:
    limit = requests.get(f"{retrieval_server.url}/health", timeout=10).json()["limits"]["max_body_bytes"]
    big = b'{"queries": ["' + b"a" * (limit + 1000) + b'"]}'
    r = requests.post(f"{retrieval_server.url}/retrieve", data=big, headers={"Content-Type": "application/json"},
                      timeout=60)
    assert r.status_code == 413 and "larger than" in r.json()["error"]
    r = requests.get(f"{retrieval_server.url}/retrieve", timeout=10)
    assert r.status_code == 405 and "not allowed" in r.json()["error"]
    r = requests.get(f"{retrieval_server.url}/search", timeout=10)
    assert r.status_code == 404 and "/retrieve" in r.json()["error"]
    # The server still answers after all that.
    assert requests.get(f"{retrieval_server.url}/health", timeout=10).status_code == 200


def test_concurrent_clients_get_their_own_answers(retrieval_server: RetrievalServer, searcher: BM25Searcher) -> None:
    queries = [f"{w} {v}" for w in ("river", "war", "music", "film", "city", "king")
               for v in ("history", "origin", "famous")]
    expected = {q: [h.docid for h in searcher.search(q, 3)] for q in queries}
    before = requests.get(f"{retrieval_server.url}/health", timeout=10).json()
    errors: list[BaseException] = []
    client = RetrievalClient(retrieval_server.url)

    def work(offset: int) -> None:
        try:
            for i in range(12):
                chunk = [queries[(offset + i + j) % len(queries)] for j in range(1 + (offset + i) % 3)]
                got = client.batch_search(chunk, topk=3)
                for q, hits in zip(chunk, got, strict=True):
                    assert [h.docid for h in hits] == expected[q], q
        except BaseException as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors[:3]
    after = requests.get(f"{retrieval_server.url}/health", timeout=10).json()
    assert after["queries"] - before["queries"] == sum(1 + (k + i) % 3 for k in range(16) for i in range(12))


class _HeldSearcher:
    """A real searcher whose first batch waits until `held` other requests are in line (deterministic coalescing)."""

    def __init__(self, searcher: BM25Searcher, batcher_ref: list) -> None:
        self.searcher = searcher
        self.batcher_ref = batcher_ref
        self.batches: list[list[str]] = []
        self.release = threading.Event()

    def batch_search(self, queries, k, threads=1):
        self.batches.append(list(queries))
        if len(self.batches) == 1:
            assert self.release.wait(30)
        return self.searcher.batch_search(queries, k, threads=threads)


def test_batcher_coalesces_waiting_requests_into_one_search(searcher: BM25Searcher) -> None:
    held = _HeldSearcher(searcher, [])
    batcher = Batcher(held, lucene_threads=2)
    results: dict[str, list] = {}

    def ask(q: str, k: int) -> None:
        results[q] = batcher.search([q], k)

    first = threading.Thread(target=ask, args=(QUERIES[0], 3))
    first.start()
    while not held.batches:
        time.sleep(0.005)
    others = [threading.Thread(target=ask, args=(q, 1 + i)) for i, q in enumerate(QUERIES[1:])]
    for t in others:
        t.start()
    while len(batcher._waiting) < len(others):  # all three are in line behind the running search
        time.sleep(0.005)
    held.release.set()
    for t in [first, *others]:
        t.join(timeout=30)
    assert held.batches == [[QUERIES[0]], QUERIES[1:]]  # the three waiting requests went as one batch
    for i, q in enumerate(QUERIES):
        k = 3 if i == 0 else i
        assert [h.docid for h in results[q][0]] == [h.docid for h in searcher.search(q, k)]
    assert batcher.batches == 2 and batcher.largest_batch == 3


def test_batcher_searches_a_large_request_in_slices(searcher: BM25Searcher) -> None:
    """A request larger than one batch (Search-R1 sends 2,560 queries at once) runs as several
    `batch_search` calls of at most `max_batch_queries`, its answers in order."""
    recorder = _HeldSearcher(searcher, [])
    recorder.release.set()
    batcher = Batcher(recorder, lucene_threads=2, max_batch_queries=4)
    queries = [f"{w} history"
               for w in ("France", "Egypt", "music", "river", "war", "physics", "Rome", "film", "art", "law")]
    got = batcher.search(queries, 2)
    assert [len(b) for b in recorder.batches] == [4, 4, 2]
    assert [[h.docid for h in hits] for hits in got] == [[h.docid for h in searcher.search(q, 2)] for q in queries]
    assert batcher.queries == 10 and batcher.batches == 3 and batcher.largest_batch == 4


def test_batcher_hands_errors_to_every_request_of_the_batch(searcher: BM25Searcher) -> None:
    batcher = Batcher(searcher)
    with pytest.raises(ValueError, match="limit"):
        batcher.search(["x" * 10_000], 3)
    assert batcher.search(["Paris"], 1)[0]  # the batcher still works afterwards


def test_down_server_gives_one_clear_error_and_restart_recovers(wiki_index: Path) -> None:
    server = RetrievalServer(wiki_index).start()
    try:
        client = RetrievalClient(server.url, retries=2, backoff=0.1)
        assert client.search("Paris", 1)
        server.kill()
        t0 = time.perf_counter()
        with pytest.raises(RetrievalServerDown, match=r"agentgym-opsd serve-retrieval --index DIR --port \d+"):
            client.search("Paris", 1)
        assert time.perf_counter() - t0 < 10
        server.start()  # the same port
        assert client.search("Paris", 1)
    finally:
        server.stop()


def test_cli_index_build_and_serve_errors(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    corpus = tmp_path / "c.jsonl"
    corpus.write_text('{"id": "q1", "title": "Quennic", "text": "Quennic is a gas giant."}\n')
    assert cli_main(["index", "build", str(corpus), str(tmp_path / "idx"), "--quiet"]) == 0
    assert "indexed 1 passages" in capsys.readouterr().out
    assert cli_main(["index", "build", str(corpus), str(tmp_path / "idx"), "--quiet"]) == 2
    assert "--overwrite" in capsys.readouterr().err
    assert cli_main(["index", "build", str(tmp_path / "none.jsonl"), str(tmp_path / "x")]) == 2
    assert "no such corpus file" in capsys.readouterr().err
    corpus.write_text('{"id": "q1", "title": "Quennic", "text": "ok"}\nnot json\n')
    assert cli_main(["index", "build", str(corpus), str(tmp_path / "bad"), "--quiet"]) == 2
    assert "c.jsonl:2" in capsys.readouterr().err
    assert cli_main(["serve-retrieval", "--index", str(tmp_path / "nowhere")]) == 2
    assert "agentgym-opsd index build" in capsys.readouterr().err


def test_a_child_server_does_not_outlive_its_parent(wiki_index: Path) -> None:
    import os
    import signal
    import subprocess
    import sys

    code = (
        "import sys, time\n"
        "from retrieval_index.process import RetrievalServer\n"
        "s = RetrievalServer(sys.argv[1]).start()\n"
        "print(s.process.pid, flush=True)\n"
        "time.sleep(120)\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", code, str(wiki_index)], stdout=subprocess.PIPE, text=True)
    try:
        child = int(parent.stdout.readline())
        os.kill(child, 0)  # the server runs
        parent.send_signal(signal.SIGKILL)  # the owner dies without cleaning up
        parent.wait(10)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                state = Path(f"/proc/{child}/stat").read_text().rsplit(")", 1)[1].split()[0]
            except (FileNotFoundError, ProcessLookupError):
                return  # gone
            if state == "Z":  # exited, waiting for init to reap it
                return
            time.sleep(0.1)
        os.kill(child, signal.SIGKILL)
        raise AssertionError("the server outlived its parent")
    finally:
        parent.kill()
