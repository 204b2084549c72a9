"""A local transformers policy as an agent (`hf:PATH`), for `eval`, `bench` and `play`.

The model is loaded with `trainer.policy.load_hf_policy` and plays through the trainer's own
token-space sampler (`trainer.sampling.HFPolicyAgent`), so an evaluated policy reads its contexts
exactly as it did in training. By default a turn also ends at the env's closing action tag (a turn
holds one action) and the per-turn cap is the model's own or the env's `max_turn_tokens`. This module
loads torch: `agentgym_app.hf_spec` reads and checks an `hf:` name without it, and `make_agent`
reaches this module by name (the `agentgym_opsd.agents` entry point) only to build an `hf:` agent.
"""

from __future__ import annotations

from pathlib import Path

from agentgym_app.hf_spec import check_hf_agent
from agentgym_opsd.agents import AgentError
from trainer.policy import PolicyLoadError, load_hf_policy, pin_cpu_threads
from trainer.sampling import HFPolicyAgent

__all__ = ["make_hf_agent"]


def make_hf_agent(spec: str, *, seed: int = 0) -> HFPolicyAgent:
    """`hf:PATH` or `hf:PATH?temperature=0.7&max_new_tokens=256&device=cuda&dtype=bf16&cpu_threads=4&stop=eot`.

    Options:
        temperature: sampling temperature (default 1; 0 is greedy).
        max_new_tokens: the per-turn token cap. Default: the model's own (`max_new_tokens` in its
            generation_config.json) where it sets one, else each env's `max_turn_tokens`.
        device, dtype: `auto` (default), `cpu`, `cuda:N`; `float32`, `bf16`, ...
        max_batch: at most this many prompts per decoding call.
        cpu_threads: torch CPU threads (`pin_cpu_threads`): a count, 0 to leave torch's setting,
            `auto` (default: 1 for a tiny model, torch's setting for others).
        stop: `action` (default): a turn also ends at its env's closing action tag (`</action>`);
            `eot`: only at the end-of-turn token or the cap, as the trainer's rollouts sample.
    """
    path, options = check_hf_agent(spec)
    stop = options.get("stop", "action")
    try:
        temperature = float(options.get("temperature", 1.0))
        max_new_tokens = int(options["max_new_tokens"]) if "max_new_tokens" in options else None
        max_batch = int(options["max_batch"]) if "max_batch" in options else None
        threads = options.get("cpu_threads", "auto")
        cpu_threads = None if threads == "auto" else int(threads)
    except ValueError as e:
        raise AgentError(f"hf:{spec}: bad option value ({e})") from None
    try:
        model, tokenizer = load_hf_policy(path, device=options.get("device", "auto"),
                                          dtype=options.get("dtype", "auto"))
        pin_cpu_threads(model, cpu_threads)
    except PolicyLoadError as e:
        raise AgentError(str(e)) from None
    if max_new_tokens is None:
        own = getattr(getattr(model, "generation_config", None), "max_new_tokens", None)
        max_new_tokens = int(own) if isinstance(own, int) and own > 0 else None
    return HFPolicyAgent(
        model, tokenizer, max_new_tokens=max_new_tokens, temperature=temperature, seed=seed, max_batch=max_batch,
        name=f"hf:{Path(path).name}", stop_at_action_close=stop == "action",
    )
