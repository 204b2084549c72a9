"""serve-policy (the OpenAI-compatible chat server over a local model): 4xx for malformed input, never
5xx, and loopback by default. Against the real server in its own process, on a seeded random tiny
Qwen3 with the real Qwen3 tokenizer and chat template.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import requests
from hypothesis import example, given
from hypothesis import strategies as st
from reliability_fuzz import ANY_TEXT, JSON_VALUES, fuzz_settings, json_bytes

FUZZ = fuzz_settings(80)

MESSAGE = st.fixed_dictionaries(
    {},
    optional={"role": st.sampled_from(["system", "user", "assistant", "tool", "", "USER"]) | JSON_VALUES,
              "content": ANY_TEXT | JSON_VALUES, "name": ANY_TEXT},
)
CHAT = st.fixed_dictionaries(
    {},
    optional={
        "model": st.sampled_from(["tiny", "gpt-4", ""]) | JSON_VALUES,
        "messages": st.lists(MESSAGE, max_size=3) | JSON_VALUES,
        "max_tokens": st.integers(-3, 8) | st.integers() | JSON_VALUES,  # small when valid: generation stays cheap
        "max_completion_tokens": st.integers(-3, 8) | JSON_VALUES,
        "temperature": st.floats(-1, 20) | JSON_VALUES,
        "top_p": st.floats(-1, 2) | JSON_VALUES,
        "seed": st.integers() | JSON_VALUES,
        "n": st.integers(-1, 3) | JSON_VALUES,
        "stream": st.booleans() | JSON_VALUES,
        "chat_template_kwargs": st.dictionaries(
            st.sampled_from(["enable_thinking", "tokenize", "messages", "add_generation_prompt", "x"]), JSON_VALUES,
            max_size=2) | JSON_VALUES,
    },
)




BODIES = st.binary(max_size=200) | JSON_VALUES.map(json_bytes) | CHAT.map(json_bytes)


@pytest.fixture(scope="module")
def policy_server(tiny_qwen3: Path, start_serve_policy):
    """`agentgym-opsd serve-policy` with no --host, as a user starts it; yields (url, pid)."""
    with start_serve_policy(tiny_qwen3) as (url, proc):
        yield url.removesuffix("/v1"), proc.pid


def test_serve_policy_listens_on_loopback_by_default(policy_server, assert_listens_on_loopback_only) -> None:
    assert_listens_on_loopback_only(policy_server[1])


@FUZZ
@given(body=BODIES)
@example(body=b'{"messages": [{"role": "user", "content": "\\udcff"}], "max_tokens": 2}')
@example(
    body=b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "chat_template_kwargs": '
         b'{"tokenize": true}}')
@example(
    body=b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "temperature": 1e308, "top_p": 1e-300}')
@example(body=b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "seed": -9223372036854775808}')
def test_chat_completions_never_answers_5xx(policy_server, body: bytes) -> None:
    url = policy_server[0]
    r = requests.post(f"{url}/v1/chat/completions", data=body, headers={"Content-Type": "application/json"},
                      timeout=120)
    assert r.status_code < 500, (r.status_code, body[:300], r.text[:300])
    if r.status_code == 200:
        assert isinstance(r.json()["choices"][0]["message"]["content"], str)
    else:
        assert r.json()["error"]["message"]


@FUZZ
@given(
    method=st.sampled_from(["GET", "POST", "PUT", "DELETE", "PATCH", "OPTIONS"]),
    path=st.sampled_from(["/v1/chat/completions", "/v1/models", "/health", "/", "/v1", "/v1/completions", "/%ff"]),
    content_type=st.sampled_from(["application/json", "text/plain", "multipart/form-data; boundary=zz", ""]),
    body=BODIES,
)
def test_every_policy_route_answers_without_5xx(policy_server, method: str, path: str, content_type: str,
                                                body: bytes) -> None:
    headers = {"Content-Type": content_type} if content_type else {}
    r = requests.request(method, f"{policy_server[0]}{path}", data=body, headers=headers, timeout=120)
    assert r.status_code < 500, (method, path, r.status_code, body[:200], r.text[:300])


@pytest.mark.parametrize(
    "body",
    [b"[" * 100_000 + b"]" * 100_000,
     b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": ' + b"9" * 5000 + b"}"],
    ids=["nested-past-the-recursion-limit", "integer-past-the-digit-limit"],
)
def test_pathological_json_is_a_400(policy_server, body: bytes) -> None:
    r = requests.post(f"{policy_server[0]}/v1/chat/completions", data=body,
                      headers={"Content-Type": "application/json"}, timeout=60)
    assert r.status_code == 400, (r.status_code, r.text[:300])
    assert r.json()["error"]["message"]
