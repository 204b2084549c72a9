"""What the trainer reads about an env family, from the registry (never from the env's code).

Each env family registers its credit defaults and its AgentOPSD skill notes with its ids
(`agentgym_opsd.registry.EnvEntry.credit_defaults`, `.skill_notes`); a plug-in env that registers
its own gets every credit method without a line here.

- `credit_config(env_id, method, preset=..., **overrides)`: the method's settings with the family's
  defaults (docs/credit.md#configuration, docs/credit.md#outcome-reward).
- `skill_text(env_id, task_type)`: AgentOPSD's privileged note: the trainer's general note
  (trainer/skills/general.txt), then the family's note for the task type
  (docs/credit.md#agentopsd-teacher).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agentgym_opsd.registry import entry
from trainer.credit.config import CreditConfig

__all__ = ["credit_config", "skill_text", "SKILLS_DIR"]

SKILLS_DIR = Path(__file__).resolve().parent / "skills"


def credit_config(env_id: str, method: str, *, preset: str = "default", **overrides: Any) -> CreditConfig:
    """`CreditConfig.for_method(method, <the family's registered defaults>, preset=..., **overrides)`.

    Raises `UnknownEnvError` for an id that is not registered.
    """
    return CreditConfig.for_method(method, entry(env_id).credit_defaults, preset=preset, **overrides)


def skill_text(env_id: str, task_type: str, skills_dir: str | Path | None = None) -> str:
    """AgentOPSD's skill note for a task: the general note, then the family's note for its type.

    `skills_dir` replaces the notes: its `general.txt` (required) and, where present,
    `<task type>.txt` instead of the family's note.
    Raises FileNotFoundError when the folder has no general.txt.
    """
    folder = Path(skills_dir) if skills_dir is not None else SKILLS_DIR
    general = folder / "general.txt"
    if not general.is_file():
        raise FileNotFoundError(f"skill folder {folder} has no general.txt (the note every task reads)")
    parts = [general.read_text(encoding="utf-8").strip()]
    own = folder / f"{str(task_type).strip().lower().replace('-', '_').replace(' ', '_')}.txt"
    if skills_dir is not None and own.is_file():
        parts.append(own.read_text(encoding="utf-8").strip())
    else:
        notes = entry(env_id).skill_notes
        note = notes(task_type) if notes is not None else None
        if note:
            parts.append(note.strip())
    return "\n\n".join(p for p in parts if p)
