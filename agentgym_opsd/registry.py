"""The registry: Gymnasium ids for every env family, subset and split, and third-party plug-ins.

Env families (ours and other packages') register through the entry-point group
`agentgym_opsd.envs`: each entry point names a function that calls `register_env` for its ids.
`import agentgym_opsd` loads them all, so `gymnasium.make("agentgym/ALFWorld-Heat-v0")` works after it.
Registering is cheap: the env class is imported only when an env is made.

What a trainer needs to know about a family travels with its registration, so a plug-in env gets
every credit method without a line in the trainer:

- `credit_defaults`: `CreditConfig` fields for the family (scored span, invalid-turn penalty, mixing
  strength, whether the env's graded score enters the reward);
- `skill_notes`: task type -> the family's strategy note for that type (AgentOPSD's privileged
  teacher text), e.g. `notes_folder(folder, aliases)` over one text file per task type.
"""

from __future__ import annotations

import difflib
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from types import MappingProxyType
from typing import Any

import gymnasium as gym

__all__ = [
    "ENTRY_POINT_GROUP",
    "EnvEntry",
    "register_env",
    "registered_envs",
    "load_plugins",
    "plugin_errors",
    "entry",
    "make",
    "UnknownEnvError",
    "notes_folder",
]

ENTRY_POINT_GROUP = "agentgym_opsd.envs"


class UnknownEnvError(KeyError):
    """No env of that id is registered."""

    def __str__(self) -> str:  # KeyError quotes its message; we want it plain
        return str(self.args[0])


@dataclass(frozen=True)
class EnvEntry:
    """One registered id.

    Attributes:
        id: the Gymnasium id, e.g. `agentgym/ALFWorld-Heat-v0`.
        family: the env family (`ALFWorld`, `SearchQA`, `WebShop`, or a plug-in's).
        subset: the task subset the id plays (`heat`, `hotpotqa`, `all`).
        splits: the splits it can be made with (`split=` keyword).
        description: one line for `agentgym-opsd list`.
        sizes: optional function `split -> number of tasks` (may load data; errors are reported).
        credit_defaults: the family's defaults for a trainer's credit settings (`CreditConfig`
            field names: `span_mode`, `invalid_coef`, `lam_mix`, `score_coef`, ...); empty: the
            trainer's generic defaults.
        skill_notes: optional function `task type -> strategy note` (None when the family has no
            note for that type): the privileged text AgentOPSD's teacher reads.
    """

    id: str
    family: str
    subset: str
    splits: tuple[str, ...]
    description: str = ""
    sizes: Callable[[str], int] | None = field(default=None, compare=False)
    credit_defaults: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}), compare=False)
    skill_notes: Callable[[str], str | None] | None = field(default=None, compare=False)


_ENTRIES: dict[str, EnvEntry] = {}
_PLUGIN_ERRORS: dict[str, str] = {}
_PLUGINS_LOADED = False


def register_env(
    env_id: str,
    entry_point: str | Callable[..., gym.Env],
    *,
    family: str,
    subset: str = "all",
    splits: tuple[str, ...] = ("test",),
    description: str = "",
    kwargs: dict[str, Any] | None = None,
    sizes: Callable[[str], int] | None = None,
    credit_defaults: Mapping[str, Any] | None = None,
    skill_notes: Callable[[str], str | None] | None = None,
) -> EnvEntry:
    """Register a `TextEnv` under a Gymnasium id (registering the same id twice is a no-op).

    Args:
        env_id: `namespace/Name-vN`; the suite's own ids use the `agentgym` namespace.
        entry_point: `"package.module:Class"` (imported only when the env is made) or a callable.
        family, subset, splits, description, sizes, credit_defaults, skill_notes: see `EnvEntry`.
        kwargs: default keyword arguments for the constructor (`gymnasium.make` ones override).
    """
    if "/" not in env_id or not env_id.rsplit("-v", 1)[-1].isdigit():
        raise ValueError(f"env id {env_id!r}: use 'namespace/Name-vN', e.g. 'agentgym/MyEnv-v0'")
    if env_id in _ENTRIES:
        return _ENTRIES[env_id]
    gym.register(id=env_id, entry_point=entry_point, kwargs=dict(kwargs or {}))
    entry = EnvEntry(env_id, family, subset, tuple(splits), description, sizes,
                     MappingProxyType(dict(credit_defaults or {})), skill_notes)
    _ENTRIES[env_id] = entry
    return entry


def load_plugins(*, reload: bool = False) -> None:
    """Run every `agentgym_opsd.envs` entry point once. A broken plug-in is reported, not fatal."""
    global _PLUGINS_LOADED
    if _PLUGINS_LOADED and not reload:
        return
    _PLUGINS_LOADED = True
    for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
        key = f"{ep.name} = {ep.value}"
        if key in _PLUGIN_ERRORS and not reload:
            continue
        try:
            target = ep.load()
            if callable(target):
                target()
            _PLUGIN_ERRORS.pop(key, None)
        except Exception as e:  # a third-party bug must not break the suite
            _PLUGIN_ERRORS[key] = f"{type(e).__name__}: {e}"
            warnings.warn(f"agentgym_opsd: env plug-in '{key}' failed to load: {e}", stacklevel=2)


def notes_folder(folder: str | Path, aliases: Mapping[str, str] | None = None) -> Callable[[str], str | None]:
    """`skill_notes` from a folder of `<task type>.txt` files.

    The task type is lower-cased with `-` and spaces as `_`; `aliases` maps other names of a type
    (a data set's long task names) to the file's. Returns None for a type without a file.
    """
    folder = Path(folder)
    aliases = dict(aliases or {})

    def note(task_type: str) -> str | None:
        kind = str(task_type).strip().lower().replace("-", "_").replace(" ", "_")
        for name in (kind, aliases.get(kind)):
            if name and (folder / f"{name}.txt").is_file():
                return (folder / f"{name}.txt").read_text(encoding="utf-8").strip()
        return None

    return note


def plugin_errors() -> dict[str, str]:
    """Plug-ins that failed to load, with the reason."""
    return dict(_PLUGIN_ERRORS)


def registered_envs() -> list[EnvEntry]:
    """Every registered id, sorted by family then id."""
    load_plugins()
    return sorted(_ENTRIES.values(), key=lambda e: (e.family, e.id))


def entry(env_id: str) -> EnvEntry:
    """The registry entry of `env_id`, or `UnknownEnvError` with the closest ids."""
    load_plugins()
    if env_id in _ENTRIES:
        return _ENTRIES[env_id]
    close = difflib.get_close_matches(env_id, list(_ENTRIES), n=3, cutoff=0.5)
    hint = f"; did you mean {', '.join(close)}?" if close else "; `agentgym-opsd list` shows them"
    raise UnknownEnvError(f"no env registered as {env_id!r}{hint}")


def make(env_id: str, **kwargs: Any) -> gym.Env:
    """`gymnasium.make` for a registered id, with a clear error for unknown ids."""
    entry(env_id)
    return gym.make(env_id, **kwargs)
