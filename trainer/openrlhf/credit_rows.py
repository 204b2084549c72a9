"""An OpenRLHF rollout batch as the credit core's `TokenRows`, teacher sequences, and the credit call.

OpenRLHF hands the experience maker a list of `Experience` micro-batches: right-padded sequences
(B, T) and per-token tensors in its action layout (B, T - 1), where index i describes token i + 1.
`rollout_token_rows` lays them out as one `trainer.rows.TokenRows` batch [R, T] in the credit core's
convention (position t holds token t, a log-prob at t is log p(token t | tokens < t)): one row per
episode (the whole chat is one sequence), the token ids exactly as generated, the turn ids and
action spans the agent executor wrote, OpenRLHF's prompt groups, and the episodes' outcomes, step
rewards and state keys from the executor's records.

From there everything is the credit core's own code: `trainer.teacher.build_teacher_sequences`
(StepOPSD's hindsight block before each span, AgentOPSD's skill note in the system message, counted
truncation), `TokenRows.credit_batch` and `trainer.credit.compute_advantages`. Only the teacher's
forward runs elsewhere: on OpenRLHF's actor group (`trainer.openrlhf.teacher.score_rows`), one
sequence per (row, turn) for StepOPSD since OpenRLHF's actor takes no custom attention masks.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import torch

from agentgym_opsd.episode import Episode
from trainer.credit import CreditConfig, compute_advantages
from trainer.openrlhf.teacher import TeacherRow, score_rows
from trainer.rows import TokenRows
from trainer.teacher import build_teacher_sequences

__all__ = ["RolloutBatch", "rollout_token_rows", "teacher_logprobs", "credit_advantages", "scalar_logs"]


@dataclass
class RolloutBatch:
    """`rows` for the credit core, the `episodes` they hold, and where each experience's rows are."""

    rows: TokenRows
    episodes: list[Episode]
    student_logprobs: torch.Tensor  # [R, T], 0 where not generated
    slices: list[tuple[int, int]]  # rows of each experience: (start, end)


def _full_layout(action_layout: torch.Tensor, width: int, fill) -> torch.Tensor:
    """(B, T-1) action layout -> (B, width) token layout: index i goes to position i + 1."""
    b, n = action_layout.shape
    out = torch.full((b, width), fill, dtype=action_layout.dtype)
    out[:, 1 : n + 1] = action_layout
    return out


def rollout_token_rows(experiences, n_samples_per_prompt: int, tokenizer, config: CreditConfig, turn_key: str,
                       action_key: str, record_key: str,
                       chat_template_kwargs: dict[str, Any] | None = None) -> RolloutBatch:
    """The credit core's rows for a list of OpenRLHF experiences (see the module docstring)."""
    width = max(int(e.sequences.shape[1]) for e in experiences)
    pad_id = int(tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id)
    ids, attention, turn, action, lp_s, groups, episodes, slices = [], [], [], [], [], [], [], []
    start = 0
    for e in experiences:
        b, t = e.sequences.shape
        ids.append(torch.nn.functional.pad(e.sequences.long(), (0, width - t), value=pad_id))
        attention.append(torch.nn.functional.pad(e.attention_mask.long(), (0, width - t), value=0))
        turn.append(_full_layout(e.info[turn_key].long() - 1, width, -1))
        action.append(_full_layout(e.info[action_key].bool(), width, False))
        lp_s.append(_full_layout((e.action_log_probs.float() * e.action_mask.float()), width, 0.0))
        if e.index is None or len(e.index) != b:
            raise ValueError("experiences lost their rollout index; credit needs OpenRLHF's prompt groups")
        groups.extend(int(i) // n_samples_per_prompt for i in e.index)
        episodes.extend(Episode.from_dict(_record(r)["episode"]) for r in e.info[record_key])
        slices.append((start, start + b))
        start += b
    input_ids, attention_mask = torch.cat(ids), torch.cat(attention)
    turn_id = torch.cat(turn)
    turn_id[attention_mask == 0] = -1
    generated = turn_id >= 0
    span = torch.cat(action) & generated if config.span_mode == "action_only" else generated
    R = input_ids.shape[0]
    errored = torch.tensor([ep.error is not None for ep in episodes], dtype=torch.bool)
    if bool((~generated.any(dim=1) & ~errored).any()):
        raise ValueError("an episode without generated tokens reached the experience maker")
    # An errored episode (no turn generated, advantage 0) is a group of its own: it neither receives
    # credit nor moves its task group's mean and std.
    groups = [("errored", i) if errored[i] else g for i, g in enumerate(groups)]
    prompt_len = torch.where(generated.any(dim=1), generated.long().argmax(dim=1), attention_mask.sum(dim=1))
    E, K = len(episodes), max([len(ep.turns) for ep in episodes] + [1])
    group_index: dict[Any, int] = {}
    state_index: dict[str, int] = {}
    step_reward = torch.zeros((E, K), dtype=torch.float32)
    state_id = torch.full((E, K), -1, dtype=torch.long)
    for i, ep in enumerate(episodes):
        for k, (t, key) in enumerate(zip(ep.turns, ep.state_keys_before(), strict=True)):
            step_reward[i, k] = float(t.reward)
            if key:
                state_id[i, k] = state_index.setdefault(key, len(state_index))
    group_ids = [group_index.setdefault(g, len(group_index)) for g in groups]
    group_index_names = [str(g) for g in group_index]
    num_turns = torch.tensor([len(ep.turns) for ep in episodes], dtype=torch.long)
    if bool((turn_id.amax(dim=1) >= num_turns).any()):
        raise ValueError("turn ids disagree with the episode records")
    rows = TokenRows(
        input_ids=input_ids,
        attention_mask=attention_mask,
        turn_id=turn_id,
        span=span,
        row_episode=torch.arange(R),
        row_turn=torch.full((R,), -1, dtype=torch.long),
        prompt_len=prompt_len,
        length=attention_mask.sum(dim=1),
        episode_group=torch.tensor(group_ids, dtype=torch.long),
        success=torch.tensor([ep.success for ep in episodes], dtype=torch.bool),
        score=torch.tensor([ep.score for ep in episodes], dtype=torch.float32),
        invalid_turns=torch.tensor([ep.invalid_turns for ep in episodes], dtype=torch.long),
        num_turns=num_turns,
        step_reward=step_reward,
        state_id=state_id,
        rollout_logprobs=torch.cat(lp_s),
        recorded=generated.clone(),
        span_mode=config.span_mode,
        contexts=["full"] * R,
        group_names=group_index_names,
        episode_ids=[ep.episode_id for ep in episodes],
        pad_token_id=pad_id,
        end_of_turn=getattr(tokenizer, "eos_token", None),
        recorded_turns=int(num_turns.sum()),
        meta={"chat_template_kwargs": dict(chat_template_kwargs or {})},
    )
    return RolloutBatch(rows, episodes, torch.cat(lp_s), slices)


def _record(value: Any) -> dict[str, Any]:
    return json.loads(value) if isinstance(value, str) else dict(value)


def teacher_logprobs(batch: RolloutBatch, tokenizer, config: CreditConfig, actor_group, max_length: int,
                     micro_batch_size: int, get=None) -> tuple[torch.Tensor, torch.Tensor, dict[str, int]]:
    """Teacher log-probs [R, T] and where they were scored [R, T], from a forward on `actor_group`.

    The sequences are the credit core's (`build_teacher_sequences`, unpacked); the forward is
    OpenRLHF's `PolicyModelActor.forward`. Returns the truncation counters too.
    """
    sequences, counters = build_teacher_sequences(
        tokenizer, batch.episodes, batch.rows, config, max_length=int(max_length), packing=False
    )
    rows = []
    for seq in sequences:
        if seq.packed:  # pragma: no cover - packing=False above
            raise AssertionError("packed teacher sequences need custom attention masks")
        if not torch.equal(seq.predict, seq.target - 1):  # pragma: no cover - unpacked: plain causal rows
            raise AssertionError("an unpacked teacher sequence predicts each target from the token before it")
        rows.append(TeacherRow(seq.ids.tolist(), seq.target.tolist()))
    scores = score_rows(actor_group, rows, micro_batch_size, batch.rows.pad_token_id, get=get)
    logprobs = torch.zeros(batch.rows.input_ids.shape, dtype=torch.float32)
    scored = torch.zeros(batch.rows.input_ids.shape, dtype=torch.bool)
    for seq, lp in zip(sequences, scores, strict=True):
        logprobs[seq.row, seq.row_pos] = lp.float()
        scored[seq.row, seq.row_pos] = True
    counters = dict(counters, sequences=len(sequences), tokens=sum(s.length for s in sequences))
    return logprobs, scored, counters


def credit_advantages(batch: RolloutBatch, config: CreditConfig, step: int, teacher=None):
    """`compute_advantages` on the batch; `teacher` is `(logprobs, scored, counters)` or None."""
    if teacher is None:
        credit_batch = batch.rows.credit_batch(batch.student_logprobs)
    else:
        logprobs, scored, counters = teacher
        credit_batch = batch.rows.credit_batch(batch.student_logprobs, logprobs, scored, counters["truncated"])
    return compute_advantages(credit_batch, config, step)


def scalar_logs(diagnostics: dict[str, Any]) -> dict[str, float]:
    """The diagnostics as scalars for OpenRLHF's logs (the B_0 histogram becomes one value per bin)."""
    out: dict[str, float] = {}
    for key, value in diagnostics.items():
        if isinstance(value, (list, tuple)):
            for i, v in enumerate(value):
                out[f"{key}_{i}"] = float(v)
        else:
            out[key] = float(value)
    return out
