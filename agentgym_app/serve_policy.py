"""`agentgym-opsd serve-policy --model PATH`: a local transformers model behind an OpenAI-compatible
chat endpoint, for users without vLLM and for the tests of the `openai:` agent.

Routes:
    GET  /v1/models             the one model served
    POST /v1/chat/completions   `{"model", "messages", "max_tokens" | "max_completion_tokens",
                                  "temperature", "top_p", "seed", "n": 1, "chat_template_kwargs"}`
    GET  /health                `{"status": "ok"}`

Requests are checked: a malformed body is a 400 with an OpenAI-style `{"error": {...}}`, an unknown
model a 404, a body over 8 MiB a 413; the server answers 5xx only for its own bugs. Generation
runs one request at a time (a seeded request always gives the same text); the waitress threads
keep accepting and answering other routes meanwhile. It binds 127.0.0.1 unless told otherwise.
"""

from __future__ import annotations

import argparse
import os
import threading
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agentgym_opsd.agents import AgentError
from agentgym_opsd.context import Message
from trainer.models import NamedModelError, resolve_model

__all__ = ["ChatGenerator", "create_app", "serve", "serve_policy_arguments", "MAX_BODY_BYTES"]

MAX_BODY_BYTES = 8 * 1024 * 1024


class ChatGenerator:
    """A local causal LM that answers chats: chat template, batched sampling with one seed per row.

    Rows are sampled with their own `torch.Generator`, so a row's text depends on its seed and its
    prompt, not on the other rows of the batch (up to float rounding of padded batches).

    Args:
        path: a folder with the model's config, weights and tokenizer (`save_pretrained` output), or a
            named model (`trainer.models`: `smollm2-135m`).
        device: torch device (default cpu).
        threads: torch CPU threads for this process (0: torch's default).
    """

    def __init__(self, path: str | os.PathLike[str], *, device: str = "cpu", threads: int = 0) -> None:
        try:
            path = resolve_model(path)  # a named model (`smollm2-135m`) or a folder
        except NamedModelError as e:
            raise AgentError(str(e)) from None
        if not (path / "config.json").exists():
            raise AgentError(f"{path}: not a model folder (no config.json); give the folder save_pretrained wrote "
                             "or a named model (smollm2-135m)")
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if threads:
            torch.set_num_threads(threads)

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
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else min(
            self.eos_ids or {0})
        self.max_positions = int(getattr(self.model.config, "max_position_embeddings", 1 << 30))

    def prompt_ids(self, messages: list[Message], **template_kwargs: Any) -> list[int]:
        """The token ids of a chat with the generation prompt appended."""
        text = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False,
                                                  **template_kwargs)
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
            result = self.model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True,
                                logits_to_keep=1)
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
                    input_ids=step, attention_mask=mask, position_ids=positions, past_key_values=result.past_key_values,
                    use_cache=True
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


class _BadRequest(Exception):
    def __init__(self, message: str, status: int = 400, param: str | None = None) -> None:
        super().__init__(message)
        self.status, self.param = status, param


def _check_number(body: dict[str, Any], key: str, kind: type, low: float, high: float, default: Any) -> Any:
    value = body.get(key, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (kind is int and not isinstance(value, int)):
        raise _BadRequest(f"{key} must be {'an integer' if kind is int else 'a number'}", param=key)
    if not low <= value <= high:
        raise _BadRequest(f"{key} must be in [{low}, {high}], got {value}", param=key)
    return kind(value)


def create_app(generator: Any, *, name: str, max_new_tokens: int = 512) -> Any:
    """The Flask app around a `ChatGenerator`."""
    from flask import Flask, jsonify, request
    from werkzeug.exceptions import HTTPException

    app = Flask("agentgym_app.serve_policy")
    app.config["MAX_CONTENT_LENGTH"] = MAX_BODY_BYTES
    lock = threading.Lock()

    def error(message: str, status: int, param: str | None = None) -> Any:
        kind = "invalid_request_error" if status < 500 else "server_error"
        return jsonify({"error": {"message": message, "type": kind, "param": param, "code": status}}), status

    @app.errorhandler(_BadRequest)
    def bad_request(e: _BadRequest) -> Any:
        return error(str(e), e.status, e.param)

    @app.errorhandler(HTTPException)
    def http_error(e: HTTPException) -> Any:
        return error(e.description or e.name, e.code or 500)

    @app.get("/health")
    def health() -> Any:
        return jsonify({"status": "ok", "model": name})

    @app.get("/v1/models")
    def models() -> Any:
        return jsonify({"object": "list", "data": [{"id": name, "object": "model", "owned_by": "agentgym-opsd"}]})

    @app.post("/v1/chat/completions")
    def chat_completions() -> Any:
        try:
            body = request.get_json(silent=True)
        except RecursionError:  # `silent` covers malformed JSON, not nesting past Python's recursion limit
            raise _BadRequest("the body is JSON nested too deeply to read") from None
        if not isinstance(body, dict):
            raise _BadRequest("the body must be a JSON object")
        model = body.get("model", name)
        if model != name:
            raise _BadRequest(f"model {model!r} is not served here; this server serves {name!r}", 404, "model")
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise _BadRequest("messages must be a non-empty list", param="messages")
        for i, m in enumerate(messages):
            if not isinstance(m, dict) or m.get("role") not in ("system", "user",
                                                                "assistant") or not isinstance(m.get("content"), str):
                raise _BadRequest(f"messages[{i}] must be {{'role': system|user|assistant, 'content': str}}",
                                  param="messages")
        if body.get("stream"):
            raise _BadRequest("streaming is not supported by serve-policy", param="stream")
        if body.get("n", 1) != 1:
            raise _BadRequest("n must be 1", param="n")
        limit = body.get("max_completion_tokens", body.get("max_tokens"))
        max_tokens = _check_number({"max_tokens": limit}, "max_tokens", int, 1, max_new_tokens,
                                   min(256, max_new_tokens))
        temperature = _check_number(body, "temperature", float, 0.0, 10.0, 1.0)
        top_p = _check_number(body, "top_p", float, 1e-6, 1.0, 1.0)
        seed = _check_number(body, "seed", int, -(2**63), 2**63 - 1, None)
        template_kwargs = body.get("chat_template_kwargs") or {}
        if not isinstance(template_kwargs, dict):
            raise _BadRequest("chat_template_kwargs must be an object", param="chat_template_kwargs")
        try:
            prompt = generator.prompt_ids([{"role": m["role"], "content": m["content"]} for m in messages],
                                          **template_kwargs)
        except Exception as e:  # a template that rejects these messages or kwargs
            raise _BadRequest(f"the chat template failed on these messages: {e}", param="messages") from None
        if len(prompt) + max_tokens > generator.max_positions:
            raise _BadRequest(
                f"the prompt is {len(prompt)} tokens and max_tokens {max_tokens}; the model takes "
                f"{generator.max_positions}",
                param="messages",
            )
        if seed is None:
            seed = uuid.uuid4().int & 0x7FFFFFFF
        with lock:
            [(text, tokens, reason)] = generator.generate(
                [prompt], [seed % (2**63)], max_tokens=max_tokens, temperature=temperature, top_p=top_p
            )
        return jsonify(
            {
                "id": f"chatcmpl-{uuid.uuid4().hex[:24]}",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": name,
                "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": reason}],
                "usage": {"prompt_tokens": len(prompt), "completion_tokens": len(tokens),
                          "total_tokens": len(prompt) + len(tokens)},
            }
        )

    return app


def serve(
    model: str,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    name: str | None = None,
    max_new_tokens: int = 512,
    threads: int = 4,
    torch_threads: int = 0,
) -> None:
    """Load the model and serve it until interrupted; prints the address (port 0 picks a free one)."""
    from waitress import create_server

    generator = ChatGenerator(model, threads=torch_threads)
    served = name or Path(model).resolve().name
    app = create_app(generator, name=served, max_new_tokens=max_new_tokens)
    server = create_server(app, host=host, port=port, threads=threads)
    print(f"serving {served} at http://{host}:{server.effective_port}/v1 (Ctrl-C stops)", flush=True)
    try:
        server.run()
    except KeyboardInterrupt:
        pass
    finally:
        server.close()


def _cmd_serve_policy(args: argparse.Namespace) -> int:
    serve(
        args.model,
        host=args.host,
        port=args.port,
        name=args.name,
        max_new_tokens=args.max_new_tokens,
        threads=args.threads,
        torch_threads=args.torch_threads,
    )
    return 0


def serve_policy_arguments(p: argparse.ArgumentParser) -> None:
    """The arguments of `agentgym-opsd serve-policy` (on the parser the CLI made for it)."""
    p.description = ("Serve a local transformers causal LM (a folder with config, weights and tokenizer) as an "
                     "OpenAI-compatible chat endpoint, for the openai:BASE_URL#MODEL agent.")
    p.add_argument("--model", required=True,
                   help="a local model folder (save_pretrained output) or a named model (smollm2-135m)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, default=8000, help="port (0: any free port; the address is printed)")
    p.add_argument("--name", help="the model name clients use (default: the folder name)")
    p.add_argument("--max-new-tokens", type=int, default=512, help="upper bound on max_tokens per request")
    p.add_argument("--threads", type=int, default=4, help="request threads (generation itself runs one at a time)")
    p.add_argument("--torch-threads", type=int, default=0,
                   help="torch CPU threads (0: torch's default; 1 suits tiny models)")
    p.set_defaults(func=_cmd_serve_policy)
