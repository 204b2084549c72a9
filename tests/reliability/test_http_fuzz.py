"""Every HTTP route answers malformed input with a 4xx, never a 5xx (hypothesis-generated requests).

Against the real retrieval server (child process, loopback): random bytes, random JSON values, bodies
that are almost right (every field of the /retrieve schema replaced by arbitrary JSON), deep nesting,
huge numbers, lone surrogates, random methods, paths, query strings and content types. A 200 must
be a well-formed answer for the queries sent. After the fuzzing the server still answers correctly.
AGENTGYM_FUZZ_EXAMPLES=N runs N examples per fuzz test instead of 120 (for a longer local hunt).
"""

from __future__ import annotations

import json

import pytest
import requests
from hypothesis import example, given
from hypothesis import strategies as st

from reliability_fuzz import ANY_TEXT, JSON_VALUES, fuzz_settings, json_bytes
from retrieval_index.process import RetrievalServer

FUZZ = fuzz_settings(120)

ALMOST_RIGHT = st.fixed_dictionaries(
    {},
    optional={
        "queries": st.lists(ANY_TEXT | JSON_VALUES, max_size=6) | JSON_VALUES,
        "topk": st.integers(-5, 10**30) | JSON_VALUES,
        "return_scores": st.booleans() | JSON_VALUES,
        "extra": JSON_VALUES,
    },
).map(json_bytes)

BODIES = st.binary(max_size=300) | JSON_VALUES.map(json_bytes) | ALMOST_RIGHT


def _check(response: requests.Response, sent: bytes | None = None, method: str = "POST") -> None:
    assert response.status_code < 500, (response.status_code, sent[:300] if sent else None, response.text[:300])
    if response.status_code == 200 and sent is not None:
        queries = json.loads(sent)["queries"]
        result = response.json()["result"]
        assert isinstance(result, list) and len(result) == len(queries)
    elif response.status_code >= 400 and method != "HEAD":
        assert response.content  # a reason, not an empty answer


@FUZZ
@given(body=BODIES)
@example(body=b'{"queries": ["\\udcff"]}')
@example(body=b'{"queries": ["Paris"], "topk": 1e400}')
@example(body=b'{"queries": ["Paris"], "topk": NaN}')
@example(body=b'{"queries": ["Paris"], "queries": 3}')
def test_retrieve_never_answers_5xx(retrieval_server: RetrievalServer, body: bytes) -> None:
    r = requests.post(f"{retrieval_server.url}/retrieve", data=body, headers={"Content-Type": "application/json"},
                      timeout=60)
    _check(r, body if r.status_code == 200 else None)


@FUZZ
@given(
    method=st.sampled_from(["GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS"]),
    path=st.sampled_from(["/retrieve", "/health", "/", "/retrieve/", "/health/x", "/%ff%fe",
                          "/..%2f..%2fetc"]) | st.text(st.characters(min_codepoint=33, max_codepoint=126),
                                                       max_size=30).map(lambda p: "/" + p),
    query=st.dictionaries(st.text(max_size=8), st.text(max_size=8), max_size=3),
    content_type=st.sampled_from(["application/json", "text/plain", "multipart/form-data; boundary=zz",
                                  "application/x-www-form-urlencoded", ""]),
    body=BODIES,
)
def test_every_route_and_method_answers_without_5xx(
    retrieval_server: RetrievalServer, method: str, path: str, query: dict, content_type: str, body: bytes
) -> None:
    headers = {"Content-Type": content_type} if content_type else {}
    r = requests.request(method, f"{retrieval_server.url}{path}", params=query, data=body, headers=headers, timeout=60)
    _check(r, method=method)
    if path == "/health" and method == "GET":
        assert r.status_code == 200 and r.json()["status"] == "ok"


def test_the_server_still_answers_correctly_after_the_fuzzing(retrieval_server: RetrievalServer) -> None:
    r = requests.post(f"{retrieval_server.url}/retrieve", json={"queries": ["Paris France capital"], "topk": 2},
                      timeout=30)
    assert r.status_code == 200 and len(r.json()["result"][0]) == 2


@pytest.mark.parametrize(
    "body,reason",
    [
        (b"[" * 100_000 + b"]" * 100_000, "nested"),
        (b'{"queries": [' + b"[" * 50_000 + b"]" * 50_000 + b"]}", "nested"),
        (b'{"queries": ["Paris"], "topk": ' + b"9" * 5000 + b"}", "not valid JSON"),
    ],
    ids=["nested-past-the-recursion-limit", "nested-inside-queries", "integer-past-the-digit-limit"],
)
def test_pathological_json_is_a_400_with_a_reason(retrieval_server: RetrievalServer, body: bytes, reason: str) -> None:
    r = requests.post(f"{retrieval_server.url}/retrieve", data=body, timeout=60)
    assert r.status_code == 400 and reason in r.json()["error"]
