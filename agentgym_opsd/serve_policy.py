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

import threading
import time
import uuid
from typing import Any

__all__ = ["create_app", "serve", "MAX_BODY_BYTES"]

MAX_BODY_BYTES = 8 * 1024 * 1024


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
    """The Flask app around a `agentgym_opsd.policy_agents.ChatGenerator`."""
    from flask import Flask, jsonify, request
    from werkzeug.exceptions import HTTPException

    app = Flask("agentgym_opsd.serve_policy")
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
        body = request.get_json(silent=True)
        if not isinstance(body, dict):
            raise _BadRequest("the body must be a JSON object")
        model = body.get("model", name)
        if model != name:
            raise _BadRequest(f"model {model!r} is not served here; this server serves {name!r}", 404, "model")
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise _BadRequest("messages must be a non-empty list", param="messages")
        for i, m in enumerate(messages):
            if not isinstance(m, dict) or m.get("role") not in ("system", "user", "assistant") or not isinstance(m.get("content"), str):
                raise _BadRequest(f"messages[{i}] must be {{'role': system|user|assistant, 'content': str}}", param="messages")
        if body.get("stream"):
            raise _BadRequest("streaming is not supported by serve-policy", param="stream")
        if body.get("n", 1) != 1:
            raise _BadRequest("n must be 1", param="n")
        limit = body.get("max_completion_tokens", body.get("max_tokens"))
        max_tokens = _check_number({"max_tokens": limit}, "max_tokens", int, 1, max_new_tokens, min(256, max_new_tokens))
        temperature = _check_number(body, "temperature", float, 0.0, 10.0, 1.0)
        top_p = _check_number(body, "top_p", float, 1e-6, 1.0, 1.0)
        seed = _check_number(body, "seed", int, -(2**63), 2**63 - 1, None)
        template_kwargs = body.get("chat_template_kwargs") or {}
        if not isinstance(template_kwargs, dict):
            raise _BadRequest("chat_template_kwargs must be an object", param="chat_template_kwargs")
        try:
            prompt = generator.prompt_ids([{"role": m["role"], "content": m["content"]} for m in messages], **template_kwargs)
        except Exception as e:  # a template that rejects these messages or kwargs
            raise _BadRequest(f"the chat template failed on these messages: {e}", param="messages") from None
        if len(prompt) + max_tokens > generator.max_positions:
            raise _BadRequest(
                f"the prompt is {len(prompt)} tokens and max_tokens {max_tokens}; the model takes {generator.max_positions}",
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
                "usage": {"prompt_tokens": len(prompt), "completion_tokens": len(tokens), "total_tokens": len(prompt) + len(tokens)},
            }
        )

    return app


def serve(model: str, *, host: str = "127.0.0.1", port: int = 8000, name: str | None = None, max_new_tokens: int = 512, threads: int = 4) -> None:
    """Load the model and serve it until interrupted; prints the address (port 0 picks a free one)."""
    from pathlib import Path

    from waitress import create_server

    from agentgym_opsd.policy_agents import ChatGenerator

    generator = ChatGenerator(model)
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
