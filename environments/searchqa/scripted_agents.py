"""Scripted Search-QA agents.

- `searchqa-oracle`: the env's expert: one search for the question (so retrieval is exercised end to
  end), then the gold answer. Privileged; its success rate checks the pipeline, not retrieval.
- `searchqa-baseline`: a non-learned retrieval baseline that reads only its messages: it searches the
  question, then answers with a span of the top passage chosen by the question's form (a year for
  "when", a number for "how many", a capitalised name for "who/where/which", else the new words of the
  passage sentence that shares most words with the question).

Both are registered with `agentgym_opsd.agents.register_agent`, so `make_agent("searchqa-baseline")`
and `agentgym-opsd eval ... --agent searchqa-baseline` work.
"""

from __future__ import annotations

import re
from typing import Any

from agentgym_opsd.agents import AgentError
from agentgym_opsd.context import Message
from agentgym_opsd.contract import TextEnv

__all__ = ["OracleAgent", "RetrievalBaselineAgent", "candidate_answer"]

_STOP = set(
    "a an the of in on at to for from by with and or but is are was were be been being "  # noqa: SIM905 (one string)
    "it its this that these those he she they his her their what which who whom whose when where why how did do "
    "does has have had as into than there here also after before during one two not no yes".split()
)
_YEAR = re.compile(r"\b(?:1\d{3}|20\d{2})\b")
_NUMBER = re.compile(r"\b\d[\d,]*(?:\.\d+)?\b")
_CAPITALISED = re.compile(r"[A-Z][\w'’\-]*(?:\s+(?:(?:of|the|de|da|von|van|and|du|la)\s+)?[A-Z][\w'’\-]*)*")
_WORD = re.compile(r"[\w'’\-]+")
_DOC1 = re.compile(r"Doc 1\(Title: (.*?)\) (.*?)(?:\nDoc 2\(Title: |</information>)", re.DOTALL)


def _words(text: str) -> list[str]:
    return [w.lower() for w in _WORD.findall(text)]


def _sentences(text: str) -> list[str]:
    return [s.strip() for s in re.split(r"(?<=[.!?])\s+(?=[A-Z0-9\"'(])", text) if s.strip()]


def candidate_answer(question: str, title: str, passage: str) -> str:
    """A short answer span from `passage` for `question` (see the module docstring)."""
    q = question.lower()
    q_words = set(_words(question))
    content = {w for w in q_words if w not in _STOP}
    sentences = _sentences(passage) or [passage]
    ranked = sorted(range(len(sentences)), key=lambda i: (-len(content & set(_words(sentences[i]))), i))

    def new(span: str) -> bool:
        words = [w for w in _words(span) if w not in _STOP]
        return bool(words) and not all(w in q_words for w in words)

    def spans(kind: str, s: str) -> list[str]:
        if kind == "year":
            return [m for m in _YEAR.findall(s) if m not in q_words]
        if kind == "number":
            return [m for m in _NUMBER.findall(s) if m not in q_words]
        if kind == "name":
            found = []
            for m in _CAPITALISED.findall(s):
                words = m.split()
                while words and words[0].lower() in _STOP:  # sentence-initial "The", "It", ...
                    words = words[1:]
                span = " ".join(words)
                if span and new(span) and span.lower() != title.lower():
                    found.append(span)
            return found
        # "words": the longest run of words that are new to the question
        runs, run = [], []
        for w in _WORD.findall(s):
            if w.lower() in q_words or w.lower() in _STOP:
                if run:
                    runs.append(run)
                run = []
            else:
                run.append(w)
        if run:
            runs.append(run)
        return [" ".join(r) for r in sorted(runs, key=len, reverse=True)]

    typed = True
    if re.search(r"\b(when|what year|which year)\b", q):
        kinds = ["year", "number", "name"]
    elif re.search(r"\bhow (many|much|long|old|tall|far|big)\b", q):
        kinds = ["number", "name"]
    elif re.search(r"\b(who|whom|whose|where|which|what city|what country)\b", q):
        kinds = ["name", "words"]
    else:  # "what is ...": the answer is in the sentence that talks about the question, whatever its form
        kinds, typed = ["name", "words", "number"], False
    if typed:  # the expected form first, wherever it is
        order = [(kind, i) for kind in kinds for i in ranked]
    else:  # the best-matching sentence first, whatever the form
        order = [(kind, i) for i in ranked for kind in kinds]
    for kind, i in order:
        found = spans(kind, sentences[i])
        if found:
            return found[0]
    return title or "unknown"


def _question(messages: list[Message]) -> str | None:
    for m in messages:
        if m.get("role") == "user":
            found = re.search(r"Question: (.+)", m.get("content", ""))
            if found:
                return found.group(1).strip()
    return None


class RetrievalBaselineAgent:
    """Search the question, then answer with a span of the top passage (reads only its messages)."""

    def __init__(self, seed: int = 0) -> None:
        self.name = "searchqa-baseline"

    def act(self, messages: list[Message], info: dict[str, Any], env: TextEnv) -> str:
        question = _question(messages)
        if question is None:
            raise AgentError("searchqa-baseline: no 'Question: ...' in the messages; is this a Search-QA env?")
        last = next((m["content"] for m in reversed(messages) if m.get("role") == "user"), "")
        if "<information>" not in last:
            return f"<think>Let me search for the question.</think>\n<search>{question}</search>"
        top = _DOC1.search(last)
        if top is None:  # nothing retrieved
            return "<think>The search found nothing.</think>\n<answer>unknown</answer>"
        answer = candidate_answer(question, top.group(1), top.group(2))
        return f"<think>The top passage suggests {answer}.</think>\n<answer>{answer}</answer>"


class OracleAgent:
    """The env's expert (one search, then the gold answer): checks the pipeline end to end."""

    def __init__(self, seed: int = 0) -> None:
        self.name = "searchqa-oracle"

    def act(self, messages: list[Message], info: dict[str, Any], env: TextEnv) -> str:
        turn = env.expert_action()
        if turn is None:
            raise AgentError("searchqa-oracle: the episode is over")
        return turn
