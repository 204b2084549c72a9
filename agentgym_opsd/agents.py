"""Agents: what writes the turns.

An agent answers `act(messages, info, env) -> str`: `messages` is the chat the context policy built
(all a learned agent may use), `info` the env's last info dict, `env` the unwrapped env. Scripted
agents (the experts, the random agent) read `env`; learned ones must not. Agents that can answer
many prompts at once also define `act_batch`, which the rollout loop prefers; agents that keep state
for the episodes they play (a policy's keys and values) may define `end_rollout()`, which the rollout
loop calls when a rollout ends.

`make_agent(name)` builds one from a name: `random`, `expert`, `hf:PATH` (a local transformers
policy), `openai:BASE_URL#MODEL` (an OpenAI-compatible endpoint such as a vLLM server).
"""

from __future__ import annotations

import hashlib
import importlib
from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np

from agentgym_opsd.context import Message
from agentgym_opsd.contract import TextEnv

__all__ = ["Agent", "RandomAgent", "ExpertAgent", "make_agent", "register_agent", "act_all", "AgentError",
           "episode_rng"]


class AgentError(RuntimeError):
    """An agent cannot act (no expert for this env, endpoint down, ...); the message says why."""


@runtime_checkable
class Agent(Protocol):
    """Anything that writes turns."""

    name: str

    def act(self, messages: list[Message], info: dict[str, Any], env: TextEnv) -> str:
        """The agent's next turn, as raw text."""
        ...


def act_all(
    agent: Agent,
    messages: Sequence[list[Message]],
    infos: Sequence[dict[str, Any]],
    envs: Sequence[TextEnv],
) -> list[str]:
    """One turn for each of several episodes, batched when the agent can batch."""
    batch = getattr(agent, "act_batch", None)
    if batch is not None:
        out = list(batch(list(messages), list(infos), list(envs)))
        if len(out) != len(messages):
            raise AgentError(f"{agent.name}: act_batch returned {len(out)} turns for {len(messages)} prompts")
        return out
    return [agent.act(m, i, e) for m, i, e in zip(messages, infos, envs, strict=True)]


def episode_rng(seed: int, info: dict[str, Any]) -> np.random.Generator:
    """A generator for one turn of one episode, from `(seed, episode id, turn)`.

    Agents that draw from it make the same choices for an episode however episodes are batched,
    ordered, resumed or spread over processes."""
    step = info.get("step")
    if step is None:
        return np.random.default_rng(seed)
    digest = hashlib.blake2b(str(step.episode_id).encode("utf-8", "surrogatepass"), digest_size=8).digest()
    return np.random.default_rng([seed, int.from_bytes(digest, "little"), int(step.turn)])


class RandomAgent:
    """Picks uniformly among the admissible actions where the env knows them (else `env.random_action`).

    Its draws come from `episode_rng(seed, info)`: an episode's turns depend on the seed and the
    episode id, not on which other episodes ran before or beside it."""

    def __init__(self, seed: int = 0) -> None:
        self.name = "random"
        self.seed = int(seed)

    def act(self, messages: list[Message], info: dict[str, Any], env: TextEnv) -> str:
        rng = episode_rng(self.seed, info)
        actions = info["step"].admissible_actions if "step" in info else None
        if actions:
            action = actions[int(rng.integers(len(actions)))]
        else:
            action = env.random_action(rng)
        return env.format_action(action)


class ExpertAgent:
    """Follows the env's scripted expert (`env.expert_action()`), written in the env's format."""

    # The env methods it calls before each turn: env workers compute them with each step.
    env_prefetch = ("expert_action",)

    def __init__(self, seed: int = 0) -> None:
        self.name = "expert"

    def act(self, messages: list[Message], info: dict[str, Any], env: TextEnv) -> str:
        try:
            turn = env.expert_action()
        except NotImplementedError as e:
            raise AgentError(f"{type(env).__name__} has no expert agent: {e}") from None
        if turn is None:
            # The expert has no move from here (the task cannot be completed): an honest no-op turn,
            # which the env records as invalid.
            return "<think>The expert has no move from this state.</think>"
        return turn


# Agent kinds named by a prefix (`hf:PATH`, `openai:URL#MODEL`) come from the entry-point group
# `agentgym_opsd.agents`: name -> "module:factory", factory(spec after the prefix, seed=...). The
# application declares its model-backed kinds there, as env families declare their envs.
AGENT_KIND_GROUP = "agentgym_opsd.agents"


def agent_kinds() -> dict[str, Any]:
    """{prefix: entry point} of the installed agent kinds."""
    from importlib import metadata

    return {ep.name: ep for ep in metadata.entry_points(group=AGENT_KIND_GROUP)}


# name -> "module:factory" (or the factory) for agents env families register; factories take (seed=)
_NAMED_AGENTS: dict[str, Any] = {}


def register_agent(name: str, factory: Any) -> None:
    """Let `make_agent(name)` build an agent: `factory(seed=...)`, given as a callable or as
    "module:attr" (imported only when the agent is made). Env families register their scripted
    agents here from their entry point, e.g. `searchqa-baseline`."""
    if not name or ":" in name or name in ("random", "expert"):
        raise ValueError(f"agent name {name!r}: use a plain name without ':' (not random or expert)")
    _NAMED_AGENTS[name] = factory


def make_agent(name: str, *, seed: int = 0) -> Agent:
    """Build an agent from its name: `random`, `expert`, a registered name (see `register_agent`),
    `hf:PATH`, `openai:BASE_URL#MODEL`."""
    if name == "random":
        return RandomAgent(seed)
    if name == "expert":
        return ExpertAgent(seed)
    if name in _NAMED_AGENTS:
        factory = _NAMED_AGENTS[name]
        if isinstance(factory, str):
            module, _, attr = factory.partition(":")
            try:
                factory = getattr(importlib.import_module(module), attr)
            except (ImportError, AttributeError) as e:
                raise AgentError(f"agent {name!r} is not available here ({e})") from None
        return factory(seed=seed)
    prefix, _, rest = name.partition(":")
    kinds = agent_kinds() if rest else {}
    if prefix in kinds:
        try:
            factory = kinds[prefix].load()
        except (ImportError, AttributeError) as e:
            raise AgentError(f"agent {name!r}: {prefix}: agents are not available here ({e})") from None
        return factory(rest, seed=seed)
    named = "".join(f", {n}" for n in sorted(_NAMED_AGENTS))
    prefixed = "".join(f", {k}:..."
                       for k in sorted(agent_kinds())) or " (no agent kinds are installed: pip install -e .)"
    raise AgentError(f"unknown agent {name!r}: use random, expert{named}{prefixed}")
