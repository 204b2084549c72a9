"""The per-turn credit record of an update: what the credit core gave each turn, for reports.

The local trainer writes, for each episode it updated on, what its credit method gave each turn
(`update_credit_records`, from the `CreditParts` of the very `compute_advantages` call whose
advantages the update used), to `credit.jsonl` in its run folder. The report reads them
(`agentgym_app.report`); nothing recomputes them.
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

`credit_record` builds one record from plain lists and checks it; `check_credit` checks one.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

__all__ = ["CREDIT_KEY", "TURN_FIELDS", "credit_record", "check_credit", "update_credit_records"]


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


def update_credit_records(episodes, rows, parts, *, method: str, update: int | None, tokenizer) -> list[dict[str, Any]]:
    """`credit.jsonl` records (one per episode) of one update, from the `CreditParts` that
    `compute_advantages(..., return_parts=True)` returned for `rows` (built from `episodes`).

    Per turn: the turn's mean advantage, and where the method defines them the evidence e_k,
    AgentOPSD's B_k, dB_k and w_k, StepOPSD's scored tokens ([text, w_t, delta_t]) and their span.
    """
    records = []
    generated = rows.generated_mask()
    for e, episode in enumerate(episodes):
        K = episode.num_turns
        turn_adv: list[float | None] = [None] * K
        tokens: list[Any] = [None] * K
        spans: list[Any] = [None] * K
        for r in (rows.row_episode == e).nonzero().squeeze(1).tolist():
            for k in range(K):
                mine = (rows.turn_id[r] == k) & generated[r]
                if not bool(mine.any()):
                    continue
                turn_adv[k] = float(parts.advantages[r][mine].mean())
                if parts.token_weight is not None:
                    scored = mine & rows.span[r]
                    positions = scored.nonzero().squeeze(1).tolist()
                    if positions:
                        pieces = [tokenizer.decode([int(rows.input_ids[r, p])]) for p in positions]
                        tokens[k] = [(text, float(parts.token_weight[r, p]), float(parts.delta[r, p]))
                                     for text, p in zip(pieces, positions, strict=True)]
                        turn = episode.turns[k]
                        spans[k] = _span_of(turn.response, "".join(pieces), turn.step.action_span)

        def column(table: Any, shift: int = 0, e: int = e, K: int = K) -> list[float | None] | None:
            if table is None:
                return None
            values = [float(x) for x in table[e, shift : shift + K].tolist()]
            return [v if math.isfinite(v) else None for v in values]

        record = credit_record(
            advantage=float(parts.A_episode[e]), turns=K, gap=column(parts.evidence), turn_advantage=turn_adv,
            belief=column(parts.belief, 1), belief_delta=column(parts.belief_delta), weight=column(parts.turn_weight),
            spans=spans if parts.token_weight is not None else None,
            tokens=tokens if parts.token_weight is not None else None, update=update,
        )
        records.append({"episode_id": episode.episode_id, "method": method, **record})
    return records


def _span_of(response: str, text: str, action_span: Any) -> list[int] | None:
    """Where the scored tokens' text sits in the response (None when it is not a slice of it)."""
    if not text:
        return None
    if action_span is not None:
        start = max(0, int(action_span[0]) - 4)
        found = response.find(text, start)
        if found >= 0:
            return [found, found + len(text)]
    found = response.find(text)
    return [found, found + len(text)] if found >= 0 else None
