"""The agent module OpenRLHF loads with `--train.agent_func_path` (this file's path).

OpenRLHF 0.11.2 imports the file given by `--train.agent_func_path` in each vLLM rollout actor and
builds its `AgentExecutor` class with no arguments. Ours plays any env registered with
agentgym-opsd: the task comes from the prompt row's label, the settings from the bridge config the
launcher put in the environment (`trainer/openrlhf/config.py`). `agentgym-opsd train-openrlhf`
passes this path for you.
"""

from __future__ import annotations

from typing import Any

from openrlhf.utils.agent import AgentExecutorBase

from trainer.openrlhf.config import BridgeConfig
from trainer.openrlhf.rollout import EnvEpisodeRunner

__all__ = ["AgentExecutor"]


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
