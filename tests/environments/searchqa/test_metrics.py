"""Answer scoring: SQuAD normalisation, EM, token F1, substring EM (values worked out by hand)."""

from __future__ import annotations

import pytest

from environments.searchqa.metrics import exact_match, f1_score, normalize_answer, score_answer, substring_match


@pytest.mark.parametrize(
    "text,expected",
    [
        ("The Eiffel Tower", "eiffel tower"),
        ("  an  apple,  a pear!", "apple pear"),
        ("Théâtre-du-Châtelet", "théâtreduchâtelet"),  # hyphens are punctuation: removed, not spaces
        ("Anthem of the Seas", "anthem of seas"),  # articles only as whole words
        ("", ""),
    ],
)
def test_normalize(text: str, expected: str) -> None:
    assert normalize_answer(text) == expected


def test_exact_match_over_aliases() -> None:
    assert exact_match("the  Onion.", ["Allium cepa", "Onion"]) == 1.0
    assert exact_match("onions", ["Onion"]) == 0.0
    assert exact_match("", ["Onion"]) == 0.0


def test_f1_is_token_overlap() -> None:
    # pred "eiffel tower paris" vs gold "eiffel tower": P = 2/3, R = 1, F1 = 0.8
    assert f1_score("Eiffel Tower, Paris", ["The Eiffel Tower"]) == pytest.approx(0.8)
    # best over golds: "tower" vs "tower bridge" -> P=1, R=1/2 -> 2/3
    assert f1_score("tower", ["London", "Tower Bridge"]) == pytest.approx(2 / 3)
    assert f1_score("a", ["the"]) == 0.0  # both normalise to nothing: no token in common (SQuAD v1.1)
    assert f1_score("x", ["y"]) == 0.0
    # repeated tokens count as a multiset: pred "new new york" vs "new york": common 2, P=2/3, R=1
    assert f1_score("new new york", ["New York"]) == pytest.approx(0.8)


def test_substring_match() -> None:
    assert substring_match("I think it is the Eiffel Tower in Paris", ["Eiffel Tower"]) == 1.0
    assert substring_match("Paris", ["Eiffel Tower"]) == 0.0
    assert substring_match("anything", ["the", "Eiffel"]) == 0.0  # an answer that normalises to "" never matches


def test_score_answer_bundle() -> None:
    assert score_answer("Paris", ["paris"]) == {"em": 1.0, "f1": 1.0, "subem": 1.0}
    s = score_answer("Paris France", ["Paris"])
    assert s["em"] == 0.0 and s["subem"] == 1.0 and s["f1"] == pytest.approx(2 / 3, abs=1e-6)


@pytest.mark.parametrize("gold", ["*", "(a", ".a", "!!!"])  # real golds that normalise to ""
@pytest.mark.parametrize("prediction", ["the", ".", "", "a"])
def test_a_gold_that_normalises_to_nothing_matches_nothing(gold: str, prediction: str) -> None:
    assert normalize_answer(gold) == ""
    assert score_answer(prediction, [gold]) == {"em": 0.0, "f1": 0.0, "subem": 0.0}
    # ... and does not hide a real match among the other golds
    assert score_answer("Paris", [gold, "paris"]) == {"em": 1.0, "f1": 1.0, "subem": 1.0}
