"""The per-turn credit record the report shows, written by the trainer beside its episodes.

A training run stores, for each episode it updated on, what each credit method gave each turn.
It lives in `Episode.meta["credit"]` (saved with the episode in its JSONL), keyed by method:

    episode.meta["credit"] = {
        "stepopsd": {                       # method: "grpo", "gigpo", "stepopsd", "agentopsd", ...
            "advantage": 0.87,              # A: the episode's sequence (GRPO) advantage
            "update": 3,                    # optional: the training update it was computed at
            "turns": [                      # one entry per turn, in turn order (len == len(turns))
                {
                    "gap": -1.92,           # e_k = sum over the scored span of (lp_T - lp_S)
                    "advantage": 0.91,      # mean of A~ over the turn's generated tokens
                    "belief": 0.61,         # AgentOPSD B_k            (absent for other methods)
                    "belief_delta": 0.05,   # AgentOPSD dB_k = B_k - B_{k-1}
                    "weight": 1.04,         # AgentOPSD turn weight w_k
                    "span": [31, 58],       # the scored span's character offsets in the response
                    "tokens": [             # StepOPSD: the scored tokens of the span, in order:
                        ["<action>", 1.00, 0.01],   # [decoded text, weight w_t, gap delta_t]
                        ["go", 1.12, 0.40],
                        ...
                    ],
                },
                ...
            ],
        },
        "agentopsd": {...},
    }

Every per-turn field is optional (`None` or absent: the method does not define it); the report
shows what is there. When `span` and `tokens` are both given, the token texts joined are the
response's `span` slice, and the report draws the heat map in place inside the response.

A trainer that writes credit apart from its episodes appends the same record, one per episode and
method, to `credit.jsonl` (in the run folder, or in `training/<method>/` beside the trainer's
`episodes/update_NNNNN.jsonl` files):

    {"episode_id": "...", "method": "stepopsd", "advantage": 0.87, "update": 3, "turns": [...]}

`merge_credit_file` attaches those records to the episodes with the same `episode_id` (and, when the
record names its `update`, the episode of that update: `meta["update"]`).
`credit_record` builds one record from plain lists (what the trainer has after a credit pass) and
checks it, so producers need not write the dictionary by hand.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from agentgym_opsd.episode import Episode
from agentgym_opsd.io import read_jsonl_numbered

__all__ = ["CREDIT_KEY", "TURN_FIELDS", "credit_record", "check_credit", "merge_credit_file", "episode_credit"]

CREDIT_KEY = "credit"
TURN_FIELDS = ("gap", "advantage", "belief", "belief_delta", "weight", "span", "tokens")


def _number(value: Any, where: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{where}: expected a number, got {type(value).__name__}")
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"{where}: not finite ({value})")
    return value


def check_credit(record: dict[str, Any], num_turns: int | None = None, *, where: str = "credit") -> dict[str, Any]:
    """Check one method's record (see the module docstring); returns it normalised (floats, lists).

    Raises:
        ValueError naming the bad field.
    """
    if not isinstance(record, dict):
        raise ValueError(f"{where}: a credit record is a dict")
    out: dict[str, Any] = {"advantage": _number(record.get("advantage"), f"{where}.advantage")}
    if record.get("update") is not None:
        out["update"] = int(record["update"])
    turns = record.get("turns")
    if not isinstance(turns, list):
        raise ValueError(f"{where}.turns: expected a list with one entry per turn")
    if num_turns is not None and len(turns) != num_turns:
        raise ValueError(f"{where}.turns: {len(turns)} entries for an episode of {num_turns} turns")
    out_turns = []
    for k, turn in enumerate(turns):
        here = f"{where}.turns[{k}]"
        if turn is None:
            out_turns.append({})
            continue
        if not isinstance(turn, dict):
            raise ValueError(f"{here}: expected a dict")
        unknown = set(turn) - set(TURN_FIELDS)
        if unknown:
            raise ValueError(f"{here}: unknown field(s) {sorted(unknown)}; known: {list(TURN_FIELDS)}")
        t: dict[str, Any] = {}
        for name in ("gap", "advantage", "belief", "belief_delta", "weight"):
            if turn.get(name) is not None:
                t[name] = _number(turn[name], f"{here}.{name}")
        if turn.get("span") is not None:
            span = turn["span"]
            if not (isinstance(span, (list, tuple)) and len(span) == 2 and 0 <= int(span[0]) <= int(span[1])):
                raise ValueError(f"{here}.span: expected [start, end] with 0 <= start <= end")
            t["span"] = [int(span[0]), int(span[1])]
        if turn.get("tokens") is not None:
            tokens = []
            for i, token in enumerate(turn["tokens"]):
                if not (isinstance(token, (list, tuple)) and len(token) in (2, 3) and isinstance(token[0], str)):
                    raise ValueError(f"{here}.tokens[{i}]: expected [text, weight, gap]")
                weight = _number(token[1], f"{here}.tokens[{i}] weight")
                gap = _number(token[2], f"{here}.tokens[{i}] gap") if len(token) == 3 else None
                tokens.append([token[0], weight, gap])
            t["tokens"] = tokens
        out_turns.append(t)
    out["turns"] = out_turns
    return out


def credit_record(
    *,
    advantage: float,
    turns: int,
    gap: Sequence[float | None] | None = None,
    turn_advantage: Sequence[float | None] | None = None,
    belief: Sequence[float | None] | None = None,
    belief_delta: Sequence[float | None] | None = None,
    weight: Sequence[float | None] | None = None,
    spans: Sequence[Sequence[int] | None] | None = None,
    tokens: Sequence[Sequence[tuple[str, float, float | None]] | None] | None = None,
    update: int | None = None,
) -> dict[str, Any]:
    """One method's credit record for an episode of `turns` turns, from per-turn lists (each list
    has one entry per turn; None where a turn has no value)."""
    columns = {
        "gap": gap,
        "advantage": turn_advantage,
        "belief": belief,
        "belief_delta": belief_delta,
        "weight": weight,
        "span": spans,
        "tokens": tokens,
    }
    rows: list[dict[str, Any]] = [{} for _ in range(turns)]
    for name, values in columns.items():
        if values is None:
            continue
        if len(values) != turns:
            raise ValueError(f"credit_record: {name} has {len(values)} entries for {turns} turns")
        for row, value in zip(rows, values, strict=True):
            if value is not None:
                row[name] = [list(t) for t in value] if name == "tokens" else (list(value) if name == "span" else value)
    record: dict[str, Any] = {"advantage": advantage, "turns": rows}
    if update is not None:
        record["update"] = update
    return check_credit(record, turns)


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
