"""The credit methods are documented inside the repository (docs/credit.md), and that is what the code cites.

A user's clone holds only the repository: a comment that sends the reader to a file beside it, or to
"the spec" and its numbered sections, points nowhere. These tests hold every tracked file to that:
no path into the shared folder's specification, no citation of a spec section or of "the spec", and
every `docs/credit.md#anchor` cited anywhere is a heading of docs/credit.md. The document itself is
held to the code: it names every `CreditConfig` field and every diagnostic `compute_advantages` logs.

The markdown pages (README.md and docs/**/*.md) are held to how GitHub renders them: every table row
has its header's cell count, every relative link and image resolves to a file of the repository (and
an `#anchor` to a heading of its target), and every figure page (`FIGURE_DIRS`) names the command that
produced its figures and the commit it ran at.
"""

from __future__ import annotations

import dataclasses
import re
import urllib.parse
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


# ------------------------------------------------------------------------------------------------
# The markdown pages: tables, links, figure pages.

# Pages that report measured figures: every markdown page under these folders (pages a benchmark
# script writes from its results; docs/scale/ already works so).
FIGURE_DIRS = ("docs/benchmarks", "docs/scale")
# A figure page names its command: a code span or an indented code line that runs a benchmark script,
# the CLI or pytest.
COMMAND = re.compile(r"(?m)(?:`|^ {4})(?:[A-Z_]+=\S+ )*(?:\.venv/bin/)?(?:python3? |agentgym-opsd |make |pytest )\S")
# ... and its commit: "commit" followed by 7-40 hex digits, or "at" followed by 7-40 hex digits with at
# least one digit and one letter (not "at 1000000 passages").
COMMIT = re.compile(r"(?i)\bcommit\W{0,3}[0-9a-f]{7,40}\b"
                    r"|\bat\W{0,3}(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}\b")

# Known defects, each an xfail(strict=True) test: when the defect is fixed, that test fails until its
# entry here is removed. (page, start of the table row) -> reason.
KNOWN_BAD_ROWS: dict[tuple[str, str], str] = {}
# page -> reason.
KNOWN_FIGURE_PAGES_WITHOUT_COMMIT: dict[str, str] = {}

INLINE_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*(<[^>]*>|[^\s()]*(?:\([^\s()]*\)[^\s()]*)*)"
                         r"(?:\s+(?:\"[^\"]*\"|'[^']*'|\([^)]*\)))?\s*\)")
REFERENCE_DEFINITION = re.compile(r"^ {0,3}\[[^\]]+\]:\s*(<[^>]*>|\S+)")
HTML_SOURCE = re.compile(r"""<(?:img|a)\b[^>]*?\b(?:src|href)\s*=\s*["']([^"']+)["']""", re.IGNORECASE)
SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")
FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
DELIMITER_CELL = re.compile(r"^\s*:?-+:?\s*$")


def markdown_pages() -> list[str]:
    """README.md and every docs/**/*.md, as paths relative to the repository."""
    pages = ["README.md"] + sorted(p.relative_to(REPO).as_posix() for p in (REPO / "docs").rglob("*.md"))
    return [p for p in pages if (REPO / p).is_file()]


def prose_lines(text: str) -> list[tuple[int, str]]:
    """(line number, line) of the lines outside fenced and indented code blocks."""
    out, fence, previous_blank = [], None, True
    for number, line in enumerate(text.splitlines(), start=1):
        m = FENCE.match(line)
        if fence is not None:
            run = m.group(1) if m else ""
            if run[:1] == fence[0] and len(run) >= len(fence) and not line.strip()[len(run):].strip():
                fence = None  # the closing fence: the same character, at least as many, nothing after
            continue
        if m:
            fence = m.group(1)
            continue
        if previous_blank and line.startswith("    ") and line.strip():
            continue  # an indented code block (it can only start after a blank line)
        previous_blank = not line.strip() or (previous_blank and line.startswith("    "))
        out.append((number, line))
    return out


def table_cells(row: str) -> list[str]:
    """The cells of a table row by GFM's rule: a `|` splits cells unless a backslash escapes it, inside
    code spans too; one leading and one trailing `|` are optional."""
    row = row.strip()
    if row.startswith("|"):
        row = row[1:]
    if row.endswith("|") and not row.endswith("\\|"):
        row = row[:-1]
    return re.split(r"(?<!\\)\|", row)


def markdown_tables(text: str) -> list[tuple[int, list[tuple[int, str]]]]:
    """Each table as (header's cell count, [(line number, row)] of its delimiter and body rows). A table
    is a header row followed by a delimiter row (`|---|:-:|`) of the same cell count; it ends at a blank line."""
    lines = prose_lines(text)
    tables, i = [], 0
    while i + 1 < len(lines):
        (n0, header), (n1, delimiter) = lines[i], lines[i + 1]
        cells = table_cells(delimiter)
        if ("|" in header and n1 == n0 + 1 and "-" in delimiter
                and all(DELIMITER_CELL.match(c) for c in cells) and len(table_cells(header)) == len(cells)):
            rows, j = [], i + 2
            while j < len(lines) and lines[j][0] == lines[j - 1][0] + 1 and lines[j][1].strip():
                rows.append(lines[j])
                j += 1
            tables.append((len(cells), rows))
            i = j
        else:
            i += 1
    return tables


def github_anchors(text: str) -> set[str]:
    """The anchors GitHub gives a page's headings (a repeated one gets -1, -2, ...), and explicit
    `<a id=...>`/`<a name=...>` anchors."""
    seen, out = {}, set()
    for anchor in doc_anchors(text):
        count = seen.get(anchor, 0)
        seen[anchor] = count + 1
        out.add(anchor if count == 0 else f"{anchor}-{count}")
    out |= set(re.findall(r"""<a\s[^>]*?\b(?:id|name)\s*=\s*["']([^"']+)["']""", text))
    return out


def strip_code_spans(line: str) -> str:
    """The line with its code spans blanked (a link inside backticks is not a link)."""
    return re.sub(r"(`+)(?:(?!\1).)+?\1", lambda m: " " * len(m.group(0)), line)


def link_targets(text: str) -> list[tuple[int, str]]:
    """(line number, target) of every inline link and image, reference definition and HTML src/href."""
    out = []
    for number, line in prose_lines(text):
        line = strip_code_spans(line)
        for m in INLINE_LINK.finditer(line):
            out.append((number, m.group(1)))
        if m := REFERENCE_DEFINITION.match(line):
            out.append((number, m.group(1)))
        out.extend((number, target) for target in HTML_SOURCE.findall(line))
    return [(n, t[1:-1] if t.startswith("<") and t.endswith(">") else t) for n, t in out]


def broken_link(page: str, target: str) -> str | None:
    """Why `target` (a link on `page`) does not resolve, or None. Links with a scheme (https:, mailto:)
    are not checked; a relative one must name a file or folder inside the repository, and its `#anchor`
    a heading of the target page (of this page for a bare `#anchor`)."""
    if not target or SCHEME.match(target) or target.startswith("//"):
        return None
    path_part, _, anchor = target.partition("#")
    path_part = urllib.parse.unquote(path_part.split("?", 1)[0])
    if path_part.startswith("/"):
        return "an absolute path (GitHub resolves it against the host, not the repository): make it relative"
    source = REPO / page
    resolved = (source.parent / path_part).resolve() if path_part else source
    if REPO not in resolved.parents and resolved != REPO:
        return "points outside the repository"
    if not resolved.exists():
        return "no such file"
    if anchor and resolved.suffix == ".md" and resolved.is_file():
        if urllib.parse.unquote(anchor).lower() not in github_anchors(resolved.read_text(encoding="utf-8")):
            return f"{resolved.relative_to(REPO).as_posix()} has no heading with the anchor #{anchor}"
    return None


def known_bad_row(page: str, row: str) -> bool:
    return any(page == p and row.lstrip().startswith(start) for p, start in KNOWN_BAD_ROWS)


@pytest.mark.parametrize("page", markdown_pages())
def test_every_table_row_has_its_headers_cell_count(page: str):
    bad = []
    for width, rows in markdown_tables((REPO / page).read_text(encoding="utf-8")):
        for number, row in rows:
            cells = len(table_cells(row))
            if cells != width and not known_bad_row(page, row):
                bad.append(f"{page}:{number}: {cells} cells, the header has {width}: {row.strip()[:100]}")
    assert not bad, ("table rows GitHub would render with cells dropped or added (escape a `|` inside a cell "
                     "as `\\|`, in code spans too):\n" + "\n".join(bad))


@pytest.mark.parametrize(("page", "start"), [
    pytest.param(page, start, id=f"{page}:{start}", marks=pytest.mark.xfail(strict=True, reason=reason))
    for (page, start), reason in KNOWN_BAD_ROWS.items()
])
def test_known_bad_table_rows(page: str, start: str):
    """The rows KNOWN_BAD_ROWS excuses, checked on their own: fixed (or gone), this test passes, and
    strict xfail turns that into a failure that says to remove the entry."""
    found = [(width, row) for width, rows in markdown_tables((REPO / page).read_text(encoding="utf-8"))
             for _, row in rows if row.lstrip().startswith(start)]
    for width, row in found:
        assert len(table_cells(row)) == width


@pytest.mark.parametrize("page", markdown_pages())
def test_every_relative_link_resolves(page: str):
    bad = []
    for number, target in link_targets((REPO / page).read_text(encoding="utf-8")):
        if why := broken_link(page, target):
            bad.append(f"{page}:{number}: ({target}): {why}")
    assert not bad, "links that do not resolve in the repository:\n" + "\n".join(bad)


def figure_pages() -> list[str]:
    return [p for p in markdown_pages() if p.startswith(tuple(d + "/" for d in FIGURE_DIRS))]


@pytest.mark.parametrize("page", [
    pytest.param(p, marks=[pytest.mark.xfail(strict=True, reason=KNOWN_FIGURE_PAGES_WITHOUT_COMMIT[p])]
                 if p in KNOWN_FIGURE_PAGES_WITHOUT_COMMIT else [])
    for p in figure_pages()
])
def test_every_figure_page_names_its_command_and_commit(page: str):
    text = (REPO / page).read_text(encoding="utf-8")
    assert COMMAND.search(text), (f"{page} reports figures but names no command that produced them "
                                  "(`python benchmarks/...` in a code span or code block)")
    assert COMMIT.search(text), f"{page} reports figures but names no commit they were measured at (\"commit abc1234\")"


def test_the_markdown_checkers_can_fail(tmp_path):
    """Each checker finds what it exists to find, by GFM's rules."""
    assert table_cells("| a | b |") == [" a ", " b "]
    assert table_cells("a | b") == ["a ", " b"]
    assert len(table_cells(r"| a \| b | c |")) == 2  # an escaped pipe does not split
    assert len(table_cells("| `a | b` | c |")) == 3  # one in a code span does (GFM)
    text = "| h1 | h2 |\n|---|:-:|\n| a | b |\n| a | b | c |\n\n| not | a table |\n"
    assert [(w, [n for n, _ in rows]) for w, rows in markdown_tables(text)] == [(2, [3, 4])]
    assert markdown_tables("```\n| a | b |\n|---|---|\n| c |\n```\n") == []
    assert markdown_tables("| a | b |\n|---|---|---|\n| c | d |\n") == []  # delimiter of another width: no table

    links = link_targets("[x](a.md) ![y](img/p.png \"t\") `[z](in-code.md)` [w](<sp ace.md#h>)\n[r]: ref.md\n"
                         "<img src=\"pic.png\">\n```\n[q](fenced.md)\n```\n")
    assert [t for _, t in links] == ["a.md", "img/p.png", "sp ace.md#h", "ref.md", "pic.png"]
    assert broken_link("README.md", "https://example.org/x") is None
    assert broken_link("README.md", "docs/credit.md#stepopsd-teacher") is None
    assert broken_link("README.md", "docs/credit.md#no-such-heading")
    assert broken_link("README.md", "docs/no-such-page.md")
    assert broken_link("README.md", "../outside.md") == "points outside the repository"
    assert broken_link("docs/scale/scale.md", "../credit.md#grpo") is None
    assert github_anchors("# A\n## A\n<a id=\"x\"></a>\n") == {"a", "a-1", "x"}

    assert COMMAND.search("Measured with: `python benchmarks/scale.py --quick`")
    assert COMMAND.search("    OMP_NUM_THREADS=1 agentgym-opsd bench x.toml")
    assert not COMMAND.search("the scale runs (python, in a sentence)")
    assert COMMIT.search("measured at commit 4d7a989 (2026-12-01)")
    assert COMMIT.search("at 4d7a989")
    assert COMMIT.search("commit 1234567")  # all digits: a commit all the same when it is named one
    assert not COMMIT.search("at 1000000 passages; commit abcdefg")
