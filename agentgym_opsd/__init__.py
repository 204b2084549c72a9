"""agentgym-opsd: multi-turn text environments with one Gymnasium contract, and per-turn credit.

The contract (`TextEnv`, `StepInfo`, `Hindsight`), the registry, episode records, the rollout loop and
the agents. Importing the package registers every installed env family (ours and plug-ins), so
`gymnasium.make("agentgym/...")` works right after `import agentgym_opsd`.
"""

from agentgym_opsd.agents import Agent, AgentError, ExpertAgent, RandomAgent, make_agent
from agentgym_opsd.context import ContextPolicy
from agentgym_opsd.contract import EnvUnavailable, FreeText, Hindsight, StepInfo, TextEnv, Transition, hash_state
from agentgym_opsd.episode import Episode, Turn, TurnTokens, append_episodes, load_episodes, save_episodes
from agentgym_opsd.parsing import ParsedAction, parse_action
from agentgym_opsd.registry import load_plugins, make, register_env, registered_envs
from agentgym_opsd.rollout import EpisodeRequest, play_episode, run_episodes

__version__ = "0.1.0"

__all__ = [
    "Agent",
    "AgentError",
    "ContextPolicy",
    "EnvUnavailable",
    "Episode",
    "EpisodeRequest",
    "ExpertAgent",
    "FreeText",
    "Hindsight",
    "ParsedAction",
    "RandomAgent",
    "StepInfo",
    "TextEnv",
    "Transition",
    "Turn",
    "TurnTokens",
    "append_episodes",
    "hash_state",
    "load_episodes",
    "load_plugins",
    "make",
    "make_agent",
    "parse_action",
    "play_episode",
    "register_env",
    "registered_envs",
    "run_episodes",
    "save_episodes",
]

load_plugins()
