"""Episodes -> token rows: the policy's chat template, and exactly which tokens each turn generated.

`build_rows(episodes, tokenizer, span_mode=...)` turns `Episode` records into padded `[R, T]` token
rows with, per token, the turn that generated it (`turn_id`, -1 for everything else) and whether it
is in the turn's scored span (`span`), plus the per-episode and per-turn facts `compute_advantages`
reads. `rows.credit_batch(student_logprobs=..., teacher_logprobs=...)` is the credit core's input.

Rows
----
- Full-chat episodes (context `full`): one row per episode holding every turn, in the order the
  conversation happened: prompt, response 1, end-of-turn, observation 1, ..., response K,
  end-of-turn. The context of turn k in the row is exactly what `render_prompt` gives for the
  episode's turn-k messages.
- Window episodes (context `window:k`): one row per turn: that turn's prompt, its response and the
  end-of-turn token. Both kinds may be mixed in one call.

Decisions (documented because they matter for exact credit)
-----------------------------------------------------------
1. Responses verbatim. Qwen3's chat template rewrites earlier assistant turns (it drops their
   `<think>` reasoning) when a conversation is re-rendered, so rendering the whole chat with
   `apply_chat_template` would not contain what the model generated. Instead the template is
   rendered with a unique placeholder in place of every assistant message; the rendered text is
   split at the placeholders, and the template pieces around them are kept while each response
   goes in verbatim. Every template piece before a response is checked to end with the template's
   generation prompt, and (`verify="first"`, the default) the first multi-turn episode of each
   call is checked turn by turn: the row's prefix before response k must equal the template's
   rendering of the turn-k prompt. A template that fails raises `ChatTemplateMismatch`, never a
   silently wrong row. `render_prompt(tokenizer, messages)` gives that same prompt text; a rollout
   agent that renders its prompts with it sees exactly the context the trainer scores.
2. Tokenized piece by piece. Every template piece and every response is tokenized on its own (one
   batched call of the fast tokenizer) and the ids are concatenated, so a token never straddles
   the template/response boundary (BPE would otherwise merge `assistant\\n` with a response that
   starts with a newline) and each response's tokens are the tokenizer's tokens of that response
   alone, the best reconstruction of the generated ids when they were not stored.
3. Exact char -> token mapping by offsets. The action span (`StepInfo.action_span`, character
   offsets into the response) maps to tokens through the fast tokenizer's offset mapping of the
   response: a token is in the span when its characters overlap the span's. A token that merges
   span text with neighbouring text (`：<` in `好的：<action>`) is therefore in the span, so the
   whole action block, tags included, is always covered. No prefix is ever re-tokenized.
4. End-of-turn counts as generated. The special token the template puts right after an assistant
   message (`<|im_end|>` for Qwen: the eos token, or another special token) was emitted by the
   model to stop: it gets the turn's `turn_id` (it receives advantage) and is in the `clean_step` span, not
   in the `action_only` span. A turn whose generation was cut at a token cap (rollout records
   `turn.info["finish_reason"] == "length"`) did not emit it: the token stays in the context with
   turn_id -1 (and the last turn's is dropped). The newline the template adds after it is template.
5. Spans: `action_only` = the tokens of the action block, tags included (empty for a turn without
   a valid action: such a turn keeps its plain advantage); `clean_step` = every generated token of
   the turn (response + end-of-turn).
6. Truncation is counted, never silent: rows longer than `max_length` are cut at the end (the
   causal prefix must stay intact); `truncated_rows`, `truncated_tokens` (generated tokens lost)
   and `truncated_turns` say how much, and a warning is logged.
7. Groups: `Episode.group`, or the env id and task id when it is empty. GiGPO's state keys are the
   states each turn acted in (`Episode.state_keys_before()`), interned to ints across the call
   (the empty key is unknown: -1).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np
import torch

from agentgym_opsd.context import ContextPolicy, HistoryItem, Message
from agentgym_opsd.episode import Episode
from trainer.credit import CreditBatch
from trainer.credit.config import SPAN_MODES

__all__ = ["TokenRows", "build_rows", "render_prompt", "episode_messages", "ChatTemplateMismatch"]

log = logging.getLogger(__name__)

_SENTINEL = "\ue000{}\ue001"  # private-use code points: never in a chat template, checked absent in texts


class ChatTemplateMismatch(ValueError):
    """The tokenizer's chat template does not render a conversation the way its turns were generated."""


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
    Counters: truncated_rows, truncated_tokens (generated tokens cut off), truncated_turns.
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
    span_mode: str
    contexts: list[str]
    group_names: list[str]
    episode_ids: list[str]
    pad_token_id: int
    end_of_turn: str | None
    truncated_rows: int = 0
    truncated_tokens: int = 0
    truncated_turns: int = 0
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
            meta={"span_mode": self.span_mode, "truncated_rows": self.truncated_rows},
        )


# ---------------------------------------------------------------------------------------------
# Chat template rendering with verbatim assistant turns


def _sentinel(k: int) -> str:
    return _SENTINEL.format(k)


def _render(tokenizer, messages: list[Message], add_generation_prompt: bool, kwargs: dict[str, Any]) -> str:
    text = tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=add_generation_prompt, **kwargs
    )
    if not isinstance(text, str):
        raise ChatTemplateMismatch(f"apply_chat_template(tokenize=False) returned {type(text).__name__}, not str")
    return text


def _split(text: str, n: int) -> list[str]:
    """Split rendered text at placeholders 0..n-1 (each exactly once, in order) -> n + 1 pieces."""
    pieces, rest = [], text
    for k in range(n):
        mark = _sentinel(k)
        if rest.count(mark) != 1:
            raise ChatTemplateMismatch(
                f"the chat template rendered assistant message {k} {rest.count(mark)} times (expected once, "
                "verbatim); this template cannot be used for multi-turn rows"
            )
        before, rest = rest.split(mark)
        pieces.append(before)
    pieces.append(rest)
    return pieces


def _with_placeholders(messages: list[Message]) -> tuple[list[Message], list[str]]:
    out, originals = [], []
    for m in messages:
        if m.get("role") == "assistant":
            out.append({**m, "content": _sentinel(len(originals))})
            originals.append(m["content"])
        else:
            out.append(m)
    return out, originals


def render_prompt(tokenizer, messages: list[Message], **chat_template_kwargs: Any) -> str:
    """The prompt text for `messages` with every assistant message verbatim, ending with the
    generation prompt: the same text `build_rows` puts before the next response.

    Use it in a rollout agent so that the model samples from exactly the context the trainer scores
    (Qwen3's own template would drop earlier turns' reasoning).
    """
    placeholder_messages, originals = _with_placeholders(messages)
    pieces = _split(_render(tokenizer, placeholder_messages, True, chat_template_kwargs), len(originals))
    text = pieces[0]
    for original, piece in zip(originals, pieces[1:], strict=True):
        text += original + piece
    return text


def episode_messages(episode: Episode, k: int, context: str | ContextPolicy | None = None) -> list[Message]:
    """The chat before turn k of `episode` under `context` (default: the episode's own)."""
    policy = ContextPolicy.parse(context if context is not None else episode.context)
    history = [HistoryItem(t.response, t.action, t.observation) for t in episode.turns[:k]]
    return policy.messages(episode.instructions, episode.initial_observation, history)


def _placeholder_messages(episode: Episode, k: int, policy: ContextPolicy) -> list[Message]:
    """Turn-k messages with placeholder j in place of response j."""
    history = [HistoryItem(_sentinel(j), t.action, t.observation) for j, t in enumerate(episode.turns[:k])]
    return policy.messages(episode.instructions, episode.initial_observation, history)


def _generation_prompt(tokenizer, kwargs: dict[str, Any]) -> str:
    messages = [{"role": "user", "content": "x"}]
    with_gp = _render(tokenizer, messages, True, kwargs)
    without = _render(tokenizer, messages, False, kwargs)
    if not with_gp.startswith(without):
        raise ChatTemplateMismatch("the chat template's generation prompt is not a suffix of the rendered chat")
    return with_gp[len(without) :]


def _end_of_turn(tokenizer, kwargs: dict[str, Any]) -> str | None:
    """The special token the template puts right after an assistant message (the model emits it to
    stop): the eos token, or another special token (`<|im_end|>` where eos is `<|endoftext|>`);
    None when the template closes assistant messages with ordinary text."""
    messages = [{"role": "user", "content": "x"}, {"role": "assistant", "content": _sentinel(0)}, {"role": "user", "content": "y"}]
    after = _split(_render(tokenizer, messages, False, kwargs), 1)[1]
    candidates = [tokenizer.eos_token] + sorted(getattr(tokenizer, "all_special_tokens", []), key=len, reverse=True)
    for token in candidates:
        if token and after.startswith(token):
            return token
    return None


# ---------------------------------------------------------------------------------------------
# Row assembly


@dataclass
class _Piece:
    text: str
    turn: int = -1  # generated by this turn, or -1
    kind: str = "template"  # template | response | eot
    action_span: tuple[int, int] | None = None


def _cut_at_length(turn) -> bool:
    return str(turn.info.get("finish_reason", "")) == "length"


def _check_text(episode: Episode) -> None:
    texts = [episode.instructions, episode.initial_observation] + [
        s for t in episode.turns for s in (t.response, t.observation, t.action or "")
    ]
    if any("\ue000" in s or "\ue001" in s for s in texts):
        raise ValueError(f"episode {episode.episode_id}: text holds U+E000/U+E001, which build_rows reserves")


def _full_row(
    episode: Episode,
    policy: ContextPolicy,
    tokenizer,
    kwargs: dict[str, Any],
    generation_prompt: str,
    eot: str | None,
    verify: bool,
) -> list[_Piece]:
    K = len(episode.turns)
    rendered = _render(tokenizer, _placeholder_messages(episode, K, policy), False, kwargs)
    between = _split(rendered, K)  # between[k] precedes response k; between[K] follows the last
    if verify:
        for k in range(K):
            prompt = _render(tokenizer, _placeholder_messages(episode, k, policy), True, kwargs)
            if prompt != "".join(between[j] + _sentinel(j) for j in range(k)) + between[k]:
                raise ChatTemplateMismatch(
                    f"episode {episode.episode_id}, turn {k}: the chat template renders the turn's prompt "
                    "differently from the conversation's prefix (it rewrites earlier turns); rows would not "
                    "match what the model saw. Use a window context (one row per turn), pass the rollout's "
                    "chat_template_kwargs, or verify='none' to accept the difference."
                )
    pieces: list[_Piece] = []
    for k, turn in enumerate(episode.turns):
        before = between[k]
        if k > 0 and eot is not None:
            before = before[len(eot) :]  # the eot after response k-1 was emitted as its own piece
        if not before.endswith(generation_prompt):
            raise ChatTemplateMismatch(
                f"episode {episode.episode_id}, turn {k}: the template's assistant header differs from its "
                f"generation prompt {generation_prompt!r} (e.g. enable_thinking=False); rows would not match "
                "what the model saw. Use a window context or the same chat_template_kwargs as the rollout."
            )
        pieces.append(_Piece(before))
        pieces.append(_Piece(turn.response, k, "response", turn.step.action_span))
        after = between[k + 1]
        if eot is not None and after.startswith(eot):
            if _cut_at_length(turn):
                if k + 1 < K:
                    pieces.append(_Piece(eot))  # in the context, but the model did not emit it
            else:
                pieces.append(_Piece(eot, k, "eot"))
        elif eot is not None:
            raise ChatTemplateMismatch(f"the template does not close assistant message {k} with {eot!r}")
    return pieces


def _turn_row(
    episode: Episode, k: int, policy: ContextPolicy, tokenizer, kwargs: dict[str, Any], eot: str | None
) -> list[_Piece]:
    # Responses the prompt shows (none under window contexts) are context, written verbatim.
    prompt = render_prompt(tokenizer, episode_messages(episode, k, policy), **kwargs)
    turn = episode.turns[k]
    pieces = [_Piece(prompt), _Piece(turn.response, k, "response", turn.step.action_span)]
    if eot is not None and not _cut_at_length(turn):
        pieces.append(_Piece(eot, k, "eot"))
    return pieces


def build_rows(
    episodes: Sequence[Episode],
    tokenizer,
    *,
    context: str | None = None,
    span_mode: str = "action_only",
    max_length: int | None = None,
    chat_template_kwargs: dict[str, Any] | None = None,
    verify: str = "first",
) -> TokenRows:
    """Token rows for `episodes` with the policy tokenizer's chat template.

    Args:
        episodes: finished episodes (drop errored ones first: they have no real outcome).
        tokenizer: the policy's fast tokenizer (offset mapping needed), with a chat template.
        context: None to use each episode's own context policy, or `full` / `window:k` for all.
            `full` gives one row per episode, `window:k` one row per turn.
        span_mode: `action_only` or `clean_step` (see the module docstring).
        max_length: rows longer than this are cut at the end (counted and logged).
        chat_template_kwargs: passed to `apply_chat_template` (use the rollout's, e.g.
            enable_thinking).
        verify: `first` (check the first multi-turn full-chat episode turn by turn), `all`, or `none`.

    Returns:
        TokenRows; `row_episode` indexes `episodes`.
    """
    if span_mode not in SPAN_MODES:
        raise ValueError(f"span_mode {span_mode!r}: use one of {', '.join(SPAN_MODES)}")
    if verify not in ("first", "all", "none"):
        raise ValueError(f"verify {verify!r}: use 'first', 'all' or 'none'")
    if not getattr(tokenizer, "is_fast", False):
        raise ValueError("build_rows needs a fast tokenizer (offset mapping); load it with use_fast=True")
    if max_length is not None and max_length < 1:
        raise ValueError(f"max_length must be >= 1, got {max_length}")
    kwargs = dict(chat_template_kwargs or {})
    generation_prompt = _generation_prompt(tokenizer, kwargs)
    eot = _end_of_turn(tokenizer, kwargs)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    if pad_id is None:
        raise ValueError("the tokenizer has neither a pad token nor an eos token to pad rows with")

    # 1. Pieces of every row.
    row_pieces: list[list[_Piece]] = []
    row_episode: list[int] = []
    row_turn: list[int] = []
    contexts: list[str] = []
    verified = False
    for i, episode in enumerate(episodes):
        if episode.error is not None:
            raise ValueError(
                f"episode {episode.episode_id!r} errored ({episode.error}); drop errored episodes before "
                "building rows (they have no real outcome)"
            )
        _check_text(episode)
        policy = ContextPolicy.parse(context if context is not None else episode.context)
        contexts.append(str(policy))
        if not episode.turns:
            continue
        if policy.kind == "full":
            check = verify == "all" or (verify == "first" and not verified and len(episode.turns) >= 2)
            row_pieces.append(_full_row(episode, policy, tokenizer, kwargs, generation_prompt, eot, check))
            verified = verified or check
            row_episode.append(i)
            row_turn.append(-1)
        else:
            for k in range(len(episode.turns)):
                row_pieces.append(_turn_row(episode, k, policy, tokenizer, kwargs, eot))
                row_episode.append(i)
                row_turn.append(k)

    # 2. One batched tokenizer call over every piece.
    flat = [p for pieces in row_pieces for p in pieces]
    if flat:
        encoded = tokenizer(
            [p.text for p in flat], add_special_tokens=False, return_offsets_mapping=True, return_attention_mask=False
        )
        piece_ids, piece_offsets = encoded["input_ids"], encoded["offset_mapping"]
    else:
        piece_ids, piece_offsets = [], []

    # 3. Assemble rows.
    ids_rows, tid_rows, span_rows, prompt_lens = [], [], [], []
    n = 0
    for pieces in row_pieces:
        ids: list[int] = []
        tid: list[np.ndarray] = []
        spn: list[np.ndarray] = []
        for j, piece in enumerate(pieces):
            pid, off = piece_ids[n], piece_offsets[n]
            n += 1
            m = len(pid)
            ids.extend(pid)
            tid.append(np.full(m, piece.turn, dtype=np.int64))
            if piece.kind == "response" and span_mode == "action_only":
                mask = np.zeros(m, dtype=bool)
                if piece.action_span is not None and m:
                    a, b = piece.action_span
                    o = np.asarray(off, dtype=np.int64).reshape(m, 2)
                    mask = (o[:, 0] < b) & (o[:, 1] > a)  # token characters overlap [a, b)
                spn.append(mask)
            else:
                spn.append(np.full(m, piece.kind != "template" and span_mode == "clean_step", dtype=bool))
            if j == 0:
                prompt_lens.append(m)
        ids_rows.append(ids)
        tid_rows.append(np.concatenate(tid) if tid else np.zeros(0, dtype=np.int64))
        span_rows.append(np.concatenate(spn) if spn else np.zeros(0, dtype=bool))

    # 4. Truncation (counted, never silent).
    truncated_rows = truncated_tokens = truncated_turns = 0
    if max_length is not None:
        for r, ids in enumerate(ids_rows):
            if len(ids) > max_length:
                lost = tid_rows[r][max_length:]
                truncated_rows += 1
                truncated_tokens += int((lost >= 0).sum())
                truncated_turns += len(set(lost[lost >= 0].tolist()))
                ids_rows[r] = ids[:max_length]
                tid_rows[r] = tid_rows[r][:max_length]
                span_rows[r] = span_rows[r][:max_length]
                prompt_lens[r] = min(prompt_lens[r], max_length)
        if truncated_rows:
            log.warning(
                "build_rows: %d of %d rows cut at max_length=%d (%d generated tokens of %d turns lost)",
                truncated_rows, len(ids_rows), max_length, truncated_tokens, truncated_turns,
            )

    # 5. Pad into tensors.
    R = len(ids_rows)
    T = max([len(x) for x in ids_rows] + [1])
    input_ids = torch.full((R, T), int(pad_id), dtype=torch.long)
    attention_mask = torch.zeros((R, T), dtype=torch.long)
    turn_id = torch.full((R, T), -1, dtype=torch.long)
    span = torch.zeros((R, T), dtype=torch.bool)
    for r in range(R):
        L = len(ids_rows[r])
        input_ids[r, :L] = torch.tensor(ids_rows[r], dtype=torch.long)
        attention_mask[r, :L] = 1
        turn_id[r, :L] = torch.from_numpy(tid_rows[r])
        span[r, :L] = torch.from_numpy(span_rows[r])

    # 6. Episode and turn facts.
    E = len(episodes)
    K = max([len(e.turns) for e in episodes] + [1])
    group_index: dict[str, int] = {}
    state_index: dict[str, int] = {}
    groups = []
    step_reward = torch.zeros((E, K), dtype=torch.float32)
    state_id = torch.full((E, K), -1, dtype=torch.long)
    for i, episode in enumerate(episodes):
        name = episode.group or f"{episode.env_id}::{episode.task_id}"
        groups.append(group_index.setdefault(name, len(group_index)))
        for k, (turn, key) in enumerate(zip(episode.turns, episode.state_keys_before(), strict=True)):
            step_reward[i, k] = float(turn.reward)
            if key:
                state_id[i, k] = state_index.setdefault(key, len(state_index))

    return TokenRows(
        input_ids=input_ids,
        attention_mask=attention_mask,
        turn_id=turn_id,
        span=span,
        row_episode=torch.tensor(row_episode, dtype=torch.long),
        row_turn=torch.tensor(row_turn, dtype=torch.long),
        prompt_len=torch.tensor(prompt_lens, dtype=torch.long),
        length=attention_mask.sum(dim=1),
        episode_group=torch.tensor(groups, dtype=torch.long),
        success=torch.tensor([e.success for e in episodes], dtype=torch.bool),
        score=torch.tensor([e.score for e in episodes], dtype=torch.float32),
        invalid_turns=torch.tensor([e.invalid_turns for e in episodes], dtype=torch.long),
        num_turns=torch.tensor([len(e.turns) for e in episodes], dtype=torch.long),
        step_reward=step_reward,
        state_id=state_id,
        span_mode=span_mode,
        contexts=contexts,
        group_names=list(group_index),
        episode_ids=[e.episode_id for e in episodes],
        pad_token_id=int(pad_id),
        end_of_turn=eot,
        truncated_rows=truncated_rows,
        truncated_tokens=truncated_tokens,
        truncated_turns=truncated_turns,
        meta={"chat_template_kwargs": kwargs},
    )
