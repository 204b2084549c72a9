"""`hf:PATH?settings`, the name of a local transformers policy as an agent, read and checked without
loading torch or the model: `eval` and `bench` check every agent before they build an env, and
`agentgym_app.policy_agents.make_hf_agent` builds the agent from the same reading."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import parse_qsl

from agentgym_opsd.agents import AgentError
from trainer.models import NAMED_MODELS, NamedModelError, is_named_model

__all__ = ["HF_SETTINGS", "check_hf_agent"]

HF_SETTINGS = {"temperature", "max_new_tokens", "device", "dtype", "max_batch", "cpu_threads", "stop"}


def check_hf_agent(spec: str) -> tuple[str, dict[str, str]]:
    """Read `PATH?settings` (see `agentgym_app.policy_agents.make_hf_agent`) and check it without
    loading anything: known settings, and a folder that holds a transformers model (its config.json) or
    a named model whose wheel is installed (`trainer.models`). Returns the path and the settings;
    raises `AgentError` naming the fix."""
    path, _, query = spec.partition("?")
    options = dict(parse_qsl(query, keep_blank_values=True))
    unknown = set(options) - HF_SETTINGS
    if unknown:
        raise AgentError(f"hf:{spec}: unknown option(s) {sorted(unknown)}; use {sorted(HF_SETTINGS)}")
    if options.get("stop", "action") not in ("action", "eot"):
        raise AgentError(
            f"hf:{spec}: stop={options['stop']!r}: use action (end a turn at the env's closing action tag) or eot")
    if is_named_model(path):  # converted on first load; here only its wheel is checked
        model = NAMED_MODELS[path]
        if not (model.folder() / "config.json").is_file():
            try:
                model.gguf_path()
            except NamedModelError as e:
                raise AgentError(f"hf:{path}: {e}") from None
        return path, options
    folder = Path(path)
    if not (folder / "config.json").is_file():
        why = "no such folder" if not folder.exists() else "the folder holds no transformers model (no config.json)"
        raise AgentError(f"hf:{path}: {why}; give a local model folder (a Qwen2.5/Qwen3 download, or a trainer "
                         f"run's OUT/model) or a named model ({', '.join(NAMED_MODELS)})")
    return path, options
