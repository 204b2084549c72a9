"""Env worker faults beyond tests/agentgym_opsd/test_workers.py (which covers an env that raises, exits
or hangs in a step, and a worker SIGKILLed mid-episode): a reset that hangs, a worker killed while
idle between episodes, and a worker frozen with SIGSTOP. Each costs at most its own episode, within
the step timeout, and the run goes on with a fresh worker.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import pytest

import agentgym_opsd
from agentgym_opsd import EpisodeRequest, run_episodes
from agentgym_opsd import workers
from agentgym_opsd.agents import ExpertAgent


# Workers start from the fork server (a picklable factory), as in the bench: forking this process,
# which runs a JVM for other tests, could hang them.
TALLY = "benchtest/Tally-Small-v0"  # tests/data/bench_plugin: task i reaches a small target in 2-3 turns
BENCH_PLUGIN = Path(__file__).resolve().parents[1] / "data" / "bench_plugin"


@pytest.fixture(scope="module", autouse=True)
def tally_env():
    """The Tally test env, registered through its entry point (as tests/agentgym_app/test_bench.py does)."""
    if str(BENCH_PLUGIN) not in sys.path:
        sys.path.insert(0, str(BENCH_PLUGIN))
    agentgym_opsd.load_plugins(reload=True)


def test_a_hung_reset_costs_its_episode_within_the_timeout() -> None:
    started = time.monotonic()
    make = workers.EnvFactory(TALLY, {"reset_delay": 120.0, "slow_tasks": (1,)})
    episodes = run_episodes(make, ExpertAgent(), [EpisodeRequest(seed=s) for s in range(6)], workers=2,
                            step_timeout=2.0, progress=False)  # fmt: skip
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

    episodes = run_episodes(workers.EnvFactory(TALLY, {}), agent, [EpisodeRequest(seed=s) for s in range(6)], workers=2,
                            step_timeout=10.0, progress=False, on_episode=on_episode)  # fmt: skip
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
            if step.episode_id == "tally-small-2@2" and step.turn == 1 and not frozen:
                frozen.append(env.worker_pid)
                os.kill(env.worker_pid, signal.SIGSTOP)
            return super().act(messages, info, env)

    started = time.monotonic()
    episodes = run_episodes(workers.EnvFactory(TALLY, {}), Freezer(), [EpisodeRequest(seed=s) for s in range(6)],
                            workers=2, step_timeout=2.0, progress=False)  # fmt: skip
    elapsed = time.monotonic() - started
    by_id = {e.episode_id: e for e in episodes}
    assert frozen and "timed out" in (by_id["tally-small-2@2"].error or "")
    assert all(e.success for e in episodes if e.episode_id != "tally-small-2@2")
    assert elapsed < 40
    with pytest.raises(ProcessLookupError):  # the frozen process was killed, not left behind
        for _ in range(50):
            os.kill(frozen[0], 0)
            time.sleep(0.1)
