"""The agent executor, loaded the way OpenRLHF 0.11.2 loads `--train.agent_func_path`, plays a real
env for a group of episodes with a tiny Qwen3 behind an async generate."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

pytest.importorskip("openrlhf.utils", reason="OpenRLHF is not installed in this venv: run `make test-openrlhf`")

from trainer.openrlhf import agent_func
from trainer.openrlhf.config import ENV_VAR, BridgeConfig, TaskLabel
from trainer.openrlhf.hf_engine import HFAsyncEngine

GROUP = 8


def load_executor(monkeypatch, config: dict):
    """OpenRLHF's own loader (RolloutRayActor does this in each vLLM actor)."""
    from openrlhf.trainer.ray.vllm_engine import _load_agent_executor

    monkeypatch.setenv(ENV_VAR, BridgeConfig.from_dict(config).to_json())
    return _load_agent_executor(str(Path(agent_func.__file__)))


def play_group(executor, engine, tokenizer, label: str, max_len: int = 1024):
    from vllm import SamplingParams

    # What OpenRLHF's SamplesGenerator builds for an agent run.
    params = SamplingParams(temperature=1.0, top_p=1.0, top_k=-1, max_tokens=None, min_tokens=1,
                            skip_special_tokens=False, logprobs=None)

    async def group():
        return await asyncio.gather(
            *[executor.execute("prompt", label, params, max_len, tokenizer, engine) for _ in range(GROUP)]
        )

    return asyncio.run(group())


@pytest.fixture(scope="module")
def group_results(guess_policy, qwen3_tokenizer, example_env_id):
    model, _ = guess_policy
    mp = pytest.MonkeyPatch()
    try:
        executor = load_executor(mp, {"rollout": {"turn_max_tokens": 12, "max_turns": 3}})
    finally:
        mp.undo()
    engine = HFAsyncEngine(model, qwen3_tokenizer, seed=1)
    results = {}
    for seed in (2, 6, 0):  # secrets 3 and 7 (the policy opens with 3 or 7) and 1 (never guessed first)
        results[seed] = play_group(executor, engine, qwen3_tokenizer, TaskLabel(example_env_id, seed).to_json())
    return executor, engine, results


def test_openrlhf_loads_our_executor(group_results):
    from openrlhf.utils.agent import AgentExecutorBase

    executor, engine, _ = group_results
    assert isinstance(executor, AgentExecutorBase)
    assert type(executor).__name__ == "AgentExecutor"
    # The episodes of a group are sampled together: far fewer batched calls than turns played.
    turns = sum(r["agentgym"]["record"]["num_turns"] for rs in group_results[2].values() for r in rs)
    assert engine.calls < turns / 2


def test_group_outcomes_follow_the_env(group_results, example_env_id):
    from agentgym_opsd.registry import entry

    _, _, results = group_results
    invalid_coef = entry(example_env_id).credit_defaults["invalid_coef"]  # the plug-in's own penalty
    assert invalid_coef != 0.1  # differs from the trainer's default, so the env's value is the one applied
    successes = [r["agentgym"]["record"]["success"] for rs in results.values() for r in rs]
    assert any(successes) and not all(successes), "the warm-started policy should both solve and fail tasks"
    for seed, group in results.items():
        for r in group:
            record = r["agentgym"]["record"]
            episode = record["episode"]
            assert episode["seed"] == seed and episode["task_id"] == f"guess-{seed % 20 + 1}"
            turns = episode["turns"]
            assert 1 <= len(turns) <= 3
            # The episode ends where the env said so, and success is the env's.
            assert turns[-1]["terminated"] or turns[-1]["truncated"]
            assert record["success"] == episode["hindsight"]["success"]
            if record["success"]:
                assert turns[-1]["action"] == f"guess {seed % 20 + 1}" and turns[-1]["reward"] == 1.0
            invalid = sum(1 for t in turns if not t["step"]["format_ok"] or t["step"]["admissible"] is False)
            assert record["invalid_turns"] == invalid
            assert r["reward"] == pytest.approx(float(record["success"]) - invalid_coef * invalid)
            assert r["scores"] == float(record["success"])
            assert r["extra_logs"]["env/success"] == float(record["success"])


def test_turn_ids_and_action_spans_match_the_generated_tokens(group_results, qwen3_tokenizer):
    tok = qwen3_tokenizer
    _, _, results = group_results
    spans_seen = 0
    for group in results.values():
        for r in group:
            tokens = r["observation_tokens"]
            turn_ids = r["agentgym"]["turn_ids"]
            turns = r["agentgym"]["record"]["episode"]["turns"]
            assert len(turn_ids) == len(tokens)
            assert len(r["action_ranges"]) == len(turns) == len(r["agentgym"]["action_spans"])
            for k, ((start, end), span,
                    turn) in enumerate(zip(r["action_ranges"], r["agentgym"]["action_spans"], turns)):
                # Explicit turn ids: exactly the generated range of turn k.
                assert [i for i, t in enumerate(turn_ids) if t == k] == list(range(start, end))
                generated = tok.decode(tokens[start:end], skip_special_tokens=True)
                assert generated == turn["response"]
                if turn["step"]["action_span"] is None:
                    assert span is None
                    continue
                spans_seen += 1
                a, b = turn["step"]["action_span"]
                assert start <= span[0] < span[1] <= end
                assert tok.decode(tokens[span[0] : span[1]]) == turn["response"][a:b]
            # Everything else is prompt, chat framing or observation; observations follow each turn.
            text = tok.decode(tokens)
            for turn in turns[:-1]:
                assert f"<|im_start|>user\n{turn['observation']}<|im_end|>\n<|im_start|>assistant\n" in text
            assert not text.endswith(turns[-1]["observation"] + "<|im_end|>\n<|im_start|>assistant\n")
    assert spans_seen > 0


def test_context_budget_ends_the_episode_without_overflow(guess_policy, qwen3_tokenizer, example_env_id, monkeypatch):
    model, _ = guess_policy
    executor = load_executor(monkeypatch, {"rollout": {"turn_max_tokens": 16, "max_turns": 10}})
    engine = HFAsyncEngine(model, qwen3_tokenizer, seed=2)
    label = TaskLabel(example_env_id, 0).to_json()  # secret 1: never among the first guesses
    prompt_len = None
    for r in play_group(executor, engine, qwen3_tokenizer, label, max_len=110):
        assert len(r["observation_tokens"]) <= 110
        record = r["agentgym"]["record"]
        if record["context_full"]:
            assert r["truncated"] and not record["success"]
            assert record["episode"]["meta"]["cut"].startswith("context full")
        prompt_len = r["action_ranges"][0][0]
    # A first prompt that does not fit is an errored sample (reward 0), not an exception that ends the run.
    for r in play_group(executor, engine, qwen3_tokenizer, label, max_len=prompt_len):
        assert r["agentgym"]["record"]["errored"] and "raise --data.max_len" in r["agentgym"]["record"]["episode"][
            "error"]


def test_bad_labels_are_clear_errors(guess_policy, qwen3_tokenizer, monkeypatch):
    model, _ = guess_policy
    executor = load_executor(monkeypatch, {})
    engine = HFAsyncEngine(model, qwen3_tokenizer)
    from trainer.openrlhf.config import ConfigError

    with pytest.raises(ConfigError, match="openrlhf-prompts"):
        play_group(executor, engine, qwen3_tokenizer, "What is 2+2?")
    with pytest.raises(ConfigError, match="env_id and seed"):
        play_group(executor, engine, qwen3_tokenizer, json.dumps({"seed": 1}))
    from agentgym_opsd.registry import UnknownEnvError

    with pytest.raises(UnknownEnvError):
        play_group(executor, engine, qwen3_tokenizer, TaskLabel("example/Nope-v0", 1).to_json())
