"""The credit methods are documented inside the repository (docs/credit.md), and that is what the code cites.

A user's clone holds only the repository: a comment that sends the reader to a file beside it, or to
"the spec" and its numbered sections, points nowhere. These tests hold every tracked file to that:
no path into the shared folder's specification, no citation of a spec section or of "the spec", and
every `docs/credit.md#anchor` cited anywhere is a heading of docs/credit.md. The document itself is
held to the code: it names every `CreditConfig` field and every diagnostic `compute_advantages` logs.
"""

from __future__ import annotations

import dataclasses
import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
CREDIT_DOC = REPO / "docs" / "credit.md"
THIS = Path(__file__).resolve().relative_to(REPO).as_posix()

# Spelled in two pieces so that this file does not match its own rules.
OUTSIDE_SPEC = "shared/" + "spec"
# A citation may break across lines (of a docstring, or of # comments).
OLD_CITATIONS = re.compile(
    r"(?i)\b(?:the|credit)[\s#]+" + "spec" + r"\b"  # "the spec", "the spec's", "the credit spec"
    # "spec section 2"
    r"|\b" + "spec" + r"(?:'s)?[\s#]+(?:sections?|defaults|properties|formulas?|bounds|asks|allows)\b"
)
CITED_ANCHOR = re.compile(r"docs/credit\.md#([\w-]+)")
HEADING = re.compile(r"^(#{1,6})\s+(.+?)\s*#*\s*$")


def tracked_text_files() -> list[tuple[str, str]]:
    """(path, text) of every file git tracks (untracked new files included), this test file excepted."""
    try:
        listing = subprocess.run(
            ["git", "-C", str(REPO), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            check=True, capture_output=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout: the tracked files are unknown")
    out = []
    for name in sorted(set(listing.decode().split("\0")) - {"", THIS}):
        path = REPO / name
        if path.is_file():
            out.append((name, path.read_bytes().decode("utf-8", errors="ignore")))
    return out


def slug(heading: str) -> str:
    """GitHub's anchor of a markdown heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"`([^`]*)`", r"\1", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def doc_anchors(text: str) -> list[str]:
    anchors, fenced = [], False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif not fenced and (m := HEADING.match(line)):
            anchors.append(slug(m.group(2)))
    return anchors


def test_nothing_points_outside_the_repository_or_at_the_old_spec():
    bad = []
    for name, text in tracked_text_files():
        found = [m.start() for m in OLD_CITATIONS.finditer(text)]
        found += [m.start() for m in re.finditer(re.escape(OUTSIDE_SPEC), text)]
        for number in sorted({text.count("\n", 0, at) + 1 for at in found}):
            bad.append(f"{name}:{number}: {text.splitlines()[number - 1].strip()[:120]}")
    assert not bad, "cite docs/credit.md#<section> instead:\n" + "\n".join(bad)


def test_every_cited_section_of_the_credit_document_exists():
    assert CREDIT_DOC.is_file(), "docs/credit.md is missing"
    anchors = doc_anchors(CREDIT_DOC.read_text(encoding="utf-8"))
    duplicates = sorted({a for a in anchors if anchors.count(a) > 1})
    assert not duplicates, f"headings with the same anchor (GitHub would number them): {duplicates}"
    bad, cited = [], 0
    for name, text in tracked_text_files():
        for number, line in enumerate(text.splitlines(), start=1):
            for anchor in CITED_ANCHOR.findall(line):
                cited += 1
                if anchor not in anchors:
                    bad.append(f"{name}:{number}: #{anchor}")
    assert not bad, "citations of sections docs/credit.md does not have:\n" + "\n".join(bad)
    assert cited >= 20  # the credit code cites its sections; a rule that matched nothing would pass vacuously


def test_the_slugs_are_githubs():
    """The checkers can fail: anchors as GitHub writes them, citations across lines."""
    assert slug("StepOPSD teacher: the hindsight block") == "stepopsd-teacher-the-hindsight-block"
    assert slug("Token gap and turn evidence") == "token-gap-and-turn-evidence"
    assert slug("The `release` preset") == "the-release-preset"
    assert doc_anchors("# A\n```\n# not a heading\n```\n## B c\n") == ["a", "b-c"]
    assert OLD_CITATIONS.search("the credit diagnostics (" + "spec\n    section 5)")
    assert OLD_CITATIONS.search("# as the\n# " + "spec asks")
    assert not OLD_CITATIONS.search("the goal of `" + "spec`, a TOML " + "spec, TinyModel" + "Spec(hidden_size=32)")


def test_the_document_names_every_setting_and_every_logged_diagnostic():
    torch = pytest.importorskip("torch")
    from trainer.credit import CreditBatch, CreditConfig, compute_advantages

    text = CREDIT_DOC.read_text(encoding="utf-8")
    missing = [f.name for f in dataclasses.fields(CreditConfig) if f"`{f.name}`" not in text]
    assert not missing, f"CreditConfig fields docs/credit.md does not describe: {missing}"

    # One group of two episodes (two turns each), every method: the keys compute_advantages logs.
    turn_id = torch.tensor([[-1, 0, 0, -1, 1, 1], [-1, 0, 0, -1, 1, 1]])
    batch = CreditBatch(
        turn_id=turn_id, span=turn_id >= 0, row_episode=torch.tensor([0, 1]), episode_group=torch.tensor([0, 0]),
        success=torch.tensor([True, False]), num_turns=torch.tensor([2, 2]), score=torch.tensor([1.0, 0.0]),
        invalid_turns=torch.tensor([0, 1]), step_reward=torch.tensor([[0.0, 1.0], [0.0, 0.0]]),
        state_id=torch.tensor([[0, 1], [0, 2]]), student_logprobs=torch.full((2, 6), -1.0),
        teacher_logprobs=torch.tensor([[0.0, -0.5, -2.0, 0.0, -0.2, -1.5]] * 2),
    )
    keys = set()
    for method in ("grpo", "gigpo", "stepopsd", "agentopsd", "rlsd"):
        config = CreditConfig.for_method(method)
        keys |= set(compute_advantages(batch, config, 0)[1])
    unnamed = sorted(k for k in keys if f"`{k}`" not in text)
    assert not unnamed, f"diagnostics docs/credit.md does not list: {unnamed}"
