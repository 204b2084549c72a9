"""Settings of the OpenRLHF bridge: ours, in one file, beside OpenRLHF's own flags.

`agentgym-opsd train-openrlhf --config bridge.yaml -- <OpenRLHF flags>` reads this file. OpenRLHF's
flags (model, batch sizes, learning rate, group size ...) stay OpenRLHF's; this file holds what
OpenRLHF has no flag for: how episodes are rolled out and scored, and the credit method.

The launcher hands the settings to every Ray worker (the vLLM rollout actors that run the agent
executor and the trainer actor that computes advantages) through the environment variable
`AGENTGYM_OPSD_OPENRLHF`, as JSON, so no shared file system is needed.

Example (YAML):

    rollout:
      turn_max_tokens: 512        # per-turn generation cap
      max_turns: 50               # overrides the env's own limit
      chat_template_kwargs: {enable_thinking: false}
    credit:                       # the method, then any trainer.credit.CreditConfig field
      method: stepopsd            # grpo | gigpo | stepopsd | agentopsd | rlsd
      preset: default             # or release (AgentOPSD's public-code preset)
      env: agentgym/ALFWorld-v0   # whose family defaults apply (default: the prompt dataset's env)
      lam_mix: 0.2
    teacher:
      max_len: 8192
      micro_batch_size: 4

The credit section also sets the outcome reward (`success_scale`, `score_coef`, `invalid_coef`), so
the agent executor's reward, OpenRLHF's group normalisation and the credit core agree.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from agentgym_opsd.io import DataFileError, read_config_file
from agentgym_opsd.registry import UnknownEnvError, entry
from trainer.env_knowledge import credit_config

__all__ = [
    "ENV_VAR",
    "BridgeConfig",
    "RolloutSettings",
    "TeacherSettings",
    "TaskLabel",
    "ConfigError",
    "load_sections",
    "merge_sections",
    "resolve_credit_config",
]

ENV_VAR = "AGENTGYM_OPSD_OPENRLHF"


class ConfigError(ValueError):
    """A bridge config file or task label is wrong; the message names the key and the fix."""


def _build(cls, data: Any, where: str):
    if data is None:
        return cls()
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: expected a mapping, got {type(data).__name__}")
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {unknown}; known: {sorted(known)}")
    try:
        return cls(**data)
    except (TypeError, ValueError) as e:  # a value of the wrong type or range: name the file and the section
        raise ConfigError(f"{where}: {e}") from None


@dataclass
class RolloutSettings:
    """How the agent executor plays episodes.

    Attributes:
        turn_max_tokens: cap on the tokens generated in one turn (None: OpenRLHF's
            `--rollout.max_new_tokens`, and without it whatever is left of `--data.max_len`).
        max_turns: turns before an episode is truncated (None: the env's own `max_turns`).
        env_kwargs: keyword arguments for every env (a label's own `env_kwargs` override them).
        chat_template_kwargs: passed to the tokenizer's chat template (Qwen3: `enable_thinking`).
        env_threads: threads that step envs (envs are stepped off the event loop; 1 keeps env
            libraries that are not thread-safe safe).
    """

    turn_max_tokens: int | None = None
    max_turns: int | None = None
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    env_threads: int = 1

    def __post_init__(self) -> None:
        if self.turn_max_tokens is not None and int(self.turn_max_tokens) < 1:
            raise ConfigError(f"rollout.turn_max_tokens must be >= 1, got {self.turn_max_tokens}")
        if self.max_turns is not None and int(self.max_turns) < 1:
            raise ConfigError(f"rollout.max_turns must be >= 1, got {self.max_turns}")
        if int(self.env_threads) < 1:
            raise ConfigError(f"rollout.env_threads must be >= 1, got {self.env_threads}")


@dataclass
class TeacherSettings:
    """Teacher scoring on the actor group (see trainer/openrlhf/experience.py).

    Attributes:
        max_len: longest teacher sequence. A teacher context that does not fit is never cut
            silently: its turns are not scored (their gap is 0, so they keep the plain GRPO
            advantage) and they are counted in the `credit/teacher_truncated` log.
        micro_batch_size: teacher rows per forward call on one actor.
    """

    max_len: int = 16384
    micro_batch_size: int = 4

    def __post_init__(self) -> None:
        if int(self.max_len) < 8:
            raise ConfigError(f"teacher.max_len must be >= 8, got {self.max_len}")
        if int(self.micro_batch_size) < 1:
            raise ConfigError(f"teacher.micro_batch_size must be >= 1, got {self.micro_batch_size}")


@dataclass
class BridgeConfig:
    """The whole bridge config: `rollout`, `credit` (CreditConfig fields) and `teacher`."""

    rollout: RolloutSettings = field(default_factory=RolloutSettings)
    credit: dict[str, Any] = field(default_factory=dict)
    teacher: TeacherSettings = field(default_factory=TeacherSettings)

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None, where: str = "bridge config") -> BridgeConfig:
        data = dict(data or {})
        unknown = sorted(set(data) - {"rollout", "credit", "teacher"})
        if unknown:
            raise ConfigError(f"{where}: unknown section(s) {unknown}; sections: rollout, credit, teacher")
        credit = data.get("credit") or {}
        if not isinstance(credit, dict):
            raise ConfigError(f"{where}: credit: expected a mapping of CreditConfig fields")
        try:
            return cls(
                rollout=_build(RolloutSettings, data.get("rollout"), f"{where}: rollout"),
                credit=dict(credit),
                teacher=_build(TeacherSettings, data.get("teacher"), f"{where}: teacher"),
            )
        except TypeError as e:  # wrong value types reach the dataclass constructors
            raise ConfigError(f"{where}: {e}") from None

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> BridgeConfig:
        """Read a YAML or JSON file."""
        return cls.from_dict(load_sections(path), str(path))

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    def credit_config(self, env_id: str):
        """The `CreditConfig` for episodes of `env_id` (see `resolve_credit_config`)."""
        return resolve_credit_config(self.credit, env_id)

    def batch_env_id(self, env_ids) -> str:
        """The env whose family defaults apply to a batch: `credit.env` when given, else the batch's
        env, which must then be of one family (their defaults differ: span mode, invalid penalty)."""
        if self.credit.get("env"):
            return str(self.credit["env"])

        ids = sorted(set(env_ids))
        if not ids:
            raise ConfigError("no episodes in the batch")
        families = {entry(i).family for i in ids}
        if len(families) > 1:
            raise ConfigError(
                f"the prompt dataset mixes env families {sorted(families)} ({', '.join(ids)}); set credit.env to the "
                "one whose defaults apply, or train one family at a time"
            )
        return ids[0]

    @classmethod
    def from_environment(cls) -> BridgeConfig:
        """The config the launcher put in `AGENTGYM_OPSD_OPENRLHF` (defaults when unset)."""
        raw = os.environ.get(ENV_VAR)
        if not raw:
            return cls()
        try:
            return cls.from_dict(json.loads(raw), f"${ENV_VAR}")
        except json.JSONDecodeError as e:
            raise ConfigError(
                f"${ENV_VAR} is not valid JSON ({e}); start training with `agentgym-opsd train-openrlhf`") from None


def load_sections(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The raw sections of a YAML or JSON bridge config file (ConfigError when unreadable)."""
    path = Path(path)
    try:
        data = read_config_file(path, "json" if path.suffix.lower() == ".json" else "yaml")
    except DataFileError as e:  # names the file and the line
        raise ConfigError(str(e)) from None
    if data is not None and not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping with sections rollout, credit, teacher")
    return dict(data or {})


def merge_sections(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """`override`'s keys over `base`'s, section by section."""
    out = {k: dict(v) if isinstance(v, dict) else v for k, v in base.items()}
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = {**out[key], **value}
        else:
            out[key] = value
    return out


def resolve_credit_config(section: dict[str, Any], env_id: str):
    """`trainer.env_knowledge.credit_config(env, method, preset=..., **fields)` from the bridge's `credit` section.

    `env` in the section (else `env_id`, the env being trained on) picks the family defaults (span
    mode, invalid penalty, mixing strength, WebShop's graded score). The teacher is the live policy:
    the bridge scores it on OpenRLHF's actor group right after the student forward, which holds the
    rollout (old) policy; a `stale` snapshot would need a second model group, so it is refused.
    """
    fields = dict(section or {})
    method = fields.pop("method", "grpo")
    preset = fields.pop("preset", "default")
    env = fields.pop("env", None) or env_id
    if fields.get("teacher_mode", "live") != "live":
        raise ConfigError(
            "credit.teacher_mode: the OpenRLHF bridge scores the teacher with the actor group (the live, old "
            "policy); set teacher_mode: live or leave it out"
        )
    fields["teacher_mode"] = "live"
    try:
        return credit_config(str(env), str(method), preset=str(preset), **fields)
    except UnknownEnvError as e:
        raise ConfigError(f"credit: {e}") from None
    except (TypeError, ValueError) as e:
        raise ConfigError(f"credit: {e}") from None


@dataclass(frozen=True)
class TaskLabel:
    """What one row of the prompt dataset asks for: the env, the reset seed and options.

    It travels as the dataset's label (a JSON string), so OpenRLHF hands it to the agent executor
    untouched. The `n_samples_per_prompt` samples of one row share it: same seed, same task (a GRPO
    group).
    """

    env_id: str
    seed: int
    options: dict[str, Any] = field(default_factory=dict)
    env_kwargs: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps(
            {"env_id": self.env_id, "seed": int(self.seed), "options": self.options, "env_kwargs": self.env_kwargs},
            sort_keys=True,
        )

    @classmethod
    def parse(cls, label: Any) -> TaskLabel:
        """Read a label (JSON string or mapping). Raises ConfigError naming what is wrong."""
        data = label
        if isinstance(label, str):
            try:
                data = json.loads(label)
            except json.JSONDecodeError:
                raise ConfigError(
                    f"label {label[:80]!r} is not a task label; write the prompt dataset with "
                    "`agentgym-opsd openrlhf-prompts` and pass --data.label_key label"
                ) from None
        if not isinstance(data, dict) or "env_id" not in data or "seed" not in data:
            raise ConfigError(f"task label {str(label)[:80]!r} needs env_id and seed")
        unknown = sorted(set(data) - {"env_id", "seed", "options", "env_kwargs"})
        if unknown:
            raise ConfigError(f"task label: unknown key(s) {unknown}")
        return cls(str(data["env_id"]), int(data["seed"]), dict(data.get("options") or {}),
                   dict(data.get("env_kwargs") or {}))
