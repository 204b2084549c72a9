"""Tag parsing shared by every environment.

An agent's turn is free text. Environments read the action out of it with `parse_action`, which
knows four tags: `<think>` (reasoning, never an action) and the action tags `<action>`, `<search>` and
`<answer>`; each environment says which action tags it accepts.

The rules, in the order they are applied (each one is tested in tests/agentgym_opsd/test_parsing.py):

1. Tag names match case-insensitively and only in the exact forms `<name>` and `</name>`; any other
   angle-bracket text (`<b>`, `< action>`, `<action x=1>`) is ordinary text.
2. A `<think>` block is reasoning: action tags inside it do not count. An unclosed `<think>` swallows
   the rest of the turn, so the turn has no action (error "unclosed <think>").
3. Outside `<think>`, the accepted action tags must form exactly one complete, non-nested block:
   - none at all: "missing" (unless the env accepts a bare command, rule 5);
   - an opening tag with no closing tag: "unclosed <tag>";
   - a closing tag with no opening tag: "stray </tag>";
   - a tag opened inside another action block: "nested <tag>";
   - a block closed by another tag's closing tag: "mismatched </tag> inside <other>";
   - two or more blocks (of the same or of different accepted tags): "multiple action blocks".
4. The action is the block's content with surrounding whitespace removed; an empty content is an
   error ("empty <tag>"). Text before or after the block is ignored.
5. Bare commands (for scripted agents and people at a terminal): when the env allows them and the
   turn contains no recognised tag at all, the whole turn, stripped, is the action (kind "bare"),
   provided it is one non-empty line.

Spans are character offsets into the text that was parsed: `text[span[0]:span[1]]` is the whole
block with its tags (what StepOPSD's `action_only` scores) and `text[content_span[0]:content_span[1]]`
is the action itself. Parsing is one linear scan (a single regular expression with no backtracking
hazards), so it answers in bounded time on any input.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["ACTION_TAGS", "ParsedAction", "parse_action"]

ACTION_TAGS = ("action", "search", "answer")

_TAG = re.compile(r"<(/?)(think|action|search|answer)>", re.IGNORECASE)


@dataclass(frozen=True)
class ParsedAction:
    """What `parse_action` found in one turn.

    Attributes:
        kind: the tag the action came from (`"action"`, `"search"`, `"answer"`), `"bare"` for a bare
            command, or None when the turn holds no valid action.
        content: the action text (stripped), or None.
        span: `(start, end)` of the whole block, tags included, or None.
        content_span: `(start, end)` of `content`, or None.
        error: why the turn holds no valid action, or None when it does.
    """

    kind: str | None
    content: str | None
    span: tuple[int, int] | None
    content_span: tuple[int, int] | None
    error: str | None

    @property
    def ok(self) -> bool:
        """True when the turn holds exactly one valid action."""
        return self.error is None


def _invalid(error: str) -> ParsedAction:
    return ParsedAction(None, None, None, None, error)


def _strip_span(text: str, start: int, end: int) -> tuple[int, int]:
    """Shrink `[start, end)` so that it excludes leading and trailing whitespace."""
    while start < end and text[start].isspace():
        start += 1
    while end > start and text[end - 1].isspace():
        end -= 1
    return start, end


def parse_action(
    text: str,
    tags: tuple[str, ...] = ("action",),
    *,
    allow_bare: bool = False,
) -> ParsedAction:
    """Read the single action of a turn.

    Args:
        text: the agent's whole turn.
        tags: the action tags this env accepts (a subset of `ACTION_TAGS`).
        allow_bare: accept a bare one-line command when the turn has no recognised tag.

    Returns:
        A `ParsedAction`; never raises on any string.
    """
    accepted = {t.lower() for t in tags}
    unknown = accepted - set(ACTION_TAGS)
    if unknown:
        raise ValueError(f"unknown action tags {sorted(unknown)}; choose from {ACTION_TAGS}")

    in_think = False
    open_tag: str | None = None  # action tag currently open
    open_at = 0  # index just after the opening tag
    block_start = 0
    blocks: list[tuple[str, int, int, int, int]] = []  # kind, block start, block end, content start, end
    saw_tag = False

    for m in _TAG.finditer(text):
        closing, name = m.group(1) == "/", m.group(2).lower()
        saw_tag = True
        if in_think:
            if name == "think" and closing:
                in_think = False
            continue
        if name == "think":
            if closing:
                continue  # a stray </think> (models often start mid-thought) is harmless text
            if open_tag is None:
                in_think = True
            continue  # <think> inside an action block is just text of the action
        if name not in accepted:
            continue  # e.g. <answer> in an env that only takes <action>: ordinary text
        if closing:
            if open_tag is None:
                return _invalid(f"stray </{name}>")
            if name != open_tag:
                return _invalid(f"mismatched </{name}> inside <{open_tag}>")
            blocks.append((open_tag, block_start, m.end(), open_at, m.start()))
            open_tag = None
        else:
            if open_tag is not None:
                return _invalid(f"nested <{name}>")
            open_tag, open_at, block_start = name, m.end(), m.start()

    if in_think:
        return _invalid("unclosed <think>")
    if open_tag is not None:
        return _invalid(f"unclosed <{open_tag}>")
    if len(blocks) > 1:
        return _invalid("multiple action blocks")
    if len(blocks) == 1:
        kind, b0, b1, c0, c1 = blocks[0]
        c0, c1 = _strip_span(text, c0, c1)
        if c0 == c1:
            return _invalid(f"empty <{kind}>")
        return ParsedAction(kind, text[c0:c1], (b0, b1), (c0, c1), None)
    if allow_bare and not saw_tag:
        c0, c1 = _strip_span(text, 0, len(text))
        if c0 < c1 and "\n" not in text[c0:c1]:
            return ParsedAction("bare", text[c0:c1], (c0, c1), (c0, c1), None)
    expected = " or ".join(f"<{t}>...</{t}>" for t in tags)
    return _invalid(f"missing {expected}")
