"""`agentgym-opsd bench CONFIG`: agents x envs x splits x seeds x episodes, resumable, with tables,
plots and an HTML report.

The config (TOML or YAML: agents, envs, splits, seeds, episodes, workers, a headline) is read and
checked by `agentgym_app.bench_config`, which documents its format.

Episode i of run seed s, on an env with n tasks and N episodes, plays task (i + s N) mod n (see
`task_index`) with reset seed i + 1_000_000 s, by an agent built with seed s; its key is (agent,
env id, split, i, s). So run seeds play different tasks as long as seeds x N <= n (with
`episodes = "all"` every seed plays every task). The 95% interval counts distinct outcomes: a
task replayed with the same turns (a deterministic agent) is one outcome (`agentgym_opsd.summary`). Every
finished episode is appended to `RUN_DIR/episodes.jsonl` at once; running the same config again on the same folder
skips the keys already there (errored episodes are played again), so a broken run resumes where
it stopped (it prints `resuming: 110 of 240 episodes done`). Then the run folder gets:

- `results.json`: one summary per (agent, env id, split) (success with its 95% Wilson interval,
  mean score, mean turns, invalid-action rate, per subset). It depends only on the episodes: a
  resumed run writes the same file as an unbroken one.
- `results.md` and `tables/<family>.md`: a Markdown table per env family.
- `plots/<family>-<subset>.png`: success per agent with its interval, one chart per subset that
  says something (not when every agent but the expert won nothing: the table has those rows), and
  `plots/headline.png`, the headline's chart, full width.
- `report.html` (the `bench` command writes it after the run, `agentgym_app.report`): everything above plus
  a trajectory viewer.
- `run.json`: timings and versions (what may differ between runs).
"""

from __future__ import annotations

import json
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from agentgym_app.bench_config import AgentSpec, BenchConfig, ConfigError, EnvSpec, Headline
from agentgym_app.charts import success_chart_png
from agentgym_app.cli_agents import check_agent
from agentgym_app.results import COUNTING_NOTE, chart_groups, markdown_tables, result_row, says_something
from agentgym_opsd.agents import AgentError
from agentgym_opsd.agents import make_agent as default_make_agent
from agentgym_opsd.episode import Episode, append_episodes, load_episodes
from agentgym_opsd.io import atomic_write_bytes, atomic_write_json, atomic_write_text
from agentgym_opsd.registry import entry
from agentgym_opsd.rollout import EpisodeRequest, run_episodes
from agentgym_opsd.summary import summarize
from agentgym_opsd.usage import format_option
from agentgym_opsd.workers import EnvFactory

__all__ = [
    "HEADLINE_CHART",
    "RESET_SEED_STRIDE",
    "env_factory",
    "episode_key",
    "eval_command",
    "headline_title",
    "plot_results",
    "run_bench",
    "summarize_bench",
    "task_index",
    "write_results",
]

RESET_SEED_STRIDE = 1_000_000


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
) -> dict[str, Any]:
    """Run (or resume) a bench into `run_dir` and write its results; returns results.json's content.

    Args:
        config: the bench (see `load_config`).
        run_dir: the run folder; an existing one is resumed.
        restart: delete the folder's episodes and start over.
        progress: show a progress bar over all episodes.
        make_agent: builds agents (default `agentgym_opsd.agents.make_agent`).
    """
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
    bar = tqdm(total=len(planned), initial=len(planned) - len(todo), desc=f"bench {config.name}", unit="ep",
               disable=not progress)
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
    results = write_results(run_dir, config, done)
    elapsed = time.time() - started
    run_info = {"wall_seconds": round(elapsed, 3), "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S")}
    atomic_write_json(run_dir / "run.json", run_info)
    return results


def _check_agents(config: BenchConfig) -> None:
    """Every agent's name checked without loading a model (`check_agent`): a wrong one is a
    ConfigError before the envs are built and before the other agents play."""
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

    first = seed * episodes
    args = ["agentgym-opsd", "eval", spec.id, "--agent", agent.agent, "--episodes", str(episodes), "--seed", str(first)]
    for key, value in env_factory(spec).kwargs.items():
        args += ["--option", format_option(key, value)]
    if config.context != "full":
        args += ["--context", config.context]
    args += ["--out", out or f"runs/{_safe(config.name)}-eval/{_safe(agent.name)}"]
    return shlex.join(args)


def write_results(run_dir: str | Path, config: BenchConfig,
                  episodes_by_key: dict[str, Episode] | None = None) -> dict[str, Any]:
    """Write results.json, results.md, tables/ and plots/ from the run's episodes."""
    run_dir = Path(run_dir)
    if episodes_by_key is None:
        episodes_by_key = _load_done(run_dir / "episodes.jsonl")
    results = summarize_bench(config, episodes_by_key)
    atomic_write_json(run_dir / "results.json", results)
    headline = None if config.headline is None else (config.headline.id, config.headline.split, config.headline.label)
    tables = markdown_tables(results, headline)
    for family, text in tables.items():
        atomic_write_text(run_dir / "tables" / f"{_safe(family)}.md", text)
    atomic_write_text(run_dir / "results.md",
                      f"# {config.name}\n\n" + "\n".join(tables.values()) + "\n" + COUNTING_NOTE + "\n")
    plot_results(results, run_dir / "plots", config.headline)
    return results
