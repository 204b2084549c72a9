"""Per-turn credit records for the report (`trainer.credit_records`), from the intermediates of the
very `compute_advantages` call whose advantages an update uses, on real ALFWorld episodes and a
seeded random tiny Qwen3 (real Qwen3 tokenizer): the parts the report shows agree with the
advantages and with the formulas of docs/credit.md, and the local trainer writes them for every update."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

import agentgym_opsd
from agentgym_opsd import EpisodeRequest, run_episodes
from agentgym_opsd.agents import ExpertAgent, RandomAgent
from agentgym_app.report import check_credit, load_run
from agentgym_opsd.episode import save_episodes
from agentgym_opsd.io import append_jsonl

pytestmark = pytest.mark.float_sensitive  # also run under a second set of CPU kernels (.ci/run)

ENV = "agentgym/ALFWorld-Pick-v0"
# ALFWorld's defaults (docs/credit.md#configuration): StepOPSD lam_mix, alpha_clip; AgentOPSD b.
LAM, ALPHA, B = 0.2, 0.2, 0.2
AGENT_LAM = 0.5


@pytest.fixture(scope="module")
def episodes(contract_options_alfworld):
    """One task played four times: the expert (solves it) and the random agent (does not), one group."""
    options = {**contract_options_alfworld, "split": "train", "max_turns": 6}

    def make():
        return agentgym_opsd.make(ENV, **options)

    requests = [EpisodeRequest(seed=s, options={"task_index": 0}, episode_id=f"ep{s}", group="task0") for s in range(4)]
    played = run_episodes(make, ExpertAgent(), requests[:1], progress=False)
    played += run_episodes(make, RandomAgent(seed=1), requests[1:], progress=False)
    assert played[0].success and not any(e.success for e in played[1:])
    return played


@pytest.fixture(scope="module")
def model_and_tokenizer(qwen3_tokenizer):
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    tokenizer = qwen3_tokenizer
    torch.manual_seed(0)
    config = Qwen3Config(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, max_position_embeddings=8192, tie_word_embeddings=True,
    )
    return Qwen3ForCausalLM(config).eval(), tokenizer


@pytest.fixture(scope="module")
def records(episodes, model_and_tokenizer):
    """One update's credit per method, as the local trainer computes and records it."""
    from trainer.credit_pass import credit_pass
    from trainer.credit_records import update_credit_records
    from trainer.env_knowledge import credit_config

    model, tokenizer = model_and_tokenizer
    out = []
    for method in ("grpo", "stepopsd", "agentopsd"):
        config = credit_config(ENV, method, **({"budget": False} if method == "stepopsd" else {}))
        rows, _, parts = credit_pass(model, model, tokenizer, episodes, config)
        out += update_credit_records(episodes, rows, parts, method=method, update=1, tokenizer=tokenizer)
    return {(r["episode_id"], r["method"]): r for r in out}


def _grpo_advantages(episodes) -> list[float]:
    """docs/credit.md#sequence-advantage: R_i = success_i - 0.1 * invalid turns;
    A_i = (R_i - mean) / (unbiased std + 1e-6)."""
    rewards = [float(e.success) - 0.1 * e.invalid_turns for e in episodes]
    mean = sum(rewards) / len(rewards)
    std = math.sqrt(sum((r - mean) ** 2 for r in rewards) / (len(rewards) - 1))
    return [(r - mean) / (std + 1e-6) for r in rewards]


def test_records_hold_one_checked_entry_per_episode_and_method(episodes, records):
    assert len(records) == 3 * len(episodes)
    for (episode_id, _), record in records.items():
        episode = next(e for e in episodes if e.episode_id == episode_id)
        check_credit({k: v for k, v in record.items() if k not in ("episode_id", "method")}, episode.num_turns)
        assert record["update"] == 1


def test_grpo_records_the_group_normalized_advantage_on_every_turn(episodes, records):
    for episode, expected in zip(episodes, _grpo_advantages(episodes), strict=True):
        record = records[(episode.episode_id, "grpo")]
        assert record["advantage"] == pytest.approx(expected, abs=1e-5)
        assert all(t["advantage"] == pytest.approx(expected, abs=1e-5) for t in record["turns"])
        assert all("gap" not in t and "tokens" not in t for t in record["turns"])  # no teacher in GRPO


def test_stepopsd_token_weights_follow_their_formula_and_tile_the_action_blocks(episodes, records):
    weights_seen = []
    for episode in episodes:
        record = records[(episode.episode_id, "stepopsd")]
        A = record["advantage"]
        assert A != 0
        for turn, credit in zip(episode.turns, record["turns"], strict=True):
            if turn.step.action_span is None:  # no action block: nothing scored (action_only)
                assert "tokens" not in credit
                continue
            text = "".join(t[0] for t in credit["tokens"])
            start, end = credit["span"]
            assert turn.response[start:end] == text
            a, b = turn.step.action_span
            assert start <= a and end >= b  # the whole block, tags included
            for _, w, delta in credit["tokens"]:
                # w_t = clip(2 sigma(sign(A) delta_t), 1 - alpha, 1 + alpha)
                expected = min(1 + ALPHA, max(1 - ALPHA, 2 / (1 + math.exp(-math.copysign(1, A) * delta))))
                assert w == pytest.approx(expected, abs=1e-5)
                weights_seen.append(w)
            assert credit["gap"] == pytest.approx(sum(t[2] for t in credit["tokens"]), abs=1e-4)  # e_k = sum delta
            # A~ = A (1 + lam (w - 1)) keeps A's sign and stays within lam * alpha of it (no budget here)
            ratio = credit["advantage"] / A
            assert 1 - LAM * ALPHA - 1e-6 <= ratio <= 1 + LAM * ALPHA + 1e-6
    assert len({round(w, 4) for w in weights_seen}) > 3  # a random teacher disagrees token by token


def test_agentopsd_beliefs_and_turn_weights_give_the_core_advantages(episodes, records):
    for episode in episodes:
        record = records[(episode.episode_id, "agentopsd")]
        A = record["advantage"]
        turns = record["turns"]
        previous = None
        for credit in turns:
            assert 0 < credit["belief"] < 1
            if previous is not None:
                assert credit["belief_delta"] == pytest.approx(credit["belief"] - previous, abs=1e-9)
            previous = credit["belief"]
            assert 1 - B - 1e-9 <= credit["weight"] <= 1 + B + 1e-9
            # Every token of turn k gets A * ((1 - lam) + lam * w_k): the turn's mean advantage from
            # compute_advantages is exactly that, so the recorded w_k is the one the update used.
            assert credit["advantage"] == pytest.approx(A * (1 + AGENT_LAM * (credit["weight"] - 1)), rel=1e-4,
                                                        abs=1e-6)


def test_the_report_shows_the_records_beside_the_trainer_episodes(tmp_path, episodes, records):
    method_dir = tmp_path / "run" / "training" / "stepopsd"
    save_episodes(method_dir / "episodes" / "update_00001.jsonl", episodes)
    append_jsonl(method_dir / "credit.jsonl", [r for r in records.values() if r["method"] != "grpo"])
    data = load_run(tmp_path / "run")
    shown = {e.episode_id: e for source, e in data.viewer if source == "train:stepopsd"}
    assert set(shown) == {e.episode_id for e in episodes}
    for episode in shown.values():
        assert set(episode.meta["credit"]) == {"stepopsd", "agentopsd"} and episode.meta["update"] == 1


@pytest.mark.parametrize("method", ["stepopsd", "agentopsd"])
def test_the_local_trainer_records_what_each_update_used(tmp_path, method):
    """credit.jsonl holds, per update and episode, the credit of the advantages that update trained on."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "trainer"))
    from test_local_train import config

    from agentgym_opsd.io import read_jsonl
    from trainer.local import LocalTrainer

    run = LocalTrainer(config(tmp_path / "run", method=method, steps=2, max_new_tokens=6), progress=False)
    run.run()
    lines = list(read_jsonl(tmp_path / "run" / "credit.jsonl"))
    assert {r["update"] for r in lines} == {1, 2} and {r["method"] for r in lines} == {method}
    last = [r for r in lines if r["update"] == 2]
    episodes = {e["episode_id"]: e for e in read_jsonl(tmp_path / "run" / "episodes" / "update_00002.jsonl")}
    assert {r["episode_id"] for r in last} == set(episodes)
    parts = run.last_credit
    for r in last:
        assert len(r["turns"]) == len(episodes[r["episode_id"]]["turns"])
    assert sorted(round(r["advantage"], 5) for r in last) == sorted(round(float(a), 5) for a in parts.A_episode)
