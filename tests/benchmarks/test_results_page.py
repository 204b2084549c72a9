"""A benchmark's results page: the script rewrites what is above the marker and keeps the discussion below it."""

from __future__ import annotations

from benchmarks.common import DISCUSSION_MARKER, markdown_table, write_results_page
from tests.test_docs import COMMAND, COMMIT, markdown_tables, table_cells


def test_a_rewrite_keeps_the_hand_written_discussion_and_replaces_the_figures(tmp_path):
    page = write_results_page("speed", "Speed", "old figure: 1.0", command="python -m benchmarks.speed --page",
                              threads=2, load=[1.5, 2.0], commit="abc1234", pages=tmp_path)
    page.write_text(page.read_text() + "Why 1.0: the cache was cold.\n")
    write_results_page("speed", "Speed", "new figure: 2.0", command="python -m benchmarks.speed --page",
                       threads=2, load=[0.5], commit="def5678", pages=tmp_path)
    text = page.read_text()
    above, below = text.split(DISCUSSION_MARKER)
    assert "new figure: 2.0" in above and "old figure" not in text
    assert "Why 1.0: the cache was cold." in below and text.count(DISCUSSION_MARKER) == 1
    # the page passes the docs checks: it names its command and commit
    assert COMMAND.search(above) and COMMIT.search(above) and "def5678" in above


def test_a_table_cell_with_a_pipe_keeps_the_headers_cell_count():
    table = markdown_table(["flag", "meaning"], [["`--a | --b`", "either"], ["x", "y|z"]])
    [(width, rows)] = markdown_tables(table + "\n")
    assert width == 2 and [len(table_cells(row)) for _, row in rows] == [2, 2]
