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
        return requests.post(self.url,
                             json={"queries": queries, "topk": self.topk, "return_scores": return_scores}).json()

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
def test_one_and_two_queries_read_as_search_r1_reads_them(client: SearchR1Client, searcher: BM25Searcher,
                                                          count: int) -> None:
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


def grpo_turn_queries() -> list[str]:
    """2,560 short queries (512 prompts x 5 rollouts), some repeated, two empty, as a GRPO turn sends them."""
    words = ["river", "war", "music", "film", "city", "king", "physics", "novel", "empire", "island", "opera", "saint"]
    topics = ["history", "origin", "famous", "capital", "founder", "language", "religion", "population"]
    pool = [f"{a} {b} {c}" for a, b, c in itertools.product(words, topics, ["", "of Europe", "in 1900"])]
    queries = [pool[(i * 7) % len(pool)] for i in range(SEARCH_R1_LARGEST_REQUEST)]
    queries[5] = queries[777] = ""  # a rollout that wrote <search></search>
    return queries


def test_the_largest_grpo_request_is_answered_whole_and_in_order(
    client: SearchR1Client, searcher: BM25Searcher, retrieval_server: RetrievalServer
) -> None:
    """2,560 queries in one request (512 prompts x 5 rollouts), some repeated, some empty, as a GRPO
    turn sends them; every answer is the one in-process search gives, in the order sent."""
    queries = grpo_turn_queries()
    health_before = requests.get(f"{retrieval_server.url}/health", timeout=10).json()
    assert health_before["limits"]["max_queries"] >= SEARCH_R1_LARGEST_REQUEST

    rendered = client.batch_search(queries)

    assert len(rendered) == SEARCH_R1_LARGEST_REQUEST
    assert rendered[5] == rendered[777] == ""
    expected = searcher.batch_search(queries, 3, threads=1)
    assert rendered == [SearchR1Client.render([{"document": {"contents": h.contents}} for h in hits])
                        for hits in expected]
    health_after = requests.get(f"{retrieval_server.url}/health", timeout=10).json()
    assert health_after["queries"] - health_before["queries"] == SEARCH_R1_LARGEST_REQUEST
    # Searched in slices (one Lucene batch is at most max_batch_queries), not one 2,560-query call.
    assert health_after["batches"] - health_before["batches"] >= SEARCH_R1_LARGEST_REQUEST // 256
    # Without scores too (the same documents, bare).
    bare = client.post(queries[:300], return_scores=False)["result"]
    assert [[d["id"] for d in row] for row in bare] == [[h.docid for h in hits] for hits in expected[:300]]


# A policy writes over-long queries (500 Qwen3 tokens can decode to 7,000 characters). The two kinds of
# the issue: one past the character limit (4,096), one past Lucene's default clause limit (1,024
# distinct terms, one clause each: Search-R1's own server answers such a query with a 500).
HAN = "".join(chr(0x4E00 + i) for i in range(2000))  # CJK ideographs: each one is a term of its own
TAIL = " Evan Morris lobbyist"  # words that would change the answer if the cut kept them


def five_thousand_character_query() -> tuple[str, str]:
    """(the query, its cut form: as many of its words as fit in 4,096 characters). The words past
    the cut (the tail, repeated) would decide the answer if they were searched."""
    filler = itertools.cycle(["river", "war", "music", "film", "city", "king", "physics", "novel", "empire", "island",
                              "opera", "saint", "history", "origin", "famous", "founder", "language",
                              "religion"])  # fmt: skip
    query = ""
    while len(query) < 4100:
        query += f" {next(filler)}"
    while len(query) + len(TAIL) <= 5000:
        query += TAIL
    query = query.strip() + " " + "z" * (5000 - len(query))  # a last word to make exactly 5,000 characters
    kept = query.split(" ")
    while len(" ".join(kept)) > 4096:
        kept.pop()
    return query, " ".join(kept)


def two_thousand_term_query() -> tuple[str, str]:
    """(the query: 2,000 distinct terms in 2,028 characters, its cut form: the first 1,024 terms).
    "capital France history capital" analyses to 3 distinct terms (capit, franc, histori), the
    tail to 3 more (evan, morri, lobbyist)."""
    head = "capital France history capital "
    return head + HAN[:1994] + TAIL, head + HAN[: 1024 - 3]


def test_over_long_queries_are_searched_cut_and_do_not_fail_the_batch(
    client: SearchR1Client, searcher: BM25Searcher, retrieval_server: RetrievalServer
) -> None:
    """The largest GRPO request with a 5,000-character query and a 2,000-distinct-term query in it:
    answered 200 with a result for every query (before, the whole batch got a 400, and Search-R1's
    client died on `KeyError('result')`); each over-long query is answered from its cut form, every
    other query as if it were alone; /health counts the two cut queries and the log has one line
    for the request."""
    queries = grpo_turn_queries()
    long_query, long_cut = five_thousand_character_query()
    many_terms, many_terms_cut = two_thousand_term_query()
    assert len(long_query) == 5000 and len(many_terms) < 4096
    queries[100], queries[2000] = long_query, many_terms
    health_before = requests.get(f"{retrieval_server.url}/health", timeout=10).json()
    log_before = retrieval_server.log_tail(10**7)

    answer = client.post(queries)  # Search-R1's request shape, read as its client reads it
    rendered = [SearchR1Client.render(row) for row in answer["result"]]

    assert len(rendered) == SEARCH_R1_LARGEST_REQUEST
    assert rendered[100] == expected_rendering(searcher, long_cut) != expected_rendering(searcher, long_query)
    assert rendered[2000] == expected_rendering(searcher, many_terms_cut) != expected_rendering(searcher, many_terms)
    expected = searcher.batch_search(queries, 3, threads=1)
    for i in range(SEARCH_R1_LARGEST_REQUEST):
        if i not in (100, 2000):
            assert rendered[i] == SearchR1Client.render([{"document": {"contents": h.contents}}
                                                         for h in expected[i]]), i
    assert client.batch_search([queries[0]]) == [rendered[0]]  # a normal query's answer is its answer alone
    health_after = requests.get(f"{retrieval_server.url}/health", timeout=10).json()
    assert health_after["cut_queries"] - health_before["cut_queries"] == 2
    assert health_after["requests_with_cut_queries"] - health_before["requests_with_cut_queries"] == 1
    assert health_after["limits"]["max_query_chars"] == 4096 and health_after["limits"]["max_query_terms"] == 1024
    new_lines = retrieval_server.log_tail(10**7)[len(log_before) :].splitlines()
    cut_lines = [line for line in new_lines if "cut " in line and "queries of a request" in line]
    assert len(cut_lines) == 1, new_lines
    assert "cut 2 of 2560 queries" in cut_lines[0]
    assert f"[100] 5000 -> {len(long_cut)} characters" in cut_lines[0]
    assert f"[2000] {len(many_terms)} -> {len(many_terms_cut)} characters" in cut_lines[0]
