"""The bridge config, task labels and prompt rows (no OpenRLHF needed: runs in the main suite too)."""

from __future__ import annotations

import json

import pytest

from trainer.openrlhf.config import ENV_VAR, BridgeConfig, ConfigError, TaskLabel
from trainer.openrlhf.dataset import parse_seeds, prompt_rows


def test_config_file_round_trip_through_the_environment(tmp_path, monkeypatch):
    path = tmp_path / "bridge.yaml"
    path.write_text(
        "rollout:\n  turn_max_tokens: 256\n  max_turns: 20\n  chat_template_kwargs: {enable_thinking: false}\n"
        "credit:\n  method: stepopsd\n  lam_mix: 0.1\n  invalid_coef: 0.05\n"
        "teacher:\n  max_len: 4096\n"
    )
    config = BridgeConfig.load(path)
    monkeypatch.setenv(ENV_VAR, config.to_json())
    again = BridgeConfig.from_environment()
    assert again == config
    credit = again.credit_config("agentgym/ALFWorld-All-v0")
    # Family defaults (ALFWorld: action_only spans), then the file's fields, and the live teacher.
    assert (credit.method, credit.span_mode, credit.lam_mix,
            credit.invalid_coef) == ("stepopsd", "action_only", 0.1, 0.05)
    assert credit.teacher_mode == "live"
    assert again.credit_config("agentgym/SearchQA-NQ-v0").span_mode == "clean_step"


@pytest.mark.parametrize(
    "text, match",
    [
        ("rollout:\n  max_turn: 3\n", "unknown key"),
        ("rollout:\n  max_turns: 0\n", "max_turns must be >= 1"),
        ("policy: {}\n", "unknown section"),
        ("- a\n- b\n", "expected a mapping"),
        ("rollout: [\n", "invalid YAML"),
        ("teacher:\n  micro_batch_size: 0\n", "micro_batch_size"),
    ],
)
def test_bad_config_files_name_the_problem(tmp_path, text, match):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=match):
        BridgeConfig.load(path)


def test_bad_credit_sections_fail_when_resolved():
    env = "agentgym/ALFWorld-Heat-v0"
    with pytest.raises(ConfigError, match="teacher_mode"):
        BridgeConfig.from_dict({"credit": {"method": "stepopsd", "teacher_mode": "stale"}}).credit_config(env)
    with pytest.raises(ConfigError, match="method"):
        BridgeConfig.from_dict({"credit": {"method": "ppo"}}).credit_config(env)
    with pytest.raises(ConfigError, match="unexpected keyword|lam_mixx"):
        BridgeConfig.from_dict({"credit": {"lam_mixx": 0.1}}).credit_config(env)
    with pytest.raises(ConfigError, match="no env registered as 'x/Y-v0'"):  # family defaults come from the registry
        BridgeConfig.from_dict({"credit": {"method": "grpo"}}).credit_config("x/Y-v0")


def test_one_family_per_batch_unless_the_config_names_it():
    config = BridgeConfig()
    assert config.batch_env_id(["agentgym/ALFWorld-Heat-v0",
                                "agentgym/ALFWorld-Cool-v0"]) == "agentgym/ALFWorld-Cool-v0"
    with pytest.raises(ConfigError, match="mixes env families"):
        config.batch_env_id(["agentgym/ALFWorld-Heat-v0", "agentgym/WebShop-v0"])
    named = BridgeConfig.from_dict({"credit": {"env": "agentgym/WebShop-v0"}})
    assert named.batch_env_id(["agentgym/ALFWorld-Heat-v0", "agentgym/WebShop-v0"]) == "agentgym/WebShop-v0"


def test_task_labels():
    label = TaskLabel("example/GuessNumber-v0", 7, {"task_index": 2}, {"high": 30})
    assert TaskLabel.parse(label.to_json()) == label
    assert TaskLabel.parse(json.loads(label.to_json())) == label
    with pytest.raises(ConfigError, match="openrlhf-prompts"):
        TaskLabel.parse("2 + 2 = ?")
    with pytest.raises(ConfigError, match="unknown key"):
        TaskLabel.parse({"env_id": "a/B-v0", "seed": 1, "split": "train"})


def test_seeds_and_prompt_rows(example_env_id):
    assert parse_seeds("0:3,7, 9") == [0, 1, 2, 7, 9]
    for bad in ("", "3:3", "a:b", "1,x"):
        with pytest.raises(ValueError):
            parse_seeds(bad)
    rows = prompt_rows(example_env_id, [4, 24], {"high": 20}, progress=False)
    # Seeds 4 and 24 pick the same task (24 % 20 == 4): same prompt, different labels.
    assert rows[0]["prompt"] == rows[1]["prompt"] and rows[0]["task_id"] == rows[1]["task_id"] == "guess-5"
    assert [TaskLabel.parse(r["label"]).seed for r in rows] == [4, 24]
