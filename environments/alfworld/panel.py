"""The embedded panel: a fixed set of generated games, built on first use and cached.

`ensure_panel(PanelSpec())` returns a folder laid out like ALFWorld's data
(`json_2.1.1/<split>/<task_type>-<Object>-None-<Receptacle>-<scene>/<trial>/{game.tw-pddl,traj_data.json}`),
so the same loader reads it and alfworld's own `AlfredTWEnv` can play it too. The default panel has 20
games per task type for `train` and 10 per type for `valid_seen` and `valid_unseen` (240 games).

It lives in `<cache>/<GENERATOR_VERSION>-<seed>[-<room>][-n<train>-<seen>-<unseen>]/`, with `<cache>` =
`$AGENTGYM_CACHE/alfworld` or `~/.cache/agentgym-opsd/alfworld`. It is generated once: into a staging
folder, under a file lock (concurrent processes wait for the first), renamed into place when complete,
and marked by `panel.json` (sizes, seconds, the game list).
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

from environments.alfworld.expert import TASK_TYPES
from environments.alfworld.generator import GENERATOR_VERSION, ROOMS
from environments.alfworld.paths import cache_root

__all__ = ["PanelSpec", "DEFAULT_SIZES", "SPLITS", "ensure_panel", "panel_dir", "read_manifest"]

SPLITS = ("train", "valid_seen", "valid_unseen")
DEFAULT_SIZES = {"train": 20, "valid_seen": 10, "valid_unseen": 10}
MANIFEST = "panel.json"


@dataclass(frozen=True)
class PanelSpec:
    """Which panel: generator seed, room size (`full` or `small`, see generator.ROOMS), games per task type
    for each split."""

    seed: int = 0
    room: str = "full"
    sizes: tuple[tuple[str, int], ...] = field(default_factory=lambda: tuple(DEFAULT_SIZES.items()))

    @classmethod
    def make(cls, seed: int = 0, room: str = "full", sizes: int | dict[str, int] | None = None) -> PanelSpec:
        """Build a spec; `sizes` is games per type (one number for every split, or a dict per split)."""
        if room not in ROOMS:
            raise ValueError(f"room={room!r}: use one of {', '.join(ROOMS)}")
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
        return cls(int(seed), room, tuple((s, merged[s]) for s in SPLITS))

    def size(self, split: str) -> int:
        return dict(self.sizes)[split]

    @property
    def name(self) -> str:
        parts = [f"{GENERATOR_VERSION}-{self.seed}"]
        if self.room != "full":
            parts.append(self.room)
        if dict(self.sizes) != DEFAULT_SIZES:
            parts.append("n" + "-".join(str(n) for _, n in self.sizes))
        return "-".join(parts)


def panel_dir(spec: PanelSpec, root: str | os.PathLike[str] | None = None) -> Path:
    """Where the panel lives (whether or not it is generated yet): `<root>/<spec.name>`."""
    return _root(root) / spec.name


def _root(root: str | os.PathLike[str] | None) -> Path:
    return Path(root).expanduser() if root is not None else cache_root()


def read_manifest(folder: Path) -> dict[str, Any] | None:
    try:
        return json.loads((folder / MANIFEST).read_text())
    except (OSError, ValueError):
        return None


# ---------------------------------------------------------------------------------------------------------
# Generation.

_WORKER_ENGINE = None


def _make_game(job: tuple[str, str, int, str, str, str, int]) -> tuple[str, str, str, int]:
    """Worker: generate one game and write its folder under `staging`; returns (split, type, relpath, steps)."""
    global _WORKER_ENGINE
    from environments.alfworld.engine import AlfredEngine
    from environments.alfworld.generator import generate_game

    from agentgym_opsd.io import atomic_write_json

    staging, cache, seed, room, split, task_type, index = job
    if _WORKER_ENGINE is None:
        _WORKER_ENGINE = AlfredEngine()
    draft, walkthrough = generate_game(seed, room, split, task_type, index, _WORKER_ENGINE, cache_dir=cache)
    rel = f"{split}/{draft.folder}/{draft.trial}"
    folder = Path(staging) / "json_2.1.1" / rel
    data = draft.game_data()
    data["solvable"] = True
    data["walkthrough"] = walkthrough
    atomic_write_json(folder / "traj_data.json", draft.traj_data())
    atomic_write_json(folder / "game.tw-pddl", data, indent=None)
    return split, task_type, rel, len(walkthrough)


def _jobs(spec: PanelSpec, staging: Path, cache: Path) -> list[tuple[str, str, int, str, str, str, int]]:
    return [
        (str(staging), str(cache), spec.seed, spec.room, split, task_type, index)
        for split in SPLITS
        for task_type in TASK_TYPES
        for index in range(spec.size(split))
    ]


def ensure_panel(
    spec: PanelSpec,
    root: str | os.PathLike[str] | None = None,
    *,
    workers: int | None = None,
    progress: bool = True,
) -> Path:
    """The panel's folder (the one holding `json_2.1.1/`), generating it first if needed.

    Args:
        spec: which panel.
        root: the cache folder (default `$AGENTGYM_CACHE/alfworld` or `~/.cache/agentgym-opsd/alfworld`).
        workers: processes for generation (default: the machine's cores for big panels, 1 for small).
        progress: show a tqdm bar while generating.
    """
    base = _root(root)
    folder = panel_dir(spec, root)
    if read_manifest(folder) is not None:
        return folder
    base.mkdir(parents=True, exist_ok=True)
    with open(base / f".{spec.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another process may be generating the same panel: wait for it
        if read_manifest(folder) is not None:
            return folder
        if folder.exists():  # left by a crash before the manifest was written
            shutil.rmtree(folder)
        staging = base / f".{spec.name}.staging-{os.getpid()}"
        shutil.rmtree(staging, ignore_errors=True)
        try:
            manifest = _generate(spec, staging, base, workers=workers, progress=progress)
            from agentgym_opsd.io import atomic_write_json

            atomic_write_json(staging / MANIFEST, manifest)
            os.replace(staging, folder)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return folder


def _generate(spec: PanelSpec, staging: Path, cache: Path, *, workers: int | None, progress: bool) -> dict[str, Any]:
    from tqdm import tqdm

    jobs = _jobs(spec, staging, cache)
    if workers is None:
        workers = 1 if len(jobs) < 40 else max(1, min(os.cpu_count() or 1, 8))
    started = time.perf_counter()
    results: list[tuple[str, str, str, int]] = []
    bar = tqdm(total=len(jobs), desc=f"generating ALFWorld panel {spec.name}", disable=not progress, unit="game")
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
    games: dict[str, dict[str, list[str]]] = {s: {t: [] for t in TASK_TYPES} for s in SPLITS}
    steps: dict[str, list[int]] = {t: [] for t in TASK_TYPES}
    for split, task_type, rel, n in sorted(results):
        games[split][task_type].append(rel)
        steps[task_type].append(n)
    return {
        "generator_version": GENERATOR_VERSION,
        "seed": spec.seed,
        "room": spec.room,
        "sizes": dict(spec.sizes),
        "seconds": round(time.perf_counter() - started, 2),
        "workers": workers,
        "mean_walkthrough": {t: round(sum(v) / len(v), 2) if v else None for t, v in steps.items()},
        "games": games,
    }


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
