"""The bridge on a real ALFWorld env (the TextWorld engine, the small embedded test panel): prompt
rows, the executor's episodes, and the StepOPSD teacher (ALFWorld's hindsight reference: the expert
plan) on the actor group."""

from __future__ import annotations

import asyncio
import copy

import pytest

pytest.importorskip("openrlhf.utils", reason="OpenRLHF is not installed in this venv: run `make test-openrlhf`")

from trainer.openrlhf.config import BridgeConfig, TaskLabel
from trainer.openrlhf.dataset import prompt_rows
from trainer.openrlhf.hf_engine import HFAsyncEngine

ENV_ID = "agentgym/ALFWorld-Pick-v0"
GROUP = 4


@pytest.fixture(scope="module")
def alfworld_kwargs(contract_options_alfworld):
    return {**contract_options_alfworld, "split": "train"}


def test_alfworld_group_through_executor_and_teacher(guess_policy, qwen3_tokenizer, policy_group, alfworld_kwargs):
    from openrlhf.trainer.ppo_utils.kl_controller import FixedKLController
    from openrlhf.utils.deepspeed import DeepspeedStrategy
    from vllm import SamplingParams

    from trainer.openrlhf.agent_func import AgentExecutor
    from trainer.openrlhf.experience import CreditExperienceMaker
    from trainer.openrlhf.launch import complete_flags, parse_openrlhf_flags
    from trainer.openrlhf.samples import AgentGymSamplesGenerator

    model, path = guess_policy
    rows = prompt_rows(ENV_ID, [0, 1], alfworld_kwargs, progress=False)
    assert "Your task is to:" in rows[0]["prompt"][1]["content"] and rows[0]["datasource"] == "ALFWorld/pick"
    bridge = BridgeConfig.from_dict({"rollout": {"turn_max_tokens": 12, "max_turns": 3},
                                     "credit": {"method": "stepopsd"}})
    executor = AgentExecutor(bridge)
    engine = HFAsyncEngine(model, qwen3_tokenizer, seed=11)
    params = SamplingParams(temperature=1.0, max_tokens=None, min_tokens=1, skip_special_tokens=False)

    async def play():
        return await asyncio.gather(*[
            executor.execute(r["prompt"], r["label"], params, 1024, qwen3_tokenizer, engine)
            for r in rows for _ in range(GROUP)
        ])

    responses = asyncio.run(play())
    for r in responses:
        episode = r["agentgym"]["record"]["episode"]
        assert episode["env_id"] == ENV_ID and episode["task_type"] == "pick"
        assert len(episode["turns"]) == 3 and episode["turns"][-1]["truncated"]
        assert episode["hindsight"]["reference"]  # the expert plan the StepOPSD teacher reads
        first = episode["turns"][0]
        if first["action"] is not None:  # "guess 3" parses but is no ALFWorld command
            assert first["step"]["admissible"] is False
        invalid = r["agentgym"]["record"]["invalid_turns"]
        assert r["reward"] == pytest.approx(-0.1 * invalid)  # ALFWorld's invalid_coef

    args = parse_openrlhf_flags(complete_flags([
        "--actor.model_name_or_path", str(path), "--data.prompt_dataset", "unused.jsonl",
        "--rollout.n_samples_per_prompt", str(GROUP), "--rollout.batch_size", "2", "--rollout.micro_batch_size", "4",
        "--train.batch_size", str(2 * GROUP), "--data.max_len", "1024", "--algo.kl.init_coef", "0",
        "--vllm.num_engines", "1", "--actor.num_gpus_per_node", "1",
    ]))
    strategy = DeepspeedStrategy(seed=0, zero_stage=2, args=args)
    generator = AgentGymSamplesGenerator(strategy, None, None, qwen3_tokenizer, [])
    samples = [generator._process_response_into_experience(r, max_len=1024) for r in responses]
    maker = CreditExperienceMaker(policy_group, None, None, None, FixedKLController(0.0), strategy, qwen3_tokenizer,
                                  bridge=bridge)
    experiences = maker.make_experience_batch(copy.deepcopy(samples))
    logs = maker.last_diagnostics
    spans = sum(1 for r in responses for s in r["agentgym"]["action_spans"] if s is not None)
    # One teacher sequence per turn with an action block (ALFWorld: action_only spans).
    assert logs["teacher/sequences"] == spans > 0 and logs["teacher/truncated"] == 0
    assert logs["credit/scored_tokens"] > 0
    for e in experiences:
        assert (e.advantages[e.action_mask == 0] == 0).all()
    assert TaskLabel.parse(rows[1]["label"]).env_kwargs["split"] == "train"
