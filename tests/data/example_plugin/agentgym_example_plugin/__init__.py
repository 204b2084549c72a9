"""A third-party env package, as a user would write one: one TextEnv subclass and an entry point.

The tests put this folder on sys.path; its dist-info declares the entry point
`[agentgym_opsd.envs] guess = agentgym_example_plugin:register`.
"""

from __future__ import annotations

from agentgym_opsd import Hindsight, TextEnv, Transition, hash_state, register_env


class GuessNumberEnv(TextEnv):
    """Find a hidden number in [1, high]; each guess is answered "higher" or "lower".

    Args:
        high: the largest number; task i hides i + 1, so the env holds `high` tasks.
    """

    instructions = (
        "Find the hidden number. Think inside <think></think>, then guess inside "
        "<action>guess N</action>. You are told whether the number is higher or lower."
    )
    max_turns = 10

    def __init__(self, high: int = 20, **kwargs):
        super().__init__(**kwargs)
        self.high = int(high)
        self.secret, self.lo, self.hi, self.solved = 1, 1, self.high, False

    @property
    def num_tasks(self) -> int:
        return self.high

    def _load_task(self, index, options):
        self.secret, self.lo, self.hi, self.solved = index + 1, 1, self.high, False
        self.task_id, self.task_type = f"guess-{self.secret}", "guess"
        return f"I am thinking of a number between 1 and {self.high}."

    def admissible_actions(self):
        return [f"guess {k}" for k in range(self.lo, self.hi + 1)]

    def _apply(self, action):
        words = action.content.split()
        # ASCII digits only: str.isdigit() also accepts "²", which int() refuses.
        if len(words) != 2 or words[0] != "guess" or not (words[1].isascii()
                                                          and words[1].isdigit()) or len(words[1]) > 9:
            return Transition("Nothing happens.", admissible=False)
        k = int(words[1])
        admissible = self.lo <= k <= self.hi
        if k == self.secret:
            self.solved = True
            return Transition("Correct!", reward=1.0, terminated=True, admissible=True)
        if k < self.secret:
            self.lo = max(self.lo, k + 1)
            return Transition("Higher.", admissible=admissible)
        self.hi = min(self.hi, k - 1)
        return Transition("Lower.", admissible=admissible)

    def state_key(self):
        return hash_state(self.secret, self.lo, self.hi, self.solved)

    def hindsight(self):
        return Hindsight(self.solved, float(self.solved), f"The number was {self.secret}.", {"secret": self.secret})

    def expert_action(self):
        return self.format_action(f"guess {(self.lo + self.hi) // 2}")


# What a trainer reads about this family (optional): credit defaults and AgentOPSD's skill notes.
CREDIT_DEFAULTS = {"span_mode": "action_only", "invalid_coef": 0.05, "lam_mix": 0.3}
SKILL_NOTE = (
    "Binary search: guess the middle of the range that is still possible, then halve it with each "
    "answer (higher: the lower bound rises past your guess; lower: the upper bound falls below it)."
)


def skill_notes(task_type):
    return SKILL_NOTE if task_type == "guess" else None


def register():
    # As the README's example: no `description` (`list` shows the class docstring's first paragraph)
    # and no `sizes` (`list` makes the env and reads its `num_tasks`).
    register_env(
        "example/GuessNumber-v0",
        "agentgym_example_plugin:GuessNumberEnv",
        family="Example",
        subset="guess",
        splits=("test",),
        credit_defaults=CREDIT_DEFAULTS,
        skill_notes=skill_notes,
    )
