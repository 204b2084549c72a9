"""The contract every environment of the suite follows.

`TextEnv` is a `gymnasium.Env[str, str]`: observations are the user turns an agent reads, actions are
the agent's whole raw turns. The env reads the action out of the turn itself (its action format is in
`instructions`), so junk text is an invalid step, never an exception.

Every `info` dict, from `reset` and from `step`, holds a `StepInfo` under `"step"`; the final step's
`info` also holds the episode's `Hindsight` under `"hindsight"`. Hindsight is privileged: it is for
the trainer's teacher and for reports, never for the agent.
"""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass, field, fields
from typing import Any, ClassVar, SupportsFloat

import gymnasium as gym
import numpy as np

from agentgym_opsd.parsing import ParsedAction, parse_action

__all__ = [
    "FreeText",
    "Hindsight",
    "StepInfo",
    "TextEnv",
    "Transition",
    "EnvUnavailable",
    "hash_state",
]


class EnvUnavailable(RuntimeError):
    """An env cannot be built here: missing data, missing service. The message says how to fix it."""


class FreeText(gym.Space[str]):
    """Any unicode string of at most `max_length` characters.

    Gymnasium's `spaces.Text` only admits a fixed character set (no spaces, newlines or non-ASCII by
    default); agent turns and observations are arbitrary text.
    """

    def __init__(self, max_length: int = 100_000, seed: int | np.random.Generator | None = None):
        if max_length < 1:
            raise ValueError(f"max_length must be >= 1, got {max_length}")
        self.max_length = int(max_length)
        super().__init__(shape=None, dtype=None, seed=seed)

    @property
    def is_np_flattenable(self) -> bool:
        return False

    def sample(self, mask: Any = None, probability: Any = None) -> str:
        """A random string: words, tags and unicode, up to 200 characters (for fuzzing and checks)."""
        pieces = ["go", "to", "take", "<action>", "</action>", "<think>", "é", "中", " ", "\n", "1"]
        n = int(self.np_random.integers(0, 40))
        text = "".join(pieces[int(i)] for i in self.np_random.integers(0, len(pieces), size=n))
        return text[: min(200, self.max_length)]

    def contains(self, x: Any) -> bool:
        return isinstance(x, str) and len(x) <= self.max_length

    def __repr__(self) -> str:
        return f"FreeText(max_length={self.max_length})"

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, FreeText) and other.max_length == self.max_length


def _to_span(value: Any) -> tuple[int, int] | None:
    return None if value is None else (int(value[0]), int(value[1]))


@dataclass
class StepInfo:
    """Step-boundary metadata, in `info["step"]` after `reset` and after every `step`.

    Attributes:
        turn: turns taken so far: 0 after `reset`, k after the k-th `step`.
        action: the action read from the turn (an ALFWorld command, a search query, an answer), or
            None when the turn held no valid action (and after `reset`).
        action_kind: the tag the action came from (`action`, `search`, `answer`, `bare`), or None.
        action_span: `(start, end)` character offsets of the action block in the raw turn, tags
            included (`response[start:end] == "<action>go to desk 1</action>"`), or None.
        format_ok: the turn followed the action format.
        format_error: why it did not (None when it did).
        admissible: the action was valid in the state it was taken in; None where the env cannot
            tell before acting (False for malformed turns).
        admissible_actions: the actions valid in the state the env is now in (what the agent may do
            next), or None where the env has no finite action set.
        state_key: a hash of the env's true state after this step; equal states give equal keys,
            across episodes (GiGPO groups turns by it).
        task_id: the task being played (stable across runs and machines).
        task_type: the subset it belongs to (ALFWorld "heat", Search-QA "hotpotqa", ...).
        episode_id: the episode's id.
    """

    turn: int
    action: str | None
    action_kind: str | None
    action_span: tuple[int, int] | None
    format_ok: bool
    format_error: str | None
    admissible: bool | None
    admissible_actions: list[str] | None
    state_key: str
    task_id: str
    task_type: str
    episode_id: str

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["action_span"] = None if self.action_span is None else list(self.action_span)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> StepInfo:
        known = {f.name for f in fields(cls)}
        extra = set(d) - known
        if extra:
            raise ValueError(f"StepInfo: unknown fields {sorted(extra)}")
        d = dict(d)
        d["action_span"] = _to_span(d.get("action_span"))
        if d.get("admissible_actions") is not None:
            d["admissible_actions"] = list(d["admissible_actions"])
        return cls(**d)


@dataclass
class Hindsight:
    """What became known by the end of the episode: privileged, never shown to the agent.

    Attributes:
        success: the task was solved.
        score: the env's graded score in [0, 1] (1.0/0.0 where the env only knows success).
        reference: text for the trainer's teacher: the expert plan and goal (ALFWorld), the gold
            answers and supporting passages (Search-QA), the target product and goal attributes
            (WebShop).
        details: structured facts behind the reference (JSON-serialisable).

    Optional key of `details`, from envs built with `turn_labels=True` (see `TextEnv`):
        "turn_labels": one dict per turn played so far, in order (the k-th is turn k): the env's
            oracle verdict on whether the turn helped, for evaluating credit, never for the agent.
            Every entry holds `turn` (int), `progress` (bool: the turn moved the episode toward
            success), `delta` (signed number or None: the change the turn made to the distance to
            success, < 0 progress, 0 wasted, > 0 regress; None where the env cannot measure it) and
            `expert_action` (str or None: what `StepInfo.action` would have read had the env's
            expert played this turn from the same state); each env documents its further keys.
    """

    success: bool
    score: float
    reference: str
    details: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "success": bool(self.success),
            "score": float(self.score),
            "reference": self.reference,
            "details": self.details,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Hindsight:
        return cls(bool(d["success"]), float(d["score"]), str(d["reference"]), dict(d.get("details") or {}))


@dataclass
class Transition:
    """What an env's `_apply` returns for one well-formed action.

    Attributes:
        observation: the text the agent reads next.
        reward: the step's reward.
        terminated: the episode ended by itself (task solved, answer given, product bought).
        admissible: the action was valid in the state it was taken in (None: cannot tell).
        info: extra, JSON-serialisable entries for `info` (sub-scores, F1, ...).
    """

    observation: str
    reward: float = 0.0
    terminated: bool = False
    admissible: bool | None = None
    info: dict[str, Any] = field(default_factory=dict)


def hash_state(*parts: Any) -> str:
    """A short, stable hash of a state description (sorted facts, a page id, ...)."""
    h = hashlib.blake2b(digest_size=10)
    for part in parts:
        h.update(repr(part).encode("utf-8", "surrogatepass"))
        h.update(b"\x1f")
    return h.hexdigest()


class TextEnv(gym.Env[str, str]):
    """Base class of every multi-turn text environment.

    Subclasses implement the task logic in a few methods and get the contract for free:
    turn counting, `max_turns` truncation, action parsing and invalid steps, `StepInfo` on every
    step, hindsight on the final step, seeded task choice.

    To implement:
        num_tasks: how many tasks the env holds (for the chosen subset and split).
        _load_task(index, options) -> str: start task `index`; return the first observation. Set
            `self.task_id` and `self.task_type`.
        _apply(action: ParsedAction) -> Transition: play one well-formed action.
        state_key() -> str: hash of the true state (use `hash_state`).
        hindsight() -> Hindsight: the episode's privileged outcome and reference, at any time.
    May override:
        admissible_actions() -> list[str] | None, expert_action() -> str | None,
        _invalid(parsed) -> str (the observation after a malformed turn),
        format_action(action) -> str (how a scripted agent writes an action).
    Turn labels (optional; privileged, for evaluating credit): an env that can tell after the fact
    whether a turn helped implements `_label_turn` (and `_label_context` when it needs the state
    before the turn). Built with `turn_labels=True`, it gets `self.turn_labels`, a list that `step`
    fills with one label per turn (malformed turns included) and `reset` empties; its `hindsight()`
    puts a copy under `details["turn_labels"]` (see `Hindsight`). Off by default (`self.turn_labels`
    is None): the hooks are then never called and normal rollouts pay nothing for them.

    Class attributes:
        instructions: the system prompt: task rules and the action format.
        action_tags: the tags an action may come in.
        allow_bare_action: accept a bare one-line command (for scripted agents and people).
        max_turns: turns before the episode is truncated.
        max_turn_tokens: the per-turn generation cap that suits this env's turns (reasoning and one
            action); a model-backed agent (`hf:`) uses it unless its own cap is given.
        max_response_chars: longer turns are parsed only up to this many characters.
    Keywords of the constructor (`max_turns` and `allow_bare_action` set the class attributes above
    for one env; None keeps the class's value):
        render_mode: `ansi` (`render()` returns the last observation as text) or None (no rendering).
        turn_labels: fill `self.turn_labels` with a label per turn (see above); only for an env that
            implements `_label_turn`.

    A turn is parsed as valid Unicode: lone surrogates (U+D800 to U+DFFF, which no tokenizer
    produces but a buggy client may send) read as `?`, one character each, so spans still index the
    raw turn and no action text reaches a search engine or a server that would refuse it.
    """

    metadata: ClassVar[dict[str, Any]] = {"render_modes": ["ansi"], "render_fps": 1}
    instructions: str = ""
    action_tags: tuple[str, ...] = ("action",)
    allow_bare_action: bool = False
    max_turns: int = 50
    max_turn_tokens: int = 256
    max_response_chars: int = 20_000
    max_observation_chars: int = 200_000
    invalid_observation: str = "Invalid action."

    task_id: str = ""
    task_type: str = ""

    def __init__(
        self,
        *,
        max_turns: int | None = None,
        allow_bare_action: bool | None = None,
        render_mode: str | None = None,
        turn_labels: bool = False,
    ) -> None:
        if turn_labels and type(self)._label_turn is TextEnv._label_turn:
            raise ValueError(
                f"turn_labels=True: {type(self).__name__} cannot label turns (it implements no _label_turn)"
            )
        if max_turns is not None:
            if int(max_turns) < 1:
                raise ValueError(f"max_turns must be >= 1, got {max_turns}")
            self.max_turns = int(max_turns)
        if allow_bare_action is not None:
            self.allow_bare_action = bool(allow_bare_action)
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ValueError(f"render_mode {render_mode!r} not in {self.metadata['render_modes']}")
        self.render_mode = render_mode
        self.action_space = FreeText(max_length=1_000_000)
        self.observation_space = FreeText(max_length=self.max_observation_chars)
        self.turn = 0
        self.episode_id = ""
        self.done = True
        self.last_observation = ""
        self.turn_labels: list[dict[str, Any]] | None = [] if turn_labels else None

    # ----------------------------------------------------------------------------------------
    # To implement in subclasses.

    @property
    def num_tasks(self) -> int:
        raise NotImplementedError

    def _load_task(self, index: int, options: dict[str, Any]) -> str:
        raise NotImplementedError

    def _apply(self, action: ParsedAction) -> Transition:
        raise NotImplementedError

    def state_key(self) -> str:
        raise NotImplementedError

    def hindsight(self) -> Hindsight:
        raise NotImplementedError

    # ----------------------------------------------------------------------------------------
    # May override.

    def admissible_actions(self) -> list[str] | None:
        """The actions valid now, or None where the env has no finite action set."""
        return None

    def expert_action(self) -> str | None:
        """The scripted expert's next turn, written in this env's format (privileged; it may read
        the true state), or None when it has no move from here."""
        raise NotImplementedError(f"{type(self).__name__} has no expert")

    def random_action(self, rng: np.random.Generator) -> str:
        """An action a random agent would take now: an admissible one where they are known."""
        options = self.admissible_actions()
        if options:
            return options[int(rng.integers(len(options)))]
        words = self.last_observation.split() or ["look"]
        n = int(rng.integers(1, 4))
        return " ".join(words[int(i)] for i in rng.integers(0, len(words), size=n))

    def format_action(self, action: str, kind: str | None = None) -> str:
        """How an agent writes `action` as a turn in this env's format."""
        tag = kind or self.action_tags[0]
        return f"<{tag}>{action}</{tag}>"

    def _invalid(self, parsed: ParsedAction) -> str:
        """The observation after a malformed turn."""
        return f"{self.invalid_observation} ({parsed.error})"

    def _label_context(self) -> Any:
        """What `_label_turn` needs to know about the state a turn is taken in (the expert's plan, the
        page), read just before the turn is played; called only with `turn_labels=True`."""
        return None

    def _label_turn(self, parsed: ParsedAction, transition: Transition, before: Any) -> dict[str, Any]:
        """The oracle label of the turn just played (privileged; called only with `turn_labels=True`).

        Args:
            parsed: the turn as read (`parsed.ok` is False for a malformed turn).
            transition: what the turn did (a malformed turn's is an invalid step).
            before: what `_label_context()` returned before the turn.

        Returns:
            A JSON-serialisable dict with at least `progress`, `delta` and `expert_action` (see
            `Hindsight`); `turn` is added by `step`.
        """
        raise NotImplementedError(f"{type(self).__name__} has no turn labels")

    def task_index(self, task_id: str) -> int:
        """The index of `task_id` (for `reset(options={"task_id": ...})`)."""
        raise KeyError(f"{type(self).__name__} cannot look tasks up by id")

    def parse_action(self, response: str) -> ParsedAction:
        """Read the action out of a raw turn with this env's tags."""
        return parse_action(response, self.action_tags, allow_bare=self.allow_bare_action)

    # ----------------------------------------------------------------------------------------
    # The Gymnasium API.

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]:
        """Start an episode.

        The task is chosen from the seed: `seed % num_tasks`, so seeds 0..n-1 play every task once and
        the same seed is the same task on every machine. Without a seed, one is drawn from the env's
        generator. Options: `task_index` or `task_id` (play that task), `episode_id` (name the episode).

        Returns:
            The first observation and an info dict with `info["step"]` (turn 0).
        """
        super().reset(seed=seed)
        options = dict(options or {})
        if seed is None:
            seed = int(self.np_random.integers(0, 2**31 - 1))
        n = self.num_tasks
        if n < 1:
            raise EnvUnavailable(f"{type(self).__name__} has no tasks (check its data and split)")
        if options.get("task_index") is not None:
            index = int(options["task_index"])
            if not 0 <= index < n:
                raise ValueError(f"task_index {index} out of range [0, {n})")
        elif options.get("task_id") is not None:
            index = self.task_index(str(options["task_id"]))
        else:
            index = int(seed) % n
        self.turn = 0
        self.done = False
        if self.turn_labels is not None:
            self.turn_labels = []
        observation = self._load_task(index, options)
        self.episode_id = str(options.get("episode_id") or f"{self.task_id}@{seed}")
        self.last_observation = observation
        info = {"step": self._step_info(None, admissible=None)}
        return observation, info

    def step(self, action: str) -> tuple[str, SupportsFloat, bool, bool, dict[str, Any]]:
        """Play one turn: `action` is the agent's whole raw text.

        Returns:
            `(observation, reward, terminated, truncated, info)`; `info["step"]` is a `StepInfo`,
            and on the final step `info["hindsight"]` is the episode's `Hindsight`.
        """
        if not isinstance(action, str):
            raise TypeError(f"a TextEnv action is the agent's turn as a str, got {type(action).__name__}")
        if self.done:
            raise gym.error.ResetNeeded("the episode is over; call reset() before step()")
        response = action[: self.max_response_chars]
        if not response.isascii():
            response = response.encode("utf-8", "replace").decode("utf-8")  # lone surrogates -> "?"
        parsed = self.parse_action(response)
        before = self._label_context() if self.turn_labels is not None else None
        self.turn += 1
        if parsed.ok:
            transition = self._apply(parsed)
        else:
            transition = Transition(self._invalid(parsed), 0.0, False, admissible=False)
        if self.turn_labels is not None:
            self.turn_labels.append({"turn": self.turn, **self._label_turn(parsed, transition, before)})
        terminated = bool(transition.terminated)
        truncated = not terminated and self.turn >= self.max_turns
        self.done = terminated or truncated
        observation = transition.observation[: self.max_observation_chars]
        self.last_observation = observation
        info: dict[str, Any] = dict(transition.info)
        info["step"] = self._step_info(parsed, admissible=transition.admissible)
        if self.done:
            info["hindsight"] = self.hindsight()
        return observation, float(transition.reward), terminated, truncated, info

    def render(self) -> str | None:
        if self.render_mode == "ansi":
            return self.last_observation
        return None

    # ----------------------------------------------------------------------------------------

    def _step_info(self, parsed: ParsedAction | None, admissible: bool | None) -> StepInfo:
        actions = self.admissible_actions()
        return StepInfo(
            turn=self.turn,
            action=None if parsed is None else parsed.content,
            action_kind=None if parsed is None else parsed.kind,
            action_span=None if parsed is None else parsed.span,
            format_ok=True if parsed is None else parsed.ok,
            format_error=None if parsed is None else parsed.error,
            admissible=admissible,
            admissible_actions=None if actions is None else list(actions),
            state_key=self.state_key(),
            task_id=self.task_id,
            task_type=self.task_type,
            episode_id=self.episode_id,
        )
