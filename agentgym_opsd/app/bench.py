"""`agentgym-opsd bench CONFIG`: agents x envs x splits x seeds x episodes, resumable, with tables,
plots and an HTML report.

The config is TOML (`.toml`) or YAML (`.yaml`/`.yml`):

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

Episode i of run seed s, on an env with n tasks and N episodes, plays task (i + s N) mod n (see
`task_index`) with reset seed i + 1_000_000 s, by an agent built with seed s; its key is (agent,
env id, split, i, s). So run seeds play different tasks as long as seeds x N <= n (with
`episodes = "all"` every seed plays every task). The 95% interval counts distinct outcomes: a
task replayed with the same turns (a deterministic agent) is one outcome (`agentgym_opsd.summary`). Every finished episode is
appended to `RUN_DIR/episodes.jsonl` at once; running the same config again on the same folder
skips the keys already there (errored episodes are played again), so a broken run resumes where
it stopped (it prints `resuming: 110 of 240 episodes done`). Then the run folder gets:

- `results.json`: one summary per (agent, env id, split) (success with its 95% Wilson interval,
  mean score, mean turns, invalid-action rate, per subset). It depends only on the episodes: a
  resumed run writes the same file as an unbroken one.
- `results.md` and `tables/<family>.md`: a Markdown table per env family.
- `plots/<family>-<subset>.png`: success per agent with its interval, one chart per subset that
  says something (not when every agent but the expert won nothing: the table has those rows), and
  `plots/headline.png`, the headline's chart, full width.
- `report.html`: everything above plus a trajectory viewer (`agentgym_opsd.app.report`).
- `run.json`: timings and versions (what may differ between runs).
"""

from __future__ import annotations

import json
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from agentgym_opsd.app.results import COUNTING_NOTE, chart_groups, markdown_tables, result_row, says_something
from agentgym_opsd.episode import Episode, append_episodes, load_episodes
from agentgym_opsd.io import atomic_write_bytes, atomic_write_json, atomic_write_text
from agentgym_opsd.registry import EnvOptionError, check_env_options, entry, registered_envs
from agentgym_opsd.rollout import EpisodeRequest, run_episodes
from agentgym_opsd.summary import summarize
from agentgym_opsd.workers import EnvFactory

__all__ = ["AgentSpec", "BenchConfig", "EnvSpec", "Headline", "ConfigError", "load_config", "run_bench", "write_results",
           "episode_key", "task_index", "eval_command", "RESET_SEED_STRIDE"]

RESET_SEED_STRIDE = 1_000_000


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


_TOP_KEYS = {"agents", "envs", "seeds", "episodes", "workers", "num_envs", "step_timeout", "context", "name", "headline"}
_ENV_KEYS = {"id", "family", "splits", "split", "episodes", "options"}
_HEADLINE_KEYS = {"id", "split", "label", "note"}


def _read(path: Path) -> dict[str, Any]:
    from agentgym_opsd.io import DataFileError, read_config_file

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


def config_from_dict(data: dict[str, Any], where: str = "config", *, data_root: str | Path | None = None) -> BenchConfig:
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
    from agentgym_opsd.context import ContextPolicy

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
        raise ConfigError(f'{here}: give a table with id (and split, label, note), e.g. headline = {{ id = "{envs[0].id}", '
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
    from agentgym_opsd.paths import PathOutsideRoot, contain_path_options

    try:
        return contain_path_options(options, data_root, f"{here}: options")
    except PathOutsideRoot as e:
        raise ConfigError(str(e)) from None


def load_config(path: str | Path, *, data_root: str | Path | None = None) -> BenchConfig:
    """Read and check a bench config file. Its data paths (env options such as `data_file`) are
    relative to `data_root` and may not lead outside it; the default root is the config's folder."""
    path = Path(path)
    return config_from_dict(_read(path), str(path), data_root=path.parent if data_root is None else data_root)


# ---------------------------------------------------------------------------------------------
# Running.


def env_factory(spec: EnvSpec) -> EnvFactory:
    """Builds the env of `spec` (picklable: workers start from the fork server). `split=` is passed
    unless the id has a single split (then it is the env's only data and the class need not take
    the keyword)."""
    kwargs = dict(spec.options)
    if entry(spec.id).splits != (spec.split,):
        kwargs["split"] = spec.split
    return EnvFactory(spec.id, kwargs)


def task_index(index: int, seed: int, episodes: int, num_tasks: int) -> int:
    """The task episode `index` of run seed `seed` plays: run seed s starts s x `episodes` tasks on,
    so seeds play different tasks until the env's `num_tasks` run out (then the order wraps)."""
    return (index + seed * episodes) % num_tasks


def episode_key(agent: str, env_id: str, split: str, index: int, seed: int) -> str:
    """The key a bench episode is stored and resumed under."""
    return json.dumps([agent, env_id, split, index, seed])


def _load_done(path: Path) -> dict[str, Episode]:
    """The latest record of every key in the episodes file (a torn last line is ignored)."""
    done: dict[str, Episode] = {}
    if path.exists():
        for episode in load_episodes(path, skip_torn_lines=True):
            key = episode.meta.get("bench_key")
            if key is not None:
                done[key] = episode
    return done


def _task_count(spec: EnvSpec) -> int:
    """The env's number of tasks, from one trial build; options the env refuses (a TypeError or
    ValueError of its constructor) are a ConfigError naming the env, the split and the options."""
    try:
        env = env_factory(spec)()
    except (TypeError, ValueError) as e:
        given = ", ".join(f"{k}={v!r}" for k, v in spec.options.items()) or "none"
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ConfigError(f"envs: {spec.id} ({spec.split}): {reason} (options: {given}; "
                          f"`agentgym-opsd list --options {spec.id}` lists them)") from None
    try:
        return int(env.unwrapped.num_tasks)
    finally:
        env.close()


def run_bench(
    config: BenchConfig,
    run_dir: str | Path,
    *,
    restart: bool = False,
    progress: bool = True,
    make_agent: Callable[..., Any] | None = None,
    report: bool = True,
) -> dict[str, Any]:
    """Run (or resume) a bench into `run_dir` and write its results; returns results.json's content.

    Args:
        config: the bench (see `load_config`).
        run_dir: the run folder; an existing one is resumed.
        restart: delete the folder's episodes and start over.
        progress: show a progress bar over all episodes.
        make_agent: builds agents (default `agentgym_opsd.agents.make_agent`).
        report: also write report.html.
    """
    from tqdm.auto import tqdm

    from agentgym_opsd.agents import make_agent as default_make_agent

    build_agent = make_agent or default_make_agent
    run_dir = Path(run_dir)
    _check_agents(config)  # before any env is built or episode played
    episodes_path = _prepare_run_dir(run_dir, config, restart)

    # 1. The plan: every (agent, run seed, env, episode index); the keys the episodes file holds
    #    without an error are done.
    tasks = [_task_count(spec) for spec in config.envs]
    counts = [n if spec.episodes == "all" else int(spec.episodes) for spec, n in zip(config.envs, tasks, strict=True)]
    done = _load_done(episodes_path)
    finished = {k for k, e in done.items() if e.error is None}
    planned = [
        (agent_spec.name, seed, spec, index)
        for agent_spec in config.agents
        for seed in config.seeds
        for number, spec in enumerate(config.envs)
        for index in range(counts[number])
    ]
    todo = [p for p in planned if episode_key(p[0], p[2].id, p[2].split, p[3], p[1]) not in finished]
    if done:
        replayed = len(todo) - sum(1 for p in todo if episode_key(p[0], p[2].id, p[2].split, p[3], p[1]) not in done)
        again = f"; {replayed} errored episodes are played again" if replayed else ""
        print(f"resuming: {len(planned) - len(todo)} of {len(planned)} episodes done{again}", flush=True)

    # 2. Play what is left: one `run_episodes` call per agent, run seed and env; an agent is built
    #    once per run seed, and only when it has episodes to play. Each episode is stored as it ends.
    started = time.time()
    bar = tqdm(total=len(planned), initial=len(planned) - len(todo), desc=f"bench {config.name}", unit="ep", disable=not progress)
    record = _Recorder(episodes_path, done, bar)
    try:
        for agent_spec in config.agents:
            for seed in config.seeds:
                agent = None
                for number, spec in enumerate(config.envs):
                    requests, record.keys = _requests(todo, agent_spec.name, seed, spec, counts[number], tasks[number])
                    if not requests:
                        continue
                    if agent is None:
                        agent = build_agent(agent_spec.agent, seed=seed)
                    bar.set_description_str(f"bench {config.name}: {agent_spec.name} on {spec.id}")
                    run_episodes(env_factory(spec), agent, requests, num_envs=config.num_envs, workers=config.workers,
                                 step_timeout=config.step_timeout, context=config.context, progress=False,
                                 on_episode=record)  # fmt: skip
    finally:
        bar.close()

    # 3. Results (from the episodes alone) and the run's timings.
    results = write_results(run_dir, config, done, report=report)
    elapsed = time.time() - started
    run_info = {"wall_seconds": round(elapsed, 3), "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S")}
    atomic_write_json(run_dir / "run.json", run_info)
    return results


def _check_agents(config: BenchConfig) -> None:
    """Every agent's name checked without loading a model (`check_agent`): a wrong one is a
    ConfigError before the envs are built and before the other agents play."""
    from agentgym_opsd.agents import AgentError
    from agentgym_opsd.app.agents import check_agent

    for spec in config.agents:
        try:
            check_agent(spec.agent)
        except AgentError as e:
            raise ConfigError(f"agents: {spec.name!r}: {e}") from None


def _prepare_run_dir(run_dir: Path, config: BenchConfig, restart: bool) -> Path:
    """Create (or, with `restart`, empty) the run folder, refuse one that holds a run of another config,
    record the config; returns the episodes file's path."""
    run_dir.mkdir(parents=True, exist_ok=True)
    episodes_path = run_dir / "episodes.jsonl"
    config_path = run_dir / "config.json"
    if restart:
        for stale in (episodes_path, run_dir / "results.json"):
            stale.unlink(missing_ok=True)
    if config_path.exists() and episodes_path.exists():
        previous = json.loads(config_path.read_text(encoding="utf-8"))
        if previous.get("identity") != json.loads(json.dumps(config.identity())):
            raise ConfigError(
                f"{run_dir} holds a run of another config; pass --restart to start it over, or --out for a new folder"
            )
    atomic_write_json(config_path, {"config": config.to_dict(), "identity": config.identity()})
    return episodes_path


def _requests(todo: list[tuple[str, int, EnvSpec, int]], agent_name: str, seed: int, spec: EnvSpec, count: int,
              num_tasks: int) -> tuple[list[EpisodeRequest], dict[str, str]]:  # fmt: skip
    """The episodes of `todo` that `agent_name` plays with run seed `seed` on `spec` (an env with
    `count` episodes and `num_tasks` tasks), and the bench key of each by episode id."""
    requests, keys = [], {}
    for a, s, sp, index in todo:
        if a == agent_name and s == seed and sp == spec:
            episode_id = f"{spec.id}:{spec.split}:{index}@{seed}"
            keys[episode_id] = episode_key(agent_name, spec.id, spec.split, index, seed)
            requests.append(
                EpisodeRequest(
                    seed=index + RESET_SEED_STRIDE * seed,
                    options={"task_index": task_index(index, seed, count, num_tasks)},
                    episode_id=episode_id,
                )
            )
    return requests, keys


class _Recorder:
    """`on_episode` of a bench: stores each finished episode under its bench key (`keys`: episode id
    -> key, for the agent, seed and env playing now) in the episodes file at once, and counts errors."""

    def __init__(self, episodes_path: Path, done: dict[str, Episode], bar: Any) -> None:
        self.episodes_path, self.done, self.bar = episodes_path, done, bar
        self.keys: dict[str, str] = {}
        self.errors_seen = 0

    def __call__(self, episode: Episode) -> None:
        key = self.keys[episode.episode_id]
        episode.meta["bench_key"] = key
        episode.meta["agent_spec"] = episode.agent
        episode.agent = json.loads(key)[0]  # the bench's name for it
        append_episodes(self.episodes_path, [episode])
        self.done[key] = episode
        self.bar.update(1)
        if episode.error:
            self.errors_seen += 1
            self.bar.set_postfix_str(f"{self.errors_seen} errored", refresh=False)


# ---------------------------------------------------------------------------------------------
# Results.


def _family(env_id: str) -> tuple[str, str]:
    e = entry(env_id)
    return e.family, e.subset


def summarize_bench(config: BenchConfig, episodes_by_key: dict[str, Episode]) -> dict[str, Any]:
    """results.json's content: one entry per (agent, env id, split), in config order, over the
    episodes of every seed (ordered by seed, then episode index)."""
    grouped: dict[tuple[str, str, str], list[tuple[int, int, Episode]]] = defaultdict(list)
    for key, episode in episodes_by_key.items():
        agent_name, env_id, split, index, seed = json.loads(key)
        grouped[(agent_name, env_id, split)].append((seed, index, episode))
    results = []
    for agent_spec in config.agents:
        agent_name = agent_spec.name
        for spec in config.envs:
            rows = sorted(grouped.get((agent_name, spec.id, spec.split), []), key=lambda t: (t[0], t[1]))
            chosen = [e for seed, _, e in rows if seed in config.seeds]
            family, subset = _family(spec.id)
            summary = summarize(chosen, env_id=spec.id, agent=agent_name)
            by_type = summary.pop("by_task_type")
            summary.update(
                family=family,
                subset=subset,
                split=spec.split,
                seeds=list(config.seeds),
                subsets={t: result_row(s) for t, s in by_type.items()},
            )
            results.append(summary)
    return {"name": config.name, "results": results}


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "-" for c in name).strip("-") or "x"


def plot_results(results: dict[str, Any], out_dir: Path, headline: Headline | None = None) -> list[Path]:
    """The charts of `plots/`: one per env family and subset that says something (`says_something`:
    not when every agent but the expert won nothing), a bar per agent and split with its 95% interval;
    and `headline.png`, the headline's env and split across the full width. Charts of an earlier write
    that this one does not draw are removed."""
    from agentgym_opsd.app.charts import success_chart_png

    out_dir.mkdir(parents=True, exist_ok=True)
    charts: dict[str, bytes] = {}
    for (family, subset), rows in chart_groups(results).items():
        if says_something(rows):
            charts[f"{_safe(family)}-{_safe(subset)}.png"] = success_chart_png(rows, title=f"{family}: {subset}")
    if headline is not None:
        rows = [{"agent": r["agent"], "split": r["split"], **result_row(r)} for r in results["results"]
                if (r["env_id"], r["split"]) == (headline.id, headline.split)]
        if rows:
            charts[HEADLINE_CHART] = success_chart_png(rows, title=headline_title(headline), wide=True, zoom=True)
    written = []
    for name, png in charts.items():
        atomic_write_bytes(out_dir / name, png)
        written.append(out_dir / name)
    for stale in out_dir.glob("*.png"):
        if stale.name not in charts:
            stale.unlink()
    return written


HEADLINE_CHART = "headline.png"


def headline_title(headline: Headline) -> str:
    """The headline's title: its label, env id and split."""
    return f"{headline.label}: {headline.id} ({headline.split})"


def eval_command(config: BenchConfig, spec: EnvSpec, agent: AgentSpec, episodes: int, *, seed: int = 0,
                 out: str | None = None) -> str:  # fmt: skip
    """The `agentgym-opsd eval` command that plays the episodes run seed `seed` of the bench played
    with `agent` on `spec` (`episodes` of them): the same env keywords (`env_factory`), the same tasks
    (eval's seeds seed x episodes + i are the bench's tasks (i + seed x episodes) mod n) and the
    same context. A shell line (arguments quoted)."""
    import shlex

    from agentgym_opsd.usage import format_option

    first = seed * episodes
    args = ["agentgym-opsd", "eval", spec.id, "--agent", agent.agent, "--episodes", str(episodes), "--seed", str(first)]
    for key, value in env_factory(spec).kwargs.items():
        args += ["--option", format_option(key, value)]
    if config.context != "full":
        args += ["--context", config.context]
    args += ["--out", out or f"runs/{_safe(config.name)}-eval/{_safe(agent.name)}"]
    return shlex.join(args)


def write_results(
    run_dir: str | Path, config: BenchConfig, episodes_by_key: dict[str, Episode] | None = None, *, report: bool = True
) -> dict[str, Any]:
    """Write results.json, results.md, tables/, plots/ (and report.html) from the run's episodes."""
    run_dir = Path(run_dir)
    if episodes_by_key is None:
        episodes_by_key = _load_done(run_dir / "episodes.jsonl")
    results = summarize_bench(config, episodes_by_key)
    atomic_write_json(run_dir / "results.json", results)
    headline = None if config.headline is None else (config.headline.id, config.headline.split, config.headline.label)
    tables = markdown_tables(results, headline)
    for family, text in tables.items():
        atomic_write_text(run_dir / "tables" / f"{_safe(family)}.md", text)
    atomic_write_text(run_dir / "results.md", f"# {config.name}\n\n" + "\n".join(tables.values()) + "\n" + COUNTING_NOTE + "\n")
    plot_results(results, run_dir / "plots", config.headline)
    if report:
        from agentgym_opsd.app.report import write_report

        write_report(run_dir)
    return results
