"""`CreditBatch`: the one input layout of every credit method, and the turn bookkeeping they share.

Token tensors are `[R, T]` (rows x tokens, right-padded). Position t of a row holds token t; a
log-prob at position t is log p(token t | tokens < t) (position 0 has none: any value, never read).
A row is a whole episode (full-chat context, every turn in it) or one turn (window context); nothing
below cares which, because every token says which episode (`row_episode`) and which turn
(`turn_id`) it belongs to. Episode-level tensors are `[E]`, turn-level tensors `[E, K]` with
K = max turns; turn k of episode e is the flat index `e * K + k`.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

import torch

__all__ = ["CreditBatch", "TurnLayout"]


@dataclass
class CreditBatch:
    """Everything `compute_advantages` reads.

    Token tensors [R, T]:
        turn_id: long; the turn (0-based) that generated the token, -1 for every token the model did
            not generate (system, user, observations, chat-template text, padding).
        span: bool; the scored span T_k of each turn (a subset of the generated tokens).
        student_logprobs: float; lp_S, the rollout policy's log-probs (needed by teacher methods).
        teacher_logprobs: float; lp_T with privileged context (needed by teacher methods).
        teacher_scored: bool; where the teacher did score (None: the whole span). Span tokens it could
            not score (teacher context too long) get delta = 0.
    Row tensor [R]:
        row_episode: long; the episode (index into the episode tensors) the row belongs to.
    Episode tensors [E]:
        episode_group: long; group id (episodes of one task sampled together share it).
        success: bool; the raw success flag.
        score: float; the env's graded score (1/0 where it only knows success).
        invalid_turns: long; malformed or inadmissible turns.
        num_turns: long; K_i.
    Turn tensors [E, K] (GiGPO):
        step_reward: float; r_t, the env's reward of each turn (0 past the end).
        state_id: long; the interned state key of the state each turn acted in; equal ints are equal
            states; -1 = unknown or past the end (never clustered).
    Counters:
        teacher_truncated: teacher contexts that did not fit (reported in the diagnostics).
    """

    turn_id: torch.Tensor
    span: torch.Tensor
    row_episode: torch.Tensor
    episode_group: torch.Tensor
    success: torch.Tensor
    num_turns: torch.Tensor
    score: torch.Tensor | None = None
    invalid_turns: torch.Tensor | None = None
    step_reward: torch.Tensor | None = None
    state_id: torch.Tensor | None = None
    student_logprobs: torch.Tensor | None = None
    teacher_logprobs: torch.Tensor | None = None
    teacher_scored: torch.Tensor | None = None
    teacher_truncated: int = 0
    meta: dict = field(default_factory=dict)

    @property
    def num_rows(self) -> int:
        return int(self.turn_id.shape[0])

    @property
    def num_episodes(self) -> int:
        return int(self.episode_group.shape[0])

    @property
    def max_turns(self) -> int:
        return int(self.num_turns.max().item()) if self.num_turns.numel() else 0

    @property
    def device(self) -> torch.device:
        return self.turn_id.device

    def to(self, device: torch.device | str) -> CreditBatch:
        """A copy with every tensor on `device`."""
        values = {}
        for f in fields(self):
            v = getattr(self, f.name)
            values[f.name] = v.to(device) if isinstance(v, torch.Tensor) else v
        return CreditBatch(**values)

    def validate(self, needs_teacher: bool = False, needs_steps: bool = False) -> None:
        """Raise ValueError with the fix when shapes, dtypes or indices are inconsistent."""
        R, T = self.turn_id.shape if self.turn_id.dim() == 2 else (None, None)
        if R is None:
            raise ValueError(f"turn_id must be [rows, tokens], got shape {tuple(self.turn_id.shape)}")
        if self.span.shape != self.turn_id.shape:
            raise ValueError(f"span {tuple(self.span.shape)} must have turn_id's shape {tuple(self.turn_id.shape)}")
        if self.row_episode.shape != (R,):
            raise ValueError(f"row_episode must be [{R}], got {tuple(self.row_episode.shape)}")
        E = self.num_episodes
        for name in ("success", "num_turns", "score", "invalid_turns"):
            v = getattr(self, name)
            if v is not None and v.shape != (E,):
                raise ValueError(f"{name} must be [{E}] (one per episode), got {tuple(v.shape)}")
        if R and E == 0:
            raise ValueError("rows point at episodes, but the batch has no episode tensors")
        if R:
            lo, hi = int(self.row_episode.min()), int(self.row_episode.max())
            if lo < 0 or hi >= E:
                raise ValueError(f"row_episode holds {lo}..{hi}; it must index the {E} episodes")
            lowest, highest = torch.aminmax(self.turn_id, dim=1) if T else (None, None)
            if T and (int(lowest.min()) < -1 or bool((highest >= self.num_turns[self.row_episode]).any())):
                raise ValueError("turn_id must be -1 or a turn index < num_turns of the row's episode")
        if needs_teacher:
            for name in ("student_logprobs", "teacher_logprobs"):
                v = getattr(self, name)
                if v is None:
                    raise ValueError(f"this method needs {name} [rows, tokens]: score the batch first")
                if v.shape != self.turn_id.shape:
                    raise ValueError(f"{name} {tuple(v.shape)} must have turn_id's shape {tuple(self.turn_id.shape)}")
            if self.teacher_scored is not None and self.teacher_scored.shape != self.turn_id.shape:
                raise ValueError("teacher_scored must have turn_id's shape")
        if needs_steps:
            K = self.max_turns
            for name in ("step_reward", "state_id"):
                v = getattr(self, name)
                if v is None:
                    raise ValueError(f"GiGPO needs {name} [episodes, max_turns]")
                if v.shape[0] != E or v.shape[1] < K:
                    raise ValueError(f"{name} must be [{E}, >= {K}], got {tuple(v.shape)}")


@dataclass
class TurnLayout:
    """The generated tokens of a batch as one flat vector, and where each one's turn lives.

    Every per-token computation runs on the N generated tokens only (observation and padding tokens
    never receive advantage), gathered once; `to_rows` puts results back into [R, T].

    index: [N] long; flat positions (into R * T) of the generated tokens, in row-major order.
    turn: [N] long; the token's turn in the flat [E * K] turn table (e * K + k).
    episode: [N] long; the token's episode.
    span: [N] bool; the token is in its turn's scored span.
    exists: [E, K] bool; k < K_e.
    """

    E: int
    K: int
    R: int
    T: int
    index: torch.Tensor
    turn: torch.Tensor
    episode: torch.Tensor
    span: torch.Tensor
    exists: torch.Tensor

    @classmethod
    def of(cls, batch: CreditBatch) -> TurnLayout:
        R, T = batch.turn_id.shape
        E, K = batch.num_episodes, max(batch.max_turns, 1)
        index = (batch.turn_id >= 0).view(-1).nonzero().squeeze(1)
        turn_id = batch.turn_id.view(-1)[index]
        episode = batch.row_episode[torch.div(index, T, rounding_mode="trunc")] if T else index
        exists = torch.arange(K, device=batch.device).unsqueeze(0) < batch.num_turns.unsqueeze(1)
        span = batch.span.reshape(-1)[index]
        return cls(E, K, R, T, index, episode * K + turn_id, episode, span, exists)

    @property
    def num_generated(self) -> int:
        return int(self.index.numel())

    def take(self, x: torch.Tensor) -> torch.Tensor:
        """The generated tokens' values of an [R, T] tensor  ->  [N]."""
        return x.reshape(-1)[self.index]

    def to_rows(self, values: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """[N] values back into an [R, T] tensor, 0 on tokens the model did not generate."""
        out = torch.zeros(self.R * self.T, dtype=dtype, device=values.device)
        out[self.index] = values.to(dtype)
        return out.view(self.R, self.T)

    def turn_sum(self, values: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """[E, K] float64 sums of [N] values over each turn's tokens (where `mask` holds).

        Masked-out tokens add 0 (a `where`, not a boolean selection: no nonzero pass, no NaN leak).
        Tokens are summed in float64 (docs/credit.md#properties: e_k and m_k meet 1e-6 with float32 inputs);
        the [N] upcast is per token, the memory of one float64 vector.
        """
        values = values.to(torch.float64)
        if mask is not None:
            values = torch.where(mask, values, torch.zeros((), dtype=values.dtype, device=values.device))
        out = torch.zeros(self.E * self.K, dtype=torch.float64, device=values.device)
        return out.index_add_(0, self.turn, values).view(self.E, self.K).to(torch.float64)

    def turn_count(self, mask: torch.Tensor | None = None) -> torch.Tensor:
        """[E, K] long: number of tokens of each turn (where `mask` holds)."""
        ones = torch.ones_like(self.turn) if mask is None else mask.to(torch.long)
        out = torch.zeros(self.E * self.K, dtype=torch.long, device=self.turn.device)
        return out.index_add_(0, self.turn, ones).view(self.E, self.K)

    def gather(self, per_turn: torch.Tensor) -> torch.Tensor:
        """Each generated token takes its turn's value from `per_turn` [E, K]  ->  [N]."""
        return per_turn.reshape(-1)[self.turn]
