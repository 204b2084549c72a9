"""Teacher log-probs for the credit core, computed on OpenRLHF's actor group.

Where: one extra no-grad forward pass on the actor group (`PolicyModelActor.forward`, the same
DeepSpeed engine, weights and numerics that produced the student log-probs in `make_experience`),
right after `make_experience`. Why not vLLM prompt log-probs in the executor: the token gap
delta = lp_T - lp_S is a difference of two log-probs, and AgentOPSD sums it over every token of a
turn; computing lp_T in vLLM and lp_S in DeepSpeed would add the engines' numeric mismatch (bf16
kernels, sampling-time logit processing) to every token of that sum, and the mismatch does not
average out. On the actor group both terms come from one engine, so delta is zero wherever the
privileged context changes nothing. It also keeps the vLLM engines free for rollouts.

A teacher row is a token sequence that holds the SAME generated tokens as the student row, with
privileged text spliced in before them, and the positions of the tokens to score in it.

Cost. OpenRLHF's `Actor.forward` takes padded rows (or unpads them itself with
--ds.packing_samples), never a custom attention mask or a reused key/value cache, so StepOPSD's
teacher here is one sequence per turn (the student's prefix, the block, the span): about
sum_k (s_k + |block| + |span_k|) tokens, where the local trainer's prefix-cache scorer runs the
prefix once (`trainer.forward.score_inserts_with_prefix_cache`). The rows are sorted by length
into micro-batches, so padding costs little. AgentOPSD's teacher is one sequence per episode here
(the local trainer runs the shared skill note once, `trainer.forward.score_sequences_with_shared_prefix`). The
sequences themselves are the credit core's (`trainer.teacher.build_teacher_sequences`); this module
only runs them (see `trainer.openrlhf.credit_rows.teacher_logprobs`).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

__all__ = ["TeacherRow", "score_rows", "pad_rows"]


@dataclass
class TeacherRow:
    """One teacher forward row: its token ids and the positions (>= 1) of the tokens to score."""

    sequence: list[int]
    targets: list[int] = field(default_factory=list)


def pad_rows(rows: Sequence[TeacherRow], pad_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded `(sequences, attention_mask, action_mask)` for `Actor.forward`.

    The action mask covers positions 1..L-1 (OpenRLHF's layout: index i is token i + 1) and is 1 on
    the scored tokens only.
    """
    width = max(len(r.sequence) for r in rows)
    sequences = torch.full((len(rows), width), int(pad_id), dtype=torch.long)
    attention = torch.zeros((len(rows), width), dtype=torch.long)
    action = torch.zeros((len(rows), width - 1), dtype=torch.long)
    for i, r in enumerate(rows):
        sequences[i, : len(r.sequence)] = torch.tensor(r.sequence, dtype=torch.long)
        attention[i, : len(r.sequence)] = 1
        for t in r.targets:
            action[i, t - 1] = 1
    return sequences, attention, action


def score_rows(actor_group, rows: Sequence[TeacherRow], micro_batch_size: int, pad_id: int,
               get=None) -> list[torch.Tensor]:
    """Teacher log-probs of every row's scored tokens, from the actor group's `forward`.

    The rows go out as micro-batches of `micro_batch_size`, spread over the group's actors as
    `RemoteExperienceMaker.make_experience` spreads the student forward. The number of micro-batches
    is padded to a multiple of the data-parallel actor count (repeating the last one; its result is
    dropped), so every rank runs the same number of forwards (ZeRO-3 needs them in lockstep).

    Returns:
        One float tensor per row: the log-prob of each of its `targets`, in order.
    """
    import ray

    get = get or ray.get
    if not rows:
        return []
    # Longest first, so a micro-batch holds rows of about one length: little padding (and with
    # --ds.packing_samples OpenRLHF's forward drops what there is). Results go back in the rows' order.
    order = sorted(range(len(rows)), key=lambda i: -len(rows[i].sequence))
    batches = [[rows[i] for i in order[j : j + micro_batch_size]] for j in range(0, len(order), micro_batch_size)]
    n_real = len(batches)
    duplicate = int(getattr(actor_group, "duplicate_actors", 1) or 1)
    handlers = getattr(actor_group, "_actor_handlers", None)
    effective = max(1, len(handlers) // duplicate) if handlers else 1
    while len(batches) % effective:
        batches.append(batches[-1])
    padded = [pad_rows(b, pad_id) for b in batches]
    refs = actor_group.async_run_method_batch(
        method_name="forward",
        sequences=[p[0] for p in padded],
        action_mask=[p[2] for p in padded],
        attention_mask=[p[1] for p in padded],
    )
    results = list(itertools.chain.from_iterable(get(refs)[::duplicate]))[:n_real]
    scored: list[torch.Tensor] = []
    for batch, log_probs in zip(batches[:n_real], results, strict=True):
        log_probs = log_probs.float()
        for i, r in enumerate(batch):
            index = torch.tensor([t - 1 for t in r.targets], dtype=torch.long)
            scored.append(log_probs[i, index] if len(index) else torch.zeros(0))
    out: list[torch.Tensor] = [torch.zeros(0)] * len(rows)
    for position, i in enumerate(order):
        out[i] = scored[position]
    return out
