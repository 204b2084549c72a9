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
import importlib
import inspect
import re
import sys
import typing
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
    "env_description",
    "task_count",
    "make",
    "UnknownEnvError",
    "notes_folder",
    "EnvOption",
    "EnvOptionError",
    "env_options",
    "check_env_options",
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
        description: one line for `agentgym-opsd list` ("": `env_description` reads the env class's
            docstring instead).
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
_PLUGINS_WAITING: set[str] = set()  # plug-ins whose module was mid-import


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
    """Run every `agentgym_opsd.envs` entry point once. A broken plug-in is reported, not fatal.

    A plug-in whose module is still being imported (a program that imports `environments.alfworld`
    first imports `agentgym_opsd` from inside it) is not broken: it waits, and the next lookup
    (`entry`, `make`, `registered_envs`) runs it, once its module has finished importing.
    """
    global _PLUGINS_LOADED
    if _PLUGINS_LOADED and not reload and not _PLUGINS_WAITING:
        return
    first = not _PLUGINS_LOADED or reload
    _PLUGINS_LOADED = True
    for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
        key = f"{ep.name} = {ep.value}"
        if not first and key not in _PLUGINS_WAITING:
            continue
        if key in _PLUGIN_ERRORS and not reload:
            continue
        if _still_importing(ep.module):
            _PLUGINS_WAITING.add(key)
            continue
        _PLUGINS_WAITING.discard(key)
        try:
            target = ep.load()
            if callable(target):
                target()
            _PLUGIN_ERRORS.pop(key, None)
        except Exception as e:  # a third-party bug must not break the suite
            _PLUGIN_ERRORS[key] = f"{type(e).__name__}: {e}"
            warnings.warn(f"agentgym_opsd: env plug-in '{key}' failed to load: {e}", stacklevel=2)


def _still_importing(module_name: str) -> bool:
    """Whether `module_name` is half-imported: in `sys.modules`, its body still running."""
    module = sys.modules.get(module_name)
    return module is not None and bool(getattr(getattr(module, "__spec__", None), "_initializing", False))


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


def env_description(env_id: str) -> str:
    """One line that says what `env_id` is: its registered description, else the first paragraph of
    its env class's docstring (a plug-in that registers without a description), else ""."""
    described = entry(env_id).description
    if described:
        return described
    try:
        cls = _env_class(env_id)
    except Exception:  # a plug-in whose class does not import: `list` still lists it
        return ""
    own = cls.__dict__.get("__doc__") if inspect.isclass(cls) else getattr(cls, "__doc__", None)
    paragraph = inspect.cleandoc(own or "").split("\n\n")[0]
    return " ".join(paragraph.split())


def task_count(env_id: str, split: str) -> int:
    """The number of tasks `env_id` holds in `split`: the registered `sizes` function, else the
    `num_tasks` of an env made for that split (which may load data)."""
    e = entry(env_id)
    if e.sizes is not None:
        return int(e.sizes(split))
    env = make(env_id, **({} if e.splits == (split,) else {"split": split}))
    try:
        return int(env.unwrapped.num_tasks)
    finally:
        env.close()


def make(env_id: str, **kwargs: Any) -> gym.Env:
    """`gymnasium.make` for a registered id, with a clear error for unknown ids."""
    entry(env_id)
    return gym.make(env_id, **kwargs)


# ---------------------------------------------------------------------------------------------
# The keyword options of a registered id (what `--option KEY=VALUE` and a bench's `options` may set).


class EnvOptionError(ValueError):
    """An env option that the env does not take, or a value of the wrong kind; one line that names
    the env and the option and lists the env's options."""


@dataclass(frozen=True)
class EnvOption:
    """One keyword of an env's constructor.

    Attributes:
        name: the keyword.
        default: its default (`inspect.Parameter.empty` when it has none); the id's own registered
            keywords (e.g. the subset) are shown as defaults.
        kinds: the kinds of value it takes, from its annotation (`int`, `str`, `None`, ...), or
            None when the annotation does not say (then any value is passed through).
        description: the line of the env's docstring that explains it ("" when none does).
        class_default: for a None default, the env class's own value of that name, which None
            leaves in force (`max_turns`: 50), or None.
    """

    name: str
    default: Any
    kinds: tuple[type, ...] | None
    description: str = ""
    class_default: Any = None


# Keywords `gymnasium.make` takes itself, for every id.
_MAKE_KEYWORDS = ("max_episode_steps", "disable_env_checker")
_KIND_WORDS = {int: "an integer", float: "a number", str: "a string", bool: "true or false", type(None): "null",
               dict: "a table", list: "a list"}


def _env_class(env_id: str) -> Any:
    target = gym.spec(env_id).entry_point
    if isinstance(target, str):
        module, _, attr = target.partition(":")
        target = getattr(importlib.import_module(module), attr)
    return target


def _kinds(annotation: Any) -> tuple[type, ...] | None:
    """The runtime classes an annotation allows, or None when it is not a plain union of them."""
    if annotation is inspect.Parameter.empty or annotation is Any:
        return None
    members = typing.get_args(annotation) if typing.get_origin(annotation) in (
        typing.Union, getattr(__import__("types"), "UnionType", None)) else (annotation,)
    out: list[type] = []
    for member in members:
        origin = typing.get_origin(member) or member
        if member is None or member is type(None):
            out.append(type(None))
        elif origin in (int, float, str, bool, dict, list, tuple):
            out.append(list if origin is tuple else origin)
        elif isinstance(origin, type) and origin.__module__ == "collections.abc" and origin.__name__ in (
            "Sequence", "Iterable", "Collection"):
            out.append(list)
        elif isinstance(origin, type) and origin.__module__ == "collections.abc" and origin.__name__ == "Mapping":
            out.append(dict)
        else:  # a path, a callable, a class of the env's own: not checked here
            return None
    return tuple(dict.fromkeys(out))


def _docs(cls: Any) -> str:
    texts = [inspect.getdoc(klass) or "" for klass in inspect.getmro(cls) if klass.__module__ != "builtins"]
    module = sys.modules.get(getattr(cls, "__module__", ""), None)
    texts.append((module.__doc__ or "") if module is not None else "")
    return "\n".join(texts)


def _describe(name: str, docs: str) -> str:
    """The docstring text that explains `name` (an `Args:`-style line `name, other: text` and its
    more indented continuation lines); a bare "see `X`" defers to a later docstring (a base class's)."""
    lines = docs.splitlines()
    fallback = ""
    for i, line in enumerate(lines):
        match = re.match(r"(\s*)([A-Za-z_][\w, ]*):\s+(.*)", line)
        if not match or name not in [n.strip() for n in match.group(2).split(",")]:
            continue
        text, indent = [match.group(3).strip()], len(match.group(1))
        for more in lines[i + 1 :]:
            if not more.strip() or len(more) - len(more.lstrip()) <= indent:
                break
            text.append(more.strip())
        joined = " ".join(text)
        if joined.lower().startswith("see `"):
            fallback = fallback or joined
            continue
        return joined
    return fallback


def env_options(env_id: str) -> list[EnvOption] | None:
    """The keyword options of a registered id, read from its class's constructor (and the
    constructors it forwards `**kwargs` to), with the docstring line that explains each; None when
    the entry point does not say (a factory taking `**kwargs` only)."""
    entry(env_id)
    registered = dict(gym.spec(env_id).kwargs or {})
    try:
        cls = _env_class(env_id)
    except Exception:
        return None
    classes = inspect.getmro(cls) if inspect.isclass(cls) else (cls,)
    found: dict[str, EnvOption] = {}
    docs = _docs(cls) if inspect.isclass(cls) else (inspect.getdoc(cls) or "")
    for klass in classes:
        init = klass.__init__ if inspect.isclass(klass) else klass
        if inspect.isclass(klass) and "__init__" not in vars(klass):
            continue
        try:
            signature = inspect.signature(init)
            hints = typing.get_type_hints(init)
        except Exception:
            try:
                signature, hints = inspect.signature(init), {}
            except (TypeError, ValueError):
                return None
        forwards = False
        for p in signature.parameters.values():
            if p.name == "self" or p.kind == p.VAR_POSITIONAL:
                continue
            if p.kind == p.VAR_KEYWORD:
                forwards = True
                continue
            if p.name not in found:
                default = registered.get(p.name, p.default)
                own = getattr(cls, p.name, None) if default is None and inspect.isclass(cls) else None
                own = own if isinstance(own, (bool, int, float, str)) else None  # not a property or method
                found[p.name] = EnvOption(p.name, default, _kinds(hints.get(p.name, inspect.Parameter.empty)),
                                          _describe(p.name, docs), own)
        if not forwards:
            return list(found.values())
        if not inspect.isclass(klass) or klass.__init__ is object.__init__:
            break
    return None  # **kwargs reach a constructor we cannot see


def _kind_ok(value: Any, kinds: tuple[type, ...]) -> bool:
    for kind in kinds:
        if kind is type(None) and value is None:
            return True
        if kind is bool and isinstance(value, bool):
            return True
        if kind is int and isinstance(value, int) and not isinstance(value, bool):
            return True
        if kind is float and isinstance(value, (int, float)) and not isinstance(value, bool):
            return True
        if kind in (str, dict) and isinstance(value, kind):
            return True
        if kind is list and isinstance(value, (list, tuple)):
            return True
    return False


def check_env_options(env_id: str, options: dict[str, Any]) -> None:
    """Raise `EnvOptionError` (one line) for an option `env_id` does not take, or a value of a kind
    its annotation does not allow (`max_turns="abc"`). Options of envs whose constructor cannot be
    read pass unchecked."""
    known = env_options(env_id)
    if known is None:
        return
    by_name = {o.name: o for o in known}
    listing = ", ".join(o.name for o in known)
    for name, value in options.items():
        if name in _MAKE_KEYWORDS:
            continue
        option = by_name.get(name)
        if option is None:
            close = difflib.get_close_matches(name, list(by_name), n=1, cutoff=0.6)
            hint = f" (did you mean {close[0]}?)" if close else ""
            raise EnvOptionError(f"{env_id} has no option {name!r}{hint}; its options: {listing} "
                                 f"(`agentgym-opsd list --options {env_id}` explains them)")
        if option.kinds is not None and not _kind_ok(value, option.kinds):
            wanted = " or ".join(_KIND_WORDS.get(k, k.__name__) for k in option.kinds)
            raise EnvOptionError(f"{env_id}: option {name}={value!r}: {name} takes {wanted}")
