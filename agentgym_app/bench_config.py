"""The bench config: what `agentgym-opsd bench CONFIG` plays, read from TOML (`.toml`) or YAML
(`.yaml`/`.yml`), checked, and normalised into a `BenchConfig` (`load_config`, `config_from_dict`).
`agentgym_app.bench` runs it.

    agents = ["expert", "random"]      # random, expert, hf:PATH, openai:BASE_URL#MODEL, or
                                       # { name = "tiny", agent = "hf:runs/x/model" } to name one
    seeds = [0, 1]                     # run seeds: each plays its own tasks (see below) with its own agent seed
    episodes = 20                      # episodes per env and split ("all": one per task)
    workers = 2                        # env worker processes (0: envs in this process)
    num_envs = 8                       # envs stepped together when workers = 0
    step_timeout = 60                  # seconds a step may take in a worker
    context = "full"                   # or "window:K"

    [[envs]]
    id = "agentgym/ALFWorld-Heat-v0"   # or: family = "ALFWorld" (every registered id of it)
    splits = ["valid_seen"]            # default: the id's first split
    episodes = 10                      # overrides the top-level count
    options = { max_turns = 30 }       # keywords for gymnasium.make

    [headline]                         # optional: the result that matters, first and large in the report
    id = "agentgym/ALFWorld-Heat-v0"
    split = "valid_seen"               # default: the id's split when the config has one
    label = "held-out"                 # what its rows are marked with (default "headline")
    note = "..."                       # one sentence on what it measures

Data paths among the options (`data_file`, `catalog`, `index_dir`, ...) are relative to the data root,
the config's folder unless `agentgym-opsd bench --data-root DIR` says otherwise, and may not lead
outside it (`..`, absolute paths and symbolic links elsewhere are refused): a config from someone
else reads only what it was given.

`envs` may also be a list of ids. `family` stands for the family's per-subset ids (an id whose subset
is `all` is used only when the family has no other).

Which tasks a run seed plays, and what a run folder holds: `agentgym_app.bench`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from agentgym_opsd.context import ContextPolicy
from agentgym_opsd.io import DataFileError, read_config_file
from agentgym_opsd.paths import PathOutsideRoot, contain_path_options
from agentgym_opsd.registry import EnvOptionError, check_env_options, entry, registered_envs

__all__ = ["AgentSpec", "BenchConfig", "ConfigError", "EnvSpec", "Headline", "config_from_dict", "load_config"]


class ConfigError(ValueError):
    """A bench config is wrong; the message names the file and the field."""


@dataclass(frozen=True)
class EnvSpec:
    """One env id and split of a bench, with its options and episode count."""

    id: str
    split: str
    episodes: int | str
    options: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class AgentSpec:
    """An agent of a bench: the name it has in tables and keys, and what `make_agent` builds."""

    name: str
    agent: str


@dataclass(frozen=True)
class Headline:
    """The result that matters (an env id and split of the bench): the report shows it first, as a
    full-width chart with the exact `eval` command that replays it, and marks its rows with `label`."""

    id: str
    split: str
    label: str = "headline"
    note: str = ""


@dataclass(frozen=True)
class BenchConfig:
    agents: tuple[AgentSpec, ...]
    envs: tuple[EnvSpec, ...]
    seeds: tuple[int, ...] = (0,)
    workers: int = 0
    num_envs: int = 8
    step_timeout: float | None = 60.0
    context: str = "full"
    name: str = "bench"
    headline: Headline | None = None

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["agents"] = [asdict(a) for a in self.agents]
        d["seeds"] = list(self.seeds)
        d["envs"] = [asdict(e) for e in self.envs]
        d["headline"] = None if self.headline is None else asdict(self.headline)
        return d

    def headline_spec(self) -> EnvSpec | None:
        """The env spec the headline names (None without a headline)."""
        if self.headline is None:
            return None
        return next(e for e in self.envs if (e.id, e.split) == (self.headline.id, self.headline.split))

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> BenchConfig:
        """The inverse of `to_dict` (a run folder's config.json)."""
        return cls(
            agents=tuple(AgentSpec(a["name"], a["agent"]) for a in d["agents"]),
            envs=tuple(EnvSpec(e["id"], e["split"], e["episodes"], dict(e.get("options") or {})) for e in d["envs"]),
            seeds=tuple(d["seeds"]),
            workers=int(d.get("workers", 0)),
            num_envs=int(d.get("num_envs", 8)),
            step_timeout=d.get("step_timeout"),
            context=str(d.get("context", "full")),
            name=str(d.get("name", "bench")),
            headline=Headline(**d["headline"]) if d.get("headline") else None,
        )

    def identity(self) -> dict[str, Any]:
        """What must not change for a run folder to be resumed (workers, timeouts and what the
        report puts first may)."""
        d = self.to_dict()
        for key in ("workers", "num_envs", "step_timeout", "name", "headline"):
            d.pop(key)
        return d


_TOP_KEYS = {"agents", "envs", "seeds", "episodes", "workers", "num_envs", "step_timeout", "context", "name",
             "headline"}
_ENV_KEYS = {"id", "family", "splits", "split", "episodes", "options"}
_HEADLINE_KEYS = {"id", "split", "label", "note"}


def _read(path: Path) -> dict[str, Any]:
    if path.suffix not in (".toml", ".yaml", ".yml"):
        raise ConfigError(f"{path}: a bench config is a .toml, .yaml or .yml file")
    try:
        data = read_config_file(path)
    except DataFileError as e:  # names the file and the line
        raise ConfigError(str(e)) from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the config must be a table of settings")
    return data


def _episodes(value: Any, where: str) -> int | str:
    if value == "all":
        return "all"
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{where}: episodes must be a positive integer or \"all\", got {value!r}")
    return value


def config_from_dict(data: dict[str, Any], where: str = "config", *,
                     data_root: str | Path | None = None) -> BenchConfig:
    """Check and normalise a config table (see the module docstring).

    Args:
        data_root: when given (configs read from files), path-valued env options (`data_file`,
            `index_dir`, `catalog`, ...; see `agentgym_opsd.paths.is_path_option`) are resolved
            against it and must stay inside it: `..`, absolute paths and symbolic links that lead
            elsewhere are refused with a ConfigError.
    """
    unknown = set(data) - _TOP_KEYS
    if unknown:
        raise ConfigError(f"{where}: unknown setting(s) {sorted(unknown)}; known: {sorted(_TOP_KEYS)}")
    agents = _agents(data.get("agents"), where)
    seeds = _seeds(data.get("seeds", [0]), where)
    default_episodes = _episodes(data.get("episodes", 10), f"{where}: episodes")
    envs = _envs(data.get("envs"), where, default_episodes, data_root)
    workers = data.get("workers", 0)
    if not isinstance(workers, int) or workers < 0:
        raise ConfigError(f"{where}: workers must be an integer >= 0")
    num_envs = data.get("num_envs", 8)
    if not isinstance(num_envs, int) or num_envs < 1:
        raise ConfigError(f"{where}: num_envs must be an integer >= 1")
    timeout = data.get("step_timeout", 60.0)
    if timeout is not None and (not isinstance(timeout, (int, float)) or timeout <= 0):
        raise ConfigError(f"{where}: step_timeout must be a positive number of seconds")
    context = str(data.get("context", "full"))

    try:
        ContextPolicy.parse(context)
    except ValueError as e:
        raise ConfigError(f"{where}: {e}") from None
    return BenchConfig(
        agents=agents,
        envs=envs,
        seeds=seeds,
        workers=workers,
        num_envs=num_envs,
        step_timeout=None if timeout is None else float(timeout),
        context=context,
        name=str(data.get("name", "bench")),
        headline=_headline(data.get("headline"), where, envs),
    )


def _headline(raw: Any, where: str, envs: tuple[EnvSpec, ...]) -> Headline | None:
    """The `headline` table: an env id and split of `envs` (the split may be left out when the
    config plays the id on one split), a label and a note."""
    if raw is None:
        return None
    here = f"{where}: headline"
    if not isinstance(raw, dict) or "id" not in raw or set(raw) - _HEADLINE_KEYS:
        raise ConfigError(f'{here}: give a table with id (and split, label, note), e.g. headline = {{ id = '
                          f'"{envs[0].id}", '
                          f'split = "{envs[0].split}" }}')  # fmt: skip
    if not all(isinstance(v, str) and v for v in raw.values()):
        raise ConfigError(f"{here}: id, split, label and note are non-empty strings")
    splits = [e.split for e in envs if e.id == raw["id"]]
    if not splits:
        raise ConfigError(f"{here}: {raw['id']!r} is not among the envs; they are: {sorted({e.id for e in envs})}")
    if "split" not in raw and len(splits) > 1:
        raise ConfigError(f"{here}: {raw['id']} is played on {splits}: say which split with split = ...")
    split = raw.get("split", splits[0])
    if split not in splits:
        raise ConfigError(f"{here}: {raw['id']} is played on {splits}, not on {split!r}")
    return Headline(raw["id"], split, raw.get("label", "headline"), raw.get("note", ""))


def _agents(raw: Any, where: str) -> tuple[AgentSpec, ...]:
    """The `agents` setting: names (`"random"`) or `{ name, agent }` tables, each name once."""
    if isinstance(raw, str):
        raw = [raw]
    if not raw or not isinstance(raw, list):
        raise ConfigError(f'{where}: agents must be a list of agent names, e.g. agents = ["expert", "random"]')
    agents = []
    for a in raw:
        if isinstance(a, str) and a:
            agents.append(AgentSpec(a, a))
        elif isinstance(a, dict) and set(a) == {"name", "agent"} and all(isinstance(v, str) and v for v in a.values()):
            agents.append(AgentSpec(a["name"], a["agent"]))
        else:
            raise ConfigError(f'{where}: agent {a!r}: give a name ("random") or {{ name = "tiny", agent = "hf:PATH" }}')
    if len({a.name for a in agents}) != len(agents):
        raise ConfigError(f"{where}: two agents have the same name")
    return tuple(agents)


def _seeds(raw: Any, where: str) -> tuple[int, ...]:
    """The `seeds` setting: distinct non-negative integers (one integer is a list of one)."""
    seeds = [raw] if isinstance(raw, int) and not isinstance(raw, bool) else raw
    if not seeds or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in seeds):
        raise ConfigError(f"{where}: seeds must be a list of non-negative integers, got {seeds!r}")
    if len(set(seeds)) != len(seeds):
        raise ConfigError(f"{where}: seeds repeat: {seeds}")
    return tuple(seeds)


def _envs(raw: Any, where: str, default_episodes: int | str, data_root: str | Path | None) -> tuple[EnvSpec, ...]:
    """The `envs` list: one EnvSpec per env id and split, each pair once."""
    if not raw or not isinstance(raw, list):
        raise ConfigError(f'{where}: envs must be a list, e.g. [[envs]] id = "agentgym/ALFWorld-Heat-v0"')
    envs: list[EnvSpec] = []
    for number, item in enumerate(raw, start=1):
        envs += _env_item(item, f"{where}: envs[{number}]", default_episodes, data_root)
    keys = [(e.id, e.split) for e in envs]
    if len(set(keys)) != len(keys):
        raise ConfigError(f"{where}: an env id and split appear twice")
    return tuple(envs)


def _env_item(item: Any, here: str, default_episodes: int | str, data_root: str | Path | None) -> list[EnvSpec]:
    """One item of `envs` (an id, or a table with an id or a family, splits, episodes, options): the
    EnvSpecs it stands for, its options checked against every env id's constructor."""
    if isinstance(item, str):
        item = {"id": item}
    if not isinstance(item, dict):
        raise ConfigError(f"{here}: an env is an id or a table with id or family")
    unknown = set(item) - _ENV_KEYS
    if unknown:
        raise ConfigError(f"{here}: unknown key(s) {sorted(unknown)}; known: {sorted(_ENV_KEYS)}")
    if ("id" in item) == ("family" in item):
        raise ConfigError(f"{here}: give exactly one of id and family")
    ids = _env_ids(item, here)
    splits = item.get("splits", item.get("split"))
    if isinstance(splits, str):
        splits = [splits]
    options = _env_options(item.get("options", {}), here, data_root)
    count = _episodes(item.get("episodes", default_episodes), f"{here}: episodes")
    specs = []
    for env_id in ids:
        try:
            check_env_options(env_id, options)
        except EnvOptionError as e:
            raise ConfigError(f"{here}: options: {e}") from None
        known = entry(env_id).splits
        for split in splits or [known[0]]:
            if split not in known:
                raise ConfigError(f"{here}: {env_id} has no split {split!r}; its splits: {list(known)}")
            specs.append(EnvSpec(env_id, split, count, dict(options)))
    return specs


def _env_ids(item: dict[str, Any], here: str) -> list[str]:
    """The registered ids an `envs` item names: its `id`, or its `family`'s per-subset ids."""
    if "id" in item:
        try:
            entry(str(item["id"]))
        except KeyError as e:  # UnknownEnvError names the closest ids
            raise ConfigError(f"{here}: {e}") from None
        return [str(item["id"])]
    members = [e for e in registered_envs() if e.family == item["family"]]
    # A family's subset ids; an id that plays all subsets at once is left out when the family has
    # per-subset ids (it would play the same tasks again).
    ids = [e.id for e in members if e.subset != "all"] or [e.id for e in members]
    if not ids:
        families = sorted({e.family for e in registered_envs()})
        raise ConfigError(f"{here}: no env of family {item['family']!r}; registered families: {families}")
    return ids


def _env_options(options: Any, here: str, data_root: str | Path | None) -> dict[str, Any]:
    """An item's `options` table: keyword names; path options resolved inside `data_root` when given."""
    if not isinstance(options, dict):
        raise ConfigError(f"{here}: options must be a table of keywords")
    bad = [k for k in options if not isinstance(k, str) or not k.isidentifier()]
    if bad:  # YAML allows `0: x` or `true: x`; env options are Python keyword arguments
        raise ConfigError(f"{here}: options: {bad[0]!r} is not a keyword name")
    if data_root is None:
        return options

    try:
        return contain_path_options(options, data_root, f"{here}: options")
    except PathOutsideRoot as e:
        raise ConfigError(str(e)) from None


def load_config(path: str | Path, *, data_root: str | Path | None = None) -> BenchConfig:
    """Read and check a bench config file. Its data paths (env options such as `data_file`) are
    relative to `data_root` and may not lead outside it; the default root is the config's folder."""
    path = Path(path)
    return config_from_dict(_read(path), str(path), data_root=path.parent if data_root is None else data_root)
