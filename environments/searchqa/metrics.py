"""Answer scoring for open-domain QA: SQuAD normalisation, exact match, token F1, substring match.

    normalize_answer("The  Eiffel-Tower!")  ->  "eiffel tower"
    exact_match("the eiffel tower", ["Eiffel Tower"])   -> 1.0
    f1_score("eiffel tower in paris", ["Eiffel Tower"]) -> 0.667
    substring_match("it is the Eiffel Tower", ["Eiffel Tower"]) -> 1.0

The normalisation is SQuAD's (lowercase, drop punctuation, drop the articles a/an/the, collapse
whitespace); every score takes the best over the gold answers. A gold answer that normalises to
nothing (real golds such as "*", "(a", ".a", "!!!") matches nothing: F1 is 0 as in SQuAD v1.1's
script (no token in common), and EM and substring match are 0 too (v1.1's EM would count the empty
prediction "the" or "." as equal to it).
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Sequence

__all__ = ["normalize_answer", "exact_match", "f1_score", "substring_match", "score_answer"]

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = set(string.punctuation)


def normalize_answer(text: str) -> str:
    """Lowercase, remove punctuation, remove articles, collapse whitespace (SQuAD v1.1 evaluation)."""
    text = text.lower()
    text = "".join(ch for ch in text if ch not in _PUNCTUATION)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def exact_match(prediction: str, golds: Sequence[str]) -> float:
    """1.0 when the normalised prediction equals a normalised gold answer."""
    pred = normalize_answer(prediction)
    return float(any((g_norm := normalize_answer(g)) and pred == g_norm for g in golds))


def _f1(pred_tokens: list[str], gold_tokens: list[str]) -> float:
    # F1 = 2 P R / (P + R), P = |common| / |pred|, R = |common| / |gold| (token multisets); no token in
    # common (an empty prediction or gold included) gives 0, as in SQuAD v1.1.
    common = sum((Counter(pred_tokens) & Counter(gold_tokens)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(pred_tokens), common / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def f1_score(prediction: str, golds: Sequence[str]) -> float:
    """The best token-level F1 between the normalised prediction and a normalised gold answer."""
    pred = normalize_answer(prediction).split()
    return max((_f1(pred, normalize_answer(g).split()) for g in golds), default=0.0)


def substring_match(prediction: str, golds: Sequence[str]) -> float:
    """1.0 when a normalised gold answer occurs inside the normalised prediction (substring EM)."""
    pred = normalize_answer(prediction)
    return float(any((g_norm := normalize_answer(g)) and g_norm in pred for g in golds))


def score_answer(prediction: str, golds: Sequence[str]) -> dict[str, float]:
    """`{"em", "f1", "subem"}` of a prediction against the gold answers."""
    return {
        "em": exact_match(prediction, golds),
        "f1": round(f1_score(prediction, golds), 6),
        "subem": substring_match(prediction, golds),
    }
