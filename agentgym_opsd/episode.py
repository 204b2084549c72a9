"""Episode records: what a rollout produces, saved as JSONL and read back losslessly.

An `Episode` keeps what is needed to rebuild every prompt exactly (instructions, first observation,
context policy, and each turn's response, action and observation), so per-turn prompts are derived
with `Episode.messages(k)` rather than stored k times.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from agentgym_opsd.context import ContextPolicy, HistoryItem, Message
from agentgym_opsd.contract import Hindsight, StepInfo
from agentgym_opsd.io import DataFileError, append_jsonl, atomic_write_text, read_jsonl_numbered

__all__ = ["TurnTokens", "Turn", "Episode", "save_episodes", "append_episodes", "load_episodes"]

FORMAT_VERSION = 1
FINISH_REASONS = ("stop", "action", "length")


@dataclass
class TurnTokens:
    """The token ids of one turn exactly as a token-level policy saw and sampled them.

    A trainer trains on these ids (token-in, token-out), never on the text re-tokenized: a response
    decoded to text and encoded again is often not the same ids (an untrained model writes byte
    sequences that are not valid UTF-8; BPE merges differ across boundaries).

    Attributes:
        prompt_ids: the ids added to the policy's context before this turn's generation. When
            `extends` is True they follow the previous turn's context and sampled ids (for a chat
            template: the end of the previous assistant turn when the model did not write it, the
            observation as a user turn, the opening of the next assistant turn); otherwise they are
            the whole prompt.
        extends: this turn's context continues the previous turn's (full-chat contexts).
        sampled_ids: the ids the policy sampled, ending with the stop id it sampled when it stopped
            by itself (`finish_reason == "stop"`).
        logprobs: the sampling log-probs of `sampled_ids` (empty when not recorded).
        finish_reason: `stop` (the model wrote a stop id), `action` (the turn was ended after its
            closing action tag, no stop id) or `length` (cut at the token cap).
    """

    prompt_ids: list[int]
    extends: bool
    sampled_ids: list[int]
    logprobs: list[float] = field(default_factory=list)
    finish_reason: str = "stop"

    def to_dict(self) -> dict[str, Any]:
        return {
            "prompt_ids": list(self.prompt_ids),
            "extends": bool(self.extends),
            "sampled_ids": list(self.sampled_ids),
            "logprobs": list(self.logprobs),
            "finish_reason": self.finish_reason,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TurnTokens:
        tokens = cls(
            prompt_ids=[int(i) for i in d["prompt_ids"]],
            extends=bool(d["extends"]),
            sampled_ids=[int(i) for i in d["sampled_ids"]],
            logprobs=[float(x) for x in d.get("logprobs") or []],
            finish_reason=str(d.get("finish_reason", "stop")),
        )
        if tokens.finish_reason not in FINISH_REASONS:
            raise ValueError(f"finish_reason {tokens.finish_reason!r}: use one of {', '.join(FINISH_REASONS)}")
        if tokens.logprobs and len(tokens.logprobs) != len(tokens.sampled_ids):
            raise ValueError(f"{len(tokens.logprobs)} log-probs for {len(tokens.sampled_ids)} sampled ids")
        return tokens


@dataclass
class Turn:
    """One turn: the agent's raw response and what the env answered.

    Attributes:
        response: the agent's whole turn text.
        action: the action the env read from it (None for a malformed turn).
        observation: the env's answer.
        reward: the step reward.
        terminated, truncated: as returned by `step`.
        step: the step's `StepInfo`.
        info: other JSON-serialisable entries of the step's info (sub-scores, F1, ...).
        tokens: the ids the policy saw and sampled, when a token-level policy played the turn
            (None for text agents: the expert, an HTTP endpoint).
    """

    response: str
    action: str | None
    observation: str
    reward: float
    terminated: bool
    truncated: bool
    step: StepInfo
    info: dict[str, Any] = field(default_factory=dict)
    tokens: TurnTokens | None = None

    def to_dict(self) -> dict[str, Any]:
        out = {
            "response": self.response,
            "action": self.action,
            "observation": self.observation,
            "reward": float(self.reward),
            "terminated": bool(self.terminated),
            "truncated": bool(self.truncated),
            "step": self.step.to_dict(),
            "info": self.info,
        }
        if self.tokens is not None:
            out["tokens"] = self.tokens.to_dict()
        return out

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Turn:
        return cls(
            response=str(d["response"]),
            action=d["action"],
            observation=str(d["observation"]),
            reward=float(d["reward"]),
            terminated=bool(d["terminated"]),
            truncated=bool(d["truncated"]),
            step=StepInfo.from_dict(d["step"]),
            info=dict(d.get("info") or {}),
            tokens=None if d.get("tokens") is None else TurnTokens.from_dict(d["tokens"]),
        )


@dataclass
class Episode:
    """A whole episode.

    Attributes:
        env_id: the Gymnasium id it was played on.
        task_id, task_type: the task and its subset.
        episode_id: unique within a run.
        seed: the reset seed.
        agent: the agent's name.
        context: the context policy (`full` or `window:k`).
        instructions: the system prompt.
        initial_observation: the observation returned by `reset`.
        initial: the `StepInfo` returned by `reset` (turn 0: initial state key and actions); None
            only when the reset itself failed (see `error`).
        turns: the played turns.
        hindsight: the env's hindsight at the end (None if the episode errored first).
        group: the group it belongs to (episodes of one task sampled together), or "".
        error: why the episode was cut short by a failure (worker crash, timeout), or None.
        meta: free-form extras (env options, timings).
    """

    env_id: str
    task_id: str
    task_type: str
    episode_id: str
    seed: int | None
    agent: str
    context: str
    instructions: str
    initial_observation: str
    initial: StepInfo | None
    turns: list[Turn] = field(default_factory=list)
    hindsight: Hindsight | None = None
    group: str = ""
    error: str | None = None
    meta: dict[str, Any] = field(default_factory=dict)

    # -- outcome ------------------------------------------------------------------------------

    @property
    def group_key(self) -> str:
        """The group an episode's outcome is compared within (GRPO's group): `group` when the
        rollout named one, else its env and task (`env_id::task_id`)."""
        return self.group or f"{self.env_id}::{self.task_id}"

    @property
    def success(self) -> bool:
        return bool(self.hindsight is not None and self.hindsight.success)

    @property
    def score(self) -> float:
        return float(self.hindsight.score) if self.hindsight is not None else 0.0

    @property
    def total_reward(self) -> float:
        return float(sum(t.reward for t in self.turns))

    @property
    def num_turns(self) -> int:
        return len(self.turns)

    @property
    def invalid_turns(self) -> int:
        """Turns that were malformed or not admissible."""
        return sum(1 for t in self.turns if not t.step.format_ok or t.step.admissible is False)

    @property
    def finished(self) -> bool:
        return bool(self.turns) and (self.turns[-1].terminated or self.turns[-1].truncated)

    # -- prompts ------------------------------------------------------------------------------

    def messages(self, k: int) -> list[Message]:
        """The exact chat the agent read before turn `k` (0-based) under the episode's context."""
        if not 0 <= k <= len(self.turns):
            raise IndexError(f"turn {k} out of range [0, {len(self.turns)}]")
        history = [HistoryItem(t.response, t.action, t.observation) for t in self.turns[:k]]
        return ContextPolicy.parse(self.context).messages(self.instructions, self.initial_observation, history)

    def state_keys_before(self) -> list[str]:
        """For each turn, the key of the state the action was taken in (GiGPO's anchor states)."""
        first = self.initial.state_key if self.initial is not None else ""
        keys = [first] + [t.step.state_key for t in self.turns]
        return keys[: len(self.turns)]

    # -- records ------------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": FORMAT_VERSION,
            "env_id": self.env_id,
            "task_id": self.task_id,
            "task_type": self.task_type,
            "episode_id": self.episode_id,
            "seed": self.seed,
            "agent": self.agent,
            "context": self.context,
            "instructions": self.instructions,
            "initial_observation": self.initial_observation,
            "initial": None if self.initial is None else self.initial.to_dict(),
            "turns": [t.to_dict() for t in self.turns],
            "hindsight": None if self.hindsight is None else self.hindsight.to_dict(),
            "group": self.group,
            "error": self.error,
            "meta": self.meta,
            "outcome": {
                "success": self.success,
                "score": self.score,
                "total_reward": self.total_reward,
                "num_turns": self.num_turns,
                "invalid_turns": self.invalid_turns,
            },
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Episode:
        if d.get("format", FORMAT_VERSION) != FORMAT_VERSION:
            raise ValueError(f"episode record format {d.get('format')} is not {FORMAT_VERSION}")
        return cls(
            env_id=str(d["env_id"]),
            task_id=str(d["task_id"]),
            task_type=str(d["task_type"]),
            episode_id=str(d["episode_id"]),
            seed=None if d.get("seed") is None else int(d["seed"]),
            agent=str(d["agent"]),
            context=str(d["context"]),
            instructions=str(d["instructions"]),
            initial_observation=str(d["initial_observation"]),
            initial=None if d.get("initial") is None else StepInfo.from_dict(d["initial"]),
            turns=[Turn.from_dict(t) for t in d.get("turns", [])],
            hindsight=None if d.get("hindsight") is None else Hindsight.from_dict(d["hindsight"]),
            group=str(d.get("group", "")),
            error=d.get("error"),
            meta=dict(d.get("meta") or {}),
        )


def save_episodes(path: str | os.PathLike[str], episodes: Iterable[Episode]) -> None:
    """Write episodes as JSONL, atomically (the file is complete or unchanged)."""
    text = "".join(json.dumps(e.to_dict(), ensure_ascii=False) + "\n" for e in episodes)
    atomic_write_text(path, text)


def append_episodes(path: str | os.PathLike[str], episodes: Iterable[Episode]) -> None:
    """Append finished episodes to a JSONL file durably (for streaming results)."""
    append_jsonl(path, (e.to_dict() for e in episodes))


def load_episodes(path: str | os.PathLike[str], *, skip_torn_lines: bool = False) -> list[Episode]:
    """Read episodes back; a bad record raises `DataFileError` naming the file and line."""
    out = []
    for number, record in read_jsonl_numbered(path, skip_torn_lines=skip_torn_lines):
        try:
            out.append(Episode.from_dict(record))
        except (KeyError, TypeError, ValueError, IndexError) as e:
            raise DataFileError(f"{path}:{number}: not an episode record ({type(e).__name__}: {e})") from None
    return out
