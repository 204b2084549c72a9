"""The rollout loop: an agent plays episodes on many envs at once and returns `Episode` records.

All live episodes advance in lock step: at each tick the agent gets every pending prompt in one
`act_batch` call (a transformers policy samples them as one batch), then each env steps. A slot
whose episode ends takes the next request. An env that raises is an errored episode (its reason
is kept) and the slot gets a fresh env; the other episodes go on. With `workers=N` each env lives in
its own process (`agentgym_opsd.workers`): envs step in parallel, and a crash, a kill or a step past
the timeout costs one episode.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym
from tqdm.auto import tqdm

from agentgym_opsd.agents import Agent, act_all
from agentgym_opsd.context import ContextPolicy, HistoryItem
from agentgym_opsd.contract import StepInfo
from agentgym_opsd.episode import Episode, Turn
from agentgym_opsd.workers import EnvFailure, EnvHandle, LocalEnv, WorkerEnv

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
    env: EnvHandle
    request: EpisodeRequest | None = None
    index: int = -1
    episode: Episode | None = None
    history: list[HistoryItem] = field(default_factory=list)
    info: dict[str, Any] = field(default_factory=dict)


def run_episodes(
    make_env: Callable[[], gym.Env],
    agent: Agent,
    requests: Sequence[EpisodeRequest],
    *,
    num_envs: int = 8,
    context: str | ContextPolicy = "full",
    progress: bool | str = True,
    on_episode: Callable[[Episode], None] | None = None,
    workers: int = 0,
    step_timeout: float | None = 60.0,
    start_method: str | None = None,
) -> list[Episode]:
    """Play `requests` with `agent` on up to `num_envs` envs at once.

    Args:
        make_env: builds one env (e.g. `lambda: agentgym_opsd.make(env_id, split="valid_seen")`).
        agent: the agent (see `agentgym_opsd.agents`).
        requests: the episodes to play.
        num_envs: envs stepped together (the agent's batch size) when `workers` is 0.
        context: `full` or `window:k`.
        progress: show a progress bar (a string is its label).
        on_episode: called with each episode as it finishes (to stream it to disk).
        workers: 0 plays the envs in this process. N > 0 plays each env in its own worker process
            (`agentgym_opsd.workers`), N of them, stepped in parallel; N is then the number of envs
            stepped together (it replaces `num_envs`). A worker that crashes, is killed, or runs
            past `step_timeout` costs only its episode (errored, with the reason) and is restarted.
        step_timeout: seconds one reset, step or env call may take in a worker (None: no limit).
        start_method: how workers start (`agentgym_opsd.workers.default_start_method`: the fork
            server when `make_env` pickles, e.g. `agentgym_opsd.workers.EnvFactory`, else fork).

    Returns:
        The episodes, in the order of `requests`.
    """
    policy = ContextPolicy.parse(context)
    if workers < 0:
        raise ValueError(f"workers must be >= 0, got {workers}")
    count = max(1, min(workers or num_envs, len(requests)))
    if workers:
        prefetch = tuple(getattr(agent, "env_prefetch", ()))  # what a scripted agent reads before each turn
        envs: list[EnvHandle] = [
            WorkerEnv(make_env, step_timeout=step_timeout, start_method=start_method, prefetch=prefetch)
            for _ in range(count)
        ]
    else:
        envs = [LocalEnv(make_env) for _ in range(count)]
    label = progress if isinstance(progress, str) else getattr(agent, "name", "agent")
    bar = tqdm(total=len(requests), desc=label, unit="ep", disable=not progress, leave=False)
    rollout = _Rollout(agent, policy, requests, envs, on_episode, bar)
    try:
        while True:
            live = rollout.start_episodes()  # 1. idle envs reset on the next requests
            if not live:
                break
            responses = rollout.act(live)  # 2. one batched agent call for every pending prompt
            if responses is None:  # an env the agent read failed: play the tick again without it
                continue
            rollout.step(live, responses)  # 3. each env steps; finished episodes are recorded
    finally:
        bar.close()
        rollout.close()
        end = getattr(agent, "end_rollout", None)  # an agent's per-rollout state (a policy's keys and values)
        if end is not None:
            end()
    return rollout.episodes()


class _Rollout:
    """The state of one `run_episodes` call: the requests still to play, one slot per env, the
    episodes played so far (by request index)."""

    def __init__(
        self,
        agent: Agent,
        policy: ContextPolicy,
        requests: Sequence[EpisodeRequest],
        envs: list[EnvHandle],
        on_episode: Callable[[Episode], None] | None,
        bar: tqdm,
    ) -> None:
        self.agent, self.policy, self.on_episode, self.bar = agent, policy, on_episode, bar
        self.slots = [_Slot(env) for env in envs]
        self.queue = list(enumerate(requests))
        self.queue.reverse()  # pop() takes the next request
        self.results: list[Episode | None] = [None] * len(requests)

    def episodes(self) -> list[Episode]:
        """The episodes played, in the order of the requests."""
        return [r for r in self.results if r is not None]

    def start_episodes(self) -> list[_Slot]:
        """Reset the idle slots' envs on the next requests (in parallel); a failed reset is an
        errored episode and its slot takes the request after. Returns the slots with a live episode."""
        idle = [s for s in self.slots if s.episode is None]
        while idle and self.queue:
            started = []
            for slot in idle[: len(self.queue)]:
                slot.index, slot.request = self.queue.pop()
                options = dict(slot.request.options)
                if slot.request.episode_id:
                    options["episode_id"] = slot.request.episode_id
                slot.env.reset_async(slot.request.seed, options)
                started.append(slot)
            for slot in started:
                try:
                    observation, info = slot.env.reset_wait()
                except EnvFailure as e:  # a broken task must not stop the others
                    slot.episode = self._new_episode(slot, "", None)
                    self.fail(slot, str(e))
                    continue
                slot.info, slot.history = info, []
                slot.episode = self._new_episode(slot, observation, info["step"])
            idle = [s for s in idle if s.episode is None]
        return [s for s in self.slots if s.episode is not None]

    def _new_episode(self, slot: _Slot, observation: str, step: StepInfo | None) -> Episode:
        """The record of the episode `slot` starts on its request; `step` is None when the reset failed."""
        request = slot.request
        assert request is not None
        if step is None:
            return Episode(
                env_id=slot.env.env_id, task_id="", task_type="", episode_id=request.episode_id or "",
                seed=request.seed, agent=self.agent.name, context=str(self.policy),
                instructions=slot.env.instructions, initial_observation="", initial=None, group=request.group,
            )  # fmt: skip
        return Episode(
            env_id=slot.env.env_id,
            task_id=step.task_id,
            task_type=step.task_type,
            episode_id=step.episode_id,
            seed=request.seed,
            agent=self.agent.name,
            context=str(self.policy),
            instructions=slot.env.instructions,
            initial_observation=observation,
            initial=step,
            group=request.group,
            meta={"options": {k: v for k, v in request.options.items()}},
        )

    def act(self, live: list[_Slot]) -> list[str] | None:
        """The agent's responses to the live slots' prompts, in one call; None when an env the agent
        read (a scripted agent's remote call) failed: those episodes end errored."""
        prompts = [
            self.policy.messages(s.episode.instructions, s.episode.initial_observation,
                                 s.history)  # type: ignore[union-attr]
            for s in live
        ]
        try:
            return act_all(self.agent, prompts, [s.info for s in live], [s.env.agent_env for s in live])
        except EnvFailure:
            broken = [s for s in live if s.env.broken]
            if not broken:
                raise
            for slot in broken:
                self.fail(slot, slot.env.broken or "env failed")
            return None

    def step(self, live: list[_Slot], responses: list[str]) -> None:
        """Step every live env on its response (in parallel) and record the turns; an episode that
        ends gets its hindsight and is finished, an env that fails ends its episode errored."""
        for slot, response in zip(live, responses, strict=True):
            slot.env.step_async(response)
        for slot, response in zip(live, responses, strict=True):
            episode = slot.episode
            assert episode is not None
            try:
                observation, reward, terminated, truncated, info = slot.env.step_wait()
            except EnvFailure as e:
                self.fail(slot, str(e))
                continue
            step = info.pop("step")
            hindsight = info.pop("hindsight", None)
            turn = Turn(response, step.action, observation, float(reward), terminated, truncated, step, info)
            episode.turns.append(turn)
            slot.history.append(HistoryItem(response, step.action, observation))
            slot.info = {"step": step, **info}
            if terminated or truncated:
                if hindsight is None:
                    try:
                        hindsight = slot.env.hindsight()
                    except EnvFailure as e:
                        self.fail(slot, str(e))
                        continue
                episode.hindsight = hindsight
                self.finish(slot)

    def finish(self, slot: _Slot, error: str | None = None) -> None:
        """Record the slot's episode (errored when `error` is given) and free the slot."""
        assert slot.episode is not None
        slot.episode.error = error
        self.results[slot.index] = slot.episode
        if self.on_episode is not None:
            self.on_episode(slot.episode)
        self.bar.update(1)
        slot.episode, slot.request = None, None

    def fail(self, slot: _Slot, reason: str) -> None:
        """End the slot's episode as errored and give the slot a fresh env."""
        self.finish(slot, reason)
        slot.env.restart()

    def close(self) -> None:
        for slot in self.slots:
            try:
                slot.env.close()
            except Exception:  # closing must not hide the error that got us here
                pass


def play_episode(
    env: gym.Env, agent: Agent, seed: int, *, context: str | ContextPolicy = "full",
    options: dict[str, Any] | None = None
) -> Episode:
    """Play one episode on an existing env (which is left open)."""

    class _Keep(gym.Wrapper):
        def close(self) -> None:  # the caller owns the env
            pass

    return run_episodes(
        lambda: _Keep(env), agent, [EpisodeRequest(seed, dict(options or {}))], num_envs=1, context=context,
        progress=False
    )[0]
