"""`serve-policy` on loopback and the `openai:` agent, with a seeded random tiny Qwen3
built from the real Qwen3 tokenizer (shipped in tests/data/tokenizers/qwen3)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

import agentgym_opsd
from agentgym_opsd import EpisodeRequest, run_episodes
from agentgym_opsd.agents import AgentError, make_agent

MAX_TOKENS = 10


@pytest.fixture(scope="module")
def alfworld_env(contract_options_alfworld):
    """ALFWorld Pick on the small test panel (tests/conftest.py), 3 turns per episode."""
    options = {**contract_options_alfworld, "split": "train", "max_turns": 3}
    return lambda: agentgym_opsd.make("agentgym/ALFWorld-Pick-v0", **options)


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    """A model of hidden size 32 gains nothing from intra-op threads, and they thrash a busy CPU."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def server(tiny_qwen3, start_serve_policy):
    """`agentgym-opsd serve-policy` in its own process on a free loopback port."""
    with start_serve_policy(tiny_qwen3) as (url, _):
        assert url.startswith("http://127.0.0.1:")
        yield url


_GENERATORS: dict[Path, object] = {}


def _local_turns(model_path: Path, episode, seed: int):
    """What the model generates in this process for each turn's prompt and seed."""
    from agentgym_app.openai_agent import turn_seed
    from agentgym_app.serve_policy import ChatGenerator

    if model_path not in _GENERATORS:
        _GENERATORS[model_path] = ChatGenerator(model_path)
    generator = _GENERATORS[model_path]
    out = []
    for k in range(episode.num_turns):
        info = {"step": SimpleNamespace(episode_id=episode.episode_id, turn=k)}
        prompt = generator.prompt_ids(episode.messages(k))
        [(text, _, _)] = generator.generate([prompt], [turn_seed(seed, info)], max_tokens=MAX_TOKENS)
        out.append(text)
    return out


def test_openai_agent_plays_episodes_against_serve_policy(server, tiny_qwen3, alfworld_env):
    agent = make_agent(f"openai:{server}#tiny?max_tokens={MAX_TOKENS}&temperature=1", seed=7)
    episodes = run_episodes(alfworld_env, agent, [EpisodeRequest(seed=s) for s in range(3)], num_envs=3, progress=False)
    assert len(episodes) == 3
    for episode in episodes:
        assert episode.error is None
        assert episode.num_turns == 3 and episode.turns[-1].truncated  # a random model does not solve ALFWorld
        # Every turn is exactly what this model samples for that prompt and that turn's seed: the
        # HTTP round trip (chat template, sampling, decoding) changed nothing.
        assert [t.response for t in episode.turns] == _local_turns(tiny_qwen3, episode, seed=7)
    responses = [t.response for e in episodes for t in e.turns]
    assert len(set(responses)) == len(responses)  # seeds differ per episode and turn
    # Replaying with the same agent seed gives the same episodes; another seed, other text.
    again = run_episodes(alfworld_env, agent, [EpisodeRequest(seed=s) for s in range(3)], num_envs=1, progress=False)
    assert [e.to_dict() for e in again] == [e.to_dict() for e in episodes]
    other = make_agent(f"openai:{server}#tiny?max_tokens={MAX_TOKENS}", seed=8)
    assert run_episodes(alfworld_env, other, [EpisodeRequest(seed=0)],
                        progress=False)[0].turns[0].response != episodes[0].turns[0].response


def test_serve_policy_answers_bad_requests_with_4xx(server):
    import requests

    url = f"{server}/chat/completions"
    ok = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "seed": 1}
    reply = requests.post(url, json=ok, timeout=60)
    assert reply.status_code == 200
    body = reply.json()
    assert body["object"] == "chat.completion" and body["choices"][0]["finish_reason"] in ("stop", "length")
    assert body["usage"]["completion_tokens"] <= 4
    assert requests.post(url, json=ok, timeout=60).json()["choices"] == body["choices"]  # seeded: same text
    bad = [
        (b"{not json", 400, "JSON object"),
        ({**ok, "model": "other"}, 404, "not served here"),
        ({**ok, "messages": []}, 400, "messages"),
        ({**ok, "messages": [{"role": "robot", "content": "x"}]}, 400, "messages[0]"),
        ({**ok, "messages": [{"role": "user", "content": 3}]}, 400, "messages[0]"),
        ({**ok, "max_tokens": 10**9}, 400, "max_tokens"),
        ({**ok, "max_tokens": "4"}, 400, "max_tokens"),
        ({**ok, "temperature": -1}, 400, "temperature"),
        ({**ok, "stream": True}, 400, "streaming"),
        ({**ok, "n": 2}, 400, "n must be 1"),
        ([1, 2], 400, "JSON object"),
    ]
    for payload, status, words in bad:
        if isinstance(payload, bytes):
            reply = requests.post(url, data=payload, headers={"Content-Type": "application/json"}, timeout=30)
        else:
            reply = requests.post(url, json=payload, timeout=30)
        assert reply.status_code == status, (payload, reply.text)
        assert words in reply.json()["error"]["message"], reply.text
    huge = b'{"messages": "' + b"x" * (9 * 1024 * 1024) + b'"}'
    reply = requests.post(url, data=huge, headers={"Content-Type": "application/json"}, timeout=30)
    assert reply.status_code == 413
    assert requests.get(f"{server}/nowhere", timeout=10).status_code == 404
    assert requests.get(url, timeout=10).status_code == 405
    assert requests.get(f"{server}/models", timeout=10).json()["data"][0]["id"] == "tiny"


def test_openai_agent_errors_say_what_to_do(server):
    down = make_agent("openai:http://127.0.0.1:9/v1#tiny?retries=0&timeout=5")
    with pytest.raises(AgentError, match="cannot reach .* serve-policy --model PATH"):
        down.act([{"role": "user", "content": "hi"}], {}, None)
    wrong = make_agent(f"openai:{server}#nope?retries=0")
    with pytest.raises(AgentError, match="HTTP 404: model 'nope' is not served here"):
        wrong.act([{"role": "user", "content": "hi"}], {}, None)
    for spec, words in [
        ("openai:http://127.0.0.1:8000/v1", "openai:BASE_URL#MODEL"),
        ("openai:http://h/v1#m?temperature=hot", "is not a float"),
        ("openai:http://h/v1#m?colour=red", "unknown setting 'colour'"),
        ("openai:ftp://h/v1#m", "not an http"),
    ]:
        with pytest.raises(AgentError, match=words):
            make_agent(spec)


def test_serve_policy_refuses_a_missing_model(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "agentgym_app.cli", "serve-policy", "--model", str(tmp_path / "nothing")],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ},
    )
    assert result.returncode == 2
    assert "not a model folder (no config.json)" in result.stderr
    assert "Traceback" not in result.stderr
