"""The agent module OpenRLHF loads with `--train.agent_func_path`.

OpenRLHF 0.11.2 imports the FILE given by `--train.agent_func_path` in each vLLM rollout actor and
builds its `AgentExecutor` class with no arguments. Ours plays any env registered with
agentgym-opsd: the task comes from the prompt row's label, the settings from the bridge config the
launcher put in the environment (`trainer/openrlhf/config.py`).

`agentgym-opsd train-openrlhf` does not pass this file's absolute path (it would not exist on the
other nodes of a cluster): it ships the project's packages with Ray's `py_modules` and a two-line
loader file in Ray's `working_dir`, and passes that file's path relative to the working directory
Ray gives every worker (`trainer.openrlhf.launch.code_runtime_env`).
"""

from __future__ import annotations

import importlib
from typing import Any

from openrlhf.utils.agent import AgentExecutorBase

from agentgym_opsd.registry import registered_envs
from trainer.openrlhf.config import BridgeConfig
from trainer.openrlhf.rollout import EnvEpisodeRunner

__all__ = ["AgentExecutor"]

# The project's own env families and the modules that register them.
BUILTIN_FAMILIES = {"ALFWorld": "environments.alfworld", "SearchQA": "environments.searchqa",
                    "WebShop": "environments.webshop"}


def register_builtin_families() -> None:
    """Register the project's env families where their entry points are not visible (the code came
    through Ray's `py_modules` to a node where the project is not pip-installed)."""
    known = {entry.family for entry in registered_envs()}
    for family, module in BUILTIN_FAMILIES.items():
        if family not in known:
            importlib.import_module(module).register()


register_builtin_families()


class AgentExecutor(AgentExecutorBase):
    """OpenRLHF's agent executor for every agentgym-opsd env (see `EnvEpisodeRunner`)."""

    def __init__(self, config: BridgeConfig | None = None) -> None:
        self.config = config or BridgeConfig.from_environment()
        self.runner = EnvEpisodeRunner(self.config)

    async def execute(
        self, prompt, label, sampling_params, max_length: int, hf_tokenizer, llm_engine, images=None
    ) -> dict[str, Any]:
        if images:
            raise ValueError("agentgym-opsd envs are text-only; the prompt dataset must not carry images")
        return await self.runner.run(prompt, label, sampling_params, max_length, hf_tokenizer, llm_engine)
