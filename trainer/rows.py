"""Episodes -> token rows: exactly the ids each turn of each episode read and wrote.

`build_rows(episodes, tokenizer, span_mode=...)` turns `Episode` records into padded `[R, T]` token
rows with, per token, the turn that generated it (`turn_id`, -1 for everything else) and whether it
is in the turn's scored span (`span`), plus the per-episode and per-turn facts `compute_advantages`
reads. `rows.credit_batch(student_logprobs=..., teacher_logprobs=...)` is the credit core's input.

Token-in, token-out
-------------------
A turn played by a token-level policy (`Turn.tokens`, written by `trainer.sampling.PolicySampler`
and by the OpenRLHF executor) is laid out from its recorded ids: the ids added to the context
before the turn (`prompt_ids`), then the ids the policy sampled, ending with the stop id it sampled.
Nothing is re-tokenized, so the update scores exactly the tokens the policy produced, in exactly
the context it produced them in. A turn played by a text agent (the expert's warm-start episodes,
an HTTP endpoint) gets the ids `trainer.chat.text_turn_tokens` reconstructs with the same chat
framing the rollout uses: one tokenization path for rollouts and rows.

Rows
----
A row is a chain of turns whose contexts extend one another: a full-chat episode is one row
(prompt, response 1 + its stop id, feedback 1, ..., response K + its stop id); a `window:k`
episode has one row per turn (its prompt, its response). Both kinds may be mixed in one call.

- Generated tokens: the sampled ids, the stop id included (the model emitted it to end the turn:
  it receives advantage). A turn cut at the token cap has no stop id. Everything else (system,
  user, observations, template text, padding) has turn_id -1.
- Spans: `action_only` = the tokens overlapping the action block's characters
  (`StepInfo.action_span`, tags included; empty for a turn without a valid action: such a turn
  keeps its plain advantage); `clean_step` = every generated token of the turn.
- Truncation is counted, never silent: rows longer than `max_length` are cut at the end (the
  causal prefix must stay intact); `truncated_rows`, `truncated_tokens` (generated tokens lost)
  and `truncated_turns` say how much, and a warning is logged.
- Groups: `Episode.group`, or the env id and task id when it is empty (`Episode.group_key`). GiGPO's state
  keys are the states each turn acted in (`Episode.state_keys_before()`), interned to ints across
  the call (the empty key is unknown: -1).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np
import torch

from agentgym_opsd.context import ContextPolicy
from agentgym_opsd.episode import Episode, TurnTokens
from trainer.chat import (
    ChatFraming,
    ChatTemplateMismatch,
    episode_messages,
    framing_for,
    generated_char_offsets,
    render_prompt,
    text_turn_tokens,
)
from trainer.credit import CreditBatch
from trainer.credit.config import SPAN_MODES

__all__ = ["TokenRows", "build_rows", "render_prompt", "episode_messages", "ChatTemplateMismatch"]

log = logging.getLogger(__name__)


@dataclass
class TokenRows:
    """Padded token rows of a batch of episodes, with per-token turn ids and scored spans.

    Token tensors [R, T] (right-padded with the tokenizer's pad token):
        input_ids: long.
        attention_mask: long; 1 on real tokens.
        turn_id: long; the 0-based turn that generated the token; -1 for tokens the model did not
            generate (system, user, observations, chat-template text, padding).
        span: bool; the scored span of each turn for `span_mode`.
    Row tensors [R]:
        row_episode: long; index into the `episodes` list given to `build_rows`.
        row_turn: long; -1 for a whole-episode row, else the one turn the row holds.
        prompt_len: long; tokens before the row's first response (the first prompt; the part a
            teacher's privileged prefix replaces).
        length: long; real tokens in the row.
    Episode tensors [E] (E = len(episodes)):
        episode_group: long (dense ids; `group_names[i]` is the name), success: bool, score: float,
        invalid_turns: long, num_turns: long.
    Turn tensors [E, K]:
        step_reward: float (the env's reward of each turn), state_id: long (-1 unknown / past the end).
        rollout_logprobs: float; the sampling log-prob of each recorded generated token (0 where
            the turn was played by a text agent or its log-probs were not recorded).
        recorded: bool; generated tokens whose ids and log-probs come from the rollout's record.
    Counters: truncated_rows, truncated_tokens (generated tokens cut off), truncated_turns,
    recorded_turns and text_turns (turns laid out from recorded ids, and from text).
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    turn_id: torch.Tensor
    span: torch.Tensor
    row_episode: torch.Tensor
    row_turn: torch.Tensor
    prompt_len: torch.Tensor
    length: torch.Tensor
    episode_group: torch.Tensor
    success: torch.Tensor
    score: torch.Tensor
    invalid_turns: torch.Tensor
    num_turns: torch.Tensor
    step_reward: torch.Tensor
    state_id: torch.Tensor
    rollout_logprobs: torch.Tensor
    recorded: torch.Tensor
    span_mode: str
    contexts: list[str]
    group_names: list[str]
    episode_ids: list[str]
    pad_token_id: int
    end_of_turn: str | None
    truncated_rows: int = 0
    truncated_tokens: int = 0
    truncated_turns: int = 0
    recorded_turns: int = 0
    text_turns: int = 0
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def num_rows(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def num_tokens(self) -> int:
        return int(self.attention_mask.sum())

    def to(self, device: torch.device | str) -> TokenRows:
        """A copy with every tensor on `device`."""
        values = {}
        for f in fields(self):
            v = getattr(self, f.name)
            values[f.name] = v.to(device) if isinstance(v, torch.Tensor) else v
        return TokenRows(**values)

    def generated_mask(self) -> torch.Tensor:
        """[R, T] bool: tokens the model generated (turn_id >= 0)."""
        return self.turn_id >= 0

    def credit_batch(
        self,
        student_logprobs: torch.Tensor | None = None,
        teacher_logprobs: torch.Tensor | None = None,
        teacher_scored: torch.Tensor | None = None,
        teacher_truncated: int = 0,
    ) -> CreditBatch:
        """The credit core's input for these rows (log-probs aligned to `input_ids`, [R, T])."""
        return CreditBatch(
            turn_id=self.turn_id,
            span=self.span,
            row_episode=self.row_episode,
            episode_group=self.episode_group,
            success=self.success,
            num_turns=self.num_turns,
            score=self.score,
            invalid_turns=self.invalid_turns,
            step_reward=self.step_reward,
            state_id=self.state_id,
            student_logprobs=student_logprobs,
            teacher_logprobs=teacher_logprobs,
            teacher_scored=teacher_scored,
            teacher_truncated=int(teacher_truncated),
            meta={"span_mode": self.span_mode, "truncated_rows": self.truncated_rows, "episode_ids": self.episode_ids},
        )


# ---------------------------------------------------------------------------------------------
# Row assembly


def _records(episode: Episode, policy: ContextPolicy, framing: ChatFraming) -> tuple[list[TurnTokens], bool]:
    """The turns' token records and whether they were recorded by the rollout (else rebuilt from text)."""
    recorded = [t.tokens for t in episode.turns]
    if all(r is not None for r in recorded) and str(policy) == str(ContextPolicy.parse(episode.context)):
        for k, r in enumerate(recorded):
            if r.extends != (k > 0 and policy.kind == "full"):
                raise ValueError(
                    f"episode {episode.episode_id!r}, turn {k}: the recorded context "
                    f"{'extends' if r.extends else 'does not extend'} the previous turn's, which a "
                    f"{policy} context does not do; the record is not from this episode's rollout"
                )
        return recorded, True
    return text_turn_tokens(framing, episode, policy), False


def _response_offsets(tokenizer, turn, record: TurnTokens, is_recorded: bool) -> list[tuple[int, int]]:
    """Character range of each sampled id in the turn's response (the stop id: empty, at the end)."""
    content = record.sampled_ids[:-1] if record.finish_reason == "stop" and is_recorded else record.sampled_ids
    if is_recorded:
        text, offsets = generated_char_offsets(tokenizer, content)
        if text != turn.response:
            raise ValueError(
                f"turn {turn.step.turn} of episode {turn.step.episode_id!r}: the recorded ids decode to a different "
                "text than the turn's response; the episode was played with another tokenizer"
            )
    else:
        encoded = tokenizer(turn.response, add_special_tokens=False, return_offsets_mapping=True)
        offsets = [tuple(o) for o in encoded["offset_mapping"]]
        content = record.sampled_ids[: len(offsets)]
    end = len(turn.response)
    return list(offsets) + [(end, end)] * (len(record.sampled_ids) - len(content))


def _span_mask(offsets: list[tuple[int, int]], action_span: tuple[int, int] | None) -> np.ndarray:
    """Tokens whose characters overlap the action span (a token holding the first bytes of a
    character that starts inside the span counts)."""
    mask = np.zeros(len(offsets), dtype=bool)
    if action_span is None or not offsets:
        return mask
    a, b = action_span
    o = np.asarray(offsets, dtype=np.int64).reshape(-1, 2)
    nonempty = o[:, 1] > o[:, 0]
    return np.where(nonempty, (o[:, 0] < b) & (o[:, 1] > a), (o[:, 0] >= a) & (o[:, 0] < b))


@dataclass
class _Row:
    """A row being assembled: its ids and, per id, the turn that generated it (-1: context), whether
    it is in the turn's span, the rollout's log-prob and whether that log-prob was recorded."""

    episode: int
    turn: int  # the one turn of a window row, -1 for a chain of several
    ids: list[int] = field(default_factory=list)
    turn_id: list[np.ndarray] = field(default_factory=list)
    span: list[np.ndarray] = field(default_factory=list)
    logprobs: list[np.ndarray] = field(default_factory=list)
    recorded: list[np.ndarray] = field(default_factory=list)
    prompt_len: int = 0

    def add_context(self, ids: list[int]) -> None:
        n = len(ids)
        self.ids += ids
        self.turn_id.append(np.full(n, -1, dtype=np.int64))
        self.span.append(np.zeros(n, dtype=bool))
        self.logprobs.append(np.zeros(n, dtype=np.float32))
        self.recorded.append(np.zeros(n, dtype=bool))

    def add_response(self, ids: list[int], turn: int, span: np.ndarray, logprobs: list[float] | None) -> None:
        n = len(ids)
        self.ids += ids
        self.turn_id.append(np.full(n, turn, dtype=np.int64))
        self.span.append(span)
        recorded = logprobs is not None
        self.logprobs.append(np.asarray(logprobs, dtype=np.float32) if recorded else np.zeros(n, dtype=np.float32))
        self.recorded.append(np.full(n, recorded, dtype=bool))

    def flat(self) -> _FlatRow:
        def join(parts: list[np.ndarray], dtype) -> np.ndarray:
            return np.concatenate(parts) if parts else np.zeros(0, dtype=dtype)

        return _FlatRow(self.ids, join(self.turn_id, np.int64), join(self.span, bool), join(self.logprobs, np.float32),
                        join(self.recorded, bool), self.prompt_len)  # fmt: skip


@dataclass
class _FlatRow:
    ids: list[int]
    turn_id: np.ndarray
    span: np.ndarray
    logprobs: np.ndarray
    recorded: np.ndarray
    prompt_len: int

    def cut(self, max_length: int) -> tuple[int, int]:
        """Cut the row at `max_length` tokens; returns (generated tokens lost, turns they belong to)."""
        lost = self.turn_id[max_length:]
        self.ids = self.ids[:max_length]
        self.turn_id, self.span = self.turn_id[:max_length], self.span[:max_length]
        self.logprobs, self.recorded = self.logprobs[:max_length], self.recorded[:max_length]
        self.prompt_len = min(self.prompt_len, max_length)
        return int((lost >= 0).sum()), len(set(lost[lost >= 0].tolist()))


def build_rows(
    episodes: Sequence[Episode],
    tokenizer,
    *,
    context: str | None = None,
    span_mode: str = "action_only",
    max_length: int | None = None,
    chat_template_kwargs: dict[str, Any] | None = None,
) -> TokenRows:
    """Token rows for `episodes` (see the module docstring).

    Args:
        episodes: finished episodes (drop errored ones first: they have no real outcome).
        tokenizer: the policy's fast tokenizer, with a chat template.
        context: None to use each episode's own context policy, or `full` / `window:k` for all
            (episodes recorded under another context are then rebuilt from their text).
        span_mode: `action_only` or `clean_step` (see the module docstring).
        max_length: rows longer than this are cut at the end (counted and logged).
        chat_template_kwargs: passed to `apply_chat_template` (use the rollout's, e.g. enable_thinking).

    Returns:
        TokenRows; `row_episode` indexes `episodes`.
    """
    if span_mode not in SPAN_MODES:
        raise ValueError(f"span_mode {span_mode!r}: use one of {', '.join(SPAN_MODES)}")
    if not getattr(tokenizer, "is_fast", False):
        raise ValueError("build_rows needs a fast tokenizer (offset mapping); load it with use_fast=True")
    if max_length is not None and max_length < 1:
        raise ValueError(f"max_length must be >= 1, got {max_length}")
    kwargs = dict(chat_template_kwargs or {})
    framing = framing_for(tokenizer, **kwargs)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    if pad_id is None:
        raise ValueError("the tokenizer has neither a pad token nor an eos token to pad rows with")

    # 1. Rows: chains of turns whose contexts extend one another.
    rows: list[_Row] = []
    contexts: list[str] = []
    recorded_turns = text_turns = 0
    for i, episode in enumerate(episodes):
        if episode.error is not None:
            raise ValueError(
                f"episode {episode.episode_id!r} errored ({episode.error}); drop errored episodes before "
                "building rows (they have no real outcome)"
            )
        policy = ContextPolicy.parse(context if context is not None else episode.context)
        contexts.append(str(policy))
        is_recorded = _add_episode_rows(rows, i, episode, policy, tokenizer, framing, span_mode)
        recorded_turns += len(episode.turns) if is_recorded else 0
        text_turns += 0 if is_recorded else len(episode.turns)

    # 2. Flatten, truncate (counted, never silent) and pad.
    flat = [row.flat() for row in rows]
    truncated_rows, truncated_tokens, truncated_turns = _truncate(flat, max_length)
    padded = _pad(flat, int(pad_id))

    # 3. Episode and turn facts.
    groups, group_names, step_reward, state_id = _episode_facts(episodes)

    return TokenRows(
        **padded,
        row_episode=torch.tensor([r.episode for r in rows], dtype=torch.long),
        row_turn=torch.tensor([r.turn for r in rows], dtype=torch.long),
        prompt_len=torch.tensor([r.prompt_len for r in flat], dtype=torch.long),
        length=padded["attention_mask"].sum(dim=1),
        episode_group=torch.tensor(groups, dtype=torch.long),
        success=torch.tensor([e.success for e in episodes], dtype=torch.bool),
        score=torch.tensor([e.score for e in episodes], dtype=torch.float32),
        invalid_turns=torch.tensor([e.invalid_turns for e in episodes], dtype=torch.long),
        num_turns=torch.tensor([len(e.turns) for e in episodes], dtype=torch.long),
        step_reward=step_reward,
        state_id=state_id,
        span_mode=span_mode,
        contexts=contexts,
        group_names=group_names,
        episode_ids=[e.episode_id for e in episodes],
        pad_token_id=int(pad_id),
        end_of_turn=framing.close_text or None,
        truncated_rows=truncated_rows,
        truncated_tokens=truncated_tokens,
        truncated_turns=truncated_turns,
        recorded_turns=recorded_turns,
        text_turns=text_turns,
        meta={"chat_template_kwargs": kwargs},
    )


def _add_episode_rows(rows: list[_Row], index: int, episode: Episode, policy: ContextPolicy, tokenizer,
                      framing: ChatFraming, span_mode: str) -> bool:  # fmt: skip
    """Append the rows of episode number `index` to `rows`: a new row wherever a turn's context does
    not extend the previous turn's. Returns whether its token records came from the rollout."""
    records, is_recorded = _records(episode, policy, framing)
    row: _Row | None = None
    for k, (turn, record) in enumerate(zip(episode.turns, records, strict=True)):
        if row is None or not record.extends:
            row = _Row(index, -1 if policy.kind == "full" else k, prompt_len=len(record.prompt_ids))
            rows.append(row)
        row.add_context(record.prompt_ids)
        if span_mode == "clean_step":
            span = np.ones(len(record.sampled_ids), dtype=bool)
        else:
            span = _span_mask(_response_offsets(tokenizer, turn, record, is_recorded), turn.step.action_span)
        has_logprobs = is_recorded and len(record.logprobs) == len(record.sampled_ids)
        row.add_response(record.sampled_ids, k, span, record.logprobs if has_logprobs else None)
    return is_recorded


def _truncate(rows: list[_FlatRow], max_length: int | None) -> tuple[int, int, int]:
    """Cut the rows longer than `max_length` (a warning says how much was lost); returns the rows
    cut, the generated tokens lost and the turns those belonged to."""
    if max_length is None:
        return 0, 0, 0
    truncated_rows = truncated_tokens = truncated_turns = 0
    for row in rows:
        if len(row.ids) > max_length:
            tokens, turns = row.cut(max_length)
            truncated_rows += 1
            truncated_tokens += tokens
            truncated_turns += turns
    if truncated_rows:
        log.warning(
            "build_rows: %d of %d rows cut at max_length=%d (%d generated tokens of %d turns lost)",
            truncated_rows, len(rows), max_length, truncated_tokens, truncated_turns,
        )
    return truncated_rows, truncated_tokens, truncated_turns


def _pad(rows: list[_FlatRow], pad_id: int) -> dict[str, torch.Tensor]:
    """The rows as right-padded `[R, T]` tensors (TokenRows' fields of the same names); the span
    holds generated tokens only."""
    R = len(rows)
    T = max([len(r.ids) for r in rows] + [1])
    input_ids = torch.full((R, T), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((R, T), dtype=torch.long)
    turn_id = torch.full((R, T), -1, dtype=torch.long)
    span = torch.zeros((R, T), dtype=torch.bool)
    rollout_logprobs = torch.zeros((R, T), dtype=torch.float32)
    recorded = torch.zeros((R, T), dtype=torch.bool)
    for r, row in enumerate(rows):
        L = len(row.ids)
        input_ids[r, :L] = torch.tensor(row.ids, dtype=torch.long)
        attention_mask[r, :L] = 1
        turn_id[r, :L] = torch.from_numpy(row.turn_id)
        span[r, :L] = torch.from_numpy(row.span)
        rollout_logprobs[r, :L] = torch.from_numpy(row.logprobs)
        recorded[r, :L] = torch.from_numpy(row.recorded)
    span &= turn_id >= 0
    return {"input_ids": input_ids, "attention_mask": attention_mask, "turn_id": turn_id, "span": span,
            "rollout_logprobs": rollout_logprobs, "recorded": recorded}  # fmt: skip


def _episode_facts(episodes: Sequence[Episode]) -> tuple[list[int], list[str], torch.Tensor, torch.Tensor]:
    """Each episode's group index, the group names, and per turn the reward and the interned state
    key it acted in (-1: unknown)."""
    E = len(episodes)
    K = max([len(e.turns) for e in episodes] + [1])
    group_index: dict[str, int] = {}
    state_index: dict[str, int] = {}
    groups = []
    step_reward = torch.zeros((E, K), dtype=torch.float32)
    state_id = torch.full((E, K), -1, dtype=torch.long)
    for i, episode in enumerate(episodes):
        groups.append(group_index.setdefault(episode.group_key, len(group_index)))
        for k, (turn, key) in enumerate(zip(episode.turns, episode.state_keys_before(), strict=True)):
            step_reward[i, k] = float(turn.reward)
            if key:
                state_id[i, k] = state_index.setdefault(key, len(state_index))
    return groups, list(group_index), step_reward, state_id
