"""CLI commands `bench`, `report`, `serve-policy` and `demo` (registered in `agentgym_app.cli.COMMANDS`).

This module stays light: each command imports what it needs when it runs.
"""

from __future__ import annotations

import argparse
from pathlib import Path

__all__ = ["add_bench", "add_report", "add_serve_policy", "add_demo"]


def _cli_error(message: str) -> Exception:
    from agentgym_opsd.usage import UsageError

    return UsageError(message)


# ---------------------------------------------------------------------------------------------
# bench


def _cmd_bench(args: argparse.Namespace) -> int:
    import dataclasses

    from agentgym_app.bench import run_bench
    from agentgym_app.bench_config import ConfigError, load_config

    try:
        config = load_config(args.config, data_root=args.data_root)
    except ConfigError as e:
        raise _cli_error(str(e)) from None
    if args.workers is not None:
        if args.workers < 0:
            raise _cli_error("--workers must be >= 0")
        config = dataclasses.replace(config, workers=args.workers)
    out = Path(args.out) if args.out else Path("runs") / Path(args.config).stem
    from agentgym_app.cli_agents import build_agent

    if args.cpu_threads is not None and args.cpu_threads < 0:
        raise _cli_error(f"--cpu-threads must be >= 0, got {args.cpu_threads}")

    def make_agent(name: str, *, seed: int = 0):
        return build_agent(name, seed=seed, cpu_threads=args.cpu_threads)

    try:
        run_bench(config, out, restart=args.restart, progress=not args.quiet, report=not args.no_report,
                  make_agent=make_agent)
    except ConfigError as e:
        message = str(e)
        raise _cli_error(message if message.startswith(str(out)) else f"{args.config}: {message}") from None
    print((out / "results.md").read_text(encoding="utf-8"))
    print(f"episodes: {out / 'episodes.jsonl'}")
    print(f"results:  {out / 'results.json'} (tables in {out / 'tables'}, charts in {out / 'plots'})")
    if not args.no_report:
        print(f"report:   {(out / 'report.html').resolve()}")
    return 0


def add_bench(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "bench",
        help="run agents x envs x splits x seeds from a TOML/YAML config; resumable; tables, charts, HTML report",
        description="Run a benchmark config (see agentgym_app/bench_config.py for the format). Running it "
                    "again on the "
        "same --out resumes: finished episodes are kept.",
    )
    p.add_argument("config", help="a .toml, .yaml or .yml bench config")
    p.add_argument("--out", help="run folder (default runs/<config name>)")
    p.add_argument("--restart", action="store_true", help="discard the folder's episodes and start over")
    p.add_argument("--workers", type=int, help="env worker processes (overrides the config; 0: in-process)")
    p.add_argument("--data-root", help="folder the config's data paths (data_file, catalog, index_dir, ...) are read "
                                       "from and may not leave (default: the config's folder)")
    p.add_argument("--no-report", action="store_true", help="do not write report.html")
    from agentgym_app.cli_agents import CPU_THREADS_HELP

    p.add_argument("--cpu-threads", type=int, metavar="N", help=CPU_THREADS_HELP)
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=_cmd_bench, on_interrupt="run the same command to resume")


# ---------------------------------------------------------------------------------------------
# report


def _cmd_report(args: argparse.Namespace) -> int:
    import json

    from agentgym_app.report import write_report

    run_dir = Path(args.run_dir)
    if not run_dir.is_dir():
        raise _cli_error(f"{run_dir}: no such run folder")
    config_path = run_dir / "config.json"
    if config_path.exists() and (run_dir / "episodes.jsonl").exists():
        # A bench folder: rebuild its results, tables and charts from the episodes first.
        from agentgym_app.bench import write_results
        from agentgym_app.bench_config import BenchConfig

        config = BenchConfig.from_dict(json.loads(config_path.read_text(encoding="utf-8"))["config"])
        write_results(run_dir, config, report=False)
    path = write_report(run_dir, args.out)
    print(f"report: {path.resolve()}")
    return 0


def add_report(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("report", help="rebuild the HTML report (and a bench's tables and charts) of a run folder")
    p.add_argument("run_dir")
    p.add_argument("--out", help="where to write the HTML (default RUN_DIR/report.html)")
    p.set_defaults(func=_cmd_report)


# ---------------------------------------------------------------------------------------------
# serve-policy


def _cmd_serve_policy(args: argparse.Namespace) -> int:
    from agentgym_app.serve_policy import serve

    serve(
        args.model,
        host=args.host,
        port=args.port,
        name=args.name,
        max_new_tokens=args.max_new_tokens,
        threads=args.threads,
        torch_threads=args.torch_threads,
    )
    return 0


def add_serve_policy(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "serve-policy",
        help="serve a local transformers model as an OpenAI-compatible /v1/chat/completions endpoint",
        description="Serve a local transformers causal LM (a folder with config, weights and tokenizer) as an "
        "OpenAI-compatible chat endpoint, for the openai:BASE_URL#MODEL agent.",
    )
    p.add_argument("--model", required=True,
                   help="a local model folder (save_pretrained output) or a named model (smollm2-135m)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, default=8000, help="port (0: any free port; the address is printed)")
    p.add_argument("--name", help="the model name clients use (default: the folder name)")
    p.add_argument("--max-new-tokens", type=int, default=512, help="upper bound on max_tokens per request")
    p.add_argument("--threads", type=int, default=4, help="request threads (generation itself runs one at a time)")
    p.add_argument("--torch-threads", type=int, default=0,
                   help="torch CPU threads (0: torch's default; 1 suits tiny models)")
    p.set_defaults(func=_cmd_serve_policy)


# ---------------------------------------------------------------------------------------------
# demo


def _cmd_demo(args: argparse.Namespace) -> int:
    from agentgym_app.demo import run_demo

    run_demo(Path(args.out), quick=args.quick)
    return 0


def add_demo(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "demo",
        help="the main job on the embedded defaults: benchmark, short training, one HTML report",
    )
    p.add_argument("--out", default="runs/demo", help="run folder (default runs/demo)")
    p.add_argument("--quick", action="store_true", help="a smaller run (for a smoke test)")
    p.set_defaults(func=_cmd_demo, on_interrupt="run the same command to resume (finished training runs are kept)")
