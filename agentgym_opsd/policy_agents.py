"""Learned agents: a local transformers policy (`hf:PATH`) and any OpenAI-compatible chat endpoint
(`openai:BASE_URL#MODEL`, e.g. a vLLM server or `agentgym-opsd serve-policy`).

Sampling settings follow the name after `?`, as URL query pairs:

    hf:runs/tiny-policy?temperature=0.7&max_tokens=64
    openai:http://127.0.0.1:8000/v1#qwen3-0.6b?temperature=0&max_tokens=256

Keys: `temperature` (default 1.0; 0 is greedy), `top_p` (1.0), `max_tokens` (256), and for the
endpoint `timeout` (seconds, 120), `retries` (3), `concurrency` (requests in flight, 8). The bearer
token for an endpoint is read from `OPENAI_API_KEY` when set.

Both agents draw each turn with a seed made from (agent seed, episode id, turn), so an episode
plays the same however episodes are batched, ordered or resumed (for the endpoint: when the server
honours `seed`, as vLLM and serve-policy do).

torch, transformers and requests are imported only when such an agent is built.
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl

from agentgym_opsd.agents import AgentError
from agentgym_opsd.context import Message

__all__ = [
    "ChatGenerator",
    "HFPolicyAgent",
    "OpenAIChatAgent",
    "make_hf_agent",
    "make_openai_agent",
    "turn_seed",
]

_SAMPLING_KEYS = {"temperature": float, "top_p": float, "max_tokens": int}
_HTTP_KEYS = {"timeout": float, "retries": int, "concurrency": int}


def turn_seed(seed: int, info: dict[str, Any]) -> int:
    """A 31-bit sampling seed for one turn of one episode: from the agent's seed, the episode id and
    the turn index (a plain per-call counter would make episodes depend on their neighbours)."""
    step = info.get("step")
    key = f"{seed}|{getattr(step, 'episode_id', '')}|{getattr(step, 'turn', 0)}"
    return int.from_bytes(hashlib.blake2b(key.encode("utf-8", "surrogatepass"), digest_size=8).digest(), "little") & 0x7FFFFFFF


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


# ---------------------------------------------------------------------------------------------
# Local generation (shared by the hf agent and serve-policy).


class ChatGenerator:
    """A local causal LM that answers chats: chat template, batched sampling with one seed per row.

    Rows are sampled with their own `torch.Generator`, so a row's text depends on its seed and its
    prompt, not on the other rows of the batch (up to float rounding of padded batches).

    Args:
        path: a folder with the model's config, weights and tokenizer (`save_pretrained` output).
        device: torch device (default cpu).
    """

    def __init__(self, path: str | os.PathLike[str], *, device: str = "cpu") -> None:
        path = Path(path)
        if not (path / "config.json").exists():
            raise AgentError(f"{path}: not a model folder (no config.json); give the folder save_pretrained wrote")
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.torch = torch
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        if self.tokenizer.chat_template is None:
            raise AgentError(f"{path}: the tokenizer has no chat template")
        self.model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).to(device).eval()
        self.device = device
        self.name = path.name
        eos = self.model.generation_config.eos_token_id if self.model.generation_config is not None else None
        if eos is None:
            eos = self.tokenizer.eos_token_id
        self.eos_ids = set(eos if isinstance(eos, list) else [eos]) - {None}
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else min(self.eos_ids or {0})
        self.max_positions = int(getattr(self.model.config, "max_position_embeddings", 1 << 30))

    def prompt_ids(self, messages: list[Message], **template_kwargs: Any) -> list[int]:
        """The token ids of a chat with the generation prompt appended."""
        text = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False, **template_kwargs)
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def generate(
        self,
        prompts: Sequence[list[int]],
        seeds: Sequence[int],
        *,
        max_tokens: int = 256,
        temperature: float = 1.0,
        top_p: float = 1.0,
    ) -> list[tuple[str, list[int], str]]:
        """Sample a completion for each prompt: `(text, token ids, finish reason)` where the reason is
        `stop` (an end-of-turn token) or `length`."""
        torch = self.torch
        longest = max(len(p) for p in prompts)
        if longest + max_tokens > self.max_positions:
            raise AgentError(
                f"a prompt of {longest} tokens plus {max_tokens} new ones exceeds the model's {self.max_positions} "
                "positions; use a shorter context (context = \"window:K\") or fewer max_tokens"
            )
        n = len(prompts)
        ids = torch.full((n, longest), self.pad_id, dtype=torch.long)
        mask = torch.zeros((n, longest), dtype=torch.long)
        for i, p in enumerate(prompts):  # left padding: every row's next token is at the end
            ids[i, longest - len(p) :] = torch.tensor(p, dtype=torch.long)
            mask[i, longest - len(p) :] = 1
        ids, mask = ids.to(self.device), mask.to(self.device)
        generators = [torch.Generator(device="cpu").manual_seed(int(s)) for s in seeds]
        out_tokens: list[list[int]] = [[] for _ in range(n)]
        done = [False] * n
        reasons = ["length"] * n
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        with torch.inference_mode():
            result = self.model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True, logits_to_keep=1)
            for _ in range(max_tokens):
                sampled = self._sample(result.logits[:, -1, :].float().cpu(), generators, temperature, top_p)
                chosen = []
                for i, token in enumerate(sampled):
                    if done[i]:
                        chosen.append(self.pad_id)
                        continue
                    if token in self.eos_ids:
                        done[i], reasons[i] = True, "stop"
                    else:
                        out_tokens[i].append(token)
                    chosen.append(token)
                if all(done):
                    break
                step = torch.tensor(chosen, dtype=torch.long, device=self.device)[:, None]
                mask = torch.cat([mask, torch.ones((n, 1), dtype=mask.dtype, device=self.device)], dim=1)
                positions = positions[:, -1:] + 1
                result = self.model(
                    input_ids=step, attention_mask=mask, position_ids=positions, past_key_values=result.past_key_values, use_cache=True
                )
        return [
            (self.tokenizer.decode(tokens, skip_special_tokens=True), tokens, reason)
            for tokens, reason in zip(out_tokens, reasons, strict=True)
        ]

    def _sample(self, logits: Any, generators: list[Any], temperature: float, top_p: float) -> list[int]:
        """One token per row: inverse-CDF sampling with one uniform draw from each row's generator
        (row i's token depends only on its logits and its generator)."""
        torch = self.torch
        draws = torch.cat([torch.rand(1, generator=g) for g in generators])
        if temperature == 0:
            return [int(t) for t in logits.argmax(-1)]
        probs = torch.softmax(logits / temperature, dim=-1)
        if top_p < 1.0:
            # Keep the smallest set of most likely tokens whose mass reaches top_p.
            sorted_probs, order = torch.sort(probs, dim=-1, descending=True)
            drop = sorted_probs.cumsum(-1) - sorted_probs >= top_p
            probs = probs.scatter(-1, order, sorted_probs.masked_fill(drop, 0.0))
        cdf = probs.cumsum(-1)
        picks = torch.searchsorted(cdf, (draws * cdf[:, -1])[:, None]).clamp(max=probs.shape[-1] - 1)
        return [int(t) for t in picks[:, 0]]


class HFPolicyAgent:
    """A local transformers policy: one batched sampling call per tick of the rollout."""

    def __init__(self, path: str, *, seed: int = 0, temperature: float = 1.0, top_p: float = 1.0, max_tokens: int = 256) -> None:
        self.generator = ChatGenerator(path)
        self.name = f"hf:{path}"
        self.seed = int(seed)
        self.temperature, self.top_p, self.max_tokens = temperature, top_p, max_tokens

    def act(self, messages: list[Message], info: dict[str, Any], env: Any) -> str:
        return self.act_batch([messages], [info], [env])[0]

    def act_batch(self, messages: list[list[Message]], infos: list[dict[str, Any]], envs: list[Any]) -> list[str]:
        prompts = [self.generator.prompt_ids(m) for m in messages]
        seeds = [turn_seed(self.seed, info) for info in infos]
        out = self.generator.generate(prompts, seeds, max_tokens=self.max_tokens, temperature=self.temperature, top_p=self.top_p)
        return [text for text, _, _ in out]


def make_hf_agent(spec: str, *, seed: int = 0) -> HFPolicyAgent:
    """`hf:PATH[?temperature=..&top_p=..&max_tokens=..]`."""
    path, options = _split_options(spec, _SAMPLING_KEYS, f"hf:{spec}")
    agent = HFPolicyAgent(path, seed=seed, **options)
    agent.name = f"hf:{spec}"
    return agent


# ---------------------------------------------------------------------------------------------
# OpenAI-compatible endpoint.


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
            raise AgentError(f"openai agent: {base_url!r} is not an http(s) URL, e.g. openai:http://127.0.0.1:8000/v1#MODEL")
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
        raise AgentError(f"openai:{spec}: write it as openai:BASE_URL#MODEL, e.g. openai:http://127.0.0.1:8000/v1#my-model")
    model, options = _split_options(rest, {**_SAMPLING_KEYS, **_HTTP_KEYS}, f"openai:{spec}")
    if not model:
        raise AgentError(f"openai:{spec}: the model name after # is empty")
    agent = OpenAIChatAgent(base, model, seed=seed, **options)
    agent.name = f"openai:{spec}"
    return agent
