"""An env whose every step computes for a set time: what a heavy simulator costs (benchmarks.env_pool).

`CPUBoundEnv`: task i is a count to `3 + i % 3`; each `<action>step</action>` moves the count on by
one after computing (a busy loop, not a sleep: it holds a core) for `work` seconds, and the episode
ends, won, at the count. Any other action is invalid and costs the same work. The expert always steps.

`make_cpu_bound_env(work, tasks)` makes one through the registry; `functools.partial` of it is the
picklable `make_env` a worker process needs (it imports this module by name, then registers the id).
"""

from __future__ import annotations

import time

from agentgym_opsd import Hindsight, TextEnv, Transition, hash_state, make, register_env

__all__ = ["ENV_ID", "CPUBoundEnv", "make_cpu_bound_env"]

ENV_ID = "bench/CPUBound-v0"


class CPUBoundEnv(TextEnv):
    instructions = "Count to the target. Each turn write <action>step</action>."
    max_turns = 12

    def __init__(self, work: float = 0.0, tasks: int = 1000, **kwargs) -> None:
        super().__init__(**kwargs)
        self.work, self.tasks = float(work), int(tasks)
        self.target = self.count = 0

    @property
    def num_tasks(self) -> int:
        return self.tasks

    def _load_task(self, index, options):
        self.target, self.count = 3 + index % 3, 0
        self.task_id, self.task_type = f"count-{index}", "count"
        return f"Target: {self.target}. Count: 0."

    def admissible_actions(self):
        return ["step"]

    def _apply(self, action):
        end = time.perf_counter() + self.work
        spins = 0
        while time.perf_counter() < end:
            spins += 1
        if action.content.strip() != "step":
            return Transition("You can only step.", admissible=False)
        self.count += 1
        done = self.count == self.target
        return Transition(f"Count: {self.count}.", reward=float(done), terminated=done, admissible=True)

    def state_key(self):
        return hash_state(self.target, self.count)

    def hindsight(self):
        won = self.count == self.target
        return Hindsight(won, float(won), f"Step {self.target} times.", {"target": self.target})

    def expert_action(self):
        return self.format_action("step")


def make_cpu_bound_env(work: float, tasks: int = 1000):
    """A `CPUBoundEnv` through the registry (registering its id in this process first)."""
    register_env(ENV_ID, f"{__name__}:CPUBoundEnv", family="CPUBound", description="steps that compute (benchmark)",
                 sizes=lambda split: tasks)
    return make(ENV_ID, work=work, tasks=tasks)
