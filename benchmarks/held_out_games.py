"""ALFWorld held-out games a policy cannot have memorised, shared by benchmarks.learning and
benchmarks.warm_start (a module they import, not a benchmark).

A held-out game whose goal text and expert plan are also a training game's is a twin: a policy can
win it by recalling the training game. `twin_free_seeds` lists the held-out games without a twin.
"""

from __future__ import annotations

import agentgym_opsd


def twin_free_seeds(env_id: str, train_options: dict, eval_options: dict, n_eval: int) -> tuple[list[int], int]:
    """The first `n_eval` held-out games' reset seeds, minus the games whose (goal, expert plan) is
    also a training game's; and how many were dropped."""
    def key(env, seed):
        env.reset(seed=seed)
        lines = env.unwrapped.hindsight().reference.splitlines()
        return tuple(line for line in lines if line.startswith(("Goal:", "Expert plan")))

    train = agentgym_opsd.make(env_id, **train_options)
    known = {key(train, s) for s in range(train.unwrapped.num_tasks)}
    train.close()
    held = agentgym_opsd.make(env_id, **eval_options)
    seeds = [s for s in range(min(n_eval, held.unwrapped.num_tasks)) if key(held, s) not in known]
    dropped = min(n_eval, held.unwrapped.num_tasks) - len(seeds)
    held.close()
    return seeds, dropped
