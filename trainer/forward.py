"""Tokens to log-probs: the trainer's one scoring core, and the attention and key/value-cache plumbing under it.

Every log-prob the trainer reads comes from here, at a temperature (logits / temperature, as when
sampling), with the output head applied only at the scored positions (`decoder_and_head`,
`picked_logprobs`): a [rows, tokens, vocabulary] logits tensor would not fit for long episodes and
large vocabularies.

- `token_logprobs`: right-padded rows, or packed sequences under a `block_causal_mask`, with grad (the
  warm start and the update). With `share_prefix`, the tokens every row starts with (an env's
  instructions and first words: often most of a short row) run once, and each row's rest after their
  keys and values.
- `score_sequences` (plain or packed `TeacherSequence`s in length-sorted micro-batches),
  `score_sequences_with_shared_prefix` (plain ones, each group's common prefix run once) and
  `score_inserts_with_prefix_cache` (segments inserted into rows, each row's prefix run once), without
  grad: the teacher's inputs (`trainer.teacher`). `row_logprobs`: the student's old log-probs of token
  rows, through the second.
- `forward_after_cache`: new tokens after cached keys and values under an additive mask, where the
  shared-prefix paths and the teacher's prefix cache meet; `masked_attention` runs such forwards (and
  the sampler's) with SDPA on grouped key/value heads on the CPU, and with `read` the last layer works
  only at the positions whose outputs are read.

Every shortcut gives the plain forward's log-probs (and gradients) up to float rounding; the tests
hold them to it (tests/trainer/test_teacher.py, test_local_policy.py, test_smollm2.py).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

import torch
from tqdm.auto import tqdm

from trainer.rows import TokenRows

__all__ = [
    "AttentionImplementationSetTo",
    "Insert",
    "TeacherSequence",
    "attention_implementation",
    "block_causal_mask",
    "cache_over",
    "decoder_and_head",
    "forward_after_cache",
    "length_batches",
    "masked_attention",
    "picked_logprobs",
    "prefix_then_causal",
    "row_logprobs",
    "score_inserts_with_prefix_cache",
    "score_sequences",
    "score_sequences_with_shared_prefix",
    "shared_prefix_length",
    "token_logprobs",
]


@dataclass
class TeacherSequence:
    """One sequence to score (a teacher input, or a student's row in `row_logprobs`) and where its log-probs go.

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


# A segment to insert into a row: (s_k: the span's first row position, block ids, span row positions).
Insert = tuple[int, list[int], torch.Tensor]


# ---------------------------------------------------------------------------------------------
# Log-probs


def decoder_and_head(model):
    """(decoder, head) when the LM's logits are head(decoder(...).last_hidden_state), else (None, None):
    then the full logits are computed (a model without a separable head, or with soft-capped logits)."""
    get_decoder, get_head = getattr(model, "get_decoder", None), getattr(model, "get_output_embeddings", None)
    if get_decoder is None or get_head is None or getattr(model.config, "final_logit_softcapping", None):
        return None, None
    try:
        decoder, head = get_decoder(), get_head()
    except (AttributeError, NotImplementedError, ValueError):
        return None, None
    if decoder is None or head is None or decoder is model:
        return None, None
    return decoder, head


def picked_logprobs(head, states: torch.Tensor, targets: torch.Tensor, *, temperature: float, chunk: int = 4096,
                    with_entropy: bool = False):
    """log p(targets) ([M] float32, on the states' device) from the states that predict them: hidden
    states [M, hidden] through `head`, or logits [M, vocab] when `head` is None; logits / temperature,
    `chunk` positions per head call. With `with_entropy`, also the entropy of each predicted
    distribution. Differentiable when grad is enabled."""
    pieces, entropies = [], []
    for start in range(0, states.shape[0], chunk):
        part = states[start : start + chunk]
        logits = (head(part) if head is not None else part).float() / temperature
        logp = torch.log_softmax(logits, dim=-1)
        pieces.append(logp.gather(-1, targets[start : start + chunk, None].to(logp.device)).squeeze(-1))
        if with_entropy:
            entropies.append(-(logp.exp() * logp).sum(-1))
    flat = torch.cat(pieces) if pieces else states.new_zeros(0, dtype=torch.float32)
    if not with_entropy:
        return flat
    return flat, torch.cat(entropies) if entropies else states.new_zeros(0, dtype=torch.float32)


def token_logprobs(
    model,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    score_mask: torch.Tensor,
    *,
    temperature: float = 1.0,
    chunk: int = 4096,
    with_entropy: bool = False,
    position_ids: torch.Tensor | None = None,
    share_prefix: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """log pi(x_t | x_<t) at every position where `score_mask` is true; 0 elsewhere.

    Args:
        model: a causal LM.
        input_ids, attention_mask: [R, T] right-padded rows; or packed sequences with a 4-D additive
            mask (`block_causal_mask`) and their `position_ids` [R, T], where every
            scored token is predicted from the token before it in the same segment.
        score_mask: [R, T] bool; position 0 is never scored (it has no prefix).
        temperature: logits are divided by it (as when sampling).
        chunk: positions per output-head call (bounds the [positions, vocab] tensor).
        with_entropy: also return the entropy of pi(. | x_<t) at the scored positions.
        position_ids: [R, T] (default: 0, 1, ... per row).
        share_prefix: for right-padded rows (a 2-D mask, default positions): run the longest
            prefix common to all rows once (`shared_prefix_length`) and the rest of each row after
            its keys and values. The same log-probs and gradients as without, up to float rounding,
            for less work when rows share a long start; ignored when they do not.

    Returns:
        float32 [R, T] log-probs (and entropies), differentiable when grad is enabled.
    """
    score_mask = score_mask.bool().clone()
    score_mask[:, 0] = False
    if share_prefix and attention_mask.dim() == 2 and position_ids is None:
        C = shared_prefix_length(input_ids, attention_mask.bool(), score_mask)
        if C >= _MIN_SHARED_PREFIX and input_ids.shape[0] > 1:
            return _logprobs_after_shared_prefix(model, input_ids, score_mask, C, temperature=temperature,
                                                 chunk=chunk, with_entropy=with_entropy)
    rows, cols = torch.nonzero(score_mask[:, 1:], as_tuple=True)  # predicting token cols+1 from position cols
    decoder, head = decoder_and_head(model)
    if decoder is not None:
        states = decoder(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids)
        picked = states.last_hidden_state[rows, cols]
    else:  # a model without a separable head: full logits
        picked = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids).logits[rows, cols]
    return _scattered_logprobs(head, picked, input_ids, rows, cols, temperature=temperature, chunk=chunk,
                               with_entropy=with_entropy)


def _scattered_logprobs(head, picked: torch.Tensor, input_ids: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor, *,
                        temperature: float, chunk: int, with_entropy: bool):
    """`token_logprobs`'s [R, T] output (and entropies) from `picked` [M, ...], the states at positions
    (rows, cols), each predicting token cols + 1 (`picked_logprobs`)."""
    scores = picked_logprobs(head, picked, input_ids[rows, cols + 1], temperature=temperature, chunk=chunk,
                             with_entropy=with_entropy)
    flat, flat_entropy = scores if with_entropy else (scores, None)
    out = torch.zeros(input_ids.shape, dtype=torch.float32, device=input_ids.device).index_put((rows, cols + 1), flat)
    if not with_entropy:
        return out
    ent = torch.zeros(input_ids.shape, dtype=torch.float32, device=input_ids.device)
    return out, ent.index_put((rows, cols + 1), flat_entropy.detach())


# Below this many shared tokens the second forward costs more than it saves.
_MIN_SHARED_PREFIX = 16


def shared_prefix_length(input_ids: torch.Tensor, valid: torch.Tensor, score_mask: torch.Tensor) -> int:
    """C: the number of leading tokens every row has in common, cut so that every row keeps at least
    one token after them and every scored token is predicted from a position >= C (right-padded
    rows; `valid` [R, T] marks the real tokens)."""
    if input_ids.shape[0] == 0:
        return 0
    C = int(valid.sum(1).min()) - 1
    if C <= 0:
        return 0
    differ = (input_ids[:, :C] != input_ids[:1, :C]).any(0).nonzero()
    if differ.numel():
        C = int(differ[0])
    scored = score_mask.nonzero()
    if scored.numel():
        C = min(C, int(scored[:, 1].min()) - 1)
    return max(C, 0)


def _logprobs_after_shared_prefix(model, input_ids, score_mask, C: int, *, temperature: float, chunk: int,
                                  with_entropy: bool):
    """`token_logprobs` for right-padded rows sharing their first C tokens: the prefix runs once (batch
    1, with grad), its keys and values are expanded over the rows (a view: the gradient of every
    row's attention to them adds up in the one prefix), and the rows' remaining tokens run at
    positions C.. attending to the prefix and causally to themselves. A real token never sees a pad
    (right padding), so one [1, S, C + S] mask serves every row."""
    decoder, head = decoder_and_head(model)
    runner = decoder if decoder is not None else model
    R, T = input_ids.shape
    S = T - C
    prefix = runner(input_ids=input_ids[:1, :C], use_cache=True)
    kv = [(layer.keys.expand(R, -1, -1, -1), layer.values.expand(R, -1, -1, -1))
          for layer in prefix.past_key_values.layers]
    del prefix
    positions = torch.arange(C, T, device=input_ids.device).expand(R, S)
    dtype = next(model.parameters()).dtype
    states = forward_after_cache(model, decoder, kv, input_ids[:, C:], positions, prefix_then_causal(S, C, dtype))
    rows, cols = torch.nonzero(score_mask[:, 1:], as_tuple=True)  # predicting token cols+1 from position cols >= C
    return _scattered_logprobs(head, states[rows, cols - C], input_ids, rows, cols, temperature=temperature,
                               chunk=chunk, with_entropy=with_entropy)


# ---------------------------------------------------------------------------------------------
# Scoring without grad: the old log-probs and the teacher's


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

    `mask` defaults to the generated tokens (`rows.generated_mask()`): the student's lp_S (old log-probs) for
    the credit core and the update. The same scoring function as the teacher's prefix strategy
    (`score_sequences_with_shared_prefix`, the prefix every row starts with run once), at the same
    temperature.
    """
    device = rows.input_ids.device
    rows = rows.to("cpu")
    mask = rows.generated_mask() if mask is None else mask.to("cpu")
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
    decoder, head = decoder_and_head(model)
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
        for batch in length_batches(members, lambda j: sequences[j].length, micro_batch_tokens):
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
                states = forward_after_cache(model, decoder, kv, ids.to(device), positions.to(device),
                                              prefix_then_causal(S, C, dtype))
            else:
                inputs = {"input_ids": ids.to(device), "position_ids": positions.to(device), "use_cache": False}
                states = decoder(**inputs).last_hidden_state if decoder is not None else model(**inputs).logits
            counters["forwards"] += 1
            counters["tokens"] += sum(sequences[j].length - C for j in batch)
            lp = picked_logprobs(head, states.reshape(n * S, -1)[torch.cat(predict).to(device)], torch.cat(targets),
                                 temperature=temperature).cpu()
            at = 0
            for j in batch:
                m = sequences[j].predict.numel()
                out[j] = lp[at : at + m]
                at += m
    return out, counters


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
    decoder, head = decoder_and_head(model)
    runner = decoder if decoder is not None else model
    pad = int(rows.pad_token_id)
    logprobs = torch.zeros(rows.input_ids.shape, dtype=torch.float32)
    scored = torch.zeros(rows.input_ids.shape, dtype=torch.bool)
    counters = {"forwards": 0, "tokens": 0, "sequences": 0}
    prefix_len = {r: max(s for s, _, _ in ins) for r, ins in inserts.items()}
    # rows of similar prefix length together, within the token budget
    batches = length_batches(inserts, lambda r: prefix_len[r], micro_batch_tokens)
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
            cache = cache_over(model, kv)
            forward_after_cache(model, decoder, cache, ids.to(device), torch.arange(shared, P).expand(n, S).to(device),
                                 prefix_then_causal(S, shared, dtype), read=(0, 0))
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
            causal = prefix_then_causal(S, 0, dtype)[0]
            where = torch.tensor([segments[j][1] for j in g])
            predict, targets = [], []
            for i, j in enumerate(g):
                s, _, r, block, pos = segments[j]
                e = int(pos[-1])
                block_ids = torch.tensor(block, dtype=torch.long)
                seg_ids[i, : lengths[j]] = torch.cat([block_ids, rows.input_ids[r, s : e + 1]])
                positions[i] = torch.arange(s, s + S)
                bias[i, :, :s] = 0                  # the row's prefix before this turn's span
                bias[i, :, C:] = causal             # the segment itself, causally (pads see only earlier tokens)
                predict.append(i * S + len(block) + (pos - s) - 1)  # flat index of the state predicting span position p
                targets.append(rows.input_ids[r, pos])
            kv = [(k[:, :, :C].index_select(0, where.to(k.device)), v[:, :, :C].index_select(0, where.to(v.device)))
                  for k, v in layers]
            # Only the span's predictions are read: from the last block token to the span's last but one.
            read = (min(len(segments[j][3]) for j in g) - 1, max(lengths[j] for j in g) - 1)
            states = forward_after_cache(model, decoder, kv, seg_ids.to(device), positions.to(device), bias, read=read)
            counters["forwards"] += 1
            counters["sequences"] += n
            counters["tokens"] += sum(lengths[j] for j in g)
            lp = picked_logprobs(head, states.reshape(n * S, -1)[torch.cat(predict).to(device)], torch.cat(targets),
                                 temperature=temperature).cpu()
            at = 0
            for j in g:
                _, _, r, _, pos = segments[j]
                logprobs[r, pos] = lp[at : at + pos.numel()]
                scored[r, pos] = True
                at += pos.numel()
    return logprobs, scored, counters


def length_batches(items, length, budget: int) -> list[list]:
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
    decoder, head = decoder_and_head(model)
    out: list[torch.Tensor | None] = [None] * len(sequences)
    batches = length_batches(range(len(sequences)), lambda j: sequences[j].length, micro_batch_tokens)
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
        inputs = {"input_ids": ids.to(device), "attention_mask": attention, "position_ids": positions.to(device)}
        if decoder is not None:
            hidden = decoder(**inputs, use_cache=False).last_hidden_state
        else:
            hidden = None
            logits_all = model(**inputs, use_cache=False).logits
        forwards += 1
        states = hidden if hidden is not None else logits_all
        for b, s in enumerate(seqs):
            out[batch[b]] = picked_logprobs(head if hidden is not None else None, states[b, s.predict.to(device)],
                                            s.ids[s.target], temperature=temperature, chunk=logit_chunk).cpu()
    return [x if x is not None else torch.zeros(0) for x in out], forwards


# ---------------------------------------------------------------------------------------------
# Attention masks and forwards after cached keys and values


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


def prefix_then_causal(S: int, C: int, dtype: torch.dtype) -> torch.Tensor:
    """[1, S, C + S] additive mask: every query sees the C cached keys, and itself causally."""
    bias = torch.zeros((1, S, C + S), dtype=dtype)
    bias[0, :, C:].masked_fill_(torch.ones((S, S), dtype=torch.bool).triu_(1), torch.finfo(dtype).min)
    return bias


def cache_over(model, kv: list[tuple[torch.Tensor, torch.Tensor]]):
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


def forward_after_cache(model, decoder, kv, ids, positions, bias: torch.Tensor, *,
                         read: tuple[int, int] | None = None) -> torch.Tensor:
    """Hidden states (or logits when the head cannot be split off) of `ids` [B, S] at `positions`,
    attending to the cached keys `kv` (length C; a list of (keys, values) per layer, or a cache, which
    the forward extends) and to themselves where the additive mask `bias` [B or 1, S, C + S] (0 or the
    dtype's minimum) allows. Eager and SDPA attention get `bias` as is, one 4-D tensor for every layer
    (a boolean mask would be converted in each layer); other implementations get the key padding mask
    (`bias`'s last query row), with causality inside the segment their own. `read` = (a, b): only
    the outputs at positions a..b-1 are read (the others may be garbage; (0, 0) when the call is for
    the cache only), so the last layer's attention may skip the other queries."""
    if attention_implementation(model) in ("eager", "sdpa"):
        mask = bias.unsqueeze(1).to(ids.device)
    else:
        mask = (bias[:, -1] == 0).expand(ids.shape[0], -1).to(device=ids.device, dtype=torch.long)
    cache = kv if not isinstance(kv, list) else cache_over(model, kv)
    inputs = {"input_ids": ids, "attention_mask": mask, "position_ids": positions, "past_key_values": cache,
              "use_cache": True}
    last_layer = nullcontext()
    if read is not None and _grouped_sdpa(model):
        inputs["read_queries"] = (len(cache.layers) - 1, *read)
        if decoder is not None and 2 * (read[1] - read[0]) <= ids.shape[1]:  # worth it when most outputs go unread
            last_layer = _LastLayerReadsOnly(decoder, *read)
    with masked_attention(model), last_layer:
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


class _LastLayerReadsOnly:
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


# ---------------------------------------------------------------------------------------------
# Attention implementation: SDPA with grouped key/value heads under a mask


def attention_implementation(model) -> str:
    return str(getattr(model.config, "_attn_implementation", None) or "eager")


def masked_attention(model):
    """The attention implementation for forwards with an additive 4-D mask: SDPA with grouped heads
    on the CPU when the model uses SDPA, else the model's own."""
    if not _grouped_sdpa(model):
        return nullcontext()
    _register_grouped_sdpa()
    return AttentionImplementationSetTo(model.config, _GROUPED_SDPA)


_GROUPED_SDPA = "agentgym_opsd_sdpa_gqa"


def _grouped_sdpa(model) -> bool:
    return attention_implementation(model) == "sdpa" and next(model.parameters()).device.type == "cpu"


@functools.cache
def _register_grouped_sdpa() -> None:
    """Once per process (the sampler enters `masked_attention` on every decoding step)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(_GROUPED_SDPA, _sdpa_with_grouped_heads)
    # A 2-D padding mask (the sampler's) becomes SDPA's 4-D one, as for `sdpa`; without this entry
    # transformers would pass no mask at all to an attention it does not know. 4-D masks pass as given.
    AttentionMaskInterface.register(_GROUPED_SDPA, sdpa_mask)


def _sdpa_with_grouped_heads(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
    """SDPA with the key/value heads shared by query groups in the kernel (`enable_gqa`), also under a
    mask: transformers' SDPA repeats the key and value heads in memory whenever a mask is given (on
    CUDA the grouped kernel would fall back to the math one; on the CPU it is faster: docs/trainer-performance.md).

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


class AttentionImplementationSetTo:
    """Sets `config._attn_implementation` for a block (the layers read it on every forward)."""

    def __init__(self, config, name: str):
        self.config, self.name = config, name

    def __enter__(self):
        self.saved = self.config._attn_implementation
        self.config._attn_implementation = self.name

    def __exit__(self, *exc):
        self.config._attn_implementation = self.saved
