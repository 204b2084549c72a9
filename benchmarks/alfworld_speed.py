"""Reset and step latency of our ALFWorld env against alfworld's own engine, on the same games and actions.

Compared, in one run:

- `ours`: `AlfWorldEnv` (the whole TextEnv: turn parsing, StepInfo with admissible commands and a state
  key, reward); `reset` is the episode start of a game already seen in this process; `new process` the
  first start of a game in a process (engine translation read from the disk cache); `1st use` the very
  first start of a game on a machine (fast-downward translates it).
- `raw`: TextWorld's `PddlEnv` wrapped in alfworld's `AlfredDemangler` + `AlfredInfos`, requesting what
  `AlfredTWEnv` requests (admissible commands, won, game file): the engine `AlfredTWEnv` runs. A reset is
  `load(game) + reset()`, as AlfredTWEnv's gym env does at every episode.
- `AlfredTWEnv`: alfworld's gym env itself (a batch of 1, in its worker process) on the real ALFWorld game
  in ../shared/data/alfworld, when present.

- threads: the same games stepped by N threads at once (a pool of N, one env per game, as the OpenRLHF
  bridge steps envs with `rollout.env_threads`), against one thread: whether more env threads are faster.

Actions: for each game, a fixed sequence recorded once from our env (seeded: random admissible commands,
a few non-admissible ones, then the expert to the goal), replayed identically on every engine; the
observations are checked equal along the way.

    .venv/bin/python -m benchmarks.alfworld_speed [--games-per-type 2] [--split valid_seen] [--page]

`--page` also writes the figures to docs/benchmarks/alfworld_speed.md.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import tempfile
import time
from pathlib import Path

from benchmarks.common import (SHARED_DATA, add_page_argument, benchmark_command, load_average, markdown_table,
                               write_results_page)
from environments.alfworld.compiled import compile_game, forget_compiled_games
from environments.alfworld.engine import AlfredEngine
from environments.alfworld.env import AlfWorldEnv

SHARED_GAME_ROOT = SHARED_DATA / "alfworld"
os.environ.setdefault("ALFWORLD_DATA", str(Path(tempfile.gettempdir()) / "agentgym-opsd-alfworld-data"))


def record_actions(env, seed: int, random_steps: int, rng: random.Random) -> list[str]:
    """A fixed command sequence for one game: random admissible + junk commands, then the expert."""
    env.reset(seed=seed)
    actions: list[str] = []
    for _ in range(random_steps):
        if rng.random() < 0.15:
            command = "take the moon from the sky"
        else:
            command = rng.choice(env.admissible_actions())
        actions.append(command)
        _, _, terminated, truncated, _ = env.step(command)
        if terminated or truncated:
            return actions
    while len(actions) < 45:
        turn = env.expert_action()
        if turn is None:
            break
        command = turn.split("<action>")[1].split("</action>")[0]
        actions.append(command)
        _, _, terminated, _, _ = env.step(command)
        if terminated:
            break
    return actions


def compare_threads(plans, thread_counts: list[int], rounds: int = 3) -> dict:
    """Steps per second when the games' replays run on a pool of N threads (one env per game): printed, and
    returned as {"games", "rounds", "steps_per_s": {N: best rate}, "c_share": share of a step in C calls}."""
    from concurrent.futures import ThreadPoolExecutor

    jobs = []
    for env, index, _, actions in plans:
        options = {"source": "alfworld", "data_dir": str(SHARED_GAME_ROOT),
                   "split": "train"} if env.source == "alfworld" else {"split": env.split}
        jobs.append((AlfWorldEnv(progress=False, **options), index, actions))

    def replay(job) -> int:
        env, index, actions = job
        env.reset(seed=index)
        for command in actions:
            env.step(command)
        return len(actions)

    for job in jobs:  # every game loaded once in this process before timing
        replay(job)
    best: dict[int, float] = {}
    for _ in range(rounds):  # interleaved rounds: a busy machine slows every count alike
        for n in thread_counts:
            with ThreadPoolExecutor(max_workers=n) as pool:
                t0 = time.perf_counter()
                steps = sum(pool.map(replay, jobs))
                rate = steps / (time.perf_counter() - t0)
            best[n] = max(best.get(n, 0.0), rate)
    # Threads overlap only what runs without the GIL: fast-downward's C calls (ctypes releases it).
    in_c = [0.0]

    class TimedLibrary:
        def __init__(self, lib) -> None:
            self.lib = lib

        def __getattr__(self, name):
            call = getattr(self.lib, name)

            def timed(*args):
                t0 = time.perf_counter()
                try:
                    return call(*args)
                finally:
                    in_c[0] += time.perf_counter() - t0

            return timed

    for env, _, _ in jobs:
        env.engine._lib = TimedLibrary(env.engine._lib)
    t0 = time.perf_counter()
    for job in jobs:
        replay(job)
    share = in_c[0] / (time.perf_counter() - t0)
    print()
    print(f"env threads (the {len(jobs)} games replayed at once on a thread pool; best of {rounds} rounds):")
    for n in thread_counts:
        print(f"  {n} thread{'s' if n > 1 else ' '}  {best[n]:8.0f} steps/s   x{best[n] / best[thread_counts[0]]:.2f}")
    print(f"  time in fast-downward's C calls (the GIL released): {share:.1%} of a step; the rest is Python under "
          "the GIL,"
          f" so N threads gain at most x{1 / (1 - share + share / max(thread_counts)):.2f}")
    for env, _, _ in jobs:
        env.close()
    return {"games": len(jobs), "rounds": rounds, "steps_per_s": best, "c_share": share}


def summary(values: list[float]) -> str:
    return (f"mean {1000 * statistics.fmean(values):8.2f} ms   median {1000 * statistics.median(values):8.2f} ms   "
            f"(n={len(values)})")


def replay_plans(args):
    """The games (the first `--games-per-type` of each type in the embedded panel's split, plus the real
    ALFWorld game when ../shared/data has it) and a fixed command sequence for each: (plans, the real
    game's env or None)."""
    rng = random.Random(0)
    sets = []
    embedded = AlfWorldEnv(split=args.split, progress=True)
    per_type: dict[str, list[int]] = {}
    for i, entry in enumerate(embedded.games):
        per_type.setdefault(entry.task_type, [])
        if len(per_type[entry.task_type]) < args.games_per_type:
            per_type[entry.task_type].append(i)
    for indices in per_type.values():
        for i in indices:
            sets.append((embedded, i))
    real = None
    if (SHARED_GAME_ROOT / "json_2.1.1").is_dir():
        real = AlfWorldEnv(source="alfworld", data_dir=str(SHARED_GAME_ROOT), split="train")
        sets.append((real, 0))
    plans = []
    for env, index in sets:
        actions = record_actions(env, index, args.random_steps, rng)
        plans.append((env, index, env.games[index].game_file, actions))
    return plans, real


def first_and_cold_resets(plans) -> tuple[list[float], list[float]]:
    """Reset seconds per game: at a game's first use ever (fast-downward translates it), and in a new
    process (empty in-process cache, the translation read from the disk cache: what a new worker sees)."""
    first = []
    probe = AlfredEngine()
    for _, _, game_file, _ in plans:
        forget_compiled_games()
        t0 = time.perf_counter()
        probe.load(compile_game(game_file, disk_cache=False))
        probe.reset()
        first.append(time.perf_counter() - t0)
    probe.close()
    forget_compiled_games()
    cold = []
    for env, index, _, _ in plans:
        t0 = time.perf_counter()
        env.reset(seed=index)
        cold.append(time.perf_counter() - t0)
    return first, cold


def ours_against_raw(plans) -> tuple[dict[str, list[float]], int]:
    """Every game replayed on our env and on the raw engine (TextWorld's PddlEnv with alfworld's
    wrappers), command by command: (seconds per reset and step of each, the observations and admissible
    lists that differ)."""
    import textworld
    from alfworld.agents.environment.alfred_tw_env import AlfredDemangler, AlfredInfos
    from textworld.envs import PddlEnv

    times: dict[str, list[float]] = {"ours_reset": [], "ours_step": [], "raw_reset": [], "raw_step": []}
    raw = AlfredInfos(AlfredDemangler(
        PddlEnv(textworld.EnvInfos(admissible_commands=True, won=True, extras=["gamefile"])), shuffle=False))
    mismatches = 0
    for env, index, game_file, actions in plans:
        t0 = time.perf_counter()
        obs, _ = env.reset(seed=index)
        times["ours_reset"].append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        raw.load(str(game_file))
        state = raw.reset()
        times["raw_reset"].append(time.perf_counter() - t0)
        mismatches += obs != state.feedback
        for command in actions:
            t0 = time.perf_counter()
            obs, _, _, _, info = env.step(f"<think>next</think><action>{command}</action>")
            times["ours_step"].append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            state, _, _ = raw.step(command)
            times["raw_step"].append(time.perf_counter() - t0)
            mismatches += (obs != state.feedback) + (info["step"].admissible_actions != state["admissible_commands"])
    return times, mismatches


def print_ours_against_raw(first: list[float], cold: list[float], times: dict[str, list[float]],
                           mismatches: int) -> list[str]:
    """Print the latencies of ours and raw and their ratios; return the ratio and mismatch lines."""
    print()
    print(f"{'':22s} {'ours':>52s}")
    print(f"reset, game's 1st use  {summary(first)}   (translates; once per machine)")
    print(f"reset, new process     {summary(cold)}   (translation read from the disk cache)")
    print(f"reset                  {summary(times['ours_reset'])}")
    print(f"step                   {summary(times['ours_step'])}")
    print(f"{'':22s} {'raw: TextWorld PddlEnv + AlfredDemangler + AlfredInfos':>52s}")
    print(f"reset (load + reset)   {summary(times['raw_reset'])}")
    print(f"step                   {summary(times['raw_step'])}")
    print()
    raw_reset = statistics.fmean(times["raw_reset"])
    r_reset = statistics.fmean(times["ours_reset"]) / raw_reset
    r_cold = statistics.fmean(cold) / raw_reset
    r_first = statistics.fmean(first) / raw_reset
    r_step = statistics.fmean(times["ours_step"]) / statistics.fmean(times["raw_step"])
    lines = [f"ratio ours/raw: reset {r_reset:.4f} (new process {r_cold:.3f}, 1st use {r_first:.2f}), step "
             f"{r_step:.4f} -> per-step overhead {100 * (r_step - 1):+.1f}% (goal: <= +10%), "
             f"speed-up x{1 / r_step:.0f}",
             f"observation/admissible mismatches along the replay: {mismatches}"]
    print("\n".join(lines))
    return lines


def latency_rows(first: list[float], cold: list[float], times: dict[str, list[float]]) -> list[tuple]:
    """(engine, what, seconds of each call) of ours and raw, as print_ours_against_raw prints them."""
    return [("ours", "reset, game's 1st use (translates; once per machine)", first),
            ("ours", "reset, new process (translation read from the disk cache)", cold),
            ("ours", "reset", times["ours_reset"]), ("ours", "step", times["ours_step"]),
            ("raw: TextWorld PddlEnv + AlfredDemangler + AlfredInfos", "reset (load + reset)", times["raw_reset"]),
            ("raw: TextWorld PddlEnv + AlfredDemangler + AlfredInfos", "step", times["raw_step"])]


def results_page_body(results: dict) -> str:
    """The results page's figures: the games, each engine's reset and step latency, the ratios, and the env
    threads' steps per second (`results` as `main` collects them)."""
    latencies = [[engine, what, f"{1000 * statistics.fmean(v):.2f}", f"{1000 * statistics.median(v):.2f}", len(v)]
                 for engine, what, v in results["latencies"]]
    parts = [results["games"], markdown_table(["engine", "call", "mean ms", "median ms", "n"], latencies),
             "\n".join(f"- {line}" for line in results["notes"])]
    if threads := results.get("threads"):
        rates = threads["steps_per_s"]
        base_threads, base = next(iter(rates.items()))  # the first count asked for, as printed
        table = [[n, f"{r:.0f}", f"{r / base:.2f}"] for n, r in rates.items()]
        parts.append(f"Env threads: the {threads['games']} games replayed at once on a thread pool, best of "
                     f"{threads['rounds']} rounds; {threads['c_share']:.1%} of a step is in fast-downward's C calls "
                     "(the GIL released).\n\n" + markdown_table(["threads", "steps/s", f"x {base_threads}"], table))
    return "\n\n".join(parts)


def compare_alfredtwenv(real, plan) -> list[tuple]:
    """alfworld's own gym env (AlfredTWEnv, batch 1, a worker process) on the real game, the same
    commands, against ours: printed, and returned as latency rows (engine, what, seconds of each call)."""
    from alfworld.agents.environment.alfred_tw_env import AlfredTWEnv

    _, index, game_file, actions = plan
    data_path = str(SHARED_GAME_ROOT / "json_2.1.1" / "train")
    config = {
        "env": {"goal_desc_human_anns_prob": 0, "task_types": [1, 2, 3, 4, 5, 6], "domain_randomization": False,
                "expert_type": "handcoded"},
        "dataset": {"data_path": data_path, "eval_id_data_path": data_path, "eval_ood_data_path": data_path,
                    "num_train_games": -1, "num_eval_games": -1},
        "logic": {"domain": "", "grammar": ""},
        "general": {"training_method": "dqn"},
        "rl": {"training": {"max_nb_steps_per_episode": 100}},
    }
    tw_env = AlfredTWEnv(config, train_eval="train").init_env(batch_size=1)
    resets, steps = [], []
    for _ in range(2):
        t0 = time.perf_counter()
        tw_env.reset()
        resets.append(time.perf_counter() - t0)
        for command in actions:
            t0 = time.perf_counter()
            tw_env.step([command])
            steps.append(time.perf_counter() - t0)
    tw_env.close()
    ours_real_steps = []
    real.reset(seed=index)
    for command in actions:
        t0 = time.perf_counter()
        real.step(command)
        ours_real_steps.append(time.perf_counter() - t0)
    print()
    print("alfworld AlfredTWEnv (gym, batch 1, worker process) on the real game, same commands:")
    print(f"reset                  {summary(resets)}")
    print(f"step                   {summary(steps)}")
    print(f"ours on that game: step {summary(ours_real_steps)}")
    print(f"ratio ours/AlfredTWEnv: step {statistics.fmean(ours_real_steps) / statistics.fmean(steps):.4f}")
    engine = "alfworld AlfredTWEnv (gym, batch 1, worker process), real game"
    return [(engine, "reset", resets), (engine, "step", steps), ("ours, real game", "step", ours_real_steps)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--games-per-type", type=int, default=2, help="embedded games per task type")
    parser.add_argument("--split", default="valid_seen")
    parser.add_argument("--random-steps", type=int, default=12, help="random commands before the expert takes over")
    parser.add_argument("--no-alfredtwenv", action="store_true", help="skip alfworld's AlfredTWEnv on the real game")
    parser.add_argument("--threads", default="1,2,4", help="thread counts for the env-threads comparison ('' to skip)")
    add_page_argument(parser)
    args = parser.parse_args()
    load_before = load_average()
    command = benchmark_command("alfworld_speed")  # before anything can change sys.argv (alfworld's code does)

    plans, real = replay_plans(args)
    print(
        f"machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} (other processes slow every "
        "figure alike)")
    games = (f"{len(plans)} games ({len(plans) - (real is not None)} embedded from {args.split}, "
             f"{int(real is not None)} real ALFWorld), {sum(len(p[3]) for p in plans)} commands in all")
    print(games)
    first, cold = first_and_cold_resets(plans)
    times, mismatches = ours_against_raw(plans)
    results = {"games": games, "latencies": latency_rows(first, cold, times),
               "notes": print_ours_against_raw(first, cold, times, mismatches)}
    thread_counts = [int(t) for t in args.threads.split(",") if t.strip()]
    if thread_counts:
        results["threads"] = compare_threads(plans, thread_counts)
    if real is not None and not args.no_alfredtwenv:
        results["latencies"] += compare_alfredtwenv(real, plans[-1])
    if args.page:
        page = write_results_page(
            "alfworld_speed", "Reset and step latency of our ALFWorld env against alfworld's own engine",
            results_page_body(results), command=command,
            load=[load_before[0], load_average()[0]])
        print(f"results page: {page}")
    return 1 if mismatches else 0


if __name__ == "__main__":
    raise SystemExit(main())
