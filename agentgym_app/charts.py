"""Success charts: one horizontal bar per agent (and split) with its 95% Wilson interval, as PNG bytes.

The bench's per-subset charts (`plots/`) and the report's headline chart are drawn here. Agent names
are never cut: a long one (`hf:runs/x/model?temperature=0`) is wrapped over several lines of its tick
label (`wrap_label`). Each bar is labelled with its wins and episodes (`13/200`), and in the wide
chart with the rate and the interval too.
"""

from __future__ import annotations

import io
import math
from collections.abc import Sequence
from typing import Any

__all__ = ["wrap_label", "success_chart_png"]

_BREAK_AFTER = "/?&=,;:_- "
_HATCHES = ["", "//", "..", "xx", "\\\\"]


def wrap_label(text: str, width: int) -> str:
    """`text` on lines of at most `width` characters, broken after `/`, `?`, `&`, `=`, `_`, `-`, a
    space or similar where it can be, inside a word only where a word is longer than a line. Nothing
    is left out: the lines joined give `text` back."""
    lines: list[str] = []
    line = ""
    piece = ""
    pieces: list[str] = []
    for char in text:
        piece += char
        if char in _BREAK_AFTER:
            pieces.append(piece)
            piece = ""
    if piece:
        pieces.append(piece)
    for piece in pieces:
        while len(piece) > width:  # longer than a line: cut where the line is full
            room = width - len(line)
            if room == 0:
                lines.append(line)
                line, room = "", width
            line += piece[:room]
            piece = piece[room:]
        if len(line) + len(piece) > width:
            lines.append(line)
            line = ""
        line += piece
    if line or not lines:
        lines.append(line)
    return "\n".join(lines)


def _wins(row: dict[str, Any]) -> int:
    return round(row["success_rate"] * row["episodes"])


def success_chart_png(rows: Sequence[dict[str, Any]], *, title: str, wide: bool = False,
                      zoom: bool = False) -> bytes:  # fmt: skip
    """A horizontal bar per row: success % with its 95% interval, agents top to bottom in the order
    given, a row's `split` as the bar's hatch (with a legend when there are several).

    Args:
        rows: dicts with `agent`, `split`, `episodes`, `success_rate`, `success_ci95`.
        title: the chart's title.
        wide: a full-width chart (the report's headline): bigger type, each bar labelled with its
            wins, rate and interval.
        zoom: end the axis a little past the highest interval of the agents below 50% (when that is
            under 50%), so that rates of a few percent are wide enough to compare; a bar past the end
            is cut there and its label says so.
    """
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    agents = list(dict.fromkeys(r["agent"] for r in rows))
    splits = list(dict.fromkeys(r["split"] for r in rows))
    label_width = 34 if wide else 22
    labels = [wrap_label(a, label_width) for a in agents]
    lines_per_agent = max(len(lab.splitlines()) for lab in labels)
    group = max(len(splits) * (0.42 if wide else 0.3), 0.2 * lines_per_agent + 0.1)
    width_in = 11.0 if wide else 5.6
    height_in = 1.1 + group * len(agents) + (0.3 if len(splits) > 1 else 0)
    fig, ax = plt.subplots(figsize=(width_in, height_in), dpi=100)
    top = 100.0
    if zoom:
        low_rows = [r for r in rows if r["success_rate"] < 0.5]
        if low_rows and len(low_rows) < len(rows):
            highest = max(100 * r["success_ci95"][1] for r in low_rows)
            if highest < 50:
                top = min(100.0, max(10.0, 5 * math.ceil(highest * 1.3 / 5)))
    palette = plt.get_cmap("tab10").colors
    bar = 0.8 / len(splits)
    fontsize = 10 if wide else 8
    for j, split in enumerate(splits):
        ys, widths, lows, highs, texts, colours = [], [], [], [], [], []
        for i, agent in enumerate(agents):
            match = [r for r in rows if r["agent"] == agent and r["split"] == split]
            if not match:
                continue
            r = match[0]
            rate, (low, high) = 100 * r["success_rate"], (100 * x for x in r["success_ci95"])
            ys.append(i + (j - (len(splits) - 1) / 2) * bar)
            widths.append(min(rate, top))
            # (the interval's float ends may sit a rounding error inside the rate at 0 and 1)
            lows.append(max(0.0, min(rate, top) - min(low, top)))
            highs.append(max(0.0, min(high, top) - min(rate, top)))
            text = f"{_wins(r)}/{r['episodes']}"
            if wide:
                text += f"  {rate:.1f}% [{low:.1f}, {high:.1f}]"
            if rate > top:
                text = f"{text}  (bar cut at {top:.0f}%)"
            texts.append(text)
            colours.append(palette[i % len(palette)])
        bars = ax.barh(ys, widths, height=bar * 0.85, xerr=[lows, highs], capsize=3, color=colours,
                       hatch=_HATCHES[j % len(_HATCHES)], edgecolor="white", label=split,
                       error_kw={"elinewidth": 1.2, "ecolor": "#333333"})  # fmt: skip
        for rect, text, high in zip(bars, texts, highs, strict=True):
            # On a long bar the label sits inside it (white); else past the whisker's end.
            inside = rect.get_width() >= 0.5 * top
            x = rect.get_width() - 0.01 * top if inside else rect.get_width() + high + 0.01 * top
            ax.text(x, rect.get_y() + rect.get_height() / 2, text, va="center", ha="right" if inside else "left",
                    fontsize=fontsize - 1, color="white" if inside else "#222222", clip_on=False)  # fmt: skip
    ax.set_yticks(range(len(agents)), labels, fontsize=fontsize)
    ax.invert_yaxis()  # the first agent on top
    ax.set_xlim(0, top)
    ax.set_xlabel("success % (bar) and 95% Wilson interval (whisker)" + (
        f"; axis ends at {top:.0f}%" if top < 100 else ""),
                  fontsize=fontsize - 1)  # fmt: skip
    ax.tick_params(axis="x", labelsize=fontsize - 1)
    ax.set_title(title, fontsize=fontsize + 1, loc="left")
    if len(splits) > 1:  # above the bars, beside the title
        ax.legend(fontsize=fontsize - 1, loc="lower right", bbox_to_anchor=(1.0, 1.0), ncol=len(splits), frameon=False)
    ax.spines[["top", "right"]].set_visible(False)
    ax.grid(axis="x", alpha=0.25)
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", bbox_inches="tight", metadata={"Software": None})  # labels past the axis kept
    plt.close(fig)
    return buffer.getvalue()
