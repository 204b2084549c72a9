"""HTTP client of the retrieval server (and of any Search-R1-compatible /retrieve endpoint).

    client = RetrievalClient("http://127.0.0.1:8000")
    client.search("who wrote hamlet", topk=3)          # [Hit(docid, score, contents), ...]
    client.batch_search(["q1", "q2"], topk=3)          # one request for several queries

One pooled HTTP session (keep-alive connections), a connect and a read timeout, and a bounded number
of retries with exponential backoff for connection failures and 5xx answers. When the server stays
unreachable, `RetrievalServerDown` says where it was looked for and how to start it; a request the
server refuses (HTTP 4xx) raises `RetrievalRequestError` with the server's message, at once.
Light: no Java, no Flask.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from typing import Any

from agentgym_opsd.contract import EnvUnavailable
from retrieval_index.corpus import Hit

__all__ = ["RetrievalClient", "RetrievalServerDown", "RetrievalRequestError", "DEFAULT_URL", "default_url"]

DEFAULT_URL = "http://127.0.0.1:8000"
URL_ENV_VAR = "AGENTGYM_RETRIEVAL_URL"
START_HINT = "start it with `agentgym-opsd serve-retrieval --index DIR --port {port}`"


def default_url() -> str:
    """The server URL to use when none is given: $AGENTGYM_RETRIEVAL_URL, else http://127.0.0.1:8000."""
    return os.environ.get(URL_ENV_VAR) or DEFAULT_URL


class RetrievalServerDown(EnvUnavailable):
    """The retrieval server cannot be reached (after the retries); the message says how to start it."""


class RetrievalRequestError(ValueError):
    """The server refused a request (HTTP 4xx); the message is the server's."""


class RetrievalClient:
    """Client of `POST /retrieve` and `GET /health`.

    Args:
        url: the server's base URL (`http://host:port`; a trailing `/retrieve` is accepted).
        connect_timeout, read_timeout: seconds (a busy server may take a while to answer a batch).
        retries: extra attempts after a connection failure or a 5xx answer.
        backoff: seconds before the first retry, doubled each time (0.25, 0.5, 1.0 by default).
        pool_size: keep-alive connections kept open (one per thread that uses the client at once).
    """

    def __init__(
        self,
        url: str | None = None,
        *,
        connect_timeout: float = 3.0,
        read_timeout: float = 30.0,
        retries: int = 3,
        backoff: float = 0.25,
        pool_size: int = 16,
    ) -> None:
        import requests
        from requests.adapters import HTTPAdapter

        base = (url or default_url()).rstrip("/")
        if base.endswith("/retrieve"):
            base = base[: -len("/retrieve")]
        if not base.startswith(("http://", "https://")):
            raise ValueError(f"retrieval server URL {base!r}: write it as http://HOST:PORT")
        if retries < 0:
            raise ValueError(f"retries must be >= 0, got {retries}")
        self.url = base
        self.timeout = (float(connect_timeout), float(read_timeout))
        self.retries = int(retries)
        self.backoff = float(backoff)
        self._requests = requests
        self._session = requests.Session()
        adapter = HTTPAdapter(pool_connections=1, pool_maxsize=int(pool_size), max_retries=0)
        self._session.mount("http://", adapter)
        self._session.mount("https://", adapter)

    # ------------------------------------------------------------------------------------------

    def _port(self) -> str:
        from urllib.parse import urlsplit

        try:
            return str(urlsplit(self.url).port or 8000)
        except ValueError:
            return "8000"

    def _down(self, reason: str) -> RetrievalServerDown:
        return RetrievalServerDown(
            f"the retrieval server at {self.url} is not reachable ({reason}); "
            + START_HINT.format(port=self._port())
        )

    def _request(self, method: str, path: str, payload: dict[str, Any] | None = None) -> Any:
        requests = self._requests
        last = ""
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(self.backoff * 2 ** (attempt - 1))
            try:
                response = self._session.request(method, self.url + path, json=payload, timeout=self.timeout)
            except requests.ReadTimeout:
                # Not retried: the server is up but did not answer in time; asking again adds load.
                raise self._down(f"no answer within {self.timeout[1]:g} s") from None
            except requests.ConnectionError as e:  # includes ConnectTimeout
                last = f"connection failed: {_short(e)}"
                continue
            except requests.RequestException as e:
                raise self._down(f"{type(e).__name__}: {_short(e)}") from None
            if response.status_code >= 500:
                last = f"HTTP {response.status_code}: {_server_message(response)}"
                continue
            if response.status_code >= 400:
                raise RetrievalRequestError(
                    f"the retrieval server at {self.url} refused the request: HTTP {response.status_code}: "
                    f"{_server_message(response)}"
                )
            try:
                return response.json()
            except ValueError:
                raise self._down(f"{path} answered something that is not JSON; is this a retrieval server?") from None
        raise self._down(f"{last}; {self.retries + 1} attempts")

    # ------------------------------------------------------------------------------------------

    def health(self) -> dict[str, Any]:
        """The server's /health answer (raises `RetrievalServerDown` when it is unreachable)."""
        return self._request("GET", "/health")

    def batch_search(self, queries: Sequence[str], topk: int = 3) -> list[list[Hit]]:
        """The top-`topk` passages of each query, in order (one HTTP request)."""
        queries = list(queries)
        if not queries:
            return []
        body = self._request("POST", "/retrieve", {"queries": queries, "topk": int(topk), "return_scores": True})
        try:
            rows = body["result"]
            if len(rows) != len(queries):
                raise ValueError(f"{len(rows)} result lists for {len(queries)} queries")
            return [
                [Hit(str(item["document"]["id"]), float(item["score"]), str(item["document"]["contents"]))
                 for item in row]
                for row in rows
            ]
        except (KeyError, TypeError, ValueError) as e:
            raise self._down(f"unexpected /retrieve answer ({e}); is this a retrieval server?") from None

    def search(self, query: str, topk: int = 3) -> list[Hit]:
        """The top-`topk` passages for one query."""
        return self.batch_search([query], topk)[0]

    def close(self) -> None:
        self._session.close()

    def __enter__(self) -> RetrievalClient:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"RetrievalClient({self.url!r})"


def _short(e: BaseException) -> str:
    text = str(e)
    if "Connection refused" in text or "Errno 111" in text:
        return "connection refused"
    if "Connection reset" in text or "RemoteDisconnected" in text or "Connection aborted" in text:
        return "connection reset"
    return text[:160]


def _server_message(response: Any) -> str:
    try:
        body = response.json()
        if isinstance(body, dict) and "error" in body:
            return str(body["error"])
    except ValueError:
        pass
    return (response.text or "")[:200]
