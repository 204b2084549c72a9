"""Search-R1's training loop against our server, request by request, as its client sends them.

Search-R1 (`search_r1/llm_agent/generation.py`) posts `{"queries": [...], "topk": 3, "return_scores":
true}` to `retriever.url` (default `http://127.0.0.1:8000/retrieve`) with a bare `requests.post` once
per turn: with no query when no rollout searched in that turn, and up to 512 prompts x 5 rollouts =
2,560 queries in its GRPO scripts. It reads `response.json()["result"]` and turns each query's list
into one `<information>` string from `item["document"]["contents"]`. `SearchR1Client` below
re-implements that client side (written here, not copied) so that the test reads our answers the way
Search-R1's loop does, over HTTP, against the real server of the session (started by the tests with
the defaults `agentgym-opsd serve-retrieval` uses).
"""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
import requests

from retrieval_index.lucene import BM25Searcher
from retrieval_index.process import RetrievalServer

SEARCH_R1_LARGEST_REQUEST = 512 * 5  # data.train_batch_size x actor_rollout_ref.rollout.n_agent in its GRPO scripts


class SearchR1Client:
    """What Search-R1's generation manager does with the retriever: one POST per turn, then each
    query's passages rendered as 'Doc i(Title: first line) rest of the lines' lines."""

    def __init__(self, url: str, topk: int = 3) -> None:
        self.url, self.topk = url, topk

    def post(self, queries: list[str], return_scores: bool = True) -> dict:
        # A bare requests.post (no session, no timeout, no status check), as Search-R1 sends it.
        return requests.post(self.url, json={"queries": queries, "topk": self.topk, "return_scores": return_scores}).json()

    def batch_search(self, queries: list[str]) -> list[str]:
        return [self.render(passages) for passages in self.post(queries)["result"]]

    @staticmethod
    def render(passages: list[dict]) -> str:
        out = []
        for number, item in enumerate(passages, start=1):
            lines = item["document"]["contents"].split("\n")
            out.append(f"Doc {number}(Title: {lines[0]}) {chr(10).join(lines[1:])}\n")
        return "".join(out)


@pytest.fixture(scope="module")
def searcher(wiki_index: Path):
    with BM25Searcher(wiki_index) as s:
        yield s


@pytest.fixture(scope="module")
def client(retrieval_server: RetrievalServer) -> SearchR1Client:
    return SearchR1Client(f"{retrieval_server.url}/retrieve")


def expected_rendering(searcher: BM25Searcher, query: str, topk: int = 3) -> str:
    return SearchR1Client.render([{"document": {"contents": h.contents}} for h in searcher.search(query, topk)])


def test_a_turn_without_searches_gets_an_empty_result(client: SearchR1Client) -> None:
    answer = client.post([])
    assert answer == {"result": []}
    assert client.batch_search([]) == []
    assert client.post([], return_scores=False) == {"result": []}


@pytest.mark.parametrize("count", [1, 2])
def test_one_and_two_queries_read_as_search_r1_reads_them(client: SearchR1Client, searcher: BM25Searcher, count: int) -> None:
    queries = ["capital of France", "who wrote the origin of species"][:count]
    rendered = client.batch_search(queries)
    assert rendered == [expected_rendering(searcher, q) for q in queries]
    assert all(r.startswith("Doc 1(Title: ") and r.count("\n") >= 3 for r in rendered)
    # The same request with scores: documents carry id, title, text and contents; scores are Lucene's.
    rows = client.post(queries)["result"]
    for query, row in zip(queries, rows, strict=True):
        hits = searcher.search(query, 3)
        assert [item["document"]["id"] for item in row] == [h.docid for h in hits]
        assert [item["score"] for item in row] == [h.score for h in hits]
        for item in row:
            document = item["document"]
            first, rest = document["contents"].split("\n", 1)
            assert (document["title"], document["text"]) == (first.strip('"'), rest)


def test_without_scores_the_result_is_the_bare_documents(client: SearchR1Client) -> None:
    queries = ["capital of France", "VIVA Media new name"]
    with_scores = client.post(queries, return_scores=True)["result"]
    bare = client.post(queries, return_scores=False)["result"]
    assert bare == [[item["document"] for item in row] for row in with_scores]
    assert all(set(doc) == {"id", "title", "text", "contents"} for row in bare for doc in row)


def test_the_largest_grpo_request_is_answered_whole_and_in_order(
    client: SearchR1Client, searcher: BM25Searcher, retrieval_server: RetrievalServer
) -> None:
    """2,560 queries in one request (512 prompts x 5 rollouts), some repeated, some empty, as a GRPO
    turn sends them; every answer is the one in-process search gives, in the order sent."""
    words = ["river", "war", "music", "film", "city", "king", "physics", "novel", "empire", "island", "opera", "saint"]
    topics = ["history", "origin", "famous", "capital", "founder", "language", "religion", "population"]
    pool = [f"{a} {b} {c}" for a, b, c in itertools.product(words, topics, ["", "of Europe", "in 1900"])]
    queries = [pool[(i * 7) % len(pool)] for i in range(SEARCH_R1_LARGEST_REQUEST)]
    queries[5] = queries[777] = ""  # a rollout that wrote <search></search>
    health_before = requests.get(f"{retrieval_server.url}/health", timeout=10).json()
    assert health_before["limits"]["max_queries"] >= SEARCH_R1_LARGEST_REQUEST

    rendered = client.batch_search(queries)

    assert len(rendered) == SEARCH_R1_LARGEST_REQUEST
    assert rendered[5] == rendered[777] == ""
    expected = searcher.batch_search(queries, 3, threads=1)
    assert rendered == [SearchR1Client.render([{"document": {"contents": h.contents}} for h in hits]) for hits in expected]
    health_after = requests.get(f"{retrieval_server.url}/health", timeout=10).json()
    assert health_after["queries"] - health_before["queries"] == SEARCH_R1_LARGEST_REQUEST
    # Searched in slices (one Lucene batch is at most max_batch_queries), not one 2,560-query call.
    assert health_after["batches"] - health_before["batches"] >= SEARCH_R1_LARGEST_REQUEST // 256
    # Without scores too (the same documents, bare).
    bare = client.post(queries[:300], return_scores=False)["result"]
    assert [[d["id"] for d in row] for row in bare] == [[h.docid for h in hits] for hits in expected[:300]]
