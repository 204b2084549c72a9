"""Building agents from the command line: `--agent NAME` and `--cpu-threads N`."""

from __future__ import annotations

from agentgym_app.hf_spec import check_hf_agent
from agentgym_opsd.agents import agent_kinds, make_agent
from agentgym_opsd.usage import UsageError
from trainer.policy import pin_cpu_threads

__all__ = ["CPU_THREADS_HELP", "build_agent", "check_agent"]


def check_agent(name: str, *, cpu_threads: int | None = None) -> None:
    """Check an agent name before any work (`eval` and `bench` call it before they build an env or
    play an episode): `hf:PATH` is read and its folder checked without loading the model; scripted
    agents and `openai:` ones (which connect only when they act) are built; another installed kind
    is checked when it is built. Raises `AgentError` (or `UsageError`) naming the fix."""
    if cpu_threads is not None and cpu_threads < 0:
        raise UsageError(f"--cpu-threads must be >= 0, got {cpu_threads}")
    prefix, sep, rest = name.partition(":")
    if sep and prefix == "hf":
        check_hf_agent(rest)
    elif not (sep and prefix != "openai" and prefix in agent_kinds()):
        make_agent(name)


def build_agent(name: str, *, seed: int = 0, cpu_threads: int | None = None):
    """`make_agent`, then `--cpu-threads` applied to a model-backed agent (None: the agent's own
    choice, which for `hf:` is `cpu_threads=auto`)."""
    if cpu_threads is not None and cpu_threads < 0:
        raise UsageError(f"--cpu-threads must be >= 0, got {cpu_threads}")
    agent = make_agent(name, seed=seed)
    model = getattr(agent, "model", None)
    if cpu_threads is not None and model is not None and hasattr(model, "parameters"):
        pin_cpu_threads(model, cpu_threads)
    return agent


CPU_THREADS_HELP = ("torch CPU threads for hf: agents (default: 1 for tiny models under 50M parameters, torch's "
                    "own setting for larger ones; 0 leaves torch's setting)")
