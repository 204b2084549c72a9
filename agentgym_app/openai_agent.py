"""An agent that asks any OpenAI-compatible chat endpoint for its turns: `openai:BASE_URL#MODEL`
(a vLLM server, or `agentgym-opsd serve-policy` around a local transformers model).

Sampling and HTTP settings follow the model name after `?`, as URL query pairs:

    openai:http://127.0.0.1:8000/v1#qwen3-0.6b?temperature=0&max_tokens=256

Keys: `temperature` (default 1.0; 0 is greedy), `top_p` (1.0), `max_tokens` (256), `timeout`
(seconds, 120), `retries` (3, on connection errors, 429 and 5xx), `concurrency` (requests in flight
for a batch, 8). The bearer token is read from `OPENAI_API_KEY` when set.

Each turn is requested with a seed made from (agent seed, episode id, turn), so an episode plays the
same however episodes are batched, ordered or resumed, on a server that honours `seed` (vLLM and
serve-policy do). `requests` is imported only when the agent is built.
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import parse_qsl

from agentgym_opsd.agents import AgentError
from agentgym_opsd.context import Message

__all__ = ["OpenAIChatAgent", "make_openai_agent", "turn_seed"]

_SAMPLING_KEYS = {"temperature": float, "top_p": float, "max_tokens": int}
_HTTP_KEYS = {"timeout": float, "retries": int, "concurrency": int}


def turn_seed(seed: int, info: dict[str, Any]) -> int:
    """A 31-bit sampling seed for one turn of one episode: from the agent's seed, the episode id and
    the turn index (a plain per-call counter would make episodes depend on their neighbours)."""
    step = info.get("step")
    key = f"{seed}|{getattr(step, 'episode_id', '')}|{getattr(step, 'turn', 0)}"
    return int.from_bytes(hashlib.blake2b(key.encode("utf-8", "surrogatepass"), digest_size=8).digest(),
                          "little") & 0x7FFFFFFF


def _split_options(spec: str, allowed: dict[str, type], what: str) -> tuple[str, dict[str, Any]]:
    head, sep, query = spec.partition("?")
    options: dict[str, Any] = {}
    if sep:
        for key, value in parse_qsl(query, keep_blank_values=True, strict_parsing=False):
            if key not in allowed:
                raise AgentError(f"{what}: unknown setting {key!r}; known: {', '.join(sorted(allowed))}")
            try:
                options[key] = allowed[key](value)
            except ValueError:
                raise AgentError(f"{what}: {key}={value!r} is not a {allowed[key].__name__}") from None
    if options.get("temperature", 1.0) < 0:
        raise AgentError(f"{what}: temperature must be >= 0")
    if not 0 < options.get("top_p", 1.0) <= 1:
        raise AgentError(f"{what}: top_p must be in (0, 1]")
    if options.get("max_tokens", 1) < 1:
        raise AgentError(f"{what}: max_tokens must be >= 1")
    return head, options


class OpenAIChatAgent:
    """Asks an OpenAI-compatible `/chat/completions` endpoint for each turn (concurrently for a
    batch: the server batches them).

    Args:
        base_url: the API root, e.g. `http://127.0.0.1:8000/v1`.
        model: the model name the server knows.
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        seed: int = 0,
        temperature: float = 1.0,
        top_p: float = 1.0,
        max_tokens: int = 256,
        timeout: float = 120.0,
        retries: int = 3,
        concurrency: int = 8,
    ) -> None:
        import requests

        if not base_url.startswith(("http://", "https://")):
            raise AgentError(
                f"openai agent: {base_url!r} is not an http(s) URL, e.g. openai:http://127.0.0.1:8000/v1#MODEL")
        self.requests = requests
        self.url = base_url.rstrip("/") + "/chat/completions"
        self.model = model
        self.seed = int(seed)
        self.sampling = {"temperature": temperature, "top_p": top_p, "max_tokens": max_tokens}
        self.timeout, self.retries, self.concurrency = timeout, max(0, retries), max(1, concurrency)
        self.name = f"openai:{base_url}#{model}"
        self._local = threading.local()
        self._headers = {"Content-Type": "application/json"}
        if os.environ.get("OPENAI_API_KEY"):
            self._headers["Authorization"] = f"Bearer {os.environ['OPENAI_API_KEY']}"

    def _session(self) -> Any:
        session = getattr(self._local, "session", None)
        if session is None:
            session = self._local.session = self.requests.Session()
        return session

    def complete(self, messages: list[Message], seed: int) -> str:
        """One chat completion's text (reasoning the server split off is put back in <think>)."""
        body = {"model": self.model, "messages": messages, "seed": seed, "n": 1, **self.sampling}
        delay = 0.5
        for attempt in range(self.retries + 1):
            last = attempt == self.retries
            try:
                reply = self._session().post(self.url, json=body, headers=self._headers, timeout=self.timeout)
            except self.requests.ConnectionError as e:
                if last:
                    raise AgentError(
                        f"cannot reach {self.url} ({type(e).__name__}); is the server running? "
                        "`agentgym-opsd serve-policy --model PATH` serves a local model"
                    ) from None
            except self.requests.Timeout:
                if last:
                    raise AgentError(f"{self.url} did not answer within {self.timeout:g}s") from None
            else:
                if reply.status_code == 200:
                    return self._text(reply)
                if reply.status_code < 500 and reply.status_code != 429:
                    raise AgentError(f"{self.url} refused the request: HTTP {reply.status_code}: {self._error(reply)}")
                if last:
                    raise AgentError(f"{self.url} failed: HTTP {reply.status_code}: {self._error(reply)}")
            time.sleep(delay)
            delay *= 2
        raise AssertionError("unreachable")

    def _text(self, reply: Any) -> str:
        try:
            message = reply.json()["choices"][0]["message"]
        except (ValueError, KeyError, IndexError, TypeError):
            raise AgentError(f"{self.url} answered without choices[0].message: {reply.text[:200]!r}") from None
        content = message.get("content") or ""
        reasoning = message.get("reasoning_content") or message.get("reasoning")
        return f"<think>{reasoning}</think>{content}" if reasoning else content

    @staticmethod
    def _error(reply: Any) -> str:
        try:
            return str(reply.json()["error"]["message"])[:300]
        except (ValueError, KeyError, TypeError):
            return reply.text[:300]

    def act(self, messages: list[Message], info: dict[str, Any], env: Any) -> str:
        return self.complete(messages, turn_seed(self.seed, info))

    def act_batch(self, messages: list[list[Message]], infos: list[dict[str, Any]], envs: list[Any]) -> list[str]:
        seeds = [turn_seed(self.seed, info) for info in infos]
        if len(messages) == 1:
            return [self.complete(messages[0], seeds[0])]
        with ThreadPoolExecutor(max_workers=min(self.concurrency, len(messages))) as pool:
            return list(pool.map(self.complete, messages, seeds))


def make_openai_agent(spec: str, *, seed: int = 0) -> OpenAIChatAgent:
    """`openai:BASE_URL#MODEL[?temperature=..&top_p=..&max_tokens=..&timeout=..&retries=..&concurrency=..]`."""
    base, sep, rest = spec.rpartition("#")
    if not sep or not base or not rest:
        raise AgentError(
            f"openai:{spec}: write it as openai:BASE_URL#MODEL, e.g. openai:http://127.0.0.1:8000/v1#my-model")
    model, options = _split_options(rest, {**_SAMPLING_KEYS, **_HTTP_KEYS}, f"openai:{spec}")
    if not model:
        raise AgentError(f"openai:{spec}: the model name after # is empty")
    agent = OpenAIChatAgent(base, model, seed=seed, **options)
    agent.name = f"openai:{spec}"
    return agent
