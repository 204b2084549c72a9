"""The contract's commands: `agentgym-opsd list`, `play` and `eval` (named in the CLI's command table)."""

from __future__ import annotations

import argparse
import inspect
import json
import os
import shutil
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

from agentgym_app.cli_agents import CPU_THREADS_HELP, build_agent, check_agent
from agentgym_opsd.episode import append_episodes, load_episodes
from agentgym_opsd.io import atomic_write_json
from agentgym_opsd.parsing import parse_action
from agentgym_opsd.registry import env_description, env_options, plugin_errors, registered_envs, task_count
from agentgym_opsd.rollout import EpisodeRequest, run_episodes
from agentgym_opsd.summary import format_table, summarize
from agentgym_opsd.usage import UsageError, check_env_usage, make_env_factory, parse_options

__all__ = ["as_played_turn", "eval_arguments", "list_arguments", "output_width", "play_arguments"]


# ---------------------------------------------------------------------------------------------
# list


def output_width() -> int:
    """Columns to wrap text to: `$COLUMNS` when set, else the terminal's width, else 100 (output to a
    file or a pipe); at least 60."""
    columns = os.environ.get("COLUMNS", "").strip()
    if columns.isdigit() and int(columns) > 0:
        width = int(columns)
    elif sys.stdout.isatty():
        width = shutil.get_terminal_size((100, 24)).columns
    else:
        width = 100
    return max(60, width)


def _pack(items: list[str], width: int, separator: str = ", ") -> list[str]:
    """`items` joined by `separator` into lines of at most `width` characters, breaking between items
    (an item longer than a line is wrapped on its own)."""
    lines: list[str] = []
    for number, item in enumerate(items):
        piece = item + (separator.rstrip() if number < len(items) - 1 else "")
        if lines and len(lines[-1]) + 1 + len(piece) <= width:
            lines[-1] += " " + piece
        else:
            lines += textwrap.wrap(piece, width, break_on_hyphens=False) or [""]
    return lines


def _wrap(text: str, width: int, indent: str) -> list[str]:
    return textwrap.wrap(text, width, initial_indent=indent, subsequent_indent=indent, break_on_hyphens=False)


def _cmd_list_options(env_id: str) -> int:
    options = env_options(env_id)
    if options is None:
        print(f"{env_id}: its constructor does not list its options (it takes **kwargs); see its documentation")
        return 0
    width = output_width()
    lines = _wrap(f"{env_id}: options for --option KEY=VALUE (eval, play) and `options = {{...}}` (bench); each "
                  "with its default and what it is", width, "")
    for o in options:
        if o.default is inspect.Parameter.empty:
            default = "(required)"
        else:
            default = json.dumps(o.default, default=str)
            if o.default is None and o.class_default is not None:
                default += f" (the env's own: {json.dumps(o.class_default)})"
        lines.append("")
        lines += _wrap(f"{o.name} = {default}", width, "  ")
        lines += _wrap(o.description or "(not documented)", width, "      ")
    print("\n".join(lines))
    return 0


def _cmd_list(args: argparse.Namespace) -> int:
    if args.options:
        return _cmd_list_options(args.options)
    entries = registered_envs()
    if not entries:
        print("no envs registered")
    width = output_width()
    rows = []
    for e in entries:
        parts = []
        for split in e.splits:
            if not args.sizes:
                parts.append(split)
                continue
            try:
                size = str(task_count(e.id, split))
            except Exception as err:  # data missing: say so, keep listing
                size = f"n/a: {str(err).splitlines()[0][:60] if str(err).strip() else type(err).__name__}"
            parts.append(f"{split} ({size})")
        rows.append((e.id, e.family, e.subset, parts, env_description(e.id)))
    head = ("id", "family", "subset", "splits (tasks)" if args.sizes else "splits")
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(3)]
    left = sum(widths) + 2 * len(widths)
    lines = ["  ".join(c.ljust(w) for c, w in zip(head[:3], widths, strict=True)) + "  " + head[3]]
    for env_id, family, subset, parts, description in rows:
        first = "  ".join(c.ljust(w) for c, w in zip((env_id, family, subset), widths, strict=True)) + "  "
        if width - left >= 24:  # the splits in their column
            splits = _pack(parts, width - left)
            lines.append(first + splits[0])
            lines += [" " * left + more for more in splits[1:]]
        else:  # a narrow terminal: under the row
            lines.append(first.rstrip())
            lines += [" " * 4 + more for more in _pack(parts, width - 4)]
        lines += _wrap(description, width, " " * 4)
    print("\n".join(lines))
    for key, err in plugin_errors().items():
        print(f"plug-in failed to load: {key}: {err}", file=sys.stderr)
    return 0


def list_arguments(p: argparse.ArgumentParser) -> None:
    """The arguments of `agentgym-opsd list` (on the parser the CLI made for it)."""
    p.add_argument("--no-sizes", dest="sizes", action="store_false", help="do not load data to count tasks")
    p.add_argument("--options", metavar="ID", help="list the options (keywords) of one env id, with defaults")
    p.set_defaults(func=_cmd_list)


# ---------------------------------------------------------------------------------------------
# play


def as_played_turn(env: Any, turn: str) -> str:
    """What `play` sends for a line a person typed: a turn with tags as it is; a bare command (one line,
    no tag) in the env's own action format (`guess 10` -> `<action>guess 10</action>`), the same for
    every env whatever its `allow_bare_action`."""
    parsed = parse_action(turn, env.action_tags, allow_bare=True)
    return env.format_action(parsed.content) if parsed.kind == "bare" else turn


def _cmd_play(args: argparse.Namespace) -> int:
    options = parse_options(args.option)
    env = make_env_factory(args.env_id, options)()
    raw = env.unwrapped
    observation, info = env.reset(seed=args.seed)
    print("=" * 30 + " system " + "=" * 30)
    print(raw.instructions)
    print("=" * 30 + " play " + "=" * 32)
    print(f"Write a turn as an agent does, or just a command: play sends `look` as {raw.format_action('look')}. "
          ":q quits.")
    print("=" * 30 + " user " + "=" * 32)
    print(observation)
    total = 0.0
    while True:
        try:
            turn = input("\nyour turn> ")
        except EOFError:
            print()
            break
        if turn.strip() in (":q", ":quit"):
            break
        sent = as_played_turn(raw, turn)
        if sent != turn:
            print(f"(sent as {sent})")
        observation, reward, terminated, truncated, info = env.step(sent)
        total += float(reward)
        print("=" * 30 + " user " + "=" * 32)
        print(observation)
        if terminated or truncated:
            print(f"\nepisode over ({'terminated' if terminated else 'truncated'}): return {total:g}")
            break
    env.close()
    return 0


def play_arguments(p: argparse.ArgumentParser) -> None:
    """The arguments of `agentgym-opsd play` (on the parser the CLI made for it)."""
    p.add_argument("env_id")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--option", action="append", metavar="KEY=VALUE", help="keyword for gymnasium.make (repeatable)")
    p.set_defaults(func=_cmd_play)


# ---------------------------------------------------------------------------------------------
# eval


def _cmd_eval(args: argparse.Namespace) -> int:
    if args.episodes < 1:
        raise UsageError("--episodes must be >= 1")
    options = parse_options(args.option)
    # Everything that can be checked without work first: a wrong agent must not wait for the env's
    # data (ALFWorld generates its games on first use).
    check_env_usage(args.env_id, options)
    check_agent(args.agent, cpu_threads=args.cpu_threads)
    factory = make_env_factory(args.env_id, options)
    agent = build_agent(args.agent, seed=args.seed, cpu_threads=args.cpu_threads)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "episodes.jsonl"
    done: dict[int, Any] = {}
    if args.resume and path.exists():
        for e in load_episodes(path, skip_torn_lines=True):
            if e.env_id == args.env_id and e.agent == agent.name and e.seed is not None:
                done[e.seed] = e
    elif path.exists():
        path.unlink()
    seeds = [args.seed + i for i in range(args.episodes)]
    requests = [EpisodeRequest(seed=s, options={}) for s in seeds if s not in done]
    if args.resume and path.exists():
        print(f"resuming: {len(seeds) - len(requests)} of {len(seeds)} episodes done", flush=True)
    started = time.perf_counter()
    new = run_episodes(
        factory,
        agent,
        requests,
        num_envs=args.num_envs,
        context=args.context,
        progress=f"{args.agent} on {args.env_id}",
        on_episode=lambda e: append_episodes(path, [e]),
    )
    by_seed = {**done, **{e.seed: e for e in new}}
    episodes = [by_seed[s] for s in seeds if s in by_seed]
    summary = summarize(episodes, env_id=args.env_id, agent=agent.name)
    summary["options"] = options
    summary["seeds"] = [seeds[0], seeds[-1]]
    summary["wall_seconds"] = round(time.perf_counter() - started, 3)
    atomic_write_json(out / "summary.json", summary)
    print(format_table(summary))
    print(f"wrote {path} and {out / 'summary.json'}")
    if episodes and all(e.error for e in episodes):
        raise UsageError(f"every episode failed; the first: {episodes[0].error}")
    return 0


def eval_arguments(p: argparse.ArgumentParser) -> None:
    """The arguments of `agentgym-opsd eval` (on the parser the CLI made for it)."""
    p.add_argument("env_id")
    p.add_argument("--agent", required=True, help="random, expert, hf:PATH or openai:BASE_URL#MODEL")
    p.add_argument("--episodes", type=int, default=10)
    p.add_argument("--seed", type=int, default=0, help="first seed; episode i uses seed+i (the seed picks the task)")
    p.add_argument("--option", action="append", metavar="KEY=VALUE", help="keyword for gymnasium.make (repeatable)")
    p.add_argument("--out", required=True, help="output folder")
    p.add_argument("--num-envs", type=int, default=8, help="episodes played at once")
    p.add_argument("--context", default="full", help="full or window:K")
    p.add_argument("--resume", action="store_true", help="keep finished episodes in OUT and play the rest")
    p.add_argument("--cpu-threads", type=int, metavar="N", help=CPU_THREADS_HELP)
    p.set_defaults(func=_cmd_eval, on_interrupt="run the same command with --resume to keep the finished episodes")
