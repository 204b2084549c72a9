"""What more than one benchmark needs: where the checkout and the shared data are, the commit a
report names, and the helpers that time work and write figures."""

from __future__ import annotations

import gc
import io
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agentgym_opsd.io import atomic_write_bytes, atomic_write_text

__all__ = ["DISCUSSION_MARKER", "PAGES", "REPO", "SHARED_DATA", "add_page_argument", "benchmark_command",
           "cpu_model", "git_commit", "load_average", "markdown_table", "page_plot", "percentile", "save_png", "timed",
           "write_results_page"]

REPO = Path(__file__).resolve().parents[1]
# Real public samples (../shared/data beside the checkout): only benchmarks and real-data tests read them.
SHARED_DATA = REPO.parent / "shared" / "data"
# A benchmark's results page (docs/benchmarks/NAME.md): the script writes everything above this line
# from its results; the discussion below it is written by hand and kept as it is when the page is rewritten.
DISCUSSION_MARKER = "<!-- discussion: written by hand below this line; the benchmark rewrites only what is above -->"
PAGES = REPO / "docs" / "benchmarks"
# A plot larger than this stays in the run's folder: the repository keeps only small figures.
PAGE_PLOT_MAX_BYTES = 150_000


def git_commit() -> str:
    """The checkout's short commit, with `+changes` when tracked files differ from it; `unknown` outside git.
    The results pages (PAGES) are left out of that check: they are what a benchmark writes, not what it
    measures, and a page written with its plot would otherwise name its own new plot as a change."""
    try:
        done = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, timeout=10, check=True)
        dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=no", "--",
                                ".", f":(exclude){PAGES.relative_to(REPO).as_posix()}"],
                               capture_output=True, text=True, timeout=10, check=True)
        return done.stdout.strip() + ("+changes" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def load_average() -> list[float]:
    """The machine's 1, 5 and 15-minute load averages, to 2 decimals (other jobs share the cores)."""
    return [round(x, 2) for x in os.getloadavg()]


def timed(fn: Callable[[], Any]) -> tuple[float, float, Any]:
    """(process CPU seconds, wall seconds, result) of `fn()`, after a garbage collection."""
    gc.collect()
    c0, w0 = time.process_time(), time.perf_counter()
    out = fn()
    return time.process_time() - c0, time.perf_counter() - w0, out


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (nearest rank) of `values`; NaN when empty."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, int(round(q / 100 * (len(ordered) - 1)))))]


def save_png(fig, path: Path, *, dpi: int = 120, metadata: dict | None = None) -> None:
    """A matplotlib figure to `path` as PNG, written atomically (a result file is complete or absent),
    and the figure closed."""
    import matplotlib.pyplot as plt

    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=dpi, metadata=metadata)
    plt.close(fig)
    atomic_write_bytes(path, buffer.getvalue())


def cpu_model() -> str:
    """The CPU's model name and count (from /proc/cpuinfo where there is one)."""
    try:
        names = [line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                 if line.startswith("model name")]
    except OSError:
        names = []
    return f"{names[0]} x {len(names)}" if names else f"unknown CPU x {os.cpu_count()}"


def markdown_table(header: list[str], rows: list[list[Any]]) -> str:
    """A GitHub markdown table; a `|` inside a cell is escaped so the row keeps its header's cell count."""
    def cell(value: Any) -> str:
        return str(value).replace("|", "\\|").replace("\n", " ")
    lines = ["| " + " | ".join(cell(h) for h in header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def add_page_argument(ap) -> None:
    """`--page`: the benchmark also writes its results page, docs/benchmarks/NAME.md (a smoke run does not
    by default: its figures would replace the page's)."""
    ap.add_argument("--page", action="store_true",
                    help="write this run's figures to the benchmark's results page, docs/benchmarks/NAME.md")


def benchmark_command(name: str, argv: list[str] | None = None) -> str:
    """The command line that ran benchmark `name` (benchmarks/`name`.py) with this process's arguments
    (or `argv`), quoted as a shell needs: what a results page names."""
    args = sys.argv[1:] if argv is None else argv
    return " ".join(["python -m benchmarks." + name, *(shlex.quote(a) for a in args)])


def page_plot(png: Path, name: str, *, pages: Path | None = None) -> tuple[str, ...]:
    """Copy the plot `png` next to the results pages as `name`.png (atomically) and return its path relative to
    the page, for `write_results_page(plots=...)`; () when it is missing or over PAGE_PLOT_MAX_BYTES (too large
    to keep in the repository: it stays where the run wrote it)."""
    png = Path(png)
    if not png.is_file() or png.stat().st_size > PAGE_PLOT_MAX_BYTES:
        return ()
    atomic_write_bytes((pages or PAGES) / f"{name}.png", png.read_bytes())
    return (f"{name}.png",)


def write_results_page(name: str, title: str, body: str, *, command: str, threads: int | str | None = None,
                       load: Any = None, commit: str | None = None, plots: tuple[str, ...] = (),
                       pages: Path | None = None, cpu: str | None = None) -> Path:
    """Write docs/benchmarks/`name`.md: the title, a line naming the command, commit, CPU model, threads,
    load average and date (`cpu`: the CPU the figures were measured on, where not this one), the results
    `body` (markdown) and the plots (paths relative to the page), then the hand-written discussion kept
    from the page already there (below `DISCUSSION_MARKER`)."""
    path = (pages or PAGES) / f"{name}.md"
    discussion = "\nNo discussion yet.\n"
    if path.is_file():
        old = path.read_text(encoding="utf-8")
        if DISCUSSION_MARKER in old:
            discussion = old.split(DISCUSSION_MARKER, 1)[1]
    load_text = ("not recorded" if load is None else
                 " -> ".join(f"{x:.2f}" for x in load) if isinstance(load, (list, tuple)) else str(load))
    facts = (f"Measured at commit {commit or git_commit()} on {time.strftime('%Y-%m-%d')}, on {cpu or cpu_model()}, "
             f"{'threads not recorded' if threads is None else f'{threads} torch thread(s)'}, load average "
             f"{load_text}, by:\n\n    {command}")
    figures = "".join(f"\n![{Path(p).stem}]({p})\n" for p in plots)
    text = f"# {title}\n\n{facts}\n\n{body.strip()}\n{figures}\n{DISCUSSION_MARKER}{discussion}"
    atomic_write_text(path, text)
    return path
