"""CLI commands `bench` and `report`, and the arguments of `demo` (named in the CLI's command table,
`agentgym_app.cli.COMMANDS`, which runs the demo with `agentgym_app.demo.run_from_args`: the demo's module
loads torch, its `--help` does not)."""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

from agentgym_app.bench import run_bench, write_results
from agentgym_app.bench_config import BenchConfig, ConfigError, load_config
from agentgym_app.cli_agents import CPU_THREADS_HELP, build_agent
from agentgym_app.report import write_report
from agentgym_opsd.usage import UsageError

__all__ = ["bench_arguments", "demo_arguments", "report_arguments"]


# ---------------------------------------------------------------------------------------------
# bench


def _cmd_bench(args: argparse.Namespace) -> int:
    try:
        config = load_config(args.config, data_root=args.data_root)
    except ConfigError as e:
        raise UsageError(str(e)) from None
    if args.workers is not None:
        if args.workers < 0:
            raise UsageError("--workers must be >= 0")
        config = dataclasses.replace(config, workers=args.workers)
    out = Path(args.out) if args.out else Path("runs") / Path(args.config).stem

    if args.cpu_threads is not None and args.cpu_threads < 0:
        raise UsageError(f"--cpu-threads must be >= 0, got {args.cpu_threads}")

    def make_agent(name: str, *, seed: int = 0):
        return build_agent(name, seed=seed, cpu_threads=args.cpu_threads)

    try:
        run_bench(config, out, restart=args.restart, progress=not args.quiet, make_agent=make_agent)
    except ConfigError as e:
        message = str(e)
        raise UsageError(message if message.startswith(str(out)) else f"{args.config}: {message}") from None
    if not args.no_report:
        write_report(out)
    print((out / "results.md").read_text(encoding="utf-8"))
    print(f"episodes: {out / 'episodes.jsonl'}")
    print(f"results:  {out / 'results.json'} (tables in {out / 'tables'}, charts in {out / 'plots'})")
    if not args.no_report:
        print(f"report:   {(out / 'report.html').resolve()}")
    return 0


def bench_arguments(p: argparse.ArgumentParser) -> None:
    """The arguments of `agentgym-opsd bench` (on the parser the CLI made for it)."""
    p.description = ("Run a benchmark config (see agentgym_app/bench_config.py for the format). Running it again on "
                     "the same --out resumes: finished episodes are kept.")
    p.add_argument("config", help="a .toml, .yaml or .yml bench config")
    p.add_argument("--out", help="run folder (default runs/<config name>)")
    p.add_argument("--restart", action="store_true", help="discard the folder's episodes and start over")
    p.add_argument("--workers", type=int, help="env worker processes (overrides the config; 0: in-process)")
    p.add_argument("--data-root", help="folder the config's data paths (data_file, catalog, index_dir, ...) are read "
                                       "from and may not leave (default: the config's folder)")
    p.add_argument("--no-report", action="store_true", help="do not write report.html")
    p.add_argument("--cpu-threads", type=int, metavar="N", help=CPU_THREADS_HELP)
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=_cmd_bench, on_interrupt="run the same command to resume")


# ---------------------------------------------------------------------------------------------
# report


def _cmd_report(args: argparse.Namespace) -> int:
    run_dir = Path(args.run_dir)
    if not run_dir.is_dir():
        raise UsageError(f"{run_dir}: no such run folder")
    config_path = run_dir / "config.json"
    if config_path.exists() and (run_dir / "episodes.jsonl").exists():
        # A bench folder: rebuild its results, tables and charts from the episodes first.
        config = BenchConfig.from_dict(json.loads(config_path.read_text(encoding="utf-8"))["config"])
        write_results(run_dir, config)
    path = write_report(run_dir, args.out)
    print(f"report: {path.resolve()}")
    return 0


def report_arguments(p: argparse.ArgumentParser) -> None:
    """The arguments of `agentgym-opsd report` (on the parser the CLI made for it)."""
    p.add_argument("run_dir")
    p.add_argument("--out", help="where to write the HTML (default RUN_DIR/report.html)")
    p.set_defaults(func=_cmd_report)


# ---------------------------------------------------------------------------------------------
# demo


def demo_arguments(p: argparse.ArgumentParser) -> None:
    """The arguments of `agentgym-opsd demo` (on the parser the CLI made for it)."""
    p.add_argument("--out", default="runs/demo", help="run folder (default runs/demo)")
    p.add_argument("--quick", action="store_true", help="a smaller run (for a smoke test)")
    p.set_defaults(on_interrupt="run the same command to resume (finished training runs are kept)")
