"""`agentgym-opsd index build|info` and `agentgym-opsd serve-retrieval` (named in the CLI's command table).

Java, Flask and waitress load when a command runs.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from agentgym_opsd.usage import UsageError
from retrieval_index.lucene import BM25Searcher, build_index, read_index_info
from retrieval_index.server import add_server_arguments, run_from_args

__all__ = ["index_arguments", "serve_arguments"]


def _cmd_index_build(args: argparse.Namespace) -> int:
    if args.threads < 1:
        raise UsageError("--threads must be >= 1")
    if not Path(args.corpus).is_file():
        raise UsageError(f"{args.corpus}: no such corpus file (JSON lines with id and contents, or id, title and text)")
    try:
        info = build_index(args.corpus, args.out_dir, threads=args.threads, progress=not args.quiet,
                           overwrite=args.overwrite)
    except FileExistsError as e:
        raise UsageError(str(e)) from None
    print(
        f"indexed {info.num_docs} passages in {info.seconds:.1f} s into {info.index_dir} "
        f"({info.size_bytes / 2**20:.1f} MiB); serve it with "
        f"`agentgym-opsd serve-retrieval --index {info.index_dir} --port 8000`"
    )
    return 0


def _cmd_index_info(args: argparse.Namespace) -> int:
    info = read_index_info(args.index_dir) or {}
    with BM25Searcher(args.index_dir) as searcher:
        info["num_docs"] = searcher.num_docs
    print(json.dumps(info, indent=2))
    return 0


def index_arguments(p: argparse.ArgumentParser) -> None:
    """The subcommands and arguments of `agentgym-opsd index` (on the parser the CLI made for it)."""
    sub = p.add_subparsers(dest="index_command", metavar="SUBCOMMAND", parser_class=type(p))
    sub.required = True
    b = sub.add_parser("build", help="CORPUS.jsonl -> OUT_DIR (a Lucene index with the passages stored)")
    b.add_argument("corpus", help='JSON lines: {"id", "contents": "\\"Title\\"\\ntext"} or {"id", "title", "text"}')
    b.add_argument("out_dir", help="the index folder to create")
    b.add_argument("--threads", type=int, default=2, help="indexing threads (default %(default)s)")
    b.add_argument("--overwrite", action="store_true", help="replace an existing index at OUT_DIR")
    b.add_argument("--quiet", action="store_true", help="no progress bar")
    b.set_defaults(func=_cmd_index_build)
    i = sub.add_parser("info", help="what an index holds")
    i.add_argument("index_dir")
    i.set_defaults(func=_cmd_index_info)


def _cmd_serve(args: argparse.Namespace) -> int:
    if not Path(args.index).is_dir():
        raise UsageError(
            f"--index {args.index}: no index folder there; build one with `agentgym-opsd index build CORPUS.jsonl "
            f"{args.index}`"
        )
    try:
        return run_from_args(args)
    except OSError as e:  # the port is taken, ...
        raise UsageError(f"serve-retrieval: {e}") from None


def serve_arguments(p: argparse.ArgumentParser) -> None:
    """The arguments of `agentgym-opsd serve-retrieval` (on the parser the CLI made for it)."""
    p.description = "Serve a Lucene BM25 index over HTTP with waitress. Binds 127.0.0.1 unless --host says otherwise."
    add_server_arguments(p)
    p.set_defaults(func=_cmd_serve)
