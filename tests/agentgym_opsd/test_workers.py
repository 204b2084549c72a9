"""Env worker processes: same episodes as in-process play; a crash, a hang or a kill costs one episode."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

import agentgym_opsd
from agentgym_opsd import EpisodeRequest, Hindsight, TextEnv, Transition, hash_state, run_episodes
from agentgym_opsd.agents import AgentError, ExpertAgent, RandomAgent
from agentgym_opsd.contract import EnvUnavailable
from agentgym_opsd.workers import EnvFactory, EnvFailure, WorkerEnv, default_start_method

REPO = Path(__file__).resolve().parents[2]
PLUGIN = REPO / "tests" / "data" / "example_plugin"


@pytest.fixture(scope="module")
def guess_env():
    """The example plug-in env (registered by tests/conftest.py through its entry point)."""
    return lambda: agentgym_opsd.make("example/GuessNumber-v0")


class CountdownEnv(TextEnv):
    """Task i: say `done` i+1 times. Some tasks misbehave on purpose at turn 2:
    `raise` raises, `exit` ends its process, `hang` sleeps for a minute."""

    instructions = "Answer <action>done</action> until the env says it is over."
    max_turns = 8
    faults = {1: "raise", 3: "exit", 5: "hang"}

    def __init__(self, faulty: bool = True, **kwargs):
        super().__init__(**kwargs)
        self.faulty = faulty
        self.index, self.left = 0, 0

    @property
    def num_tasks(self) -> int:
        return 8

    def _load_task(self, index, options):
        self.index, self.left = index, index % 3 + 2
        self.task_id, self.task_type = f"countdown-{index}", "countdown"
        return f"Say done {self.left} times."

    def _apply(self, action):
        fault = self.faults.get(self.index) if self.faulty else None
        if self.turn == 2 and fault == "raise":
            raise ZeroDivisionError("the env divided by zero on purpose")
        if self.turn == 2 and fault == "exit":
            os._exit(7)
        if self.turn == 2 and fault == "hang":
            time.sleep(60)
        if action.content != "done":
            return Transition("Say done.", admissible=False)
        self.left -= 1
        return Transition(f"{self.left} to go.", reward=float(self.left == 0), terminated=self.left == 0,
                          admissible=True)

    def state_key(self):
        return hash_state(self.index, self.left)

    def hindsight(self):
        return Hindsight(self.left == 0, float(self.left == 0), "say done", {})

    def expert_action(self):
        return self.format_action("done")


def _records(episodes):
    return [e.to_dict() for e in episodes]


def test_workers_play_the_same_episodes_as_in_process(guess_env):
    requests = [EpisodeRequest(seed=s) for s in range(12)]
    picklable = EnvFactory("example/GuessNumber-v0")
    assert default_start_method(guess_env) == "fork" and default_start_method(picklable) == "forkserver"
    for agent in (RandomAgent(seed=3), ExpertAgent()):
        local = run_episodes(guess_env, agent, requests, num_envs=3, progress=False)
        forked = run_episodes(guess_env, agent, requests, workers=2, progress=False)
        served = run_episodes(picklable, agent, requests, workers=2, progress=False)
        assert _records(forked) == _records(local)
        assert _records(served) == _records(local)
        assert all(e.error is None and e.finished for e in served)
    # The random agent really played (it is not the expert): some episode took another path.
    random_turns = [e.num_turns
                    for e in run_episodes(guess_env, RandomAgent(seed=3), requests, workers=2, progress=False)]
    expert_turns = [e.num_turns for e in local]
    assert random_turns != expert_turns


def test_a_random_agent_episode_does_not_depend_on_batching_or_order(guess_env):
    requests = [EpisodeRequest(seed=s) for s in range(10)]
    one = {e.episode_id: e.to_dict()
           for e in run_episodes(guess_env, RandomAgent(seed=5), requests, num_envs=1, progress=False)}
    many = {e.episode_id: e.to_dict()
            for e in run_episodes(guess_env, RandomAgent(seed=5), requests[::-1], num_envs=4, progress=False)}
    assert one == many


def test_crashing_exiting_and_hanging_envs_cost_one_episode_each():
    requests = [EpisodeRequest(seed=s) for s in range(8)]
    started = time.monotonic()
    episodes = run_episodes(CountdownEnv, ExpertAgent(), requests, workers=3, step_timeout=2.0, progress=False,
                            start_method="fork")
    elapsed = time.monotonic() - started
    by_task = {e.task_id: e for e in episodes}
    assert len(episodes) == 8
    assert "ZeroDivisionError: the env divided by zero on purpose" in by_task["countdown-1"].error
    assert by_task["countdown-3"].error == "worker process died (exit code 7)"
    assert by_task["countdown-5"].error == "step timed out after 2s (worker killed)"
    for task in (1, 3, 5):  # the turns played before the fault are kept
        assert by_task[f"countdown-{task}"].num_turns == 1
        assert by_task[f"countdown-{task}"].hindsight is None
    healthy = [e for e in episodes if e.task_id not in ("countdown-1", "countdown-3", "countdown-5")]
    reference = run_episodes(lambda: CountdownEnv(faulty=False), ExpertAgent(),
                             [EpisodeRequest(seed=s) for s in (0, 2, 4, 6, 7)], progress=False)
    assert _records(healthy) == _records(reference)
    assert all(e.success for e in healthy)
    assert elapsed < 45, f"the hung step was not cut off ({elapsed:.0f}s)"


class KillerAgent(ExpertAgent):
    """The expert, who SIGKILLs the worker process of one episode at its third turn."""

    def __init__(self, victim: str):
        super().__init__()
        self.victim, self.killed = victim, []

    def act(self, messages, info, env):
        step = info["step"]
        if step.episode_id == self.victim and step.turn == 2:
            self.killed.append(env.worker_pid)
            os.kill(env.worker_pid, signal.SIGKILL)
        return super().act(messages, info, env)


def test_killing_a_worker_mid_episode_errors_that_episode_and_restarts_the_worker():
    make = lambda: CountdownEnv(faulty=False)  # noqa: E731
    agent = KillerAgent(victim="countdown-2@2")
    episodes = run_episodes(make, agent, [EpisodeRequest(seed=s) for s in range(8)], workers=2, progress=False)  # fork
    assert len(agent.killed) == 1
    by_id = {e.episode_id: e for e in episodes}
    victim = by_id["countdown-2@2"]
    assert victim.error == "worker process died (killed by SIGKILL)"
    assert victim.num_turns == 2 and not victim.finished
    others = [e for e in episodes if e.episode_id != "countdown-2@2"]
    assert len(others) == 7 and all(e.error is None and e.success for e in others)
    # The pid is gone: the slot was given a fresh process.
    with pytest.raises(ProcessLookupError):
        os.kill(agent.killed[0], 0)


def test_remote_env_calls_behave_like_local_ones(guess_env):
    handle = WorkerEnv(guess_env, step_timeout=10, prefetch=("expert_action",))
    try:
        local = guess_env().unwrapped
        handle.reset_async(4, {})
        handle.reset_wait()
        local.reset(seed=4)
        remote = handle.agent_env
        # The expert's move came with the reset; it is served once, then asked for again.
        assert set(handle._prefetched) == {"expert_action"}
        assert remote.expert_action() == local.expert_action() and not handle._prefetched
        assert remote.expert_action() == local.expert_action()
        assert remote.instructions == local.instructions
        assert remote.admissible_actions() == local.admissible_actions()
        # A generator lent to a remote method advances exactly as it would locally.
        rng_remote, rng_local = np.random.default_rng(11), np.random.default_rng(11)
        draws_remote = [remote.random_action(rng_remote) for _ in range(5)]
        draws_local = [local.random_action(rng_local) for _ in range(5)]
        assert draws_remote == draws_local
        assert rng_remote.integers(1 << 30) == rng_local.integers(1 << 30)
        with pytest.raises(AttributeError):
            remote.no_such_attribute  # noqa: B018
        assert handle.broken is None  # a missing attribute does not break the env
    finally:
        handle.close()
    assert handle.pid is None


class NoExpertEnv(CountdownEnv):
    def expert_action(self):
        raise NotImplementedError("no expert here")


def test_an_env_method_exception_reaches_the_agent_as_it_would_locally():
    with pytest.raises(AgentError, match="has no expert agent"):
        run_episodes(NoExpertEnv, ExpertAgent(), [EpisodeRequest(seed=0)], workers=1, progress=False,
                     start_method="fork")


@pytest.mark.parametrize("start_method", ["fork", "forkserver"])
def test_workers_exit_when_the_rollout_process_is_killed(start_method):
    """A SIGKILLed rollout leaves no env process behind (forked workers, and workers of the fork server)."""
    script = textwrap.dedent(
        f"""
        import sys, time
        from agentgym_opsd import EpisodeRequest, run_episodes
        from agentgym_opsd.agents import ExpertAgent
        from agentgym_opsd.workers import EnvFactory

        class Agent(ExpertAgent):
            def act_batch(self, messages, infos, envs):
                for env in envs:
                    print("PID", env.worker_pid, flush=True)
                time.sleep(600)

        make = EnvFactory("example/GuessNumber-v0")
        if {start_method!r} == "fork":
            make = lambda: EnvFactory("example/GuessNumber-v0")()
        run_episodes(make, Agent(), [EpisodeRequest(seed=s) for s in range(2)], workers=2, progress=False)
        """
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(PLUGIN), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, env=env)
    pids = []
    try:
        while len(pids) < 2:
            line = proc.stdout.readline()
            assert line, "the rollout process ended early"
            pids.append(int(line.split()[1]))
        for pid in pids:
            os.kill(pid, 0)  # alive now
    finally:
        proc.kill()
        proc.wait()
    deadline = time.monotonic() + 15
    alive = set(pids)
    while alive and time.monotonic() < deadline:
        for pid in list(alive):
            try:
                os.kill(pid, 0)
                # A zombie (exited, not yet reaped by init) counts as gone.
                if Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z":
                    alive.discard(pid)
            except (ProcessLookupError, FileNotFoundError):
                alive.discard(pid)
        time.sleep(0.2)
    assert not alive, f"env workers {sorted(alive)} outlived their parent"


def test_an_env_that_cannot_be_built_raises_as_it_would_in_process(guess_env):
    handle = WorkerEnv(EnvFactory("example/GuessNumber-v0", {"high": "many"}))
    with pytest.raises(ValueError, match="invalid literal for int"):
        handle.reset_async(0, {})
    assert handle.pid is None  # nothing left running
    with pytest.raises(EnvFailure, match="env construction failed: ValueError"):
        handle.reset_async(0, {})


class UnavailableEnv(CountdownEnv):
    def __init__(self, **kwargs):
        raise EnvUnavailable("no data here: run `agentgym-opsd fetch` first")


def test_env_unavailable_in_a_worker_is_raised_as_such():
    handle = WorkerEnv(UnavailableEnv, start_method="fork")
    with pytest.raises(EnvUnavailable, match="run `agentgym-opsd fetch` first"):
        handle.reset_async(0, {})
