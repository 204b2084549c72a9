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

Cost (N = rows, T = row length, P = privileged prefix tokens, K = turns per row, H = hindsight block
tokens, L_k = span tokens of turn k, s_k = its start, Q = the rows' common token prefix):
    AgentOPSD, `prefix` (the default): the rows that start with the same skill note share the longest
        common prefix of their teacher sequences (the note, the chat template, the shared system
        prompt: P + Q tokens); it runs once per note and its keys and values are expanded over the
        rows, which run only their own tokens: P + Q + sum (T - Q) tokens.
    AgentOPSD, `per-turn` / `packed`: one sequence per row: sum (T + P) tokens.
    StepOPSD, `prefix` (the default): the rows' common prefix runs once, then each row's prefix up
        to its last insertion point continues from it with a key/value cache; then the segments
        (hindsight block + span) of every turn of a micro-batch of rows run in batches (grouped by
        block length and s_k), segment k reading its row's cached keys at positions < s_k and itself
        causally, with positions continuing from s_k. Q + sum (T - Q) + sum_k (H + L_k) tokens through
        the MLPs, and each segment token attends to at most max s_k (of its batch) + H + L_k keys.
    StepOPSD, `packed`: the same tokens in ONE sequence per row (prefix, then the segments) with a
        block-causal 4-D mask: the same tokens, but attention over the whole packed length.
    StepOPSD, `per-turn`: one sequence per (row, turn): sum_k (s_k + H + L_k) ~ K T / 2 tokens; what
        the OpenRLHF bridge does (its actor forward takes no custom mask or cache). Window rows (one
        turn each) cost the same either way. `benchmarks/teacher_speed.py` times the three.
Truncation is never silent. A StepOPSD turn whose context does not fit is first scored without the
peer trajectory (`peer_dropped`), then left unscored (`truncated`); an AgentOPSD row that does not
fit has its tail unscored (`truncated`, `truncated_tokens`); the skill note is never cut. Unscored
span tokens get `scored = False` and contribute no gap (delta = 0). Every count is in
`TeacherScores.stats()` and logged.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any

import torch
from tqdm.auto import tqdm

from agentgym_opsd.episode import Episode
from trainer.chat import episode_messages, render_prompt
from trainer.credit.config import CreditConfig
from trainer.env_knowledge import skill_text
from trainer.rows import TokenRows

__all__ = [
    "TeacherScores",
    "TeacherSequence",
    "SKILL_HEADER",
    "privileged_messages",
    "peer_episodes",
    "hindsight_block",
    "build_teacher_sequences",
    "score_teacher",
    "score_sequences",
    "block_causal_mask",
    "row_logprobs",
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
class TeacherSequence:
    """One teacher input and where its log-probs go.

    ids: [S] token ids. positions: [S] position ids.
    segment: [S] segment of each token (0 = the row itself; 1, 2, ... = inserted copies).
    prefix: [S] a token may also attend to row tokens at positions < prefix (0 for row tokens).
    predict: [M] sequence positions whose next-token distribution scores a target.
    target: [M] sequence positions of the target tokens.
    row: the row the scores belong to. row_pos: [M] their positions in the row.
    """

    ids: torch.Tensor
    positions: torch.Tensor
    segment: torch.Tensor
    prefix: torch.Tensor
    predict: torch.Tensor
    target: torch.Tensor
    row: int
    row_pos: torch.Tensor

    @property
    def length(self) -> int:
        return int(self.ids.numel())

    @property
    def packed(self) -> bool:
        return bool((self.segment > 0).any())


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
        teacher_prompt = _encode(tokenizer, render_prompt(tokenizer, privileged_messages(messages, skill_cache[key]), **kwargs))
        shift = len(teacher_prompt) - P
        ids = torch.tensor(teacher_prompt + rows.input_ids[r, P:L].tolist(), dtype=torch.long)
        row_pos = (rows.span[r, :L] & (rows.turn_id[r, :L] >= 0)).nonzero().squeeze(1)
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


def _turn_spans(rows: TokenRows, r: int) -> list[tuple[int, torch.Tensor]]:
    """[(turn, row positions of its scored span)] for row r, in turn order."""
    L = int(rows.length[r])
    span = rows.span[r, :L] & (rows.turn_id[r, :L] >= 0)
    out = []
    for k in rows.turn_id[r, :L][span].unique().tolist():
        pos = (span & (rows.turn_id[r, :L] == k)).nonzero().squeeze(1)
        pos = pos[pos >= 1]
        if pos.numel():
            out.append((int(k), pos))
    return out


Insert = tuple[int, list[int], torch.Tensor]  # (s_k: the span's first row position, block ids, span row positions)


def stepopsd_inserts(tokenizer, episodes, rows, config, max_length, counters) -> dict[int, list[Insert]]:
    """For every row, the turns whose teacher context fits: where the hindsight block goes (s_k), the
    block (without the peer trajectory when only that fits), and the span's row positions."""
    peers = peer_episodes(episodes, rows) if config.hindsight_peer else {}
    blocks: dict[int, tuple[list[int], list[int] | None]] = {}  # episode -> (full block, block without peer)
    out: dict[int, list[Insert]] = {}
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
        for _, pos in _turn_spans(rows, r):
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


# ---------------------------------------------------------------------------------------------
# Scoring


def block_causal_mask(segment: torch.Tensor, prefix: torch.Tensor, valid: torch.Tensor, dtype) -> torch.Tensor:
    """The additive [B, 1, S, S] attention mask of packed sequences (`TeacherSequence`'s layout).

    A token attends to the earlier tokens of its own segment, and to the row's tokens (segment 0) at
    sequence positions < its `prefix`; padding keys (`valid` False) never; every query at least to
    itself (so padded queries stay finite). segment, prefix, valid: [B, S].
    """
    S = segment.shape[1]
    q = torch.arange(S, device=segment.device)
    allowed = (segment.unsqueeze(2) == segment.unsqueeze(1)) & (q.view(1, 1, S) <= q.view(1, S, 1))
    allowed |= (q.view(1, 1, S) < prefix.unsqueeze(2)) & (segment.unsqueeze(1) == 0)
    allowed &= valid.unsqueeze(1)
    allowed |= torch.eye(S, dtype=torch.bool, device=segment.device).unsqueeze(0)
    attention = torch.zeros((segment.shape[0], 1, S, S), dtype=dtype, device=segment.device)
    return attention.masked_fill_(~allowed.unsqueeze(1), torch.finfo(dtype).min)


def _attention_implementation(model) -> str:
    return str(getattr(model.config, "_attn_implementation", None) or "eager")


def _model_io(model):
    """(decoder, head) when the LM's logits are head(decoder(...).last_hidden_state), else (None, None)."""
    get_decoder, get_head = getattr(model, "get_decoder", None), getattr(model, "get_output_embeddings", None)
    if get_decoder is None or get_head is None or getattr(model.config, "final_logit_softcapping", None):
        return None, None
    try:
        decoder, head = get_decoder(), get_head()
    except (AttributeError, NotImplementedError):
        return None, None
    if decoder is None or head is None or decoder is model:
        return None, None
    return decoder, head


def _length_batches(items, length, budget: int) -> list[list]:
    """`items` longest first, in batches of at most `budget` padded tokens (count x the first's length)."""
    batches: list[list] = []
    for item in sorted(items, key=lambda x: -length(x)):
        if batches and (len(batches[-1]) + 1) * length(batches[-1][0]) <= budget:
            batches[-1].append(item)
        else:
            batches.append([item])
    return batches


@torch.no_grad()
def score_sequences(
    model,
    sequences: Sequence[TeacherSequence],
    *,
    pad_token_id: int = 0,
    micro_batch_tokens: int = 16384,
    logit_chunk: int = 512,
    temperature: float = 1.0,
    progress: bool | str = False,
) -> tuple[list[torch.Tensor], int]:
    """Log-probs of each sequence's targets ([M] float32 per sequence) and the number of forwards.

    `temperature` divides the logits, as when sampling: the student's and the teacher's log-probs
    are both taken at the rollout's temperature, so a teacher identical to the student has no gap.

    Sequences are sorted by length and run in micro-batches of at most `micro_batch_tokens` (padded)
    tokens. Packed sequences get a 4-D additive attention mask; plain ones a 2-D padding mask.
    Logits are computed only at the scored positions (decoder hidden states -> output head, in chunks
    of `logit_chunk` positions), so the vocabulary-sized tensor never spans a whole batch.
    """
    device = next(model.parameters()).device
    dtype = next(model.parameters()).dtype
    decoder, head = _model_io(model)
    out: list[torch.Tensor | None] = [None] * len(sequences)
    batches = _length_batches(range(len(sequences)), lambda j: sequences[j].length, micro_batch_tokens)
    forwards = 0
    label = progress if isinstance(progress, str) else "teacher"
    for batch in tqdm(batches, desc=label, unit="batch", disable=not progress, leave=False):
        seqs = [sequences[j] for j in batch]
        B, S = len(seqs), max(s.length for s in seqs)
        ids = torch.full((B, S), pad_token_id, dtype=torch.long)
        positions = torch.zeros((B, S), dtype=torch.long)
        valid = torch.zeros((B, S), dtype=torch.bool)
        for b, s in enumerate(seqs):
            ids[b, : s.length], positions[b, : s.length], valid[b, : s.length] = s.ids, s.positions, True
        if any(s.packed for s in seqs):
            segment = torch.full((B, S), -1, dtype=torch.long)
            prefix = torch.zeros((B, S), dtype=torch.long)
            for b, s in enumerate(seqs):
                segment[b, : s.length], prefix[b, : s.length] = s.segment, s.prefix
            attention = block_causal_mask(segment.to(device), prefix.to(device), valid.to(device), dtype)
        else:
            # Plain sequences are right-padded: under the causal mask no real token sees a pad, so no
            # padding mask is needed, and without one the attention kernel skips the masked half. The
            # pads continue the positions (a position reset would read as a second packed sequence).
            attention = None
            positions = torch.arange(S).expand(B, S)
        inputs = dict(input_ids=ids.to(device), attention_mask=attention, position_ids=positions.to(device))
        if decoder is not None:
            hidden = decoder(**inputs, use_cache=False).last_hidden_state
        else:
            hidden = None
            logits_all = model(**inputs, use_cache=False).logits
        forwards += 1
        states = hidden if hidden is not None else logits_all
        for b, s in enumerate(seqs):
            out[batch[b]] = _target_logprobs(head if hidden is not None else None, states[b, s.predict.to(device)],
                                             s.ids[s.target], temperature, chunk=logit_chunk)
    return [x if x is not None else torch.zeros(0) for x in out], forwards


def _max_length(model, config: CreditConfig, max_length: int | None) -> int:
    if max_length is not None:
        return int(max_length)
    if config.teacher_max_length is not None:
        return int(config.teacher_max_length)
    return int(getattr(model.config, "max_position_embeddings", 32768) or 32768)


STRATEGIES = ("prefix", "packed", "per-turn")


def _cache_over(model, kv: list[tuple[torch.Tensor, torch.Tensor]]):
    """A DynamicCache holding `kv` ([B, kv heads, C, head dim] per layer) as given: views (an
    expanded note, a slice of a prefix) are not copied here; the forward's own concatenation with
    the new keys is the one copy."""
    from transformers import DynamicCache
    from transformers.cache_utils import DynamicLayer

    cache = DynamicCache(config=model.config)
    if len(cache.layers) != len(kv) or any(type(layer) is not DynamicLayer for layer in cache.layers):
        return DynamicCache(ddp_cache_data=kv, config=model.config)  # e.g. sliding-window layers: their own update
    for layer, (k, v) in zip(cache.layers, kv, strict=True):
        layer.lazy_initialization(k, v)
        layer.keys, layer.values = k, v
    return cache


def _sdpa_with_grouped_heads(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
    """SDPA with the key/value heads shared by query groups in the kernel (`enable_gqa`), also under a
    mask: transformers' SDPA repeats the key and value heads in memory whenever a mask is given (on
    CUDA the grouped kernel would fall back to the math one; on the CPU it is a quarter faster).

    `read_queries` = (layer, a, b): in that layer (the last), only the outputs of queries a..b-1 are
    read afterwards (the positions whose hidden states give the log-probs; none for a forward run only
    for its key/value cache), so only those queries attend and the others get zeros. Keys and values
    are cached before attention, so the cache is whole either way."""
    read = kwargs.get("read_queries")
    if read is not None and read[0] == getattr(module, "layer_idx", None):
        _, a, b = read
        out = query.new_zeros(query.shape)
        if b > a:
            out[:, :, a:b] = torch.nn.functional.scaled_dot_product_attention(
                query[:, :, a:b], key, value, attn_mask=None if attention_mask is None else attention_mask[:, :, a:b],
                dropout_p=dropout, scale=scaling, enable_gqa=key.shape[1] != query.shape[1],
            )
        return out.transpose(1, 2).contiguous(), None
    # No mask: transformers left it out because it is plain causal (queries and keys aligned), or
    # there is one query; as its own SDPA path does, causality then goes to the kernel.
    causal = attention_mask is None and query.shape[2] > 1 and getattr(module, "is_causal", True)
    out = torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=attention_mask, dropout_p=dropout, scale=scaling, is_causal=causal,
        enable_gqa=key.shape[1] != query.shape[1],
    )
    return out.transpose(1, 2).contiguous(), None


_GROUPED_SDPA = "agentgym_opsd_sdpa_gqa"


def _grouped_sdpa(model) -> bool:
    return _attention_implementation(model) == "sdpa" and next(model.parameters()).device.type == "cpu"


def _masked_attention(model):
    """The attention implementation for forwards with an additive 4-D mask: SDPA with grouped heads
    on the CPU when the model uses SDPA, else the model's own."""
    if not _grouped_sdpa(model):
        return nullcontext()
    _register_grouped_sdpa()
    return _attention_implementation_set_to(model.config, _GROUPED_SDPA)


@functools.cache
def _register_grouped_sdpa() -> None:
    """Once per process (the sampler enters `_masked_attention` on every decoding step)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(_GROUPED_SDPA, _sdpa_with_grouped_heads)
    # A 2-D padding mask (the sampler's) becomes SDPA's 4-D one, as for `sdpa`; without this entry
    # transformers would pass no mask at all to an attention it does not know. 4-D masks pass as given.
    AttentionMaskInterface.register(_GROUPED_SDPA, sdpa_mask)


class _attention_implementation_set_to:
    """Sets `config._attn_implementation` for a block (the layers read it on every forward)."""

    def __init__(self, config, name: str):
        self.config, self.name = config, name

    def __enter__(self):
        self.saved = self.config._attn_implementation
        self.config._attn_implementation = self.name

    def __exit__(self, *exc):
        self.config._attn_implementation = self.saved


def _forward_after_cache(model, decoder, kv, ids, positions, bias: torch.Tensor, *,
                         read: tuple[int, int] | None = None) -> torch.Tensor:
    """Hidden states (or logits when the head cannot be split off) of `ids` [B, S] at `positions`,
    attending to the cached keys `kv` (length C; a list of (keys, values) per layer, or a cache, which
    the forward extends) and to themselves where the additive mask `bias` [B or 1, S, C + S] (0 or the
    dtype's minimum) allows. Eager and SDPA attention get `bias` as is, one 4-D tensor for every layer
    (a boolean mask would be converted in each layer); other implementations get the key padding mask
    (`bias`'s last query row), with causality inside the segment their own. `read` = (a, b): only
    the outputs at positions a..b-1 are read (the others may be garbage; (0, 0) when the call is for
    the cache only), so the last layer's attention may skip the other queries."""
    if _attention_implementation(model) in ("eager", "sdpa"):
        mask = bias.unsqueeze(1).to(ids.device)
    else:
        mask = (bias[:, -1] == 0).expand(ids.shape[0], -1).to(device=ids.device, dtype=torch.long)
    cache = kv if not isinstance(kv, list) else _cache_over(model, kv)
    inputs = dict(input_ids=ids, attention_mask=mask, position_ids=positions, past_key_values=cache, use_cache=True)
    last_layer = nullcontext()
    if read is not None and _grouped_sdpa(model):
        inputs["read_queries"] = (len(cache.layers) - 1, *read)
        if decoder is not None and 2 * (read[1] - read[0]) <= ids.shape[1]:  # worth it when most outputs go unread
            last_layer = _last_layer_reads_only(decoder, *read)
    with _masked_attention(model), last_layer:
        if decoder is not None:
            return decoder(**inputs).last_hidden_state
        return model(**inputs).logits


class _OnPositions(torch.nn.Module):
    """`module` applied to the positions a..b-1 of a [B, S, ...] input only; zeros elsewhere."""

    def __init__(self, module: torch.nn.Module, a: int, b: int, width: int):
        super().__init__()
        self.module, self.a, self.b, self.width = module, a, b, width

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = x.new_zeros((*x.shape[:-1], self.width))
        if self.b > self.a:
            out[:, self.a : self.b] = self.module(x[:, self.a : self.b])
        return out


class _last_layer_reads_only:
    """In the decoder's last layer, everything after the keys and values (the query projection, the
    attention output projection, the post-attention norm and the MLP) runs only at the positions
    a..b-1 whose outputs are read: the other positions' hidden states leave the model as garbage,
    and no later layer reads them. With a hindsight block of ~120 tokens before a span of ~10 that
    skips nine tenths of the last layer's work. Layers without the usual attributes (self_attn.q_proj,
    self_attn.o_proj, post_attention_layernorm, mlp) run whole."""

    def __init__(self, decoder, a: int, b: int):
        self.swaps: list[tuple[torch.nn.Module, str, torch.nn.Module, torch.nn.Module]] = []
        layers = getattr(decoder, "layers", None)
        layer = layers[-1] if layers is not None and len(layers) else None
        attn = getattr(layer, "self_attn", None)
        hidden = getattr(getattr(decoder, "config", None), "hidden_size", None)
        parts = [(attn, "q_proj"), (attn, "o_proj"), (layer, "post_attention_layernorm"), (layer, "mlp")]
        if hidden is None or any(not isinstance(getattr(owner, name, None), torch.nn.Module) for owner, name in parts):
            return
        if not all(isinstance(getattr(attn, name), torch.nn.Linear) for name in ("q_proj", "o_proj")):
            return
        for owner, name in parts:
            module = getattr(owner, name)
            width = module.out_features if isinstance(module, torch.nn.Linear) else hidden
            self.swaps.append((owner, name, module, _OnPositions(module, a, b, width)))

    def __enter__(self):
        for owner, name, _, wrapped in self.swaps:
            setattr(owner, name, wrapped)

    def __exit__(self, *exc):
        for owner, name, module, _ in self.swaps:
            setattr(owner, name, module)


def _prefix_then_causal(S: int, C: int, dtype: torch.dtype) -> torch.Tensor:
    """[1, S, C + S] additive mask: every query sees the C cached keys, and itself causally."""
    bias = torch.zeros((1, S, C + S), dtype=dtype)
    bias[0, :, C:].masked_fill_(torch.ones((S, S), dtype=torch.bool).triu_(1), torch.finfo(dtype).min)
    return bias


def _target_logprobs(head, states: torch.Tensor, targets: torch.Tensor, temperature: float, chunk: int = 4096) -> torch.Tensor:
    """log p(targets) from hidden states ([M, hidden], through `head`) or logits (`head` None): [M] float32 on CPU."""
    out = torch.empty(targets.numel(), dtype=torch.float32)
    for c in range(0, targets.numel(), chunk):
        logits = head(states[c : c + chunk]) if head is not None else states[c : c + chunk]
        logp = torch.log_softmax(logits.float() / temperature, dim=-1)
        out[c : c + chunk] = logp.gather(1, targets[c : c + chunk, None].to(logp.device)).squeeze(1).cpu()
    return out


@torch.no_grad()
def score_inserts_with_prefix_cache(
    model,
    rows: TokenRows,
    inserts: dict[int, list[Insert]],
    *,
    micro_batch_tokens: int = 16384,
    temperature: float = 1.0,
    progress: bool | str = False,
) -> tuple[torch.Tensor, torch.Tensor, dict[str, int]]:
    """StepOPSD's teacher with each row's prefix computed once.

    For a micro-batch of rows, the teacher runs the rows' prefixes (up to their last insertion
    point) once, right-padded and causal, keeping keys and values. Then the segments (hindsight block +
    span) of all the micro-batch's turns, sorted by insertion point s_k, run in batches on those
    caches: segment k sees its row's prefix keys at positions < s_k and itself causally, with
    position ids continuing from s_k; a batch attends to the prefix keys up to its largest s_k only.
    That is the same computation as the sequence prefix + block + span, with the prefix run once
    instead of once per turn. The log-probs come from one output-head call per batch.

    Returns (logprobs [R, T], scored [R, T], counters: forwards, tokens).
    """
    device, dtype = next(model.parameters()).device, next(model.parameters()).dtype
    decoder, head = _model_io(model)
    runner = decoder if decoder is not None else model
    pad = int(rows.pad_token_id)
    logprobs = torch.zeros(rows.input_ids.shape, dtype=torch.float32)
    scored = torch.zeros(rows.input_ids.shape, dtype=torch.bool)
    counters = {"forwards": 0, "tokens": 0, "sequences": 0}
    prefix_len = {r: max(s for s, _, _ in ins) for r, ins in inserts.items()}
    # rows of similar prefix length together, within the token budget
    batches = _length_batches(inserts, lambda r: prefix_len[r], micro_batch_tokens)
    order = [r for batch in batches for r in batch]
    # The rows' common token prefix (the system prompt, ...), up to the first insertion point of any
    # row, runs once; every row's prefix continues from its keys and values.
    shared = 0
    if inserts:
        first = rows.input_ids[order[0]]
        shared = min(min(s for s, _, _ in ins) for ins in inserts.values())
        for r in order[1:]:
            differ = (rows.input_ids[r, :shared] != first[:shared]).nonzero()
            shared = int(differ[0]) if differ.numel() else shared
    shared_kv = None
    if shared > 1:
        out = runner(input_ids=first[:shared].unsqueeze(0).to(device), use_cache=True)
        shared_kv = [(layer.keys, layer.values) for layer in out.past_key_values.layers]
        counters["forwards"] += 1
        counters["tokens"] += shared
        del out
    else:
        shared = 0
    label = progress if isinstance(progress, str) else "teacher"
    for batch in tqdm(batches, desc=label, unit="batch", disable=not progress, leave=False):
        P = max(prefix_len[r] for r in batch)
        ids = torch.full((len(batch), P - shared), pad, dtype=torch.long)
        for b, r in enumerate(batch):
            ids[b, : prefix_len[r] - shared] = rows.input_ids[r, shared : prefix_len[r]]
        # Right-padded and causal: a pad's key sits after every insertion point of its row, and no
        # real token attends to it, so no padding mask is needed (without any mask SDPA runs its
        # causal kernel).
        if shared_kv is None:
            out = runner(input_ids=ids.to(device), use_cache=True)
            layers = [(layer.keys, layer.values) for layer in out.past_key_values.layers]
        else:
            n, S = ids.shape
            kv = [(k.expand(n, -1, -1, -1), v.expand(n, -1, -1, -1)) for k, v in shared_kv]
            cache = _cache_over(model, kv)
            _forward_after_cache(model, decoder, cache, ids.to(device), torch.arange(shared, P).expand(n, S).to(device),
                                 _prefix_then_causal(S, shared, dtype), read=(0, 0))
            layers = [(layer.keys, layer.values) for layer in cache.layers]  # [n, kv heads, P, head dim]
        counters["forwards"] += 1
        counters["tokens"] += sum(prefix_len[r] - shared for r in batch)
        # Every segment of the batch's rows: (s, batch index, row, block, span positions), by block length
        # (the peer trajectory makes some blocks much longer) and then by s, both descending.
        segments = sorted(((s, b, r, block, pos) for b, r in enumerate(batch) for s, block, pos in inserts[r]),
                          key=lambda x: (-len(x[3]), -x[0]))
        lengths = [len(block) + int(pos[-1]) - s + 1 for s, _, _, block, pos in segments]
        groups: list[list[int]] = []  # segments whose padded size (largest s + longest segment) fits the budget
        for j in range(len(segments)):
            if groups:
                g = groups[-1]
                width = max(segments[i][0] for i in g + [j]) + max(lengths[i] for i in g + [j])
                if (len(g) + 1) * width <= micro_batch_tokens:
                    g.append(j)
                    continue
            groups.append([j])
        for g in groups:
            n, C, S = len(g), max(segments[j][0] for j in g), max(lengths[j] for j in g)
            seg_ids = torch.full((n, S), pad, dtype=torch.long)
            positions = torch.empty((n, S), dtype=torch.long)
            bias = torch.full((n, S, C + S), torch.finfo(dtype).min, dtype=dtype)
            causal = _prefix_then_causal(S, 0, dtype)[0]
            where = torch.tensor([segments[j][1] for j in g])
            predict, targets = [], []
            for i, j in enumerate(g):
                s, _, r, block, pos = segments[j]
                e = int(pos[-1])
                seg_ids[i, : lengths[j]] = torch.cat([torch.tensor(block, dtype=torch.long), rows.input_ids[r, s : e + 1]])
                positions[i] = torch.arange(s, s + S)
                bias[i, :, :s] = 0                  # the row's prefix before this turn's span
                bias[i, :, C:] = causal             # the segment itself, causally (pads see only earlier tokens)
                predict.append(i * S + len(block) + (pos - s) - 1)  # flat index of the state predicting span position p
                targets.append(rows.input_ids[r, pos])
            kv = [(k[:, :, :C].index_select(0, where.to(k.device)), v[:, :, :C].index_select(0, where.to(v.device)))
                  for k, v in layers]
            # Only the span's predictions are read: from the last block token to the span's last but one.
            read = (min(len(segments[j][3]) for j in g) - 1, max(lengths[j] for j in g) - 1)
            states = _forward_after_cache(model, decoder, kv, seg_ids.to(device), positions.to(device), bias, read=read)
            counters["forwards"] += 1
            counters["sequences"] += n
            counters["tokens"] += sum(lengths[j] for j in g)
            lp = _target_logprobs(head, states.reshape(n * S, -1)[torch.cat(predict).to(device)], torch.cat(targets),
                                  temperature)
            at = 0
            for j in g:
                _, _, r, _, pos = segments[j]
                logprobs[r, pos] = lp[at : at + pos.numel()]
                scored[r, pos] = True
                at += pos.numel()
    return logprobs, scored, counters


@torch.no_grad()
def score_sequences_with_shared_prefix(
    model,
    sequences: Sequence[TeacherSequence],
    keys: Sequence[Any],
    *,
    pad_token_id: int = 0,
    micro_batch_tokens: int = 16384,
    temperature: float = 1.0,
    progress: bool | str = False,
) -> tuple[list[torch.Tensor], dict[str, int]]:
    """Plain (causal, unpacked) sequences scored with their common prefix run once.

    Sequences with the same key (AgentOPSD: the skill note they start with) are one group; the
    group's shared prefix is the longest common prefix of their token ids, cut back so that every
    sequence keeps its first scored prediction and at least one token after it. That prefix runs
    once; its keys and values are expanded over each micro-batch of the group's sequences, whose
    remaining tokens run with positions continuing after it. The same log-probs as `score_sequences`
    (the sequences one by one) up to float rounding.

    Returns (log-probs [M] per sequence, counters: forwards, tokens, sequences).
    """
    device, dtype = next(model.parameters()).device, next(model.parameters()).dtype
    decoder, head = _model_io(model)
    runner = decoder if decoder is not None else model
    out: list[torch.Tensor] = [torch.zeros(0) for _ in sequences]
    counters = {"forwards": 0, "tokens": 0, "sequences": len(sequences)}
    groups: dict[Any, list[int]] = {}
    for j, (seq, key) in enumerate(zip(sequences, keys, strict=True)):
        if seq.packed or not torch.equal(seq.positions, torch.arange(seq.length)):
            raise ValueError("score_sequences_with_shared_prefix takes plain causal sequences")
        if seq.predict.numel():  # nothing to score: no forward
            groups.setdefault(key, []).append(j)
    label = progress if isinstance(progress, str) else "teacher"
    for members in tqdm(list(groups.values()), desc=label, unit="prefix", disable=not progress, leave=False):
        first = sequences[members[0]].ids
        C = min(min(int(sequences[j].predict.min()) for j in members), first.numel())
        for j in members[1:]:
            other = sequences[j].ids[:C]
            differ = (first[: other.numel()] != other).nonzero()
            C = min(C, other.numel(), int(differ[0]) if differ.numel() else C)
        if C > 0:
            prefix = runner(input_ids=first[:C].unsqueeze(0).to(device), use_cache=True)
            layers = [(layer.keys, layer.values) for layer in prefix.past_key_values.layers]
            del prefix
            counters["forwards"] += 1
            counters["tokens"] += C
        for batch in _length_batches(members, lambda j: sequences[j].length, micro_batch_tokens):
            n, S = len(batch), sequences[batch[0]].length - C
            ids = torch.full((n, S), int(pad_token_id), dtype=torch.long)
            predict, targets = [], []
            for i, j in enumerate(batch):
                seq = sequences[j]
                ids[i, : seq.length - C] = seq.ids[C:]
                predict.append(i * S + seq.predict - C)
                targets.append(seq.ids[seq.target])
            positions = torch.arange(C, C + S).expand(n, S)
            if C > 0:
                # Every suffix sees the whole shared prefix and itself causally (right padding: no
                # real token sees a pad); the prefix's keys are one copy expanded over the batch.
                kv = [(k.expand(n, -1, -1, -1), v.expand(n, -1, -1, -1)) for k, v in layers]
                states = _forward_after_cache(model, decoder, kv, ids.to(device), positions.to(device),
                                              _prefix_then_causal(S, C, dtype))
            else:
                inputs = dict(input_ids=ids.to(device), position_ids=positions.to(device), use_cache=False)
                states = decoder(**inputs).last_hidden_state if decoder is not None else model(**inputs).logits
            counters["forwards"] += 1
            counters["tokens"] += sum(sequences[j].length - C for j in batch)
            lp = _target_logprobs(head, states.reshape(n * S, -1)[torch.cat(predict).to(device)], torch.cat(targets),
                                  temperature)
            at = 0
            for j in batch:
                m = sequences[j].predict.numel()
                out[j] = lp[at : at + m]
                at += m
    return out, counters


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
    if strategy == "packed" and _attention_implementation(model) not in ("eager", "sdpa"):
        raise ValueError(f"the packed strategy needs custom attention masks; {_attention_implementation(model)} has none")
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


@torch.no_grad()
def row_logprobs(
    model,
    rows: TokenRows,
    *,
    mask: torch.Tensor | None = None,
    micro_batch_tokens: int = 16384,
    temperature: float = 1.0,
    progress: bool | str = False,
) -> torch.Tensor:
    """The model's log-probs of the rows' own tokens ([R, T] float32, 0 outside `mask`; no grad).

    `mask` defaults to the generated tokens (turn_id >= 0): the student's lp_S (old log-probs) for
    the credit core and the update. The same scoring function as the teacher's prefix strategy
    (`score_sequences_with_shared_prefix`, the prefix every row starts with run once), at the same
    temperature.
    """
    device = rows.input_ids.device
    rows = rows.to("cpu")
    mask = rows.turn_id >= 0 if mask is None else mask.to("cpu")
    sequences = []
    for r in range(rows.num_rows):
        L = int(rows.length[r])
        pos = mask[r, :L].nonzero().squeeze(1)
        pos = pos[pos >= 1]
        sequences.append(
            TeacherSequence(
                ids=rows.input_ids[r, :L].cpu(), positions=torch.arange(L), segment=torch.zeros(L, dtype=torch.long),
                prefix=torch.zeros(L, dtype=torch.long), predict=pos - 1, target=pos, row=r, row_pos=pos,
            )
        )
    was_training = model.training
    model.eval()
    try:
        # The rows' common start (the instructions, the first observation's opening) runs once.
        scores, _ = score_sequences_with_shared_prefix(
            model, sequences, [0] * len(sequences), pad_token_id=rows.pad_token_id,
            micro_batch_tokens=micro_batch_tokens, temperature=temperature, progress=progress,
        )
    finally:
        model.train(was_training)
    out = torch.zeros(rows.input_ids.shape, dtype=torch.float32)
    for seq, lp in zip(sequences, scores, strict=True):
        out[seq.row, seq.row_pos] = lp
    return out.to(device)
