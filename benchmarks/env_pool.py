"""Env worker pool throughput: episodes per second in-process and with 1, 2 and 4 worker processes.

Three envs: a CPU-bound one (`benchmarks.cpu_bound_env`, each step computing for `--work` seconds:
what a heavy simulator costs), ALFWorld on its embedded panel (the TextWorld PDDL engine)
and WebShop on its built-in catalog (page rendering and Lucene search per step). The expert plays, so the agent
costs next to nothing and the figures are the envs' and the pool's. Throughput should grow with workers up to the cores.

    .venv/bin/python -m benchmarks.env_pool [--episodes 160] [--work 0.004] [--workers 1 2 4] [--repeat 3] [--page]

Each row is the best of `--repeat` runs: other processes on a shared machine only ever slow a run down.
`--page` also writes the table to docs/benchmarks/env_pool.md.
"""

from __future__ import annotations

import argparse
import functools
import os
import time

import agentgym_opsd
from agentgym_opsd import EpisodeRequest, run_episodes
from agentgym_opsd.agents import ExpertAgent
from agentgym_opsd.registry import registered_envs
from agentgym_opsd.workers import EnvFactory
from benchmarks.common import add_page_argument, benchmark_command, load_average, markdown_table, write_results_page
from benchmarks.cpu_bound_env import make_cpu_bound_env

HEADER = ["env", "pool", "start-up s", "episodes/s", "steps/s", "vs 1 worker", "errored"]


def measure(make_env, episodes: int, workers: int) -> tuple[float, float, float, int]:
    """(start-up seconds, episodes/s, steps/s, errored) for one pool size (0: in-process, 8 envs
    stepped together). The rates are steady-state: from the end of the first wave of episodes
    (one per env) to the end of the last, so building the envs is not counted in them."""
    requests = [EpisodeRequest(seed=i) for i in range(episodes)]
    finished: list[tuple[float, int]] = []
    started = time.perf_counter()
    played = run_episodes(
        make_env, ExpertAgent(), requests, num_envs=8, workers=workers, progress=False,
        on_episode=lambda e: finished.append((time.perf_counter(), e.num_turns)),
    )
    wave = workers or 8
    t0 = finished[wave - 1][0]
    rest = finished[wave:]
    elapsed = finished[-1][0] - t0
    return t0 - started, len(rest) / elapsed, sum(n for _, n in rest) / elapsed, sum(1 for e in played if e.error)


def results_page_body(episodes: int, rows: list[tuple[str, str, float, float, float, str, int]]) -> str:
    """The results page's table: one row per (env, pool size) as `main` prints it (HEADER's columns)."""
    table = [[name, pool, f"{startup:.2f}", f"{eps:.1f}", f"{sps:.1f}", ratio, errors]
             for name, pool, startup, eps, sps, ratio, errors in rows]
    return (f"{episodes} expert episodes per row, the best of the repeats; rates from the end of the first wave of "
            "episodes (one per env) to the end of the last.\n\n" + markdown_table(HEADER, table))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--episodes", type=int, default=160)
    parser.add_argument("--work", type=float, default=0.004, help="seconds of computation per CPU-bound step")
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--repeat", type=int, default=3,
                        help="runs per row; the best is printed (the machine is shared)")
    parser.add_argument("--envs", default="cpu,alfworld,webshop", help="which of cpu, alfworld, webshop to run")
    add_page_argument(parser)
    args = parser.parse_args()
    load_before = load_average()
    command = benchmark_command("env_pool")  # before anything can change sys.argv (alfworld's code does)
    agentgym_opsd.load_plugins(reload=True)
    wanted = {name.strip().lower() for name in args.envs.split(",")}
    envs = {}
    if "cpu" in wanted:
        envs["CPU-bound (%.0f ms/step)" % (1000 * args.work)] = functools.partial(make_cpu_bound_env, args.work)
    ids = {e.id for e in registered_envs()}
    if "alfworld" in wanted and "agentgym/ALFWorld-All-v0" in ids:
        panel = {"train": 8, "valid_seen": 0, "valid_unseen": 0}
        envs["ALFWorld (TextWorld engine)"] = EnvFactory(
            "agentgym/ALFWorld-All-v0", {"split": "train", "room": "small", "panel_size": panel, "progress": False}
        )
    if "webshop" in wanted and "agentgym/WebShop-v0" in ids:
        envs["WebShop (built-in catalog)"] = EnvFactory("agentgym/WebShop-v0", {"split": "train"})
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(
        f"cores: {os.cpu_count()}; load average {load} (other processes share the cores); {args.episodes} expert "
        "episodes per row")
    print(
        f"{'env':34s} {'pool':>12s} {'start-up s':>10s} {'episodes/s':>11s} {'steps/s':>9s} {'vs 1 worker':>12s} "
        f"{'errored':>8s}")
    measured = []
    for name, make_env in envs.items():
        make_env().close()  # build caches (WebShop's index) before timing
        base = None
        for workers in [0, *args.workers]:
            runs = [measure(make_env, args.episodes, workers) for _ in range(args.repeat)]
            startup, eps, sps, errors = max(runs, key=lambda r: r[1])
            if workers == 1:
                base = eps
            label = "in-process" if workers == 0 else f"{workers} worker{'s' if workers > 1 else ''}"
            ratio = f"{eps / base:.2f}x" if base and workers >= 1 else ""
            print(f"{name:34s} {label:>12s} {startup:10.2f} {eps:11.1f} {sps:9.1f} {ratio:>12s} {errors:8d}")
            measured.append((name, label, startup, eps, sps, ratio, errors))
    if args.page:
        page = write_results_page(
            "env_pool", "Env worker pool throughput: expert episodes per second in-process and with worker processes",
            results_page_body(args.episodes, measured), command=command,
            load=[load_before[0], load_average()[0]])
        print(f"results page: {page}")


if __name__ == "__main__":  # (workers start from the fork server, which imports this file)
    main()
