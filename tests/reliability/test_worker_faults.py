"""Env worker faults beyond tests/agentgym_opsd/test_workers.py (which covers an env that raises, exits
or hangs in a step, and a worker SIGKILLed mid-episode): a reset that hangs, a worker killed while
idle between episodes, and a worker frozen with SIGSTOP. Each costs at most its own episode, within
the step timeout, and the run goes on with a fresh worker.
"""

from __future__ import annotations

import os
import signal
import time

import pytest

from agentgym_opsd import EpisodeRequest, Hindsight, TextEnv, Transition, hash_state, run_episodes
from agentgym_opsd.agents import ExpertAgent

workers = pytest.importorskip("agentgym_opsd.workers", reason="the env worker pool (agentgym_opsd.workers) is not on this branch")


class EchoEnv(TextEnv):
    """Task i: say `done` twice. Task 1's reset hangs when `hang_reset` is set."""

    instructions = "Answer <action>done</action> until the env says it is over."
    max_turns = 6

    def __init__(self, hang_reset: bool = False, **kwargs):
        super().__init__(**kwargs)
        self.hang_reset = hang_reset
        self.index, self.left = 0, 0

    @property
    def num_tasks(self) -> int:
        return 6

    def _load_task(self, index, options):
        if self.hang_reset and index == 1:
            time.sleep(120)
        self.index, self.left = index, 2
        self.task_id, self.task_type = f"echo-{index}", "echo"
        return "Say done twice."

    def _apply(self, action):
        if action.content != "done":
            return Transition("Say done.", admissible=False)
        self.left -= 1
        return Transition(f"{self.left} to go.", reward=float(self.left == 0), terminated=self.left == 0, admissible=True)

    def state_key(self):
        return hash_state(self.index, self.left)

    def hindsight(self):
        return Hindsight(self.left == 0, float(self.left == 0), "say done twice", {})

    def expert_action(self):
        return self.format_action("done")


def test_a_hung_reset_costs_its_episode_within_the_timeout() -> None:
    started = time.monotonic()
    episodes = run_episodes(lambda: EchoEnv(hang_reset=True), ExpertAgent(), [EpisodeRequest(seed=s) for s in range(6)],
                            workers=2, step_timeout=2.0, progress=False, start_method="fork")  # fmt: skip
    elapsed = time.monotonic() - started
    by_seed = {e.seed: e for e in episodes}  # an episode that never started has no id yet, but its seed
    assert len(episodes) == 6
    assert by_seed[1].error and "timed out" in by_seed[1].error
    assert all(by_seed[s].error is None and by_seed[s].success for s in (0, 2, 3, 4, 5))
    assert elapsed < 40, f"the hung reset was not cut off ({elapsed:.0f}s)"


class _Recorder(ExpertAgent):
    """The expert, noting which worker process plays each episode."""

    def __init__(self) -> None:
        super().__init__()
        self.pid_of: dict[str, int] = {}

    def act(self, messages, info, env):
        self.pid_of.setdefault(info["step"].episode_id, env.worker_pid)
        return super().act(messages, info, env)


def test_a_worker_killed_while_idle_costs_no_finished_episode() -> None:
    """SIGKILL a worker right after its episode finished (between episodes, as the OOM killer may):
    the finished episode stays whole, and no later episode is lost for it."""
    agent = _Recorder()
    killed: list[int] = []

    def on_episode(episode) -> None:
        if not killed:
            pid = agent.pid_of[episode.episode_id]
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)

    episodes = run_episodes(EchoEnv, agent, [EpisodeRequest(seed=s) for s in range(6)], workers=2, step_timeout=10.0,
                            progress=False, start_method="fork", on_episode=on_episode)  # fmt: skip
    assert len(killed) == 1 and len(episodes) == 6
    # The dead worker had no episode: it is replaced before the next one starts, which is played in full.
    assert [e.error for e in episodes] == [None] * 6
    assert all(e.success for e in episodes)


def test_a_frozen_worker_costs_its_episode_within_the_timeout() -> None:
    """SIGSTOP (a worker stuck in the kernel or swapped out): the step timeout ends it like a hang."""
    frozen: list[int] = []

    class Freezer(ExpertAgent):
        def act(self, messages, info, env):
            step = info["step"]
            if step.episode_id == "echo-2@2" and step.turn == 1 and not frozen:
                frozen.append(env.worker_pid)
                os.kill(env.worker_pid, signal.SIGSTOP)
            return super().act(messages, info, env)

    started = time.monotonic()
    episodes = run_episodes(EchoEnv, Freezer(), [EpisodeRequest(seed=s) for s in range(6)], workers=2, step_timeout=2.0,
                            progress=False, start_method="fork")  # fmt: skip
    elapsed = time.monotonic() - started
    by_id = {e.episode_id: e for e in episodes}
    assert frozen and "timed out" in (by_id["echo-2@2"].error or "")
    assert all(e.success for e in episodes if e.episode_id != "echo-2@2")
    assert elapsed < 40
    with pytest.raises(ProcessLookupError):  # the frozen process was killed, not left behind
        for _ in range(50):
            os.kill(frozen[0], 0)
            time.sleep(0.1)
