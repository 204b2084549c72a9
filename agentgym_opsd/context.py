"""Context policies: what the agent is shown at each turn.

- `full`: the whole chat: system (the env's instructions), the first observation as a user turn,
  then each response as an assistant turn and each observation as a user turn.
- `window:k` (verl-agent style): the system prompt and one user message holding the first
  observation (it carries the task), the last k actions with their observations, and the current
  observation. Prompts stay short however long the episode is; each turn is its own row for the
  trainer.

The same function builds the prompt during rollout and when the trainer rebuilds it from a saved
`Episode`, so they cannot drift apart.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["ContextPolicy", "Message", "HistoryItem"]

Message = dict[str, str]


@dataclass(frozen=True)
class HistoryItem:
    """One played turn, as the context policy needs it."""

    response: str
    action: str | None
    observation: str


@dataclass(frozen=True)
class ContextPolicy:
    """`full` chat, or a `window` of the last `k` turns."""

    kind: str = "full"
    k: int = 0

    @classmethod
    def parse(cls, spec: str | ContextPolicy) -> ContextPolicy:
        """`"full"` or `"window:k"` (k >= 1)."""
        if isinstance(spec, ContextPolicy):
            return spec
        text = str(spec).strip().lower()
        if text == "full":
            return cls("full", 0)
        if text.startswith("window:"):
            try:
                k = int(text.split(":", 1)[1])
            except ValueError:
                k = 0
            if k >= 1:
                return cls("window", k)
        raise ValueError(f"context policy {spec!r}: use 'full' or 'window:K' with K >= 1")

    def __str__(self) -> str:
        return "full" if self.kind == "full" else f"window:{self.k}"

    def messages(
        self, instructions: str, initial_observation: str, history: Sequence[HistoryItem]
    ) -> list[Message]:
        """The chat messages the agent reads before its next turn."""
        system = [{"role": "system", "content": instructions}] if instructions else []
        if self.kind == "full":
            out = system + [{"role": "user", "content": initial_observation}]
            for item in history:
                out.append({"role": "assistant", "content": item.response})
                out.append({"role": "user", "content": item.observation})
            return out
        if not history:
            return system + [{"role": "user", "content": initial_observation}]
        recent = history[-self.k :]
        first = len(history) - len(recent) + 1
        lines = [
            initial_observation,
            "",
            f"You have taken {len(history)} step(s) so far. Your last {len(recent)} step(s):",
        ]
        for i, item in enumerate(recent[:-1], start=first):
            action = item.action if item.action is not None else "(invalid turn)"
            lines += [f"[Step {i}] Action: {action}", f"Observation: {item.observation}"]
        last = recent[-1]
        action = last.action if last.action is not None else "(invalid turn)"
        lines += [
            f"[Step {len(history)}] Action: {action}",
            "",
            f"Current observation (step {len(history) + 1}):",
            last.observation,
        ]
        return system + [{"role": "user", "content": "\n".join(lines)}]
