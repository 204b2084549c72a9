"""Fixtures of the OpenRLHF bridge suite (`make test-openrlhf`, its own venv: .venv-openrlhf).

The suite runs the REAL OpenRLHF 0.11.2 classes (agent-executor loader, samples generator,
experience maker, `Experience`, `RayActorGroup`, `Actor`, `PolicyLoss`, the `train_ppo_ray` argument
parser and checks). OpenRLHF is installed with `--no-deps` plus all its requirements except two that
cannot be installed on a CPU-only machine:

- flash-attn: a CUDA source build (OpenRLHF pins flash-attn==2.8.3);
- vllm: pins a CUDA build of torch, and serves generation on GPUs only.

OpenRLHF imports both at module import time, so this conftest STUBS them: it puts the stand-in
packages in tests/trainer/openrlhf/stand_ins on `sys.path` and `PYTHONPATH` (Ray workers import OpenRLHF
too), and only when the real packages are missing. See stand_ins/README.md. Generation comes from a
real transformers model behind `trainer.openrlhf.hf_engine.HFAsyncEngine`, never from a stand-in.
The real Qwen3 tokenizer is tests/conftest.py's `qwen3_tokenizer` (shipped in tests/data).
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

REPO = Path(__file__).resolve().parents[3]
EXAMPLE_PLUGIN = REPO / "tests" / "data" / "example_plugin"
STAND_INS = Path(__file__).resolve().parent / "stand_ins"

# OpenRLHF's own package, not this folder: tests/trainer is on sys.path (tests/trainer/conftest.py), and
# there `openrlhf` names this folder, as a namespace package without an origin, where OpenRLHF is missing.
# The test modules skip the same way: `pytest.importorskip("openrlhf.utils")`, a module only OpenRLHF has.
OPENRLHF_SPEC = importlib.util.find_spec("openrlhf")
HAVE_OPENRLHF = OPENRLHF_SPEC is not None and OPENRLHF_SPEC.origin is not None


def install_stand_ins() -> list[str]:
    """Put the stand-in flash_attn and vllm on the import path where the real ones are missing."""
    missing = [name for name in ("flash_attn", "vllm") if importlib.util.find_spec(name) is None]
    if missing:
        sys.path.insert(0, str(STAND_INS))
        paths = [str(STAND_INS), str(EXAMPLE_PLUGIN)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep)
                                                         if p]
        os.environ["PYTHONPATH"] = os.pathsep.join(paths)
    return missing


STUBBED = install_stand_ins() if HAVE_OPENRLHF else []


@pytest.fixture(scope="session")
def example_env_id():
    """The GuessNumber plug-in env (tests/data/example_plugin), registered through its entry point."""
    import agentgym_opsd

    if str(EXAMPLE_PLUGIN) not in sys.path:
        sys.path.insert(0, str(EXAMPLE_PLUGIN))
    agentgym_opsd.load_plugins(reload=True)
    assert "example/GuessNumber-v0" in {e.id for e in agentgym_opsd.registered_envs()}
    return "example/GuessNumber-v0"


def _tiny_qwen3(tokenizer, seed: int):
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    config = Qwen3Config(
        vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, tie_word_embeddings=True,
        max_position_embeddings=4096, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
    )
    model = Qwen3ForCausalLM(config)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model


def warm_start_on_guesses(model, tokenizer, env_id: str, guesses=(3, 7), steps: int = 40, lr: float = 1e-2):
    """A few supervised steps so the tiny policy writes `<action>guess K</action>` turns, K in `guesses`.

    The loss is taken on the response tokens only (the 151k-way output layer runs on those rows
    alone, which keeps a step cheap). Sampled at temperature 1 the policy then opens with one of `guesses` and
    drifts on later turns, so groups mix successes, failures and invalid turns.
    """
    import torch

    import agentgym_opsd

    env = agentgym_opsd.make(env_id)
    observation, _ = env.reset(seed=0)
    messages = agentgym_opsd.ContextPolicy.parse("full").messages(env.unwrapped.instructions, observation, [])
    env.close()
    prompt = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    responses = [
        tokenizer(f"<action>guess {k}</action>", add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        for k in guesses
    ]
    rows = [prompt_ids + r for r in responses]
    width = max(map(len, rows))
    ids = torch.full((len(rows), width), tokenizer.pad_token_id)
    attention = torch.zeros((len(rows), width), dtype=torch.long)
    target = torch.zeros((len(rows), width), dtype=torch.bool)
    for i, row in enumerate(rows):
        ids[i, : len(row)] = torch.tensor(row)
        attention[i, : len(row)] = 1
        target[i, len(prompt_ids) : len(row)] = True
    where = target[:, 1:].nonzero()
    labels = ids[where[:, 0], where[:, 1] + 1]
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    model.train()
    for _ in range(steps):
        hidden = model.model(input_ids=ids, attention_mask=attention).last_hidden_state
        logits = model.lm_head(hidden[where[:, 0], where[:, 1]])
        loss = torch.nn.functional.cross_entropy(logits.float(), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval()
    return float(loss.detach())


@pytest.fixture(scope="session")
def guess_policy(qwen3_tokenizer, example_env_id, tmp_path_factory):
    """A tiny Qwen3 on the real Qwen3 tokenizer, warm-started to guess, saved as a HF folder
    (OpenRLHF's `Actor` loads it by path, as on a cluster)."""
    model = _tiny_qwen3(qwen3_tokenizer, seed=0)
    loss = warm_start_on_guesses(model, qwen3_tokenizer, example_env_id)
    assert loss < 1.0, f"warm start did not converge (loss {loss:.3f})"
    path = tmp_path_factory.mktemp("guess_policy")
    model.save_pretrained(path)
    qwen3_tokenizer.save_pretrained(path)
    return model, path


@pytest.fixture(scope="session")
def ray_cluster():
    """A local Ray instance (2 CPUs); the actors of the tests take no CPU reservation."""
    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def load_actor(path, temperature=1.0):
    """OpenRLHF's `Actor` loaded by path as `PolicyModelActor` loads it (bf16 weights), then run in fp32."""
    from openrlhf.models import Actor

    actor = Actor(str(path), attn_implementation="eager", param_dtype="bf16", temperature=temperature)
    actor.model.float()
    return actor


def make_actor_group(model_path):
    """A real `RayActorGroup` of one CPU actor that serves `forward` like `PolicyModelActor`."""

    import ray
    from openrlhf.trainer.ray.launcher import BaseModelActor, RayActorGroup

    # The tests' modules are not importable in a Ray worker: ship the actor class by value.
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

    class CPUPolicyActor(BaseModelActor):
        """`PolicyModelActor` without DeepSpeed: OpenRLHF's `Actor` loaded by path, in fp32 on CPU."""

        def init_model_from_pretrained(self, pretrain, temperature):
            self.strategy = SimpleNamespace(is_rank_0=lambda: True)
            self.actor = load_actor(pretrain, temperature)
            self.calls = 0

        def forward(self, sequences, action_mask=None, attention_mask=None, packed_seq_lens=None,
                    mm_train_inputs_list=None):
            self.calls += 1
            self.actor.eval()
            with torch.no_grad():
                return self.actor(sequences, action_mask, attention_mask, ring_attn_group=None).to("cpu")

        def forward_calls(self):
            return self.calls

    group = RayActorGroup(1, 1, ray.remote(CPUPolicyActor), num_gpus_per_actor=0)
    ray.get(group.async_init_model_from_pretrained(str(model_path), 1.0))
    return group


@pytest.fixture(scope="session")
def policy_group(guess_policy, ray_cluster):
    """A real OpenRLHF `RayActorGroup` of one CPU actor holding the warm-started policy."""
    return make_actor_group(guess_policy[1])


@pytest.fixture(scope="session")
def load_policy_actor():
    """`load_actor` for tests (OpenRLHF's `Actor` loaded by path as the CPU actor loads it)."""
    return load_actor
