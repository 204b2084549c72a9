"""The rollout loop: an agent plays episodes on many envs at once and returns `Episode` records.

All live episodes advance in lock step: at each tick the agent gets every pending prompt in one
`act_batch` call (a transformers policy samples them as one batch), then each env steps. A slot
whose episode ends takes the next request. An env that raises is an errored episode (its reason
is kept) and the slot gets a fresh env; the other episodes go on.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym
from tqdm.auto import tqdm

from agentgym_opsd.agents import Agent, act_all
from agentgym_opsd.context import ContextPolicy, HistoryItem
from agentgym_opsd.core import TextEnv
from agentgym_opsd.episode import Episode, Turn

__all__ = ["EpisodeRequest", "run_episodes", "play_episode"]


@dataclass(frozen=True)
class EpisodeRequest:
    """One episode to play: the reset seed (it picks the task), reset options, an id and a group."""

    seed: int
    options: dict[str, Any] = field(default_factory=dict)
    episode_id: str | None = None
    group: str = ""


@dataclass
class _Slot:
    env: gym.Env
    request: EpisodeRequest | None = None
    index: int = -1
    episode: Episode | None = None
    history: list[HistoryItem] = field(default_factory=list)
    info: dict[str, Any] = field(default_factory=dict)


def _env_id(env: gym.Env) -> str:
    return env.spec.id if env.spec is not None else type(env.unwrapped).__name__


def run_episodes(
    make_env: Callable[[], gym.Env],
    agent: Agent,
    requests: Sequence[EpisodeRequest],
    *,
    num_envs: int = 8,
    context: str | ContextPolicy = "full",
    progress: bool | str = True,
    on_episode: Callable[[Episode], None] | None = None,
) -> list[Episode]:
    """Play `requests` with `agent` on up to `num_envs` envs at once.

    Args:
        make_env: builds one env (e.g. `lambda: agentgym_opsd.make(env_id, split="valid_seen")`).
        agent: the agent (see `agentgym_opsd.agents`).
        requests: the episodes to play.
        num_envs: envs stepped together (the agent's batch size).
        context: `full` or `window:k`.
        progress: show a progress bar (a string is its label).
        on_episode: called with each episode as it finishes (to stream it to disk).

    Returns:
        The episodes, in the order of `requests`.
    """
    policy = ContextPolicy.parse(context)
    results: list[Episode | None] = [None] * len(requests)
    queue = list(enumerate(requests))
    queue.reverse()
    slots = [_Slot(make_env()) for _ in range(max(1, min(num_envs, len(requests))))]
    label = progress if isinstance(progress, str) else getattr(agent, "name", "agent")
    bar = tqdm(total=len(requests), desc=label, unit="ep", disable=not progress, leave=False)

    def finish(slot: _Slot, error: str | None = None) -> None:
        assert slot.episode is not None
        slot.episode.error = error
        results[slot.index] = slot.episode
        if on_episode is not None:
            on_episode(slot.episode)
        bar.update(1)
        slot.episode, slot.request = None, None

    def start(slot: _Slot) -> None:
        while queue:
            index, request = queue.pop()
            options = dict(request.options)
            if request.episode_id:
                options["episode_id"] = request.episode_id
            try:
                observation, info = slot.env.reset(seed=request.seed, options=options)
            except Exception as e:  # a broken task must not stop the others
                env = slot.env.unwrapped
                slot.episode = Episode(
                    env_id=_env_id(slot.env), task_id="", task_type="", episode_id=request.episode_id or "",
                    seed=request.seed, agent=agent.name, context=str(policy),
                    instructions=getattr(env, "instructions", ""), initial_observation="",
                    initial=None,
                    group=request.group,
                )
                slot.index = index
                finish(slot, f"reset failed: {type(e).__name__}: {e}")
                slot.env = make_env()
                continue
            env: TextEnv = slot.env.unwrapped  # type: ignore[assignment]
            step = info["step"]
            slot.request, slot.index, slot.info, slot.history = request, index, info, []
            slot.episode = Episode(
                env_id=_env_id(slot.env),
                task_id=step.task_id,
                task_type=step.task_type,
                episode_id=step.episode_id,
                seed=request.seed,
                agent=agent.name,
                context=str(policy),
                instructions=env.instructions,
                initial_observation=observation,
                initial=step,
                group=request.group,
                meta={"options": {k: v for k, v in request.options.items()}},
            )
            return

    try:
        for slot in slots:
            start(slot)
        while True:
            live = [s for s in slots if s.episode is not None]
            if not live:
                break
            prompts = [
                policy.messages(s.episode.instructions, s.episode.initial_observation, s.history)  # type: ignore[union-attr]
                for s in live
            ]
            responses = act_all(agent, prompts, [s.info for s in live], [s.env.unwrapped for s in live])  # type: ignore[misc]
            for slot, response in zip(live, responses, strict=True):
                episode = slot.episode
                assert episode is not None
                try:
                    observation, reward, terminated, truncated, info = slot.env.step(response)
                except Exception as e:
                    finish(slot, f"step failed: {type(e).__name__}: {e}")
                    slot.env.close()
                    slot.env = make_env()
                    start(slot)
                    continue
                step = info.pop("step")
                hindsight = info.pop("hindsight", None)
                episode.turns.append(
                    Turn(response, step.action, observation, float(reward), terminated, truncated, step, info)
                )
                slot.history.append(HistoryItem(response, step.action, observation))
                slot.info = {"step": step, **info}
                if terminated or truncated:
                    episode.hindsight = hindsight if hindsight is not None else slot.env.unwrapped.hindsight()
                    finish(slot)
                    start(slot)
    finally:
        bar.close()
        for slot in slots:
            slot.env.close()
    return [r for r in results if r is not None]


def play_episode(
    env: gym.Env, agent: Agent, seed: int, *, context: str | ContextPolicy = "full", options: dict[str, Any] | None = None
) -> Episode:
    """Play one episode on an existing env (which is left open)."""

    class _Keep(gym.Wrapper):
        def close(self) -> None:  # the caller owns the env
            pass

    return run_episodes(
        lambda: _Keep(env), agent, [EpisodeRequest(seed, dict(options or {}))], num_envs=1, context=context, progress=False
    )[0]
