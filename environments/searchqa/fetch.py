"""`agentgym-opsd searchqa-data`: fetch the public question sets and the wiki-18 corpus, when the network allows.

    agentgym-opsd searchqa-data list
    agentgym-opsd searchqa-data fetch nq --split test            # FlashRAG's NQ test set
    agentgym-opsd searchqa-data fetch hotpotqa --split dev
    agentgym-opsd searchqa-data fetch wiki-18 --index            # 21M passages (~5 GB gzip), then a BM25 index

Files land under `data_home()/searchqa/` ($AGENTGYM_OPSD_CACHE, default ~/.cache/agentgym-opsd), where the
Search-QA envs look for them by default: `<dataset>/<split>.jsonl`, `corpora/wiki-18.jsonl`,
`indexes/wiki-18/`. Sources: the FlashRAG datasets (RUC-NLPIR/FlashRAG_datasets, `<dataset>/<split>.jsonl`)
and Search-R1's wiki-18 corpus (PeterJinGo/wiki-18-corpus, `wiki-18.jsonl.gz`), both on the Hugging Face
hub. `--base-url` points at a mirror instead: an http(s) URL or a local folder with the same layout.

Each download streams into a temporary file beside its target, is checked (every question parsed, the
corpus's first records read), then renamed into place: a failed or interrupted fetch leaves nothing
half-written. The network is never used at import or by the envs themselves.
"""

from __future__ import annotations

import argparse
import gzip
import itertools
import json
import os
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from agentgym_opsd.usage import UsageError
from environments.searchqa.data import data_home, default_data_file, load_questions
from retrieval_index.corpus import normalize_record
from retrieval_index.lucene import build_index

__all__ = ["FLASHRAG_BASE_URL", "WIKI18_URL", "QUESTION_SETS", "fetch_questions", "fetch_corpus", "data_arguments"]

FLASHRAG_BASE_URL = "https://huggingface.co/datasets/RUC-NLPIR/FlashRAG_datasets/resolve/main"
WIKI18_URL = "https://huggingface.co/datasets/PeterJinGo/wiki-18-corpus/resolve/main/wiki-18.jsonl.gz"
# FlashRAG question sets Search-R1 evaluates on -> their splits (the first one is the default)
QUESTION_SETS: dict[str, tuple[str, ...]] = {
    "nq": ("test", "dev", "train"),
    "triviaqa": ("test", "dev", "train"),
    "hotpotqa": ("dev", "train"),
    "popqa": ("test",),
    "2wikimultihopqa": ("dev", "train"),
    "musique": ("dev", "train"),
    "bamboogle": ("test",),
}
CORPORA = {"wiki-18": WIKI18_URL}


class FetchError(RuntimeError):
    """A download failed; the message says what to do instead."""


def _as_url(base: str) -> str:
    """An http(s)/file URL; a local folder becomes a file:// URL."""
    if "://" in base:
        return base.rstrip("/")
    return Path(base).resolve().as_uri()


def corpus_path(name: str = "wiki-18") -> Path:
    return data_home() / "searchqa" / "corpora" / f"{name}.jsonl"


def index_path(name: str = "wiki-18") -> Path:
    return data_home() / "searchqa" / "indexes" / name


def _download(url: str, target: Path, *, progress: bool, gunzip: bool) -> Path:
    """Stream `url` into a temporary file beside `target` (decompressing gzip); return the temp path."""
    from tqdm.auto import tqdm

    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.parent / f".{target.name}.part-{os.getpid()}"
    try:
        response = urllib.request.urlopen(url, timeout=60)  # noqa: S310 (http(s) or file URLs chosen by the user)
    except (urllib.error.URLError, OSError, ValueError) as e:
        reason = getattr(e, "reason", e)
        raise FetchError(
            f"could not download {url} ({reason}); check the network, or pass --base-url a mirror (a URL or a "
            f"local folder with the same layout), or put the file at {target} yourself"
        ) from None
    total = response.headers.get("Content-Length")
    try:
        with response, open(tmp, "wb") as out:
            bar = tqdm(total=int(total) if total and total.isdigit() else None, unit="B", unit_scale=True,
                       desc=f"fetching {url.rsplit('/', 1)[-1]}", disable=not progress)  # fmt: skip
            source: Any = response
            if gunzip:

                class _Counting:
                    def read(self, n: int = -1) -> bytes:
                        chunk = response.read(n)
                        bar.update(len(chunk))
                        return chunk

                source = gzip.GzipFile(fileobj=_Counting())  # type: ignore[arg-type]
            while True:
                chunk = source.read(1 << 20)
                if not chunk:
                    break
                out.write(chunk)
                if not gunzip:
                    bar.update(len(chunk))
            bar.close()
            out.flush()
            os.fsync(out.fileno())
    except (OSError, EOFError, gzip.BadGzipFile) as e:
        tmp.unlink(missing_ok=True)
        raise FetchError(f"download of {url} failed midway ({type(e).__name__}: {e}); run the command again") from None
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return tmp


def fetch_questions(
    name: str, split: str | None = None, *, base_url: str = FLASHRAG_BASE_URL, progress: bool = True,
    force: bool = False
) -> Path:
    """Download a FlashRAG question set to `default_data_file(name, split)`; return its path."""
    if name not in QUESTION_SETS:
        raise ValueError(f"unknown question set {name!r}; choose from {', '.join(QUESTION_SETS)}")
    split = split or QUESTION_SETS[name][0]
    if split not in QUESTION_SETS[name]:
        raise ValueError(f"{name} has no split {split!r}; it has {', '.join(QUESTION_SETS[name])}")
    target = default_data_file(name, split)
    if target.is_file() and not force:
        return target
    tmp = _download(f"{_as_url(base_url)}/{name}/{split}.jsonl", target, progress=progress, gunzip=False)
    try:
        load_questions(tmp, dataset=name)  # every record must parse (DataFileError names the line)
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)
    return target


def fetch_corpus(
    name: str = "wiki-18",
    *,
    url: str | None = None,
    build: bool = False,
    threads: int = 2,
    progress: bool = True,
    force: bool = False,
) -> Path:
    """Download a passage corpus (`wiki-18`) to `corpus_path(name)`; with `build`, index it at `index_path(name)`."""
    if name not in CORPORA and url is None:
        raise ValueError(f"unknown corpus {name!r}; choose from {', '.join(CORPORA)} or pass --url")
    url = _as_url(url) if url else CORPORA[name]
    target = corpus_path(name)
    if not target.is_file() or force:
        tmp = _download(url, target, progress=progress, gunzip=url.endswith(".gz"))
        try:
            with open(tmp, "rb") as f:
                for number, line in enumerate(itertools.islice(f, 1000), start=1):
                    if line.strip():
                        try:
                            normalize_record(json.loads(line), f"{url}:{number}")
                        except json.JSONDecodeError as e:
                            raise FetchError(f"{url}:{number}: not a JSON-lines corpus ({e})") from None
            os.replace(tmp, target)
        finally:
            tmp.unlink(missing_ok=True)
    if build:
        build_index(target, index_path(name), threads=threads, progress=progress, overwrite=True)
    return target


# ------------------------------------------------------------------------------------------------
# CLI


def _cmd_list(args: argparse.Namespace) -> int:
    print(f"data folder: {data_home() / 'searchqa'}")
    for name, splits in QUESTION_SETS.items():
        status = ", ".join(f"{s} ({'here' if default_data_file(name, s).is_file() else 'not fetched'})" for s in splits)
        print(f"  {name:<16} {status}")
    for name in CORPORA:
        corpus = "here" if corpus_path(name).is_file() else "not fetched"
        index = "built" if (index_path(name) / "agentgym_index.json").is_file() else "not built"
        print(f"  {name:<16} corpus {corpus}, index {index}")
    return 0


def _cmd_fetch(args: argparse.Namespace) -> int:
    try:
        if args.name in CORPORA:
            path = fetch_corpus(args.name, url=args.url, build=args.index, threads=args.threads,
                                progress=not args.quiet, force=args.force)  # fmt: skip
            print(f"{args.name}: {path}")
            if args.index:
                print(f"index: {index_path(args.name)}; serve it with "
                      f"`agentgym-opsd serve-retrieval --index {index_path(args.name)} --port 8000`")  # fmt: skip
            return 0
        splits = args.split or [QUESTION_SETS.get(args.name, ("test",))[0]]
        for split in splits:
            base = args.base_url or FLASHRAG_BASE_URL
            path = fetch_questions(args.name, split, base_url=base, progress=not args.quiet, force=args.force)
            print(f"{args.name} {split}: {len(load_questions(path, dataset=args.name))} questions at {path}")
    except FetchError as e:
        raise UsageError(str(e)) from None
    return 0


def data_arguments(p: argparse.ArgumentParser) -> None:
    """The subcommands and arguments of `agentgym-opsd searchqa-data` (on the parser the CLI made for it)."""
    sub = p.add_subparsers(dest="data_command", metavar="SUBCOMMAND", parser_class=type(p))
    sub.required = True
    ls = sub.add_parser("list", help="the sets and corpora, and which are here")
    ls.set_defaults(func=_cmd_list)
    f = sub.add_parser("fetch", help="download a question set (FlashRAG) or a corpus (wiki-18)")
    f.add_argument("name", help=f"one of: {', '.join([*QUESTION_SETS, *CORPORA])}")
    f.add_argument("--split", action="append", help="split(s) of a question set (repeatable; default: its first)")
    f.add_argument("--base-url", default=None,
                   help=f"mirror of the FlashRAG datasets (URL or folder; default {FLASHRAG_BASE_URL})")
    f.add_argument("--url", default=None, help=f"the corpus file (URL or path; default {WIKI18_URL})")
    f.add_argument("--index", action="store_true", help="also build the corpus's BM25 index")
    f.add_argument("--threads", type=int, default=2, help="indexing threads")
    f.add_argument("--force", action="store_true", help="download again even if the file is here")
    f.add_argument("--quiet", action="store_true", help="no progress bars")
    f.set_defaults(func=_cmd_fetch)
