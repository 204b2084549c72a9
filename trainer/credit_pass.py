"""One credit pass: what an update computes for a batch of episodes, without the update.

`credit_pass` builds the token rows, scores them with the student and (for the methods that have one)
the teacher with privileged context, and runs `compute_advantages(..., return_parts=True)`: the same
steps the local trainer takes before its loss. For a report of credit without a training run (the
demo's reading-teacher section; `trainer.credit_records.update_credit_records` turns the result into
the records the report reads).
"""

from __future__ import annotations

from trainer.credit import compute_advantages
from trainer.forward import row_logprobs
from trainer.rows import build_rows
from trainer.teacher import score_teacher

__all__ = ["credit_pass"]


def credit_pass(student, teacher, tokenizer, episodes, config, step: int = 0, *, temperature: float = 1.0):
    """What an update computes for `episodes` (the local trainer runs the same steps): token rows, the
    student's log-probs, the teacher's with privileged context (for the methods that have one), and
    `compute_advantages(..., return_parts=True)`. Returns (rows, student log-probs, parts)."""
    rows = build_rows(list(episodes), tokenizer, span_mode=config.span_mode)
    lp_student = row_logprobs(student, rows, temperature=temperature)
    if config.needs_teacher:
        scores = score_teacher(teacher, tokenizer, list(episodes), rows, config, temperature=temperature)
        batch = rows.credit_batch(lp_student, scores.logprobs, scores.scored, scores.truncated)
    else:
        batch = rows.credit_batch(lp_student)
    _, _, parts = compute_advantages(batch, config, step, return_parts=True)
    return rows, lp_student, parts
