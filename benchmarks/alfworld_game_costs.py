"""What one ALFWorld game costs a process: the figures behind the engine's caches (environments/alfworld/README.md).

Per game of the embedded panel (train split): its file, fast-downward's SAS translation as text and as the
compressed copy a compiled game keeps, the time to decompress it at a reset, and the propositions TextWorld
interns (in a table it never empties) when the game is compiled and reset, and the memory that only the table
keeps alive (what a process held per game played, before `bound_interned_propositions`). Per process: the copy of
fast-downward's library each engine loads, and one installed-version lookup of importlib.metadata.

    .venv/bin/python -m benchmarks.alfworld_game_costs [--games-per-type 2] [--page]

`--page` also writes the figures to docs/benchmarks/alfworld_game_costs.md.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import time
import tracemalloc
import zlib
from importlib import metadata

from benchmarks.common import add_page_argument, benchmark_command, load_average, markdown_table, write_results_page
from environments.alfworld import compiled
from environments.alfworld.env import AlfWorldEnv
from environments.alfworld.grammar import TextWorldImports


def results_page_body(rows: dict[str, list[float]], library_mb: float, lookups_ms: list[float]) -> str:
    """The results page's figures: per measure, the median and range over the games; the per-process costs."""
    table = [[name, f"{statistics.median(v):.2f}", f"{min(v):.2f}", f"{max(v):.2f}"] for name, v in rows.items()]
    games = len(next(iter(rows.values()), []))
    return (f"{games} embedded train games; per game:\n\n" + markdown_table(["measure", "median", "min", "max"], table)
            + "\n\nPer process:\n\n" + markdown_table(["cost", "figure"], [
                ["fast-downward library copied per engine", f"{library_mb:.1f} MB"],
                ["importlib.metadata.version, first lookup", f"{lookups_ms[0]:.1f} ms"],
                ["importlib.metadata.version, later lookups (median)", f"{statistics.median(lookups_ms[1:]):.1f} ms"]]))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--games-per-type", type=int, default=2, help="embedded train games per task type")
    add_page_argument(parser)
    args = parser.parse_args()
    load_before = load_average()
    command = benchmark_command("alfworld_game_costs")  # before anything can change sys.argv (alfworld's code does)

    import mementos.core
    from fast_downward.interface import DOWNWARD_LIB_PATH

    sizes = {"train": args.games_per_type, "valid_seen": 1, "valid_unseen": 1}
    env = AlfWorldEnv(split="train", panel_size=sizes, progress=True)
    proposition = TextWorldImports.load().Proposition
    names = ("file_kb", "sas_kb", "zlib_kb", "decompress_ms", "propositions", "table_only_kb")
    rows: dict[str, list[float]] = {k: [] for k in names}
    for seed, entry in enumerate(env.games):
        compiled.forget_compiled_games()
        mementos.core._memento_cache = {}  # count what this game alone interns (the bound is far above it)
        tracemalloc.start()
        env.reset(seed=seed)
        rows["propositions"].append(
            sum(1 for k in list(mementos.core._memento_cache) if type(k) is tuple and k and k[0] is proposition)
        )
        gc.collect()
        held = tracemalloc.get_traced_memory()[0]
        mementos.core._memento_cache = {}  # what only the table kept alive: what a process held per game played
        gc.collect()
        rows["table_only_kb"].append((held - tracemalloc.get_traced_memory()[0]) / 1000)
        tracemalloc.stop()
        game = env.engine.game
        t0 = time.perf_counter()
        for _ in range(100):
            zlib.decompress(game.sas_compressed)
        rows["decompress_ms"].append((time.perf_counter() - t0) * 10)
        rows["file_kb"].append(entry.game_file.stat().st_size / 1000)
        rows["sas_kb"].append(len(game.sas) / 1000)
        rows["zlib_kb"].append(len(game.sas_compressed) / 1000)
    env.close()

    lookups = []
    for _ in range(6):
        t0 = time.perf_counter()
        metadata.version("fast-downward-textworld")
        lookups.append((time.perf_counter() - t0) * 1000)
    print(f"machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}")
    print(f"{len(rows['file_kb'])} embedded train games; per game: median (min-max)")
    for name, values in rows.items():
        print(f"  {name:14s} {statistics.median(values):9.2f}  ({min(values):.2f}-{max(values):.2f})")
    print(f"fast-downward library copied per engine: {os.path.getsize(DOWNWARD_LIB_PATH) / 1e6:.1f} MB")
    later = statistics.median(lookups[1:])
    print(f"importlib.metadata.version: first lookup {lookups[0]:.1f} ms, then median {later:.1f} ms")
    if args.page:
        page = write_results_page(
            "alfworld_game_costs",
            "What one ALFWorld game costs a process: its files, SAS translation and interned propositions",
            results_page_body(rows, os.path.getsize(DOWNWARD_LIB_PATH) / 1e6, lookups),
            command=command,
            load=[load_before[0], load_average()[0]])
        print(f"results page: {page}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
