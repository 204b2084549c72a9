"""Teacher contexts and teacher scoring (docs/credit.md#teacher-log-probs, #stepopsd-teacher, #agentopsd-teacher).

The teacher is a causal LM (the policy, a snapshot of it, or the live one) that reads the SAME
generated tokens as the student, with privileged text added to its context, in one extra no-grad
pass. `score_teacher` returns its log-probs aligned to the rows (`TeacherScores.logprobs`, [R, T]).

StepOPSD: a hindsight block inserted right before each turn's scored span (docs/credit.md#stepopsd-teacher):

    <student's causal prefix up to the span start>
    <hindsight>
    final_correctness: correct | incorrect
    peer_correct_trajectory: <peer_correct_trajectory> ... </peer_correct_trajectory>   (optional)
    reference: ...                                                                      (optional)
    </hindsight>
    <the span>

RLSD (optional baseline) uses the same hindsight context over whole responses (`clean_step`).
The peer block goes only to failed episodes of mixed groups: the first successful episode of the
group (in the order given), written as `config.peer_format` says (by default its actions, one line
per step; `actions_observations` adds each observation). The reference is the env's
`Hindsight.reference` (expert plan, gold answers, target product).

AgentOPSD (docs/credit.md#agentopsd-teacher): the privileged skill note prepended to the first
message of the student prompt (the system message):
"[Privileged Skill Information]\\n" + skill text + "\\n\\n" + the original content.
The rest of the row (every response, observation and template token) is unchanged, so one forward
per row scores every turn. Skill notes: `trainer.env_knowledge.skill_text` (the env family's own).

How a row's turns are scored (`score_teacher`'s `strategy`, the same log-probs each way): `prefix`
(the default) runs what rows share once and reuses its keys and values: StepOPSD's rows' common start,
then each row's prefix once for every turn's block and span (`score_inserts_with_prefix_cache`);
AgentOPSD's skill note with the prompt the rows share, once per note
(`score_sequences_with_shared_prefix`). `packed`: a row's turns in one sequence under a block-causal
4-D mask. `per-turn`: one sequence per turn, what the OpenRLHF bridge does (its actor forward takes
no custom mask or cache). The scorers are `trainer.forward`'s; what each strategy costs:
docs/trainer-performance.md.

Truncation is never silent. A StepOPSD turn whose context does not fit is first scored without the
peer trajectory (`peer_dropped`), then left unscored (`truncated`); an AgentOPSD row that does not
fit has its tail unscored (`truncated`, `truncated_tokens`); the skill note is never cut. Unscored
span tokens get `scored = False` and contribute no gap (delta = 0). Every count is in
`TeacherScores.stats()` and logged.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from agentgym_opsd.episode import Episode
from trainer.chat import episode_messages, render_prompt
from trainer.credit.config import CreditConfig
from trainer.env_knowledge import skill_text
from trainer.forward import (
    Insert,
    TeacherSequence,
    attention_implementation,
    score_inserts_with_prefix_cache,
    score_sequences,
    score_sequences_with_shared_prefix,
)
from trainer.rows import TokenRows

__all__ = [
    "SKILL_HEADER",
    "TeacherScores",
    "build_teacher_sequences",
    "hindsight_block",
    "peer_episodes",
    "privileged_messages",
    "score_teacher",
]

log = logging.getLogger(__name__)

SKILL_HEADER = "[Privileged Skill Information]\n"
def privileged_messages(messages: list[dict[str, str]], skill: str) -> list[dict[str, str]]:
    """AgentOPSD's teacher prompt: the skill note prepended to the first message's content."""
    if not messages:
        raise ValueError("no messages to add the skill note to")
    first = dict(messages[0])
    first["content"] = SKILL_HEADER + skill + "\n\n" + first["content"]
    return [first] + [dict(m) for m in messages[1:]]


def peer_episodes(episodes: Sequence[Episode], rows: TokenRows | None = None) -> dict[int, int]:
    """{failed episode: the first successful episode of its group} for mixed groups."""
    groups: dict[Any, list[int]] = {}
    for i, ep in enumerate(episodes):
        key = int(rows.episode_group[i]) if rows is not None else ep.group_key
        groups.setdefault(key, []).append(i)
    out = {}
    for members in groups.values():
        winners = [i for i in members if episodes[i].success]
        if winners and len(winners) < len(members):
            for i in members:
                if not episodes[i].success:
                    out[i] = winners[0]
    return out


def _peer_trajectory(peer: Episode, max_chars: int, form: str = "actions") -> tuple[str, bool]:
    lines = []
    for k, turn in enumerate(peer.turns, start=1):
        lines.append(f"step {k}: {turn.action if turn.action is not None else '(invalid turn)'}")
        if form == "actions_observations":
            lines.append(f"observation: {turn.observation}")
    text = "\n".join(lines)
    if len(text) > max_chars:
        cut = len(text) - max_chars
        return text[:max_chars] + f"\n[... {cut} characters cut]", True
    return text, False


def hindsight_block(
    episode: Episode, peer: Episode | None, config: CreditConfig, *, with_peer: bool = True
) -> tuple[str, bool]:
    """StepOPSD's hindsight block for `episode` (and whether the peer text was cut)."""
    lines = ["<hindsight>", f"final_correctness: {'correct' if episode.success else 'incorrect'}"]
    cut = False
    if with_peer and config.hindsight_peer and peer is not None:
        text, cut = _peer_trajectory(peer, config.peer_max_chars, config.peer_format)
        lines.append(f"peer_correct_trajectory: <peer_correct_trajectory>\n{text}\n</peer_correct_trajectory>")
    if config.hindsight_reference and episode.hindsight is not None and episode.hindsight.reference.strip():
        lines.append(f"reference: {episode.hindsight.reference.strip()}")
    lines.append("</hindsight>")
    return "\n".join(lines) + "\n", cut


# ---------------------------------------------------------------------------------------------
# Teacher sequences



@dataclass
class TeacherScores:
    """Teacher log-probs aligned to the rows, and what it cost.

    logprobs: [R, T] float32; lp_T at scored positions, 0 elsewhere.
    scored: [R, T] bool; where the teacher scored (a subset of the rows' span).
    """

    logprobs: torch.Tensor
    scored: torch.Tensor
    forwards: int = 0
    sequences: int = 0
    tokens: int = 0
    truncated: int = 0
    truncated_tokens: int = 0
    peer_dropped: int = 0
    peer_cut: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    def stats(self) -> dict[str, float]:
        """Counters for the run log (`teacher/...`)."""
        return {
            "teacher/forwards": float(self.forwards),
            "teacher/sequences": float(self.sequences),
            "teacher/tokens": float(self.tokens),
            "teacher/truncated": float(self.truncated),
            "teacher/truncated_tokens": float(self.truncated_tokens),
            "teacher/peer_dropped": float(self.peer_dropped),
            "teacher/peer_cut": float(self.peer_cut),
        }


def _encode(tokenizer, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def _row_first_messages(episode: Episode, rows: TokenRows, r: int) -> list[dict[str, str]]:
    k = max(int(rows.row_turn[r]), 0)
    return episode_messages(episode, k, rows.contexts[int(rows.row_episode[r])])


def _note_key(episode: Episode) -> tuple[str, str | None]:
    """Which skill note an episode's AgentOPSD teacher prompt starts with (`skill_text`'s arguments)."""
    return (episode.env_id, episode.task_type)


def agentopsd_sequences(tokenizer, episodes, rows, config, max_length, counters):
    kwargs = rows.meta.get("chat_template_kwargs", {})
    seqs = []
    skill_cache: dict[tuple[str, str], str] = {}
    scored = rows.span & rows.generated_mask()
    for r in range(rows.num_rows):
        if not bool(rows.span[r].any()):  # nothing to score (e.g. an errored episode's placeholder row)
            continue
        episode = episodes[int(rows.row_episode[r])]
        L, P = int(rows.length[r]), int(rows.prompt_len[r])
        key = _note_key(episode)
        if key not in skill_cache:
            skill_cache[key] = skill_text(episode.env_id, episode.task_type, config.skills_dir)
        messages = _row_first_messages(episode, rows, r)
        student_prompt = _encode(tokenizer, render_prompt(tokenizer, messages, **kwargs))
        if student_prompt != rows.input_ids[r, :P].tolist():
            raise ValueError(
                f"row {r}: the prompt re-rendered from episode {episode.episode_id!r} does not match the row's "
                "first tokens; build the rows and score the teacher with the same tokenizer and episodes"
            )
        teacher_messages = privileged_messages(messages, skill_cache[key])
        teacher_prompt = _encode(tokenizer, render_prompt(tokenizer, teacher_messages, **kwargs))
        shift = len(teacher_prompt) - P
        ids = torch.tensor(teacher_prompt + rows.input_ids[r, P:L].tolist(), dtype=torch.long)
        row_pos = scored[r, :L].nonzero().squeeze(1)
        row_pos = row_pos[row_pos >= max(P, 1)]
        if ids.numel() > max_length:
            keep = row_pos + shift < max_length
            counters["truncated"] += 1
            counters["truncated_tokens"] += int((~keep).sum())
            row_pos = row_pos[keep]
            ids = ids[:max_length]
        S = ids.numel()
        seqs.append(
            TeacherSequence(
                ids=ids,
                positions=torch.arange(S),
                segment=torch.zeros(S, dtype=torch.long),
                prefix=torch.zeros(S, dtype=torch.long),
                predict=row_pos + shift - 1,
                target=row_pos + shift,
                row=r,
                row_pos=row_pos,
            )
        )
    return seqs


def _turn_spans(rows: TokenRows, r: int, scored: torch.Tensor) -> list[tuple[int, torch.Tensor]]:
    """[(turn, row positions of its scored span)] for row r, in turn order; `scored`: the rows' span
    on generated tokens ([R, T])."""
    L = int(rows.length[r])
    span = scored[r, :L]
    out = []
    for k in rows.turn_id[r, :L][span].unique().tolist():
        pos = (span & (rows.turn_id[r, :L] == k)).nonzero().squeeze(1)
        pos = pos[pos >= 1]
        if pos.numel():
            out.append((int(k), pos))
    return out


def stepopsd_inserts(tokenizer, episodes, rows, config, max_length, counters) -> dict[int, list[Insert]]:
    """For every row, the turns whose teacher context fits: where the hindsight block goes (s_k), the
    block (without the peer trajectory when only that fits), and the span's row positions."""
    peers = peer_episodes(episodes, rows) if config.hindsight_peer else {}
    blocks: dict[int, tuple[list[int], list[int] | None]] = {}  # episode -> (full block, block without peer)
    out: dict[int, list[Insert]] = {}
    scored = rows.span & rows.generated_mask()
    for r in range(rows.num_rows):
        i = int(rows.row_episode[r])
        episode = episodes[i]
        if i not in blocks:
            peer = episodes[peers[i]] if i in peers else None
            text, cut = hindsight_block(episode, peer, config)
            counters["peer_cut"] += int(cut)
            short = _encode(tokenizer, hindsight_block(episode, None, config)[0]) if peer is not None else None
            blocks[i] = (_encode(tokenizer, text), short)
        full_block, short_block = blocks[i]
        inserts = []
        for _, pos in _turn_spans(rows, r, scored):
            s, e = int(pos[0]), int(pos[-1])
            block = full_block
            if s + len(block) + (e - s + 1) > max_length:
                if short_block is not None and s + len(short_block) + (e - s + 1) <= max_length:
                    block = short_block
                    counters["peer_dropped"] += 1
                else:
                    counters["truncated"] += 1
                    counters["truncated_tokens"] += int(pos.numel())
                    continue
            inserts.append((s, block, pos))
        if inserts:
            out[r] = inserts
    return out


def _stepopsd_sequences(tokenizer, episodes, rows, config, max_length, packing, counters):
    seqs = []
    for r, inserts in stepopsd_inserts(tokenizer, episodes, rows, config, max_length, counters).items():
        row_ids = rows.input_ids[r]
        # Group insertion points into packs that fit (one pack per insertion without packing).
        packs: list[list[tuple[int, list[int], torch.Tensor]]] = []
        for ins in inserts:
            s, block, pos = ins
            size = len(block) + int(pos[-1]) - s + 1
            if packing and packs:
                current = packs[-1]
                base = max(x[0] for x in current + [ins])
                total = base + sum(len(b) + int(p[-1]) - x + 1 for x, b, p in current) + size
                if total <= max_length:
                    current.append(ins)
                    continue
            packs.append([ins])
        for pack in packs:
            if len(pack) == 1 or not packing:
                # A plain causal sequence: prefix, block, span copy.
                (s, block, pos), = pack
                e = int(pos[-1])
                ids = torch.cat([row_ids[:s], torch.tensor(block, dtype=torch.long), row_ids[s : e + 1]])
                offset = len(block)  # row position p >= s sits at p + len(block)
                S = ids.numel()
                seqs.append(
                    TeacherSequence(
                        ids=ids, positions=torch.arange(S), segment=torch.zeros(S, dtype=torch.long),
                        prefix=torch.zeros(S, dtype=torch.long), predict=pos + offset - 1, target=pos + offset,
                        row=r, row_pos=pos,
                    )
                )
                continue
            base = max(s for s, _, _ in pack)
            parts_ids = [row_ids[:base]]
            parts_pos = [torch.arange(base)]
            parts_seg = [torch.zeros(base, dtype=torch.long)]
            parts_pre = [torch.zeros(base, dtype=torch.long)]
            predict, target, row_pos = [], [], []
            cursor = base
            for j, (s, block, pos) in enumerate(pack, start=1):
                e = int(pos[-1])
                copy = torch.cat([torch.tensor(block, dtype=torch.long), row_ids[s : e + 1]])
                n = copy.numel()
                parts_ids.append(copy)
                parts_pos.append(torch.arange(s, s + n))
                parts_seg.append(torch.full((n,), j, dtype=torch.long))
                parts_pre.append(torch.full((n,), s, dtype=torch.long))
                at = cursor + len(block) + (pos - s)  # where span position p sits in the sequence
                predict.append(at - 1)
                target.append(at)
                row_pos.append(pos)
                cursor += n
            seqs.append(
                TeacherSequence(
                    ids=torch.cat(parts_ids), positions=torch.cat(parts_pos), segment=torch.cat(parts_seg),
                    prefix=torch.cat(parts_pre), predict=torch.cat(predict), target=torch.cat(target),
                    row=r, row_pos=torch.cat(row_pos),
                )
            )
    return seqs


def _check_rows(episodes, rows: TokenRows, config: CreditConfig) -> None:
    if len(episodes) != int(rows.episode_group.numel()):
        raise ValueError(f"{len(episodes)} episodes given, the rows were built from {int(rows.episode_group.numel())}")
    if rows.span_mode != config.span_mode:
        raise ValueError(
            f"rows were built with span_mode={rows.span_mode!r}, the config says {config.span_mode!r}: "
            "build them with span_mode=config.span_mode"
        )


def build_teacher_sequences(
    tokenizer,
    episodes: Sequence[Episode],
    rows: TokenRows,
    config: CreditConfig,
    *,
    max_length: int,
    packing: bool = True,
) -> tuple[list[TeacherSequence], dict[str, int]]:
    """The teacher's inputs for `rows` (no model needed): sequences and truncation counters."""
    _check_rows(episodes, rows, config)
    counters = {"truncated": 0, "truncated_tokens": 0, "peer_dropped": 0, "peer_cut": 0}
    rows = rows.to("cpu")  # sequences are assembled on the CPU and moved per micro-batch
    if config.method == "agentopsd":
        seqs = agentopsd_sequences(tokenizer, episodes, rows, config, max_length, counters)
    elif config.method in ("stepopsd", "rlsd"):
        seqs = _stepopsd_sequences(tokenizer, episodes, rows, config, max_length, packing, counters)
    else:
        raise ValueError(f"{config.method} uses no teacher")
    return seqs, counters


def _max_length(model, config: CreditConfig, max_length: int | None) -> int:
    if max_length is not None:
        return int(max_length)
    if config.teacher_max_length is not None:
        return int(config.teacher_max_length)
    return int(getattr(model.config, "max_position_embeddings", 32768) or 32768)


STRATEGIES = ("prefix", "packed", "per-turn")


def score_teacher(
    model,
    tokenizer,
    episodes: Sequence[Episode],
    rows: TokenRows,
    config: CreditConfig,
    *,
    max_length: int | None = None,
    strategy: str = "auto",
    micro_batch_tokens: int = 16384,
    temperature: float = 1.0,
    progress: bool | str = False,
) -> TeacherScores:
    """Teacher log-probs of the rows' scored tokens, with privileged context (no grad).

    Args:
        model: the teacher causal LM (a snapshot of the policy for `stale`, the policy for `live`).
        tokenizer: the tokenizer the rows were built with.
        episodes: the episodes the rows were built from (same list, same order).
        rows: `build_rows(episodes, tokenizer, span_mode=config.span_mode)`.
        config: `method` picks the context (StepOPSD and RLSD: hindsight block; AgentOPSD: skill note).
        max_length: longest teacher sequence (default: config.teacher_max_length, else the model's
            max_position_embeddings).
        strategy: StepOPSD and RLSD only, how a row's turns are scored (the same log-probs each way):
            `prefix` (the row's prefix once, its keys and values reused by every turn's block and
            span), `packed` (the row's turns in one sequence with a block-causal 4-D mask), `per-turn`
            (one sequence per turn); `auto` is `prefix`. AgentOPSD: `prefix` runs the rows' shared
            teacher prefix (the skill note, ...) once per note and then each row's own tokens; the
            others run one sequence per row (the skill note goes before the whole conversation).
        micro_batch_tokens: padded tokens per forward.
        temperature: the rollout's sampling temperature (the student's log-probs use it too).

    Returns:
        TeacherScores: `.logprobs` [R, T] and `.scored` [R, T] for `rows.credit_batch(...)`, and the
        cost and truncation counters (`.stats()`).
    """
    strategy = "prefix" if strategy == "auto" else strategy
    if strategy not in STRATEGIES:
        raise ValueError(f"teacher strategy {strategy!r}: use auto, {', '.join(STRATEGIES)}")
    if strategy == "packed" and attention_implementation(model) not in ("eager", "sdpa"):
        raise ValueError(
            f"the packed strategy needs custom attention masks; {attention_implementation(model)} has none"
        )
    limit = _max_length(model, config, max_length)
    was_training = model.training
    model.eval()
    try:
        if config.method in ("stepopsd", "rlsd") and strategy == "prefix":
            counters = {"truncated": 0, "truncated_tokens": 0, "peer_dropped": 0, "peer_cut": 0}
            _check_rows(episodes, rows, config)
            inserts = stepopsd_inserts(tokenizer, episodes, rows.to("cpu"), config, limit, counters)
            logprobs, scored, cost = score_inserts_with_prefix_cache(
                model, rows.to("cpu"), inserts, micro_batch_tokens=micro_batch_tokens, temperature=temperature,
                progress=progress,
            )
        else:
            sequences, counters = build_teacher_sequences(
                tokenizer, episodes, rows, config, max_length=limit, packing=strategy == "packed"
            )
            if config.method == "agentopsd" and strategy == "prefix":
                # The skill note (and whatever else the rows' teacher prompts share) runs once per note.
                keys = [_note_key(episodes[int(rows.row_episode[seq.row])]) for seq in sequences]
                scores, cost = score_sequences_with_shared_prefix(
                    model, sequences, keys, pad_token_id=rows.pad_token_id, micro_batch_tokens=micro_batch_tokens,
                    temperature=temperature, progress=progress,
                )
            else:
                scores, forwards = score_sequences(
                    model, sequences, pad_token_id=rows.pad_token_id, micro_batch_tokens=micro_batch_tokens,
                    temperature=temperature, progress=progress,
                )
                cost = {"forwards": forwards, "sequences": len(sequences), "tokens": sum(s.length for s in sequences)}
            logprobs = torch.zeros(rows.input_ids.shape, dtype=torch.float32)
            scored = torch.zeros(rows.input_ids.shape, dtype=torch.bool)
            for seq, lp in zip(sequences, scores, strict=True):
                logprobs[seq.row, seq.row_pos] = lp
                scored[seq.row, seq.row_pos] = True
    finally:
        model.train(was_training)
    result = TeacherScores(
        logprobs=logprobs.to(rows.input_ids.device),
        scored=scored.to(rows.input_ids.device),
        **cost,
        extra={"strategy": strategy, "max_length": limit},
        **counters,
    )
    if counters["truncated"] or counters["peer_dropped"]:
        log.warning(
            "teacher: %d contexts did not fit in %d tokens (%d span tokens unscored); %d turns scored without "
            "the peer trajectory",
            counters["truncated"], limit, counters["truncated_tokens"], counters["peer_dropped"],
        )
    return result
