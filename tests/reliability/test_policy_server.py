"""serve-policy (the OpenAI-compatible chat server over a local model): 4xx for malformed input, never
5xx, and loopback by default. Against the real server in its own process, on a seeded random tiny
Qwen3 with the real Qwen3 tokenizer and chat template.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import requests
from hypothesis import example, given
from hypothesis import strategies as st

from reliability_fuzz import ANY_TEXT, JSON_VALUES, fuzz_settings, json_bytes

REPO = Path(__file__).resolve().parents[2]
TOKENIZER = REPO.parent / "shared" / "data" / "tokenizers" / "qwen3"

FUZZ = fuzz_settings(80)

MESSAGE = st.fixed_dictionaries(
    {},
    optional={"role": st.sampled_from(["system", "user", "assistant", "tool", "", "USER"]) | JSON_VALUES, "content": ANY_TEXT | JSON_VALUES, "name": ANY_TEXT},
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
        "chat_template_kwargs": st.dictionaries(st.sampled_from(["enable_thinking", "tokenize", "messages", "add_generation_prompt", "x"]), JSON_VALUES, max_size=2) | JSON_VALUES,
    },
)




BODIES = st.binary(max_size=200) | JSON_VALUES.map(json_bytes) | CHAT.map(json_bytes)


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("agentgym_opsd.serve_policy", reason="serve-policy is not on this branch")
    if not (TOKENIZER / "tokenizer.json").exists():
        pytest.skip(f"needs the Qwen3 tokenizer at {TOKENIZER} (the shared data folder beside the repo)")
    import torch
    from transformers import AutoTokenizer, GenerationConfig, Qwen3Config, Qwen3ForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(TOKENIZER)
    torch.manual_seed(0)
    config = Qwen3Config(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=2048,
                         tie_word_embeddings=True)  # fmt: skip
    model = Qwen3ForCausalLM(config)
    model.generation_config = GenerationConfig(eos_token_id=tokenizer.convert_tokens_to_ids(["<|im_end|>"]), pad_token_id=tokenizer.pad_token_id)
    path = tmp_path_factory.mktemp("models") / "tiny"
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def policy_server(tiny_model: Path):
    """`agentgym-opsd serve-policy` with no --host, as a user starts it; yields (url, pid)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "agentgym_opsd.cli", "serve-policy", "--model", str(tiny_model), "--port", "0",
         "--name", "tiny", "--torch-threads", "1"],  # fmt: skip
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO,
    )
    try:
        line = proc.stdout.readline()
        if not line.startswith("serving"):
            proc.kill()
            pytest.fail(f"serve-policy did not start: {line}{proc.stderr.read()[-2000:]}")
        yield line.split(" at ")[1].split()[0].removesuffix("/v1"), proc.pid
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
        proc.stdout.close()
        proc.stderr.close()


def test_serve_policy_listens_on_loopback_by_default(policy_server, assert_listens_on_loopback_only) -> None:
    assert_listens_on_loopback_only(policy_server[1])


@FUZZ
@given(body=BODIES)
@example(body=b'{"messages": [{"role": "user", "content": "\\udcff"}], "max_tokens": 2}')
@example(body=b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "chat_template_kwargs": {"tokenize": true}}')
@example(body=b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "temperature": 1e308, "top_p": 1e-300}')
@example(body=b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "seed": -9223372036854775808}')
def test_chat_completions_never_answers_5xx(policy_server, body: bytes) -> None:
    url = policy_server[0]
    r = requests.post(f"{url}/v1/chat/completions", data=body, headers={"Content-Type": "application/json"}, timeout=120)
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
def test_every_policy_route_answers_without_5xx(policy_server, method: str, path: str, content_type: str, body: bytes) -> None:
    headers = {"Content-Type": content_type} if content_type else {}
    r = requests.request(method, f"{policy_server[0]}{path}", data=body, headers=headers, timeout=120)
    assert r.status_code < 500, (method, path, r.status_code, body[:200], r.text[:300])


@pytest.mark.parametrize(
    "body",
    [b"[" * 100_000 + b"]" * 100_000, b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": ' + b"9" * 5000 + b"}"],
    ids=["nested-past-the-recursion-limit", "integer-past-the-digit-limit"],
)
def test_pathological_json_is_a_400(policy_server, body: bytes) -> None:
    r = requests.post(f"{policy_server[0]}/v1/chat/completions", data=body, headers={"Content-Type": "application/json"}, timeout=60)
    assert r.status_code == 400, (r.status_code, r.text[:300])
    assert r.json()["error"]["message"]
