"""WebShop speed and memory: one process holding many env instances over the same catalog.

Measures, for `--envs` instances (default 64) made with `gymnasium.make("agentgym/WebShop-v0")`:

- memory: the process's resident memory and Python heap (tracemalloc) after the first env (which
  loads the catalog, goals and Lucene index) and after all of them; the growth per extra instance
  before and after every instance has played episodes (its per-episode state, measured as the heap
  freed when the instances are dropped), against the shared world's size. RSS after the episodes
  also holds the JVM's heap growth from the searches, which is one per process. The catalog and index are
  shared, so an instance must add only its episode state.
- latency: wall time of `reset` and `step`, per step kind (search, click, Buy Now), over
  `--episodes` episodes per env of a mixed agent (the expert's moves, with random admissible
  clicks mixed in), round-robin over the instances as a rollout would.

    .venv/bin/python -m benchmarks.webshop_speed                         # ../shared/data/webshop, 64 envs
    .venv/bin/python -m benchmarks.webshop_speed --catalog builtin --envs 16
    .venv/bin/python -m benchmarks.webshop_speed --catalog DIR --no-heap --json out.json  # what scale.py runs

The catalog's load (its files and goals: `catalog_load_s`, with the peak RSS it reached) and the index
build (`index_build_s`) are timed apart before the first env is made.

Prints a table of figures; `--json PATH` also writes them, `--page` to docs/benchmarks/webshop_speed.md.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import Any

import numpy as np

import agentgym_opsd
from agentgym_opsd.io import atomic_write_json
from benchmarks.common import (SHARED_DATA, add_page_argument, benchmark_command, load_average, markdown_table,
                               write_results_page)
from environments.webshop.world import get_world

DEFAULT_CATALOG = SHARED_DATA / "webshop"


def rss_bytes() -> int:
    """Resident memory of this process (Linux /proc; falls back to the peak from getrusage)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def peak_rss_bytes() -> int:
    """The highest resident memory of this process so far (VmHWM; not getrusage's ru_maxrss, which
    Linux carries over from the parent across exec)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def heap_bytes() -> int:
    """The Python heap traced by tracemalloc (0 when it is off: `--no-heap`)."""
    gc.collect()
    return tracemalloc.get_traced_memory()[0] if tracemalloc.is_tracing() else 0


def percentile(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--catalog", default=str(DEFAULT_CATALOG) if DEFAULT_CATALOG.exists() else "builtin",
                        help="a WebShop data folder or file, or 'builtin' (default: ../shared/data/webshop)")
    parser.add_argument("--envs", type=int, default=64, help="env instances in the process")
    parser.add_argument("--episodes", type=int, default=3, help="episodes per instance for the latency figures")
    parser.add_argument("--index-dir", default=None, help="index folder (default: a temporary one, built here)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", default=None, help="also write the figures to this JSON file")
    parser.add_argument("--no-heap", action="store_true",
                        help="no tracemalloc (Python heap figures): it slows loading and adds memory; for load time "
                             "and RSS at scale")
    add_page_argument(parser)
    return parser.parse_args(argv)


def build_envs(args, catalog: str | None, index_dir: str) -> tuple[list, Any, dict[str, float]]:
    """Load the catalog, build its index, make `--envs` instances: (the envs, their shared world, the
    times and memory of each stage)."""
    def make():
        return agentgym_opsd.make("agentgym/WebShop-v0", catalog=catalog, index_dir=index_dir, split="all")

    costs: dict[str, float] = {"rss0": rss_bytes(), "heap0": heap_bytes()}
    t0 = time.perf_counter()
    loaded = get_world(catalog, index_dir=index_dir)  # the catalog's files and its goals (what make() loads first)
    costs["load_s"] = time.perf_counter() - t0
    costs["rss_loaded"] = rss_bytes()
    costs["peak_load"] = peak_rss_bytes()
    t0 = time.perf_counter()
    loaded.search  # the search index: built here when index_dir holds none
    costs["index_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    first = make()
    costs["build_s"] = costs["load_s"] + costs["index_s"] + time.perf_counter() - t0
    costs["rss1"], costs["heap1"] = rss_bytes(), heap_bytes()
    world = first.unwrapped.world
    assert world is loaded, "make() did not reuse the world get_world() loaded"

    t0 = time.perf_counter()
    envs = [first] + [make() for _ in range(args.envs - 1)]
    costs["make_ms"] = (time.perf_counter() - t0) / max(args.envs - 1, 1) * 1000
    costs["rss_all"], costs["heap_all"] = rss_bytes(), heap_bytes()
    assert all(e.unwrapped.world is world for e in envs), "env instances do not share one world"
    return envs, world, costs


def play_round_robin(envs: list, episodes: int, seed: int) -> tuple[dict[str, list[float]], list[float]]:
    """Latency: round-robin over the instances, each playing `episodes` episodes of the expert with a
    random detour now and then; (seconds per reset, search, click and buy; the episodes' scores)."""
    rng = np.random.default_rng(seed)
    timings: dict[str, list[float]] = {"reset": [], "search": [], "click": [], "buy": []}
    n_tasks = envs[0].unwrapped.num_tasks
    live = []
    for k, env in enumerate(envs):
        t = time.perf_counter()
        env.reset(seed=(seed + k) % n_tasks)
        timings["reset"].append(time.perf_counter() - t)
        live.append([env, 0])
    scores = []
    while live:
        still = []
        for env, done_episodes in live:
            raw = env.unwrapped
            admissible = raw.admissible_actions()
            if rng.random() < 0.3 and admissible:  # a random detour now and then, as a learner would
                turn = raw.format_action(admissible[int(rng.integers(len(admissible)))])
            else:
                turn = raw.expert_action() or ""
            kind = "search" if "search[" in turn else ("buy" if "Buy Now" in turn or "buy now" in turn else "click")
            t = time.perf_counter()
            _, reward, terminated, truncated, info = env.step(turn)
            timings[kind].append(time.perf_counter() - t)
            if terminated or truncated:
                scores.append(float(info["hindsight"].score))
                done_episodes += 1
                if done_episodes < episodes:
                    t = time.perf_counter()
                    env.reset(seed=int(rng.integers(n_tasks)))
                    timings["reset"].append(time.perf_counter() - t)
                    still.append([env, done_episodes])
            else:
                still.append([env, done_episodes])
        live = still
    return timings, scores


def speed_figures(args, world, index_dir: str, costs: dict[str, float], timings: dict[str, list[float]],
                  scores: list[float]) -> dict[str, Any]:
    """The figures of one run: load, index and make times, memory per stage and per env, latencies."""
    per_env_heap = (costs["heap_all"] - costs["heap1"]) / max(args.envs - 1, 1)
    per_env_heap_played = (costs["heap_played"] - costs["heap_dropped"]) / max(args.envs - 1, 1)
    shared_growth = costs["heap_dropped"] - costs["heap1"]  # query and noun caches: shared, grow with the queries
    per_env_rss = (costs["rss_all"] - costs["rss1"]) / max(args.envs - 1, 1)
    world_heap = costs["heap1"] - costs["heap0"]
    figures = {
        "catalog": world.catalog.name,
        "products": len(world.catalog),
        "goals": len(world.goals),
        "envs": args.envs,
        "catalog_load_s": round(costs["load_s"], 3),
        "index_build_s": round(costs["index_s"], 3),
        "index_mib": round(sum(p.stat().st_size for p in Path(index_dir).rglob("*") if p.is_file()) / 2**20, 2),
        "rss_after_catalog_load_mb": round(costs["rss_loaded"] / 2**20, 1),
        "peak_rss_catalog_load_mb": round(costs["peak_load"] / 2**20, 1),
        "first_env_build_s": round(costs["build_s"], 3),
        "extra_env_make_ms": round(costs["make_ms"], 3),
        "rss_before_mb": round(costs["rss0"] / 2**20, 1),
        "rss_one_env_mb": round(costs["rss1"] / 2**20, 1),
        "rss_all_envs_mb": round(costs["rss_all"] / 2**20, 1),
        "rss_after_episodes_mb": round(costs["rss_played"] / 2**20, 1),
        "world_python_heap_mb": round(world_heap / 2**20, 2),
        "per_env_python_heap_kb": round(per_env_heap / 1024, 2),
        "per_env_python_heap_after_episodes_kb": round(per_env_heap_played / 1024, 2),
        "per_env_rss_kb": round(per_env_rss / 1024, 1),
        "per_env_over_world_heap": round(per_env_heap_played / world_heap, 5) if world_heap else None,
        "shared_cache_growth_kb": round(shared_growth / 1024, 1),
        "cached_queries": int(costs["cached_queries"]),
        "episodes": len(scores),
        "mean_score": round(statistics.fmean(scores), 4) if scores else None,
    }
    for kind, values in timings.items():
        ms = [v * 1000 for v in values]
        figures[f"{kind}_n"] = len(ms)
        figures[f"{kind}_ms_mean"] = round(statistics.fmean(ms), 3) if ms else None
        figures[f"{kind}_ms_p50"] = round(percentile(ms, 50), 3)
        figures[f"{kind}_ms_p95"] = round(percentile(ms, 95), 3)
    figures["peak_rss_mb"] = round(peak_rss_bytes() / 2**20, 1)
    steps = [v for k in ("search", "click", "buy") for v in timings[k]]
    figures["step_ms_mean"] = round(statistics.fmean(steps) * 1000, 3)
    figures["steps_per_s"] = round(len(steps) / sum(steps), 1)
    if args.no_heap:
        for key in ("world_python_heap_mb", "per_env_python_heap_kb", "per_env_python_heap_after_episodes_kb",
                    "per_env_over_world_heap", "shared_cache_growth_kb"):
            figures.pop(key)
    return figures


def results_page_body(figures: dict[str, Any]) -> str:
    """The results page's figures: one row per figure, as `main` prints them (`figures` as --json writes them)."""
    return (f"{figures['envs']} env instances over the {figures['catalog']} catalog ({figures['products']:,} products, "
            f"{figures['goals']:,} goals), {figures['episodes']} episodes round-robin.\n\n"
            + markdown_table(["figure", "value"], [[f"`{k}`", "-" if v is None else v] for k, v in figures.items()]))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    load_before = load_average()
    command = benchmark_command("webshop_speed", argv)  # before anything can change sys.argv (alfworld's code does)
    index_dir = args.index_dir or str(Path(tempfile.mkdtemp(prefix="webshop-speed-")) / "index")
    catalog = None if args.catalog == "builtin" else args.catalog
    if not args.no_heap:
        tracemalloc.start()
    envs, world, costs = build_envs(args, catalog, index_dir)
    timings, scores = play_round_robin(envs, args.episodes, args.seed)
    costs["rss_played"], costs["heap_played"] = rss_bytes(), heap_bytes()
    # What the instances themselves hold: drop all but the first and see the heap fall.
    costs["cached_queries"] = len(world.search._cache)
    while len(envs) > 1:
        envs.pop().close()
    costs["heap_dropped"] = heap_bytes()
    figures = speed_figures(args, world, index_dir, costs, timings, scores)
    if not args.no_heap:
        tracemalloc.stop()

    width = max(len(k) for k in figures)
    for key, value in figures.items():
        print(f"{key:<{width}}  {value}")
    if args.json:
        atomic_write_json(args.json, figures)
    envs[0].close()
    if args.page:
        page = write_results_page(
            "webshop_speed", "WebShop speed and memory: one process holding many env instances over one catalog",
            results_page_body(figures), command=command,
            load=[load_before[0], load_average()[0]])
        print(f"results page: {page}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
