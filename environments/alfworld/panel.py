"""The embedded panel: a fixed set of generated games, built on first use and cached.

`ensure_panel(PanelSpec())` returns a folder laid out like ALFWorld's data
(`json_2.1.1/<split>/<task_type>-<Object>-None-<Receptacle>-<scene>/<trial>/{game.tw-pddl,traj_data.json,
initial_state.pddl}`),
so the same loader reads it and alfworld's own `AlfredTWEnv` can play it too. The default panel has 20
games per task type for `train` and 10 per type for `valid_seen` and `valid_unseen` (240 games).
`mix="alfworld"` keeps each split's total but shares it out in the proportions of ALFWorld's training
set (`ALFWORLD_TRAIN_COUNTS`: pick 790, look 308, clean 650, heat 459, cool 533, pick-two 813 of 3,553
games): 120 train games are 27 pick, 10 look, 22 clean, 16 heat, 18 cool, 27 pick-two. The k-th game
of a type is the same file in every panel of one seed and room. `task_types` restricts a panel to some
types (e.g. 1,000 Pick games for a warm start without generating 5,000 others); its games are the
same files as the full panel's games of those types.

It lives in
`<cache>/<GENERATOR_VERSION>-<seed>[-<room>][-r<cap>][-mixalfworld][-n<train>-<seen>-<unseen>][-only-<types>]/`,
with `<cache>` = `$AGENTGYM_OPSD_CACHE/alfworld` or `~/.cache/agentgym-opsd/alfworld`. It is generated once: into a
staging folder, under a file lock (concurrent processes wait for the first), renamed into place when complete,
and marked by `<split>.json` (sizes, seconds, the game list). Each split is generated on its first
use, so training (`train`) does not wait for the evaluation splits.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentgym_opsd.io import atomic_write_json, atomic_write_text
from environments.alfworld.engine import AlfredEngine
from environments.alfworld.expert import SUBSET_OF_TYPE, TASK_TYPES
from environments.alfworld.generator import GENERATOR_VERSION, ROOMS, generate_game, room_settings
from environments.alfworld.paths import cache_root

__all__ = ["PanelSpec", "DEFAULT_SIZES", "SPLITS", "MIXES", "ALFWORLD_TRAIN_COUNTS", "ensure_panel", "panel_dir",
           "read_manifest"]

SPLITS = ("train", "valid_seen", "valid_unseen")
DEFAULT_SIZES = {"train": 20, "valid_seen": 10, "valid_unseen": 10}
MIXES = ("uniform", "alfworld")
# Games of each type in ALFWorld's json_2.1.1 train split (3,553 in all), the proportions of mix="alfworld".
ALFWORLD_TRAIN_COUNTS = {
    "pick_and_place_simple": 790,
    "look_at_obj_in_light": 308,
    "pick_clean_then_place_in_recep": 650,
    "pick_heat_then_place_in_recep": 459,
    "pick_cool_then_place_in_recep": 533,
    "pick_two_obj_and_place": 813,
}


def mixed_counts(total: int, weights: dict[str, int] = ALFWORLD_TRAIN_COUNTS) -> dict[str, int]:
    """`total` games shared out in proportion to `weights` (largest remainders; ties in TASK_TYPES order)."""
    whole = sum(weights.values())
    exact = {t: total * weights[t] / whole for t in TASK_TYPES}
    counts = {t: int(v) for t, v in exact.items()}
    for t in sorted(TASK_TYPES, key=lambda t: -(exact[t] - counts[t]))[: total - sum(counts.values())]:
        counts[t] += 1
    return counts


@dataclass(frozen=True)
class PanelSpec:
    """Which panel: generator seed, room size (`full` or `small`, see generator.ROOMS) and receptacle cap,
    games per task type for each split, the mix of task types (`uniform` or `alfworld`), and the task
    types it holds (ALFWorld's full names, in TASK_TYPES order; all six by default)."""

    seed: int = 0
    room: str = "full"
    sizes: tuple[tuple[str, int], ...] = field(default_factory=lambda: tuple(DEFAULT_SIZES.items()))
    mix: str = "uniform"
    max_receptacles: int | None = None
    task_types: tuple[str, ...] = TASK_TYPES

    @classmethod
    def make(
        cls,
        seed: int = 0,
        room: str = "full",
        sizes: int | dict[str, int] | None = None,
        mix: str = "uniform",
        max_receptacles: int | None = None,
        task_types: tuple[str, ...] | list[str] | None = None,
    ) -> PanelSpec:
        """Build a spec; `sizes` is games per type (one number for every split, or a dict per split);
        `task_types` (ALFWorld's full names; None: all six) the types the panel holds."""
        if room not in ROOMS:
            raise ValueError(f"room={room!r}: use one of {', '.join(ROOMS)}")
        if mix not in MIXES:
            raise ValueError(f"mix={mix!r}: use one of {', '.join(MIXES)}")
        wanted = set(TASK_TYPES if task_types is None else task_types)
        if wanted - set(TASK_TYPES) or not wanted:
            raise ValueError(f"task_types={task_types!r}: use some of {', '.join(TASK_TYPES)}")
        types = tuple(t for t in TASK_TYPES if t in wanted)
        if mix != "uniform" and types != TASK_TYPES:
            raise ValueError(f"mix={mix!r} shares games out over all six task types; a panel of some types is uniform")
        room_settings(room, max_receptacles)  # checks the cap
        merged = dict(DEFAULT_SIZES)
        if isinstance(sizes, int):
            merged = {s: int(sizes) for s in SPLITS}
        elif sizes:
            unknown = set(sizes) - set(SPLITS)
            if unknown:
                raise ValueError(f"panel_size: unknown splits {sorted(unknown)}; use {', '.join(SPLITS)}")
            merged.update({k: int(v) for k, v in sizes.items()})
        if any(v < 0 for v in merged.values()):
            raise ValueError(f"panel_size must be >= 0, got {merged}")
        cap = None if max_receptacles is None else int(max_receptacles)
        return cls(int(seed), room, tuple((s, merged[s]) for s in SPLITS), mix, cap, types)

    def size(self, split: str) -> int:
        """Games per task type of a uniform panel (the mixed panel keeps six times this per split)."""
        return dict(self.sizes)[split]

    def count(self, split: str, task_type: str) -> int:
        """Games of `task_type` in `split`."""
        if task_type not in self.task_types:
            return 0
        if self.mix == "uniform":
            return self.size(split)
        return mixed_counts(self.size(split) * len(TASK_TYPES))[task_type]

    @property
    def name(self) -> str:
        parts = [f"{GENERATOR_VERSION}-{self.seed}"]
        if self.room != "full":
            parts.append(self.room)
        if self.max_receptacles is not None:
            parts.append(f"r{self.max_receptacles}")
        if self.mix != "uniform":
            parts.append(f"mix{self.mix}")
        if dict(self.sizes) != DEFAULT_SIZES:
            parts.append("n" + "-".join(str(n) for _, n in self.sizes))
        if self.task_types != TASK_TYPES:
            parts.append("only-" + "+".join(SUBSET_OF_TYPE[t] for t in self.task_types))
        return "-".join(parts)


def panel_dir(spec: PanelSpec, root: str | os.PathLike[str] | None = None) -> Path:
    """Where the panel lives (whether or not it is generated yet): `<root>/<spec.name>`."""
    return _root(root) / spec.name


def _root(root: str | os.PathLike[str] | None) -> Path:
    return Path(root).expanduser() if root is not None else cache_root()


def read_manifest(folder: Path, split: str) -> dict[str, Any] | None:
    """The manifest of a generated split (`<panel>/<split>.json`), or None while it is not generated."""
    try:
        return json.loads((folder / f"{split}.json").read_text())
    except (OSError, ValueError):
        return None


# ---------------------------------------------------------------------------------------------------------
# Generation.

_WORKER_ENGINE = None


def _make_game(job: tuple) -> tuple[str, str, str, int]:
    """Worker: generate one game and write its folder under `staging`; returns (split, type, relpath, steps)."""
    global _WORKER_ENGINE

    staging, cache, seed, room, split, task_type, index, max_receptacles = job
    if _WORKER_ENGINE is None:
        _WORKER_ENGINE = AlfredEngine()
    draft, walkthrough = generate_game(
        seed, room, split, task_type, index, _WORKER_ENGINE, cache_dir=cache, max_receptacles=max_receptacles
    )
    rel = f"{split}/{draft.folder}/{draft.trial}"
    folder = Path(staging) / "json_2.1.1" / rel
    data = draft.game_data()
    data["solvable"] = True
    data["walkthrough"] = walkthrough
    atomic_write_json(folder / "traj_data.json", draft.traj_data())
    atomic_write_text(folder / "initial_state.pddl", draft.problem)  # what alfworld-generate starts from
    atomic_write_json(folder / "game.tw-pddl", data, indent=None)
    return split, task_type, rel, len(walkthrough)


def _jobs(spec: PanelSpec, splits: list[str], staging: Path, cache: Path) -> list[tuple]:
    return [
        (str(staging), str(cache), spec.seed, spec.room, split, task_type, index, spec.max_receptacles)
        for split in splits
        for task_type in TASK_TYPES
        for index in range(spec.count(split, task_type))
    ]


def ensure_panel(
    spec: PanelSpec,
    root: str | os.PathLike[str] | None = None,
    *,
    splits: tuple[str, ...] | list[str] | None = None,
    workers: int | None = None,
    progress: bool = True,
) -> Path:
    """The panel's folder (the one holding `json_2.1.1/`), generating the requested splits first if needed.

    Each split is generated on its first use (training needs only `train`): into a staging folder,
    moved into place when complete, then marked by its manifest `<panel>/<split>.json`. A file lock makes
    concurrent processes wait for the one that generates.

    Args:
        spec: which panel.
        root: the cache folder (default `$AGENTGYM_OPSD_CACHE/alfworld` or `~/.cache/agentgym-opsd/alfworld`).
        splits: the splits needed (default: all three).
        workers: processes for generation (default: the machine's cores for big jobs, 1 for small ones).
        progress: show a tqdm bar while generating.
    """
    wanted = list(SPLITS if splits is None else splits)
    unknown = set(wanted) - set(SPLITS)
    if unknown:
        raise ValueError(f"unknown splits {sorted(unknown)}; use {', '.join(SPLITS)}")
    folder = panel_dir(spec, root)
    if all(read_manifest(folder, s) is not None for s in wanted):
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another process may be generating this panel: wait for it
        missing = [s for s in wanted if read_manifest(folder, s) is None]
        if not missing:
            return folder
        staging = folder / f".staging-{os.getpid()}"
        shutil.rmtree(staging, ignore_errors=True)
        try:
            manifests = _generate(spec, missing, staging, _root(root), workers=workers, progress=progress)

            for split in missing:
                target = folder / "json_2.1.1" / split
                if target.exists():  # left by a crash before the manifest was written
                    shutil.rmtree(target)
                source = staging / "json_2.1.1" / split
                if source.exists():
                    target.parent.mkdir(parents=True, exist_ok=True)
                    os.replace(source, target)
                atomic_write_json(folder / f"{split}.json", manifests[split])
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return folder


def _generate(
    spec: PanelSpec, splits: list[str], staging: Path, cache: Path, *, workers: int | None, progress: bool
) -> dict[str, dict[str, Any]]:
    from tqdm import tqdm

    jobs = _jobs(spec, splits, staging, cache)
    if workers is None:
        workers = 1 if len(jobs) < 40 else max(1, min(os.cpu_count() or 1, 8))
    started = time.perf_counter()
    results: list[tuple[str, str, str, int]] = []
    label = f"generating ALFWorld games {spec.name} ({', '.join(splits)})"
    bar = tqdm(total=len(jobs), desc=label, disable=not progress or not jobs, unit="game")
    try:
        if workers <= 1:
            for job in jobs:
                results.append(_make_game(job))
                bar.update(1)
        else:
            for result in _run_workers(jobs, workers):
                results.append(result)
                bar.update(1)
    finally:
        bar.close()
    seconds = round(time.perf_counter() - started, 2)
    manifests: dict[str, dict[str, Any]] = {}
    for split in splits:
        games = {t: sorted(rel for s, tt, rel, _ in results if s == split and tt == t) for t in spec.task_types}
        steps = {t: [n for s, tt, _, n in results if s == split and tt == t] for t in spec.task_types}
        manifests[split] = {
            "generator_version": GENERATOR_VERSION,
            "seed": spec.seed,
            "room": spec.room,
            "max_receptacles": spec.max_receptacles,
            "mix": spec.mix,
            "task_types": list(spec.task_types),
            "split": split,
            "games_per_type": spec.size(split),  # of a uniform panel; "games" lists what this one holds
            "seconds_for_this_run": seconds,
            "splits_in_this_run": list(splits),
            "games_in_this_run": len(jobs),
            "workers": workers,
            "mean_walkthrough": {t: round(sum(v) / len(v), 2) if v else None for t, v in steps.items()},
            "games": games,
        }
    return manifests


def _run_workers(jobs: list[tuple], workers: int):
    """Generate in `workers` child interpreters (plain subprocesses: nothing of the caller's __main__ is
    re-run, unlike multiprocessing's spawn); yields each game's result as it is written."""
    import subprocess
    import sys

    env = dict(os.environ)
    repo = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join([repo, *sys.path])
    procs = []
    for k in range(workers):
        shard = jobs[k::workers]
        if not shard:
            continue
        proc = subprocess.Popen(
            [sys.executable, "-m", "environments.alfworld.panel", "--worker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        proc.stdin.write(json.dumps(shard))
        proc.stdin.close()
        procs.append(proc)
    import selectors

    sel = selectors.DefaultSelector()
    for proc in procs:
        sel.register(proc.stdout, selectors.EVENT_READ, proc)
    open_streams = len(procs)
    try:
        while open_streams:
            for key, _ in sel.select():
                line = key.fileobj.readline()
                if not line:
                    sel.unregister(key.fileobj)
                    open_streams -= 1
                    continue
                split, task_type, rel, n = json.loads(line)
                yield split, task_type, rel, int(n)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
    failed = [p.returncode for p in procs if p.returncode != 0]
    if failed:
        raise RuntimeError(f"ALFWorld panel generation: a worker failed (exit codes {failed}); see its error above")


def _worker_main() -> None:
    """`python -m environments.alfworld.panel --worker`: read a JSON list of jobs on stdin, write one JSON
    line per generated game on stdout."""
    import sys

    jobs = json.loads(sys.stdin.read())
    for job in jobs:
        print(json.dumps(list(_make_game(tuple(job)))), flush=True)


if __name__ == "__main__":
    import sys

    if sys.argv[1:] == ["--worker"]:
        _worker_main()
    else:
        raise SystemExit("usage: python -m environments.alfworld.panel --worker  (internal: panel generation)")
