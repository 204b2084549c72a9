"""Fixtures of the OpenRLHF bridge suite (`make test-openrlhf`, its own venv: .venv-openrlhf).

The suite runs the REAL OpenRLHF 0.11.2 classes (agent executor base, samples generator, experience
maker, `Experience`, `Actor`, `PolicyLoss`, the `train_ppo_ray` argument parser). OpenRLHF is
installed with `--no-deps` plus all its requirements except two that cannot be installed on a
CPU-only machine:

- flash-attn: a CUDA source build (OpenRLHF pins flash-attn==2.8.3);
- vllm: pins a CUDA build of torch, and serves generation on GPUs only.

OpenRLHF imports both at module import time, so this conftest puts small STAND-IN modules for them
in `sys.modules` (only when the real ones are not importable). The stand-ins provide the names
OpenRLHF imports; the flash-attn functions raise if ever called (nothing on the CPU path calls them),
and vLLM's `SamplingParams` is a plain attribute holder. Generation in these tests comes from a real
transformers model behind `trainer.openrlhf.hf_engine.HFAsyncEngine`, not from vLLM.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import sys
import types
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
QWEN3_TOKENIZER = REPO.parent / "shared" / "data" / "tokenizers" / "qwen3"
EXAMPLE_PLUGIN = REPO / "tests" / "data" / "example_plugin"

if importlib.util.find_spec("openrlhf") is None:
    pytest.skip(
        "OpenRLHF is not installed in this venv; run this suite with `make test-openrlhf`",
        allow_module_level=True,
    )


def _stand_in(name: str, **attrs) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__dict__.update(attrs)
    # A spec (with no loader) so `importlib.util.find_spec` answers; transformers then looks for
    # the distribution's metadata, finds none, and keeps treating flash-attn as unavailable.
    module.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=True)
    module.__agentgym_stand_in__ = True
    sys.modules[name] = module
    parent, _, child = name.rpartition(".")
    if parent:
        setattr(sys.modules[parent], child, module)
    return module


def _unavailable(what: str):
    def call(*args, **kwargs):
        raise RuntimeError(f"{what} is a CPU-test stand-in (tests/openrlhf/conftest.py); it needs a GPU install")

    call.__name__ = what.rsplit(".", 1)[-1]
    return call


def install_stand_ins() -> list[str]:
    """Stand-in flash_attn and vllm modules, where the real ones are missing. Returns what was stubbed."""
    stubbed = []
    if importlib.util.find_spec("flash_attn") is None:
        _stand_in("flash_attn", __version__="2.8.3")
        _stand_in(
            "flash_attn.bert_padding",
            **{n: _unavailable(f"flash_attn.bert_padding.{n}") for n in ("index_first_axis", "pad_input", "rearrange", "unpad_input")},
        )
        _stand_in("flash_attn.utils")
        _stand_in("flash_attn.utils.distributed", all_gather=_unavailable("flash_attn.utils.distributed.all_gather"))
        stubbed.append("flash_attn")
    if importlib.util.find_spec("vllm") is None:

        class SamplingParams:
            """vLLM's sampling parameters, as a plain attribute holder."""

            def __init__(self, **kwargs):
                defaults = dict(temperature=1.0, top_p=1.0, top_k=-1, max_tokens=16, min_tokens=0,
                                skip_special_tokens=True, logprobs=None, n=1)
                defaults.update(kwargs)
                self.__dict__.update(defaults)

            def __repr__(self):
                return f"SamplingParams({self.__dict__})"

        class TokensPrompt(dict):
            pass

        _stand_in("vllm", __version__="0.29.0", SamplingParams=SamplingParams,
                  AsyncEngineArgs=_unavailable("vllm.AsyncEngineArgs"), AsyncLLMEngine=_unavailable("vllm.AsyncLLMEngine"))
        _stand_in("vllm.inputs", TokensPrompt=TokensPrompt)
        _stand_in("vllm.utils", random_uuid=lambda: __import__("uuid").uuid4().hex)
        stubbed.append("vllm")
    return stubbed


STUBBED = install_stand_ins()


@pytest.fixture(scope="session")
def qwen3_tokenizer():
    if not (QWEN3_TOKENIZER / "tokenizer.json").exists():
        pytest.skip(f"the real Qwen3 tokenizer is not at {QWEN3_TOKENIZER} (../shared/data/tokenizers/qwen3)")
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(QWEN3_TOKENIZER))


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
    alone, which keeps a step cheap). Sampled at temperature 1 the policy then opens with one of `guesses` and drifts on later
    turns, so groups mix successes, failures and invalid turns.
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
