"""`agentgym-opsd`: the command line.

`COMMANDS` is the command table: for each command, the line `agentgym-opsd --help` shows and the
function that adds the command's arguments to its parser, named `module:function` as an entry point
is. `main` imports the module of the command being run and no other, so `agentgym-opsd --help` and
`list` start without torch, and each command's module imports what it needs at its top. That
function sets `func` with `parser.set_defaults`: the function that runs the command and returns its
exit status; or the table names it too (`run`), when its module is heavier than the arguments' (the
demo and the trainer load torch; their `--help` does not). A user's mistake is a `UsageError` (or
another of `USER_ERRORS`), printed as one line with exit status 2.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

import gymnasium as gym

from agentgym_opsd.agents import AgentError
from agentgym_opsd.contract import EnvUnavailable
from agentgym_opsd.io import DataFileError
from agentgym_opsd.registry import UnknownEnvError
from agentgym_opsd.usage import UsageError

__all__ = ["COMMANDS", "Command", "USER_ERRORS", "build_parser", "main"]


@dataclass(frozen=True)
class Command:
    """One command: what `--help` says of it; `module:function`, the function that adds its arguments
    (and `func`, unless `run` is given) to the parser the CLI made for it; and `module:function`, the
    function that runs it, imported only when it runs (None: the `func` its arguments set)."""

    summary: str
    arguments: str
    run: str | None = None


COMMANDS: dict[str, Command] = {
    "list": Command("list the registered envs, their subsets, splits and sizes",
                    "agentgym_app.env_commands:list_arguments"),
    "play": Command("play an env in the terminal, seeing exactly what an agent sees (a bare command is sent in the "
                    "env's action tag)", "agentgym_app.env_commands:play_arguments"),
    "eval": Command("run an agent on an env and write episodes.jsonl and summary.json",
                    "agentgym_app.env_commands:eval_arguments"),
    "index": Command("build a Lucene BM25 index of a passage corpus (for serve-retrieval)",
                     "retrieval_index.cli:index_arguments"),
    "serve-retrieval": Command("serve a BM25 index over HTTP (POST /retrieve, Search-R1 compatible; GET /health)",
                               "retrieval_index.cli:serve_arguments"),
    "searchqa-data": Command("fetch the public Search-QA question sets and the wiki-18 corpus",
                             "environments.searchqa.fetch:data_arguments"),
    "train-openrlhf": Command("train on GPUs with OpenRLHF 0.11.2 (Ray + vLLM + DeepSpeed) and per-turn credit",
                              "trainer.openrlhf.cli:train_arguments"),
    "openrlhf-prompts": Command("write the prompt dataset OpenRLHF trains on (one row per task seed)",
                                "trainer.openrlhf.cli:prompts_arguments"),
    "bench": Command("run agents x envs x splits x seeds from a TOML/YAML config; resumable; tables, charts, HTML "
                     "report", "agentgym_app.bench_commands:bench_arguments"),
    "report": Command("rebuild the HTML report (and a bench's tables and charts) of a run folder",
                      "agentgym_app.bench_commands:report_arguments"),
    "serve-policy": Command("serve a local transformers model as an OpenAI-compatible /v1/chat/completions endpoint",
                            "agentgym_app.serve_policy:serve_policy_arguments"),
    "demo": Command("the main job on the embedded defaults: benchmark, short training, one HTML report",
                    "agentgym_app.bench_commands:demo_arguments", run="agentgym_app.demo:run_from_args"),
    "train": Command("train a policy with per-turn credit (GRPO, GiGPO, StepOPSD, AgentOPSD) on this machine",
                     "trainer.train_cli:train_arguments", run="trainer.local:run_from_args"),
}


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{self.prog}: {message} (see `{self.prog} --help`)")


def load(command: str, target: str) -> Callable[..., Any]:
    """The function a `module:function` name of `command` names, its module imported now."""
    module, _, name = target.partition(":")
    try:
        return getattr(importlib.import_module(module), name)
    except ImportError as e:  # a command whose dependencies are missing here
        raise UsageError(f"{command}: unavailable here: {e}") from None


def command_in(argv: Sequence[str]) -> str | None:
    """The command `argv` runs: its first word that is not an option (`agentgym-opsd` itself takes
    none but --help), or None."""
    return next((word for word in argv if not word.startswith("-")), None)


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser of `agentgym-opsd`: every command with its summary, and the arguments of `command`
    (the one being run; its module is imported now, the others' never)."""
    parser = _Parser(prog="agentgym-opsd",
                     description="Multi-turn text environments and per-turn credit for LLM agents.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True
    for name, spec in COMMANDS.items():
        p = sub.add_parser(name, help=spec.summary)
        if name == command:
            load(name, spec.arguments)(p)
    return parser


USER_ERRORS = (UsageError, UnknownEnvError, EnvUnavailable, AgentError, DataFileError, FileNotFoundError, ValueError,
               gym.error.Error)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = None
    try:
        args = build_parser(command_in(argv)).parse_args(argv)
        run = COMMANDS[args.command].run
        return int((load(args.command, run) if run else args.func)(args) or 0)
    except USER_ERRORS as e:
        msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        prefix = "" if msg.startswith("agentgym-opsd") else "agentgym-opsd: error: "
        print(f"{prefix}{msg}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        # A command that can pick up where it stopped says how (`set_defaults(on_interrupt=...)`).
        hint = getattr(args, "on_interrupt", None)
        print(f"agentgym-opsd: interrupted{'; ' + hint if hint else ''}", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
