"""A local transformers policy as an agent (`hf:PATH`), for `eval`, `bench` and `play`.

The model is loaded with `trainer.policy.load_hf_policy` and plays through the trainer's own
token-space sampler (`trainer.sampling.HFPolicyAgent`), so an evaluated policy reads its contexts
exactly as it did in training. torch and transformers are imported lazily: `import agentgym_opsd`
stays light.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import parse_qsl

from agentgym_opsd.agents import AgentError

if TYPE_CHECKING:
    from trainer.sampling import HFPolicyAgent

__all__ = ["make_hf_agent"]


def make_hf_agent(spec: str, *, seed: int = 0) -> HFPolicyAgent:
    """`hf:PATH` or `hf:PATH?temperature=0.7&max_new_tokens=256&device=cuda&dtype=bf16`."""
    path, _, query = spec.partition("?")
    options = dict(parse_qsl(query, keep_blank_values=True))
    known = {"temperature", "max_new_tokens", "device", "dtype", "max_batch"}
    unknown = set(options) - known
    if unknown:
        raise AgentError(f"hf:{spec}: unknown option(s) {sorted(unknown)}; use {sorted(known)}")
    try:
        temperature = float(options.get("temperature", 1.0))
        max_new_tokens = int(options.get("max_new_tokens", 256))
        max_batch = int(options["max_batch"]) if "max_batch" in options else None
    except ValueError as e:
        raise AgentError(f"hf:{spec}: bad option value ({e})") from None
    from trainer.policy import PolicyLoadError, load_hf_policy
    from trainer.sampling import HFPolicyAgent

    try:
        model, tokenizer = load_hf_policy(path, device=options.get("device", "auto"), dtype=options.get("dtype", "auto"))
    except PolicyLoadError as e:
        raise AgentError(str(e)) from None
    return HFPolicyAgent(
        model, tokenizer, max_new_tokens=max_new_tokens, temperature=temperature, seed=seed, max_batch=max_batch,
        name=f"hf:{Path(path).name}",
    )
