"""OpenRLHF's own PPOTrainer code path with the bridge installed, on CPU.

The trainer class is `AgentGymPPOTrainer` (the class under the Ray actor the launcher installs),
built by OpenRLHF's real constructor from OpenRLHF's real parsed args: it reads the prompt dataset
with `datasets` and OpenRLHF's `PromptDataset` (chat template applied), builds the dataloader, the
samples generator and the experience maker. Rollouts go through OpenRLHF's real `SamplesGenerator`
dispatch to Ray rollout actors whose class IS OpenRLHF's `RolloutRayActor` with two things replaced:
the vLLM engine (a transformers model behind the same async `generate`) and its construction. The
agent executor is loaded from `--train.agent_func_path` as in a cluster run, and receives the bridge
config through the actor's environment, as the launcher hands it to Ray workers.

Not run (CUDA): `train_step`'s hand-over to the DeepSpeed actors and their PPO epochs.
"""

from __future__ import annotations

import sys

import pytest
import torch

pytestmark = pytest.mark.float_sensitive  # also run under a second set of CPU kernels (.ci/run)

pytest.importorskip("openrlhf.utils", reason="OpenRLHF is not installed in this venv: run `make test-openrlhf`")

# Imported after the importorskip above (E402): the bridge modules import OpenRLHF.
from trainer.openrlhf.config import ENV_VAR, BridgeConfig  # noqa: E402
from trainer.openrlhf.launch import AGENT_FUNC_PATH, complete_flags, parse_openrlhf_flags  # noqa: E402

GROUP = 4
PROMPT_SEEDS = "2,6,0"  # secrets 3, 7 (the warm-started policy opens with 3 or 7) and 1


def rollout_actor_class():
    import ray
    from openrlhf.trainer.ray.vllm_engine import RolloutRayActor

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

    class CPURolloutActor(RolloutRayActor.__ray_actor_class__):
        """OpenRLHF's rollout actor (its generate_responses and executor loading) on a transformers model."""

        def __init__(self, agent_func_path, model_path, seed):
            from openrlhf.trainer.ray.vllm_engine import _load_agent_executor
            from transformers import AutoModelForCausalLM, AutoTokenizer

            from trainer.openrlhf.hf_engine import HFAsyncEngine

            self.executor = _load_agent_executor(agent_func_path)
            model = AutoModelForCausalLM.from_pretrained(model_path)
            self.engine = HFAsyncEngine(model, AutoTokenizer.from_pretrained(model_path), seed=seed)

        async def generate(self, prompt_token_ids, sampling_params, multi_modal_data=None):
            return await self.engine.generate(prompt_token_ids, sampling_params)

        def get_num_unfinished_requests(self) -> int:
            return 0

    return ray.remote(CPURolloutActor)


def test_openrlhf_trainer_with_the_bridge_makes_credit_experience(guess_policy, qwen3_tokenizer, example_env_id,
                                                                   policy_group, tmp_path, monkeypatch):
    from openrlhf.utils.deepspeed import DeepspeedStrategy

    from agentgym_app.cli import main as cli_main
    from trainer.openrlhf.experience import CreditExperienceMaker
    from trainer.openrlhf.ray_trainer import AgentGymPPOTrainer
    from trainer.openrlhf.samples import AgentGymSamplesGenerator

    _, model_path = guess_policy
    prompts = tmp_path / "train.jsonl"
    assert cli_main(["openrlhf-prompts", "--env", example_env_id, "--seeds", PROMPT_SEEDS, "--out", str(prompts)]) == 0
    bridge = BridgeConfig.from_dict({"rollout": {"turn_max_tokens": 12, "max_turns": 3},
                                     "credit": {"method": "agentopsd"}})
    args = parse_openrlhf_flags(complete_flags([
        "--actor.model_name_or_path", str(model_path), "--data.prompt_dataset", str(prompts),
        "--rollout.n_samples_per_prompt", str(GROUP), "--rollout.batch_size", "3", "--rollout.micro_batch_size", "4",
        "--train.batch_size", str(3 * GROUP), "--data.max_len", "256", "--rollout.max_new_tokens", "12",
        "--algo.kl.init_coef", "0", "--vllm.num_engines", "1", "--actor.num_gpus_per_node", "1",
        "--ds.attn_implementation", "eager",
    ]))
    monkeypatch.setenv(ENV_VAR, bridge.to_json())  # what the launcher exports to the trainer actor
    # This session's Ray runs in-process without the launcher's job-level runtime_env (which ships the
    # code to other nodes, test_launch.py checks it): the actor loads this checkout's agent module.
    engine = rollout_actor_class().options(runtime_env={"env_vars": {ENV_VAR: bridge.to_json()}}).remote(
        AGENT_FUNC_PATH, str(model_path), 5
    )
    actor_group = policy_group
    strategy = DeepspeedStrategy(seed=0, zero_stage=2, args=args)
    trainer = AgentGymPPOTrainer(str(model_path), strategy, actor_group, None, None, None, [engine],
                                 do_sample=True, max_len=256, max_new_tokens=12, temperature=1.0, top_p=1.0)
    assert isinstance(trainer.samples_generator, AgentGymSamplesGenerator)
    assert isinstance(trainer.experience_maker, CreditExperienceMaker)
    assert trainer.experience_maker.bridge.credit == {"method": "agentopsd"}
    assert trainer.get_max_steps() == 1

    samples, _, consumed, _ = trainer.samples_generator.generate_samples(**trainer.generate_kwargs)
    assert consumed == 3 and len(samples) == 3 * GROUP
    # OpenRLHF's PromptDataset applied the tokenizer's chat template to the dataset's prompt: it is the
    # text the executor rebuilt from the env, token for token.
    for s in samples:
        first = int(s.action_mask[0].nonzero()[0]) + 1
        assert qwen3_tokenizer.decode(s.sequences[0, :first]) == s.prompts[0]

    trainer.experience_maker.update_step = 3
    experiences = trainer.experience_maker.make_experience_batch(samples)
    logs = trainer.experience_maker.last_diagnostics
    assert logs["credit/scored_tokens"] > 0 and logs["teacher/truncated"] == 0
    for e in experiences:
        assert (e.advantages[e.action_mask == 0] == 0).all()
        assert torch.isfinite(e.advantages).all()
        assert all(not k.startswith("agentgym_") for k in e.info)
