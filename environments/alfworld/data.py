"""Finding ALFWorld games: ALFWorld's `json_2.1.1` folders, from a user's path or the embedded panel.

A game is a folder `json_2.1.1/<split>/<task folder>/<trial>/` holding `game.tw-pddl` (and
`traj_data.json`, which the expert reads). The rules are AlfredTWEnv's: folders whose path contains
`movable` or `Sliced` are skipped, and so are games whose `game.tw-pddl` is missing or not marked
`"solvable": true`. The task type is the task folder's name up to its first `-`
(`pick_heat_then_place_in_recep-Potato-None-SinkBasin-14`), as ALFWorld's evaluation reads it, with
`traj_data.json`'s `task_type` as the fallback. Games are sorted by their path, so the same data gives
the same numbering everywhere.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from agentgym_opsd.contract import EnvUnavailable
from environments.alfworld.expert import TASK_TYPES

__all__ = ["GameEntry", "resolve_data_root", "discover_games", "read_traj_data", "read_task_params"]

SPLIT_FOLDERS = ("train", "valid_seen", "valid_unseen")


@dataclass(frozen=True)
class GameEntry:
    """One playable game.

    Attributes:
        task_id: the trial folder relative to `json_2.1.1/` ("train/pick_...-14/trial_T2019...").
        game_file: its `game.tw-pddl`.
        task_type: one of the six ALFWorld task types.
    """

    task_id: str
    game_file: Path
    task_type: str

    @property
    def folder(self) -> Path:
        return self.game_file.parent


def resolve_data_root(data_dir: str | os.PathLike[str] | None) -> Path:
    """The `json_2.1.1` folder under `data_dir` (or `$ALFWORLD_DATA`), with an error that says how to fix it."""
    if data_dir is None:
        env = os.environ.get("ALFWORLD_DATA")
        if not env:
            raise EnvUnavailable(
                "ALFWorld data: pass data_dir=PATH (a folder holding json_2.1.1/) or set ALFWORLD_DATA; "
                "`alfworld-download` fetches ALFWorld's games, or use the embedded panel (the default)"
            )
        data_dir = env
    root = Path(data_dir).expanduser()
    for candidate in (root / "json_2.1.1", root):
        if any((candidate / split).is_dir() for split in SPLIT_FOLDERS):
            return candidate
    raise EnvUnavailable(
        f"ALFWorld data: {root} holds no json_2.1.1/{{train,valid_seen,valid_unseen}} folders; "
        "point data_dir (or ALFWORLD_DATA) at the folder that contains json_2.1.1/"
    )


_SOLVABLE = re.compile(rb'"solvable"\s*:\s*(true|false|null)')


def _is_solvable(game_file: Path) -> bool:
    """The `solvable` flag of a game file (read from the file's tail, where alfworld writes it)."""
    try:
        size = game_file.stat().st_size
        with open(game_file, "rb") as f:
            f.seek(max(0, size - 65536))
            tail = f.read()
        matches = _SOLVABLE.findall(tail)
        if matches:
            return matches[-1] == b"true"
        return json.loads(game_file.read_text(encoding="utf-8")).get("solvable") is True
    except (OSError, ValueError):
        return False


def _task_type(task_folder: str, trial: Path) -> str | None:
    prefix = task_folder.split("-", 1)[0]
    if prefix in TASK_TYPES:
        return prefix
    value, _ = read_task_params(trial)
    return value if value in TASK_TYPES else None


@lru_cache(maxsize=64)
def discover_games(root: Path, split: str) -> tuple[GameEntry, ...]:
    """Every playable game of `split` under a `json_2.1.1` folder, sorted by task id."""
    if split not in SPLIT_FOLDERS:
        raise ValueError(f"split={split!r}: use one of {', '.join(SPLIT_FOLDERS)}")
    base = root / split
    if not base.is_dir():
        return ()
    entries: list[GameEntry] = []
    for dirpath, dirnames, filenames in os.walk(base):
        dirnames.sort()
        if "traj_data.json" not in filenames and "game.tw-pddl" not in filenames:
            continue
        trial = Path(dirpath)
        rel = trial.relative_to(root).as_posix()
        if "movable" in rel or "Sliced" in rel:
            continue
        game_file = trial / "game.tw-pddl"
        if "game.tw-pddl" not in filenames or not _is_solvable(game_file):
            continue
        task_type = _task_type(trial.parent.name, trial)
        if task_type is None:
            continue
        entries.append(GameEntry(rel, game_file, task_type))
    entries.sort(key=lambda e: e.task_id)
    return tuple(entries)


def read_traj_data(trial: Path) -> dict[str, Any] | None:
    """A trial folder's traj_data.json, or None (read from the file at each call: ALFWorld's files are
    a few hundred kB each, with the ALFRED plan and images; `read_task_params` keeps what plays need)."""
    try:
        data = json.loads((Path(trial) / "traj_data.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


@lru_cache(maxsize=8192)
def _task_params(path: str) -> tuple[Any, Any]:
    data = read_traj_data(Path(path))
    if data is None:
        return None, None
    return data.get("task_type"), data.get("pddl_params")


def read_task_params(trial: Path) -> tuple[str | None, dict[str, Any]]:
    """`(task_type, pddl_params)` of a trial's traj_data.json (`None, {}` without one), cached per
    process: only these two fields are kept, not the whole file (a parsed ALFWorld traj_data.json is
    about a MB in memory; a process cycling through 3,553 games kept them all)."""
    task_type, params = _task_params(str(trial))
    return (task_type if isinstance(task_type, str) else None), (dict(params) if isinstance(params, dict) else {})
