"""Envs for the bench and worker tests and the pool benchmark, shipped as a plug-in (its dist-info
declares `[agentgym_opsd.envs] benchtest = agentgym_bench_testenv:register`).

`Tally`: task i asks for a target sum; each `add N` (N in 1..3) adds to the tally; the episode ends
when the tally reaches the target (success) or passes it (failure). Two subsets, `small` and
`large` targets. Options: `delay` (seconds each step sleeps: a slow service), `work` (seconds each
step computes: a CPU-bound env), `reset_delay` and `slow_tasks` (seconds the reset of each task in
`slow_tasks` sleeps: a reset that hangs). The expert always adds what is left, up to 3.
"""

from __future__ import annotations

import time

from agentgym_opsd import Hindsight, TextEnv, Transition, hash_state, register_env


class TallyEnv(TextEnv):
    instructions = (
        "Reach the target sum exactly. Each turn, think inside <think></think>, then write "
        "<action>add N</action> with N in 1, 2 or 3."
    )
    max_turns = 12

    def __init__(self, subset: str = "small", tasks: int = 30, delay: float = 0.0, work: float = 0.0,
                 reset_delay: float = 0.0, slow_tasks: tuple[int, ...] = (), **kwargs):  # fmt: skip
        super().__init__(**kwargs)
        self.reset_delay, self.slow_tasks = float(reset_delay), tuple(slow_tasks)
        if subset not in ("small", "large"):
            raise ValueError(f"subset must be small or large, got {subset!r}")
        self.subset, self.tasks, self.delay, self.work = subset, int(tasks), float(delay), float(work)
        self.target, self.total = 0, 0

    @property
    def num_tasks(self) -> int:
        return self.tasks

    def _load_task(self, index, options):
        if index in self.slow_tasks:
            time.sleep(self.reset_delay)
        self.target = (3 + index % 5) if self.subset == "small" else (9 + index % 7)
        self.total = 0
        self.task_id, self.task_type = f"tally-{self.subset}-{index}", self.subset
        return f"Target: {self.target}. Tally: 0."

    def admissible_actions(self):
        return ["add 1", "add 2", "add 3"]

    def _apply(self, action):
        if self.delay:
            time.sleep(self.delay)
        if self.work:
            end = time.perf_counter() + self.work
            x = 0
            while time.perf_counter() < end:
                x += 1
        words = action.content.split()
        if len(words) != 2 or words[0] != "add" or words[1] not in ("1", "2", "3"):
            return Transition("You can only add 1, 2 or 3.", admissible=False)
        self.total += int(words[1])
        if self.total == self.target:
            return Transition(f"Tally: {self.total}. Target reached!", reward=1.0, terminated=True, admissible=True)
        if self.total > self.target:
            return Transition(f"Tally: {self.total}. Overshot.", terminated=True, admissible=True)
        return Transition(f"Tally: {self.total}.", admissible=True)

    def state_key(self):
        return hash_state(self.target, self.total)

    def hindsight(self):
        won = self.total == self.target
        return Hindsight(won, float(won), f"Add up to {self.target}.", {"target": self.target})

    def expert_action(self):
        return self.format_action(f"add {min(3, self.target - self.total)}")


def register():
    for subset in ("small", "large"):
        register_env(
            f"benchtest/Tally-{subset.capitalize()}-v0",
            "agentgym_bench_testenv:TallyEnv",
            family="Tally",
            subset=subset,
            splits=("test",),
            kwargs={"subset": subset},
            description=f"reach a {subset} target sum (test env)",
            sizes=lambda split: 30,
        )
