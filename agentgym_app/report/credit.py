"""Reading the per-turn credit records a trainer wrote (`trainer.credit_records`) back onto episodes.

`merge_credit_file` attaches the records of a `credit.jsonl` to the episodes with the same
`episode_id` (and, when the record names its `update`, the episode of that update:
`meta["update"]`); `episode_credit` gives an episode's checked records by method.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from agentgym_opsd.episode import Episode
from agentgym_opsd.io import read_jsonl_numbered
from trainer.credit_records import CREDIT_KEY, TURN_FIELDS, check_credit, credit_record

__all__ = ["CREDIT_KEY", "TURN_FIELDS", "credit_record", "check_credit", "merge_credit_file", "episode_credit"]


def episode_credit(episode: Episode) -> dict[str, dict[str, Any]]:
    """The checked credit records of an episode, by method ({} when it has none)."""
    raw = episode.meta.get(CREDIT_KEY) or {}
    if not isinstance(raw, dict):
        raise ValueError(f"episode {episode.episode_id}: meta['credit'] must be a dict keyed by method")
    return {
        method: check_credit(record, len(episode.turns), where=f"episode {episode.episode_id}: credit[{method!r}]")
        for method, record in raw.items()
    }


def merge_credit_file(path: str | Path, episodes: Iterable[Episode]) -> int:
    """Attach the records of a credit.jsonl to the episodes with their `episode_id`; returns how
    many records found their episode. A bad record raises `DataFileError`/`ValueError` naming the
    file and line."""
    episodes = list(episodes)
    by_id = {e.episode_id: e for e in episodes}
    by_update = {(e.episode_id, e.meta.get("update")): e for e in episodes if e.meta.get("update") is not None}
    attached = 0
    for number, record in read_jsonl_numbered(path):
        where = f"{path}:{number}"
        episode_id, method = record.get("episode_id"), record.get("method")
        if not isinstance(episode_id, str) or not isinstance(method, str):
            raise ValueError(f"{where}: a credit line needs episode_id and method")
        # A record with "update" belongs to the episode of that id played at that update (a trainer
        # may play the same episode id at every update).
        update = record.get("update")
        episode = by_update.get((episode_id, update)) if update is not None else None
        if episode is None:
            episode = by_id.get(episode_id)
        if episode is None:
            continue
        body = {k: v for k, v in record.items() if k not in ("episode_id", "method")}
        episode.meta.setdefault(CREDIT_KEY, {})[method] = check_credit(body, len(episode.turns), where=where)
        attached += 1
    return attached
