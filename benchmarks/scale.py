"""How cost grows with the work: the retrieval index and server, the WebShop catalog, the ALFWorld panel.

Users run Search-R1 on wiki-18 (21,015,324 passages), WebShop on its full catalog (1,181,436 products)
and ALFWorld on its 3,553 training games. This script measures each family at sizes this machine can
hold, fits how every cost grows, and extrapolates to those sizes; each size runs in fresh processes.

Retrieval (sizes: passages): a corpus generated with the statistics of ../shared/data/wiki (passage
  lengths drawn from the real passages' word counts; words drawn from the real passages' word
  distribution, plus a Zipf tail of new words with the Good-Turing share of unseen words, so that the
  vocabulary keeps growing with the corpus as a real one does; titles shared by runs of passages as
  in the wiki-18 sample). Per size: `agentgym-opsd index build` wall time and peak RSS, index size,
  the server's start time and RSS (`agentgym-opsd serve-retrieval`, anonymous and file-backed: the
  mapped index pages count in RSS), and queries/s with p50/p99 request latency at 16 concurrent
  clients x 1 and x 8 queries per request (benchmarks/retrieval_load.py, retrieval_speed.py's load
  driver), with NQ-open dev questions as queries, after a warm-up until the JIT settles.
WebShop (sizes: products): a catalog generated from the real sample's field statistics (titles,
  descriptions, bullets, options, prices, categories, queries; attributes and instructions as in
  items_ins_v2). Per size: benchmarks/webshop_speed.py in a fresh process (catalog load, goals,
  index build, RSS with 1 and 64 envs, reset/search/click latency) and its peak RSS.
ALFWorld (sizes: games): the embedded panel with ALFWorld's training mix at 240 games up to 3,552
  (592 per type share; 3,553 is not a multiple of six). Per size: generation time per game, cache
  size on disk (games and translations), env construction, the first reset of each game in a new
  process, the first reset of a game never translated (cold disk cache), then reset and step time
  over two passes through every game, as a training run cycles through them, with the process's RSS.

    .venv/bin/python -m benchmarks.scale --quick                    # smallest sizes, a few minutes
    nice -n 10 .venv/bin/python -m benchmarks.scale --retrieval 10000 100000 1000000 \\
        --webshop 1000 10000 100000 --alfworld 240 888 3552         # the full run (hours here)
    .venv/bin/python -m benchmarks.scale --report                   # table and plots from results.json

Results go to `--out` (default runs/scale): results.json (every figure, with the load average during
each size; a size already there is skipped unless --again, so a stopped run resumes), scale.md (the
table: measured figures, fitted models and the extrapolation to the users' sizes) and one PNG per
family (cost against size, log-log); scale.md names the command and commit of each size's run, and a
discussion written below its marker is kept when it is rewritten (docs/scale/ is a copy of such an `--out`).
Generated corpora, catalogs, panels and indexes go under `--work`
(default $TMPDIR/agentgym-scale) and are deleted after each size unless --keep.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from agentgym_opsd.io import atomic_write_bytes, atomic_write_json, read_jsonl_numbered
from benchmarks.common import REPO, SHARED_DATA, benchmark_command, git_commit, save_png, write_results_page
from benchmarks.retrieval_load import run_load, warm_up
from environments.alfworld.compiled import compile_game, forget_compiled_games
from environments.alfworld.engine import AlfredEngine
from environments.alfworld.env import AlfWorldEnv
from environments.alfworld.panel import PanelSpec, ensure_panel
from retrieval_index.corpus import split_title
from retrieval_index.process import RetrievalServer

WIKI = SHARED_DATA / "wiki"
NQ = SHARED_DATA / "qa" / "nq_open_dev_part1.jsonl"
WEBSHOP = SHARED_DATA / "webshop"

TARGETS = {"retrieval": 21_015_324, "webshop": 1_181_436, "alfworld": 3_553}
TARGET_NAMES = {"retrieval": "wiki-18", "webshop": "full WebShop", "alfworld": "ALFWorld train"}
QUICK = {"retrieval": [10_000], "webshop": [1_000], "alfworld": [240]}
UNITS = {"retrieval": "passages", "webshop": "products", "alfworld": "games"}


# ------------------------------------------------------------------------------------------------
# Process figures (Linux /proc) and the machine's load.


def proc_status_mib(pid: int) -> dict[str, float]:
    """VmRSS, VmHWM (peak RSS), RssAnon and RssFile of a process, in MiB (empty if it is gone)."""
    out = {}
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            key = line.split(":")[0]
            if key in ("VmRSS", "VmHWM", "RssAnon", "RssFile"):
                out[key] = round(int(line.split()[1]) / 1024, 1)
    except OSError:
        pass
    return out


def run_measured(cmd: list[str], *, env: dict[str, str] | None = None,
                 quiet: bool = True) -> tuple[float, dict[str, float]]:
    """Run `cmd` to completion; (wall seconds, memory figures in MiB, sampled from /proc every 0.2 s):
    `peak_rss` (the child's VmHWM), and the peaks of `anon` (heap: what the process needs) and `file`
    (mapped files, e.g. Lucene's index segments: page cache the kernel can reclaim).

    Not wait4's ru_maxrss: Linux carries the parent's peak into a child across exec (this script's
    own memory would show as the child's)."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL if quiet else None, stderr=subprocess.PIPE if quiet
                            else None, cwd=REPO)  # fmt: skip
    peaks = {"VmHWM": 0.0, "RssAnon": 0.0, "RssFile": 0.0}
    done = threading.Event()

    def sample() -> None:
        while True:
            for key, value in proc_status_mib(proc.pid).items():
                if key in peaks:
                    peaks[key] = max(peaks[key], value)
            if done.wait(0.2):
                return

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    err = proc.stderr.read() if quiet else b""  # type: ignore[union-attr]
    proc.wait()
    done.set()
    sampler.join()
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(
            f"{' '.join(cmd[:6])} ... failed ({proc.returncode}):\n{err.decode(errors='replace')[-3000:]}")
    return wall, {"peak_rss": peaks["VmHWM"], "peak_anon": peaks["RssAnon"], "peak_file": peaks["RssFile"]}


def dir_mib(path: Path) -> float:
    return round(sum(p.stat().st_size for p in Path(path).rglob("*") if p.is_file()) / 2**20, 2)


class LoadSampler:
    """The 1-minute load average, sampled every few seconds while a size is measured."""

    def __init__(self, every: float = 5.0) -> None:
        self.samples: list[float] = [os.getloadavg()[0]]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(every,), daemon=True)
        self._thread.start()

    def _run(self, every: float) -> None:
        while not self._stop.wait(every):
            self.samples.append(os.getloadavg()[0])

    def stop(self) -> dict[str, float]:
        self._stop.set()
        self._thread.join()
        self.samples.append(os.getloadavg()[0])
        return {"load_mean": round(float(np.mean(self.samples)), 2), "load_max": round(max(self.samples), 2)}


# ------------------------------------------------------------------------------------------------
# Word models: an observed distribution with a Zipf tail of new words.


_CONSONANTS = "bcdfghklmnprstvz"
_VOWELS = "aeiou"
_SYLLABLES = [c + v for c in _CONSONANTS for v in _VOWELS] + [c + v + "n" for c in "bdklmrst" for v in _VOWELS]


def tail_word(rank: int) -> str:
    """A made-up word for a rank of the tail (distinct ranks give distinct words): syllables in base
    len(_SYLLABLES), at least two, so the words look like the hapaxes (names) of the real text."""
    base = len(_SYLLABLES)
    parts = []
    r = int(rank)
    while True:
        r, digit = divmod(r, base)
        parts.append(_SYLLABLES[digit])
        if r == 0 and len(parts) >= 2:
            break
    return "".join(parts)


class WordModel:
    """Draws words as a text of its kind does: from the observed counts, or with the Good-Turing
    probability of an unseen word (hapaxes / tokens) from a Zipf tail of new words beyond the observed
    vocabulary, with the exponent of the observed rank-frequency curve.

    Args:
        counts: observed word counts.
        tail_ranks: how far the tail reaches (ranks beyond the observed vocabulary).
    """

    def __init__(self, counts: Counter, tail_ranks: int = 100_000_000) -> None:
        words = sorted(counts, key=lambda w: (-counts[w], w))
        freq = np.array([counts[w] for w in words], dtype=np.float64)
        self.words = words
        self.tokens = int(freq.sum())
        self.vocabulary = len(words)
        hapaxes = [w for w in words if counts[w] == 1]
        self.p_new = len(hapaxes) / self.tokens
        self.cumulative = np.cumsum(freq) / freq.sum()
        # Zipf exponent of the observed curve, over the ranks seen more than once (the hapax plateau
        # is an artefact of the sample's size) and past the first 10 (function words bend the head).
        seen_twice = int((freq >= 2).sum())
        ranks = np.arange(1, len(freq) + 1)
        lo, hi = min(10, max(seen_twice - 2, 0)), max(seen_twice, 3)
        slope = np.polyfit(np.log(ranks[lo:hi]), np.log(freq[lo:hi]), 1)[0] if hi - lo >= 3 else -1.1
        self.zipf_s = float(min(max(-slope, 1.01), 3.0))
        self.tail_lo = float(self.vocabulary + 1)
        self.tail_hi = float(self.vocabulary + tail_ranks)
        self.capitalized = float(np.mean([w[:1].isupper() for w in hapaxes])) if hapaxes else 0.0
        trailing = Counter(w[-1] for w in hapaxes if w and not w[-1].isalnum())
        self.punctuation = [(ch, n / max(len(hapaxes), 1)) for ch, n in trailing.most_common(4)]
        self._tail_cache: dict[int, str] = {}

    def sample_ids(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """`n` word ids: 0..V-1 for observed words, V + rank for tail words."""
        out = np.searchsorted(self.cumulative, rng.random(n), side="right")
        np.minimum(out, self.vocabulary - 1, out=out)
        new = rng.random(n) < self.p_new
        k = int(new.sum())
        if k:
            a, b, s = self.tail_lo, self.tail_hi, self.zipf_s
            u = rng.random(k)
            ranks = (a ** (1 - s) + u * (b ** (1 - s) - a ** (1 - s))) ** (1 / (1 - s))  # inverse CDF of r^-s on [a, b]
            out[new] = self.vocabulary + np.floor(ranks).astype(np.int64)
        return out

    def word(self, word_id: int, rng: np.random.Generator | None = None) -> str:
        if word_id < self.vocabulary:
            return self.words[word_id]
        text = self._tail_cache.get(word_id)
        if text is None:
            h = (word_id * 2654435761) % 2**32 / 2**32  # a fixed coin per word: its case and punctuation
            text = tail_word(word_id - self.vocabulary)
            if h < self.capitalized:
                text = text.capitalize()
            edge = 0.0
            for ch, p in self.punctuation:
                edge += p
                if (h * 7.31) % 1.0 < edge:
                    text += ch
                    break
            if len(self._tail_cache) < 2_000_000:
                self._tail_cache[word_id] = text
        return text

    def words_of(self, ids: np.ndarray) -> list[str]:
        vocab, V = self.words, self.vocabulary
        return [vocab[i] if i < V else self.word(i) for i in ids.tolist()]


# ------------------------------------------------------------------------------------------------
# The corpus generator.


class CorpusModel:
    """The statistics of a folder of `{"id", "contents": "\\"Title\\"\\ntext"}` passage files."""

    def __init__(self, folder: Path = WIKI) -> None:
        body_counts: Counter = Counter()
        title_counts: Counter = Counter()
        lengths, title_lengths = [], []
        wiki18_titles: list[str] = []
        files = sorted(folder.glob("*.jsonl"))
        if not files:
            raise SystemExit(f"{folder}: no passage files (*.jsonl); the corpus generator needs ../shared/data/wiki")
        for path in files:
            with open(path, "rb") as f:
                for line in f:
                    if not line.strip():
                        continue
                    title, body = split_title(json.loads(line)["contents"])
                    words = body.split()
                    body_counts.update(words)
                    lengths.append(len(words))
                    title_words = title.split()
                    title_counts.update(title_words)
                    title_lengths.append(len(title_words))
                    if path.name.startswith("flashrag_wiki18"):
                        wiki18_titles.append(title)
        self.source = [str(p) for p in files]
        self.passages = len(lengths)
        self.body = WordModel(body_counts)
        self.title = WordModel(title_counts)
        self.lengths = np.array([n for n in lengths if n > 0], dtype=np.int64)
        self.title_lengths = np.array([max(n, 1) for n in title_lengths], dtype=np.int64)
        # wiki-18 splits articles into 100-word passages that share the title: runs of passages per title
        # with the sample's mean (passages / distinct titles), geometric.
        self.passages_per_title = len(wiki18_titles) / max(len(set(wiki18_titles)), 1) if wiki18_titles else 1.0

    def describe(self) -> dict[str, Any]:
        return {
            "source_passages": self.passages,
            "mean_words": round(float(self.lengths.mean()), 2),
            "observed_vocabulary": self.body.vocabulary,
            "p_new_word": round(self.body.p_new, 4),
            "zipf_exponent": round(self.body.zipf_s, 3),
            "passages_per_title": round(self.passages_per_title, 3),
        }

    def write(self, path: Path, n: int, seed: int = 0, chunk: int = 20_000, progress: bool = True) -> dict[str, Any]:
        """Write `n` passages as JSONL to `path`; returns what was written (bytes, words, distinct words)."""
        import orjson
        from tqdm.auto import tqdm

        rng = np.random.default_rng(seed)
        distinct = np.zeros(0, dtype=np.int64)
        words_total = 0
        title = ""
        title_left = 0
        path.parent.mkdir(parents=True, exist_ok=True)
        bar = tqdm(total=n, unit="passage", unit_scale=True, desc=f"corpus {n:,}", disable=not progress)
        with open(path, "wb") as f:  # a scratch corpus under --work, deleted after the size
            for start in range(0, n, chunk):
                k = min(chunk, n - start)
                lengths = rng.choice(self.lengths, size=k)
                ids = self.body.sample_ids(rng, int(lengths.sum()))
                distinct = np.union1d(distinct, np.unique(ids))
                words_total += int(lengths.sum())
                words = self.body.words_of(ids)
                lines = []
                at = 0
                for j in range(k):
                    if title_left <= 0:
                        t_ids = self.title.sample_ids(rng, int(rng.choice(self.title_lengths)))
                        title = " ".join(self.title.words_of(t_ids))
                        title_left = int(rng.geometric(1.0 / self.passages_per_title))
                    title_left -= 1
                    m = int(lengths[j])
                    body = " ".join(words[at : at + m])
                    at += m
                    lines.append(orjson.dumps({"id": f"gen-{start + j}", "contents": f'"{title}"\n{body}'}))
                f.write(b"\n".join(lines) + b"\n")
                bar.update(k)
        bar.close()
        return {"corpus_mib": round(path.stat().st_size / 2**20, 2), "words": words_total,
                "distinct_words": int(distinct.size), "mean_words": round(words_total / n, 2)}  # fmt: skip


# ------------------------------------------------------------------------------------------------
# The WebShop catalog generator.


class CatalogModel:
    """Field statistics of a WebShop sample (items_shuffle*.json and items_ins_v2*.json).

    A generated product takes its category from the sample's category frequencies, its query and
    category path from a real product of that category, its option groups (names, number of values)
    and price shape from a real product, and its text (title, description, bullets, option values)
    from per-field word models with a Zipf tail (brands, models and colours keep appearing as the
    catalog grows). Attributes (count and phrases) and the share of products with a synthetic
    instruction come from items_ins_v2."""

    def __init__(self, folder: Path = WEBSHOP) -> None:
        items_files = sorted(folder.glob("items_shuffle*.json"))
        ins_files = sorted(folder.glob("items_ins_v2*.json"))
        if not items_files or not ins_files:
            raise SystemExit(f"{folder}: needs items_shuffle*.json and items_ins_v2*.json (../shared/data/webshop)")
        self.items = json.loads(items_files[0].read_text())
        ins = json.loads(ins_files[0].read_text())
        self.source = [str(items_files[0]), str(ins_files[0])]

        def count(texts: list[str]) -> Counter:
            c: Counter = Counter()
            for t in texts:
                c.update(t.split())
            return c

        def bullets(item: dict) -> list[str]:
            value = item.get("small_description")
            return value if isinstance(value, list) else ([value] if value else [])

        self.title = WordModel(count([i.get("name") or "" for i in self.items]))
        self.description = WordModel(count([i.get("full_description") or "" for i in self.items]))
        self.bullet = WordModel(count([b for i in self.items for b in bullets(i)]))
        self.title_lengths = np.array([max(len((i.get("name") or "").split()), 1) for i in self.items])
        self.description_lengths = np.array([len((i.get("full_description") or "").split()) for i in self.items])
        self.bullet_counts = np.array([len(bullets(i)) for i in self.items])
        self.bullet_lengths = np.array([max(len(b.split()), 1) for i in self.items for b in bullets(i)] or [5])
        values: dict[str, Counter] = {}
        for i in self.items:
            options = i.get("customization_options")
            if isinstance(options, dict):
                for name, entries in options.items():
                    for e in entries or ():
                        if isinstance(e, dict) and e.get("value") is not None:
                            values.setdefault(name, Counter())[str(e["value"])] += 1
        self.option_values = {name: WordModel(Counter({v: n for v, n in c.items()})) for name, c in values.items()}
        self.by_category: dict[str, list[dict]] = {}
        for i in self.items:
            self.by_category.setdefault(str(i.get("category") or ""), []).append(i)
        self.categories = sorted(self.by_category)
        self.category_p = np.array([len(self.by_category[c]) for c in self.categories], float)
        self.category_p /= self.category_p.sum()
        records = list(ins.values())
        self.attribute_counts = np.array([len(r.get("attributes") or []) for r in records])
        self.attributes = Counter(a for r in records for a in (r.get("attributes") or []))
        self.attribute_words = sorted(self.attributes)
        p = np.array([self.attributes[a] for a in self.attribute_words], float)
        self.attribute_p = p / p.sum()
        with_instruction = [r for r in records if r.get("instruction")]
        self.instruction_share = len(with_instruction) / max(len(records), 1)
        self.instruction_fraction = float(np.mean([len(r.get("instruction_attributes")
                                                       or []) / max(len(r.get("attributes") or []), 1)
                                                   for r in with_instruction])) if with_instruction else 0.7

    def describe(self) -> dict[str, Any]:
        return {"source_products": len(self.items), "categories": len(self.categories),
                "option_groups": len(self.option_values), "attribute_phrases": len(self.attributes),
                "instruction_share": round(self.instruction_share, 3)}  # fmt: skip

    def _text(self, model: WordModel, rng: np.random.Generator, length: int) -> str:
        return " ".join(model.words_of(model.sample_ids(rng, int(length)))) if length > 0 else ""

    def product(self, rng: np.random.Generator, asin: str) -> tuple[dict, dict]:
        """One raw item (items_shuffle shape) and its items_ins_v2 record."""
        category = self.categories[int(rng.choice(len(self.categories), p=self.category_p))]
        peers = self.by_category[category]
        like = peers[int(rng.integers(len(peers)))]  # query and category path of a real product of the category
        shape = self.items[int(rng.integers(len(self.items)))]  # option groups and price shape of a real product
        options: Any = ""
        real_options = shape.get("customization_options")
        if isinstance(real_options, dict) and real_options:
            options = {}
            for name, entries in real_options.items():
                n_values = len(entries or ())
                model = self.option_values.get(name)
                if not n_values or model is None:
                    options[name] = None
                    continue
                chosen = dict.fromkeys(model.words_of(model.sample_ids(rng, n_values * 2)))
                options[name] = [{"is_selected": False, "value": v} for v in list(chosen)[:n_values]]
        pricing = [round(float(p) * float(np.exp(rng.normal(0, 0.15))), 2) if float(p) != 100.0 else 100.0
                   for p in (shape.get("pricing") or [])]  # fmt: skip
        if len(pricing) == 2:
            pricing.sort()
        n_bullets = int(rng.choice(self.bullet_counts))
        item = {
            "asin": asin,
            "name": self._text(self.title, rng, rng.choice(self.title_lengths)),
            "full_description": self._text(self.description, rng, rng.choice(self.description_lengths)),
            "small_description": [self._text(self.bullet, rng, rng.choice(self.bullet_lengths))
                                  for _ in range(n_bullets)],
            "pricing": pricing,
            "customization_options": options,
            "category": category,
            "query": like.get("query", ""),
            "product_category": like.get("product_category", ""),
            "average_rating": shape.get("average_rating", ""),
            "images": [],
            "page": int(rng.integers(1, 400)),
        }
        k = int(min(rng.choice(self.attribute_counts), len(self.attribute_words)))
        attributes = [self.attribute_words[int(i)] for i in rng.choice(
            len(self.attribute_words), size=k, replace=False, p=self.attribute_p)] if k else []
        record: dict[str, Any] = {"attributes": attributes}
        if attributes and rng.random() < self.instruction_share:
            m = max(1, round(len(attributes) * self.instruction_fraction))
            chosen = attributes[:m]
            record["instruction"] = f"Find me {', '.join(chosen)} {item['query']}".strip()
            record["instruction_attributes"] = chosen
        return item, record

    def write(self, folder: Path, n: int, seed: int = 0, progress: bool = True) -> dict[str, Any]:
        """Write `items_shuffle_<n>.json` and `items_ins_v2_<n>.json` into `folder` (WebShop's formats)."""
        import orjson
        from tqdm.auto import tqdm

        rng = np.random.default_rng(seed)
        folder.mkdir(parents=True, exist_ok=True)
        letters = np.array(list("ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"))
        items_path, ins_path = folder / f"items_shuffle_{n}.json", folder / f"items_ins_v2_{n}.json"
        ins: dict[str, dict] = {}
        seen: set[str] = set()
        with open(items_path, "wb") as f:  # a scratch catalog under --work, deleted after the size
            f.write(b"[")
            for k in tqdm(range(n), unit="product", unit_scale=True, desc=f"catalog {n:,}", disable=not progress):
                asin = "B0" + "".join(rng.choice(letters, size=8))
                while asin in seen:
                    asin = "B0" + "".join(rng.choice(letters, size=8))
                seen.add(asin)
                item, record = self.product(rng, asin)
                ins[asin] = record
                f.write((b",\n" if k else b"\n") + orjson.dumps(item))
            f.write(b"\n]\n")

        atomic_write_bytes(ins_path, orjson.dumps(ins))
        return {"items_mib": round(items_path.stat().st_size / 2**20, 2),
                "ins_mib": round(ins_path.stat().st_size / 2**20, 2),
                "with_instruction": sum(1 for r in ins.values() if "instruction" in r)}  # fmt: skip


# ------------------------------------------------------------------------------------------------
# Retrieval.


def nq_questions() -> list[str]:
    if not NQ.is_file():
        raise SystemExit(f"{NQ}: the NQ-open questions are the queries; needs ../shared/data/qa")
    return [r["question"] for _, r in read_jsonl_numbered(NQ)]


def measure_retrieval(n: int, work: Path, args: argparse.Namespace) -> dict[str, Any]:
    """Generate, index and serve `n` passages; the figures of one size."""
    figures: dict[str, Any] = {}
    model = CorpusModel()
    figures["generator"] = model.describe()
    corpus, index_dir = work / f"corpus-{n}.jsonl", work / f"index-{n}"
    t0 = time.perf_counter()
    figures.update(model.write(corpus, n, seed=args.seed))
    figures["generate_s"] = round(time.perf_counter() - t0, 2)
    print(f"  corpus: {figures['corpus_mib']} MiB, {figures['distinct_words']:,} distinct words", flush=True)

    cmd = [sys.executable, "-m", "agentgym_app.cli", "index", "build", str(corpus), str(index_dir),
           "--threads", str(args.index_threads), "--quiet", "--overwrite"]  # fmt: skip
    wall, memory = run_measured(cmd)
    info = json.loads((index_dir / "agentgym_index.json").read_text())
    figures.update({"build_s": round(wall, 2), "indexing_s": info["seconds"], "build_peak_rss_mib": memory["peak_rss"],
                    "build_peak_anon_mib": memory["peak_anon"], "build_peak_file_mib": memory["peak_file"],
                    "index_mib": round(info["size_bytes"] / 2**20, 2), "num_docs": info["num_docs"]})  # fmt: skip
    print(f"  index: {figures['build_s']} s, peak RSS {figures['build_peak_rss_mib']} MiB, {figures['index_mib']} MiB",
          flush=True)
    if not args.keep:
        corpus.unlink()

    queries = nq_questions()
    t0 = time.perf_counter()
    server = RetrievalServer(index_dir, startup_timeout=600).start()
    try:
        figures["server_start_s"] = round(time.perf_counter() - t0, 2)
        pid = server.process.pid  # type: ignore[union-attr]
        figures["server_idle"] = proc_status_mib(pid)
        passes = warm_up(pid, lambda: run_load(server.url, queries, clients=16, per_request=8, seconds=args.seconds))
        figures["warm_up_passes"] = passes
        figures["server_warm"] = proc_status_mib(pid)
        for name, per_request in (("16x1", 1), ("16x8", 8)):
            result = run_load(server.url, queries * args.query_repeats, clients=16, per_request=per_request,
                              seconds=args.seconds)
            figures[f"load_{name}"] = result
            print(f"  16 clients x {per_request}: {result['qps']} q/s, p50 {result['p50_ms']} ms, p99 "
                  f"{result['p99_ms']} ms, "
                  f"{result['errors']} errors", flush=True)  # fmt: skip
        figures["server_after"] = proc_status_mib(pid)
    finally:
        server.stop()
    if not args.keep:
        shutil.rmtree(index_dir, ignore_errors=True)
    return figures


# ------------------------------------------------------------------------------------------------
# WebShop.


def measure_webshop(n: int, work: Path, args: argparse.Namespace) -> dict[str, Any]:
    """Generate a catalog of `n` products and run benchmarks.webshop_speed on it in a fresh process."""
    figures: dict[str, Any] = {}
    model = CatalogModel()
    figures["generator"] = model.describe()
    folder = work / f"webshop-{n}"
    t0 = time.perf_counter()
    figures.update(model.write(folder / "data", n, seed=args.seed))
    figures["generate_s"] = round(time.perf_counter() - t0, 2)
    out = folder / "speed.json"
    cmd = [sys.executable, "-m", "benchmarks.webshop_speed", "--catalog", str(folder / "data"), "--envs",
           str(args.webshop_envs),
           "--episodes", str(args.webshop_episodes), "--index-dir", str(folder / "index"), "--no-heap", "--json",
           str(out)]  # fmt: skip
    wall, memory = run_measured(cmd)
    speed = json.loads(out.read_text())
    figures.update(speed)
    figures["process_wall_s"] = round(wall, 2)
    figures["process_peak_rss_mib"] = memory["peak_rss"]
    figures["process_peak_anon_mib"] = memory["peak_anon"]
    print(f"  load {speed['catalog_load_s']} s ({speed['goals']:,} goals), index {speed['index_build_s']} s, "
          f"RSS 1 env {speed['rss_one_env_mb']} MiB, 64 envs {speed['rss_all_envs_mb']} MiB, "
          f"search p50 {speed['search_ms_p50']} ms, click p50 {speed['click_ms_p50']} ms", flush=True)  # fmt: skip
    if not args.keep:
        shutil.rmtree(folder, ignore_errors=True)
    return figures


# ------------------------------------------------------------------------------------------------
# ALFWorld.


def panel_sizes(games: int) -> dict[str, int]:
    """A train-only panel of about `games` games in ALFWorld's training mix (games per type share)."""
    if games % 6:
        raise SystemExit(f"--alfworld {games}: use a multiple of 6 (the mixed panel holds six times its per-type "
                         "share); "
                         "3552 is the closest to ALFWorld's 3,553")  # fmt: skip
    return {"train": games // 6, "valid_seen": 0, "valid_unseen": 0}


def measure_alfworld(n: int, work: Path, args: argparse.Namespace) -> dict[str, Any]:
    """Generate a panel of `n` games, then play every game twice in a fresh process."""
    figures: dict[str, Any] = {}
    cache = work / f"alfworld-{n}"
    env = dict(os.environ, AGENTGYM_OPSD_CACHE=str(cache))
    gen = [sys.executable, "-m", "benchmarks.scale", "--child", "alfworld-generate", str(n), "--workers",
           str(args.alfworld_workers)]
    wall, memory = run_measured(gen, env=env, quiet=False)
    panel = next((cache / "alfworld").glob("g*-mixalfworld-*"))
    manifest = json.loads((panel / "train.json").read_text())
    games = sum(len(v) for v in manifest["games"].values())
    figures.update({"games": games, "generate_s": round(wall, 2), "generate_s_per_game": round(wall / games, 3),
                    "generate_workers": manifest["workers"], "generate_peak_rss_mib": memory["peak_rss"],
                    "panel_mib": dir_mib(panel),
                    "translations_mib": dir_mib(cache / "alfworld" / "compiled")})  # fmt: skip
    print(f"  generated {games} games in {wall:.0f} s ({manifest['workers']} workers); panel "
          f"{figures['panel_mib']} MiB, "
          f"translations {figures['translations_mib']} MiB", flush=True)  # fmt: skip
    out = cache / "play.json"
    if args.alfworld_game_cache:
        env["AGENTGYM_ALFWORLD_GAME_CACHE"] = str(args.alfworld_game_cache)
    figures["games_kept_in_memory"] = args.alfworld_game_cache or int(
        os.environ.get("AGENTGYM_ALFWORLD_GAME_CACHE", "512"))
    play = [sys.executable, "-m", "benchmarks.scale", "--child", "alfworld-play", str(n), "--json", str(out),
            "--alfworld-steps", str(args.alfworld_steps)]  # fmt: skip
    wall, memory = run_measured(play, env=env, quiet=False)
    figures.update(json.loads(out.read_text()))
    figures["play_peak_rss_mib"] = memory["peak_rss"]
    figures["play_s"] = round(wall, 1)
    if not args.keep:
        shutil.rmtree(cache, ignore_errors=True)
    return figures


def alfworld_generate_child(n: int, workers: int) -> None:
    spec = PanelSpec.make(0, "full", panel_sizes(n), mix="alfworld")
    ensure_panel(spec, splits=("train",), workers=workers, progress=True)


def alfworld_play_child(n: int, out: Path, steps: int) -> None:
    """In a fresh process: construct the env, play every game twice (a few random admissible steps each),
    then the first reset of games never translated; reset/step times and RSS."""
    import random

    from tqdm.auto import tqdm

    rss0 = proc_status_mib(os.getpid())
    t0 = time.perf_counter()
    env = AlfWorldEnv(split="train", mix="alfworld", panel_size=panel_sizes(n), progress=False)
    construct_s = time.perf_counter() - t0
    rng = random.Random(0)
    figures: dict[str, Any] = {"construct_s": round(construct_s, 3), "rss_start_mib": rss0.get("VmRSS")}
    for p in (1, 2):
        resets, step_times = [], []
        for i in tqdm(range(env.num_tasks), desc=f"ALFWorld {n} games, pass {p}", unit="game"):
            t = time.perf_counter()
            env.reset(seed=i)
            resets.append(time.perf_counter() - t)
            for _ in range(steps):
                command = rng.choice(env.admissible_actions())
                t = time.perf_counter()
                _, _, terminated, truncated, _ = env.step(command)
                step_times.append(time.perf_counter() - t)
                if terminated or truncated:
                    break
        ms = np.array(resets) * 1000
        figures[f"pass{p}_reset_ms_mean"] = round(float(ms.mean()), 2)
        figures[f"pass{p}_reset_ms_p50"] = round(float(np.percentile(ms, 50)), 2)
        figures[f"pass{p}_reset_ms_p95"] = round(float(np.percentile(ms, 95)), 2)
        figures[f"pass{p}_step_ms_p50"] = round(float(np.percentile(np.array(step_times) * 1000, 50)), 3)
        figures[f"pass{p}_rss_mib"] = proc_status_mib(os.getpid()).get("VmRSS")
        try:
            import mementos.core

            figures[f"pass{p}_interned_textworld_objects"] = len(mementos.core._memento_cache)
        except ImportError:
            pass
    # The first reset of a game never seen on this machine: fast-downward translates it.
    cold = []
    probe = AlfredEngine()
    for entry in env.games[:: max(1, len(env.games) // 12)][:12]:
        forget_compiled_games()
        t = time.perf_counter()
        probe.load(compile_game(entry.game_file, disk_cache=False))
        probe.reset()
        cold.append(time.perf_counter() - t)
    probe.close()
    figures["cold_first_reset_ms_mean"] = round(1000 * float(np.mean(cold)), 1)
    figures["games_played"] = env.num_tasks
    atomic_write_json(out, figures)


# ------------------------------------------------------------------------------------------------
# Fits, the table and the plots.

# (key, label, panel, how the figure is read from a size's results). Throughputs are fitted as time per
# query (1/qps) and shown back as queries/s.
METRICS: dict[str, list[tuple[str, str, str]]] = {
    "retrieval": [
        ("build_s", "index build, s (wall, with JVM start)", "time"),
        ("index_mib", "index on disk, MiB", "memory"),
        ("build_peak_anon_mib", "index build peak anonymous RSS, MiB (JVM heap, Python)", "memory"),
        ("build_peak_rss_mib", "index build peak RSS, MiB (with mapped segments)", "memory"),
        ("server_start_s", "server start, s", "time"),
        ("server_rss_mib", "server peak RSS, MiB", "memory"),
        ("server_anon_mib", "server anonymous RSS, MiB (heap; the rest is mapped index)", "memory"),
        ("qps_16x1", "16 clients x 1 query: queries/s", "throughput"),
        ("p50_16x1", "16 x 1: p50 ms", "latency"),
        ("p99_16x1", "16 x 1: p99 ms", "latency"),
        ("qps_16x8", "16 clients x 8 queries: queries/s", "throughput"),
        ("p50_16x8", "16 x 8: p50 ms", "latency"),
        ("p99_16x8", "16 x 8: p99 ms", "latency"),
    ],
    "webshop": [
        ("items_mib", "items file, MiB", "memory"),
        ("catalog_load_s", "catalog load (files + goals), s", "time"),
        ("goals", "goals (synthetic)", "count"),
        ("peak_rss_catalog_load_mb", "peak RSS while loading, MiB", "memory"),
        ("index_build_s", "search index build, s", "time"),
        ("index_mib", "search index, MiB", "memory"),
        ("rss_one_env_mb", "RSS with 1 env, MiB", "memory"),
        ("rss_all_envs_mb", "RSS with 64 envs, MiB", "memory"),
        ("process_peak_anon_mib", "peak anonymous RSS of the process, MiB", "memory"),
        ("reset_ms_p50", "reset p50, ms", "latency"),
        ("search_ms_mean", "search step mean, ms (repeated queries hit the cache)", "latency"),
        ("search_ms_p95", "search step p95, ms (a query's first search)", "latency"),
        ("click_ms_p50", "click step p50, ms", "latency"),
    ],
    "alfworld": [
        ("generate_s_per_game", "generation, s per game (wall)", "time"),
        ("panel_mib", "panel on disk, MiB", "memory"),
        ("translations_mib", "translation cache on disk, MiB", "memory"),
        ("construct_s", "env construction, s", "time"),
        ("pass1_reset_ms_mean", "first reset of a game in a process, ms (mean)", "latency"),
        ("pass2_reset_ms_mean", "reset, 2nd pass over the panel, ms (mean)", "latency"),
        ("pass2_step_ms_p50", "step p50, ms", "latency"),
        ("pass1_rss_mib", "RSS after one pass over the panel, MiB", "memory"),
        ("pass2_rss_mib", "RSS after two passes, MiB", "memory"),
        ("cold_first_reset_ms_mean", "first reset of a never-translated game, ms", "latency"),
    ],
}


def metric(family: str, key: str, figures: dict[str, Any]) -> float | None:
    """A figure of one size's results (derived where the results nest it)."""
    derived = {
        "server_rss_mib": lambda f: f.get("server_after", {}).get("VmHWM"),
        "server_anon_mib": lambda f: f.get("server_after", {}).get("RssAnon"),
        "qps_16x1": lambda f: f.get("load_16x1", {}).get("qps"),
        "p50_16x1": lambda f: f.get("load_16x1", {}).get("p50_ms"),
        "p99_16x1": lambda f: f.get("load_16x1", {}).get("p99_ms"),
        "qps_16x8": lambda f: f.get("load_16x8", {}).get("qps"),
        "p50_16x8": lambda f: f.get("load_16x8", {}).get("p50_ms"),
        "p99_16x8": lambda f: f.get("load_16x8", {}).get("p99_ms"),
    }
    value = derived[key](figures) if key in derived else figures.get(key)
    return None if value is None else float(value)


def fit(sizes: list[float], values: list[float], inverse: bool = False) -> dict[str, Any] | None:
    """Fit how a cost grows with the size n, and pick the model that fits best (smallest largest relative
    error); `inverse`: fit 1/y (time per query for a throughput).

    Models: `linear` y = a + b*n and `n log n` y = a + b*n*ln(n) (least squares on relative errors; a
    is the fixed cost: a JVM's start, imports), and `constant` (the weighted mean) where both have a
    falling cost (b < 0: flat within the noise; they would extrapolate to nothing). A power law
    y = c*n^k is fitted for its exponent k (how fast the cost grows between the sizes measured, the
    "growth n^k" column) but not used to extrapolate: with a fixed cost, a power law through small
    sizes bends below the linear growth that follows. Returns the models' R^2 (in y) and largest
    relative errors, the chosen one, and k. None with fewer than two sizes."""
    n = np.asarray(sizes, float)
    y = np.asarray(values, float)
    if len(n) < 2 or np.any(y <= 0):
        return None
    target = 1.0 / y if inverse else y
    slope, intercept = np.polyfit(np.log(n), np.log(target), 1)
    out: dict[str, Any] = {"points": len(n), "exponent": round(float(slope), 3)}
    ss = float(((target - target.mean()) ** 2).sum())

    def quality(pred: np.ndarray) -> dict[str, float]:
        r2 = 1.0 - float(((target - pred) ** 2).sum()) / ss if ss > 0 else 1.0
        return {"r2": round(r2, 4), "max_rel_err": round(float(np.max(np.abs(pred - target) / target)), 4)}

    w = 1.0 / target
    models: dict[str, dict[str, Any]] = {}
    for name, g in (("linear", n), ("n log n", n * np.log(n))):
        A = np.stack([np.ones_like(n), g], axis=1) * w[:, None]
        (a, b), *_ = np.linalg.lstsq(A, target * w, rcond=None)
        models[name] = {"a": float(a), "b": float(b), **quality(a + b * g), "usable": bool(b >= 0)}
    mean = float((target * w).sum() / w.sum())
    models["constant"] = {"a": mean, **quality(np.full_like(target, mean)),
                          "usable": not (models["linear"]["usable"] or models["n log n"]["usable"])}
    usable = [m for m in ("linear", "n log n", "constant") if models[m]["usable"]]
    best = min(usable, key=lambda m: models[m]["max_rel_err"])
    out.update({"model": best, "models": models, "r2": models[best]["r2"], "max_rel_err": models[best]["max_rel_err"]})
    return out


def predict(f: dict[str, Any], n: float, inverse: bool = False) -> float:
    name = f["model"]
    m = f["models"][name]
    if name == "constant":
        value = m["a"]
    else:
        value = m["a"] + m["b"] * (n if name == "linear" else n * math.log(n))
    if value <= 0:
        return float("nan")
    return 1.0 / value if inverse else value


def _fmt(v: float | None) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "–"
    a = abs(v)
    if a >= 100:
        return f"{v:,.0f}"
    if a >= 10:
        return f"{v:.1f}"
    if a >= 1:
        return f"{v:.2f}"
    return f"{v:.3f}"


def _size_label(n: int) -> str:
    for div, suffix in ((1_000_000, "M"), (1_000, "k")):
        if n >= div and n % (div // 10) == 0:
            return f"{n / div:g}{suffix}"
    return f"{n:,}"


def family_table(family: str, runs: dict[str, dict[str, Any]]) -> tuple[str, dict[str, Any]]:
    """The markdown table of one family: measured figures per size, the fitted model, the extrapolation."""
    sizes = sorted(int(s) for s in runs)
    target = TARGETS[family]
    measured_target = target in sizes
    head = ["figure", *[_size_label(s) for s in sizes], "model (R², max error)", "growth n^k",
            f"{_size_label(target)} {TARGET_NAMES[family]}"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    fits: dict[str, Any] = {}
    for key, label, panel in METRICS[family]:
        values = [metric(family, key, runs[str(s)]) for s in sizes]
        present = [(s, v) for s, v in zip(sizes, values) if v is not None]
        if not present:
            continue
        inverse = panel == "throughput"
        f = fit([s for s, _ in present], [v for _, v in present], inverse=inverse)
        cells = [label, *[_fmt(v) for v in values]]
        if f is None:
            cells += ["–", "–", "–"]
        else:
            fits[key] = f
            extrapolated = predict(f, target, inverse)
            f["extrapolated"] = extrapolated
            note = "" if f["points"] > 2 else ", 2 points: exact"
            k = -f["exponent"] if inverse else f["exponent"]
            cells += [f"{f['model']} ({f['r2']:.3f}, {100 * f['max_rel_err']:.0f}%{note})", f"{k:.2f}",
                      "measured" if measured_target else f"*{_fmt(extrapolated)}*"]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    loads = [runs[str(s)].get("load", {}) for s in sizes]
    load_cells = " | ".join(f"{load.get('load_mean', '?')} / {load.get('load_max', '?')}" for load in loads)
    lines.append("| load average (mean / max) | " + load_cells + " | | | |")
    return "\n".join(lines), fits


def plot_family(family: str, runs: dict[str, dict[str, Any]], fits: dict[str, Any], path: Path) -> None:
    """Cost against size, log-log: measured points joined, the fitted model dashed out to the users' size."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt


    sizes = sorted(int(s) for s in runs)
    panels = [p for p in ("time", "memory", "latency", "throughput", "count")
              if any(m[2] == p for m in METRICS[family])]
    panels = [p for p in panels if any(metric(family, k, runs[str(s)]) is not None for k, _, q in METRICS[family]
                                       if q == p for s in sizes)]
    fig, axes = plt.subplots(1, len(panels), figsize=(4.6 * len(panels), 4.0), squeeze=False)
    target = TARGETS[family]
    for ax, panel in zip(axes[0], panels):
        for i, (key, label, p) in enumerate(METRICS[family]):
            if p != panel:
                continue
            pts = [(s, metric(family, key, runs[str(s)])) for s in sizes]
            pts = [(s, v) for s, v in pts if v is not None]
            if not pts:
                continue
            line, = ax.plot([s for s, _ in pts], [v for _, v in pts], "o-", label=label, markersize=4)
            f = fits.get(key)
            if f is not None and target > max(sizes):
                xs = np.geomspace(max(sizes), target, 20)
                ys = [predict(f, x, panel == "throughput") for x in xs]
                ax.plot(xs, ys, "--", color=line.get_color(), alpha=0.7)
                ax.plot([target], [ys[-1]], "o", mfc="none", color=line.get_color())
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel(UNITS[family])
        ax.set_title(panel, fontsize=10)
        if target > max(sizes):
            ax.axvline(target, color="grey", lw=0.6, ls=":")
        ax.legend(fontsize=6.5, loc="best")
        ax.grid(True, which="both", lw=0.3, alpha=0.5)
    fig.suptitle(
        f"{family}: cost against size (dashed: fitted model to {TARGET_NAMES[family]}, {target:,} {UNITS[family]})",
        fontsize=10)
    fig.tight_layout()
    save_png(fig, path, dpi=90, metadata={"Software": None})


def before_after(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    """Markdown rows comparing the sizes measured in both runs (`--before`: the results.json of the same
    script on the code before a change)."""
    lines = ["## Before and after", "",
             "The same sizes measured on the code before the changes (`--before`) and after.", "",
             "| family | size | figure | before | after | after / before |", "|---|---|---|---|---|---|"]  # fmt: skip
    for family in ("retrieval", "webshop", "alfworld"):
        old_runs, new_runs = before.get("runs", {}).get(family, {}), after.get("runs", {}).get(family, {})
        for size in sorted(set(old_runs) & set(new_runs), key=int):
            for key, label, _ in METRICS[family]:
                a, b = metric(family, key, old_runs[size]), metric(family, key, new_runs[size])
                if a is None or b is None:
                    continue
                ratio = f"{b / a:.2f}" if a else "–"
                lines.append(f"| {family} | {int(size):,} | {label} | {_fmt(a)} | {_fmt(b)} | {ratio} |")
            loads = [runs[size].get("load", {}) for runs in (old_runs, new_runs)]
            cells = " | ".join(f"{load.get('load_mean')} / {load.get('load_max')}" for load in loads)
            lines.append(f"| {family} | {int(size):,} | load average (mean / max) | {cells} | |")
    return lines + [""]


def write_report(results: dict[str, Any], out: Path, before: dict[str, Any] | None = None, *,
                 command: str = "python -m benchmarks.scale --report") -> str:
    """scale.md (a results page: what is above its discussion marker, the discussion kept) and one PNG per family
    from results.json's figures; `command` is the run that writes it. Returns the page's text."""
    parts = [f"Machine: {results['machine']['cpus']} cores, {results['machine']['memory_gib']} GiB, shared with "
             "other jobs (the load average during each size is in its table). Figures in *italics* are extrapolated "
             "with the model named beside them (fitted on relative errors; R² and the largest relative error of the "
             "fit); the rest are measured.", ""]
    all_fits, commits = {}, set()
    for family in ("retrieval", "webshop", "alfworld"):
        runs = results.get("runs", {}).get(family)
        if not runs:
            continue
        table, fits = family_table(family, runs)
        all_fits[family] = fits
        plot_family(family, runs, fits, out / f"{family}.png")
        sizes = sorted(int(s) for s in runs)
        parts += [f"## {family} ({UNITS[family]}: {', '.join(f'{s:,}' for s in sizes)})", "", table, "",
                  f"![{family}]({family}.png)", ""]
        measured = sorted({(r.get("commit") or "not recorded", r["command"]) for r in runs.values()
                           if r.get("command")})
        commits |= {commit for commit, _ in measured}
        if measured:
            parts += ["Measured with: " + "; ".join(f"`{c}` (commit {commit})" for commit, c in measured), ""]
    if before:
        parts += before_after(before, results)
    # the figures' commit: one when every run names the same, else each size's (named beside its command)
    commit = next(iter(commits)) if len(commits) == 1 else "of each size's run (named beside its command)"
    page = write_results_page("scale", "How cost grows with the work", "\n".join(parts), command=command,
                              commit=commit if commits else None, load="per size, in its table", pages=out)
    atomic_write_json(out / "fits.json", all_fits)
    return page.read_text(encoding="utf-8")


# ------------------------------------------------------------------------------------------------
# Main.

NEEDS_BYTES = {"retrieval": 4_000, "webshop": 12_000, "alfworld": 400_000}  # disk per unit of size (generous)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="the smallest sizes: 10k passages, 1k products, 240 games")
    parser.add_argument("--retrieval", type=int, nargs="*", default=[], metavar="PASSAGES")
    parser.add_argument("--webshop", type=int, nargs="*", default=[], metavar="PRODUCTS")
    parser.add_argument("--alfworld", type=int, nargs="*", default=[], metavar="GAMES", help="multiples of 6")
    parser.add_argument("--report", action="store_true", help="only write the table and plots from results.json")
    parser.add_argument("--before", default=None, metavar="RESULTS_JSON",
                        help="add a before/after table against this results.json (the same sizes measured on "
                             "older code)")  # fmt: skip
    parser.add_argument("--out", default=str(REPO / "runs" / "scale"),
                        help="results.json, scale.md, PNGs (default runs/scale)")
    parser.add_argument("--work", default=str(Path(tempfile.gettempdir()) / "agentgym-scale"),
                        help="generated corpora, catalogs, panels, indexes (deleted after each size)")  # fmt: skip
    parser.add_argument("--keep", action="store_true", help="keep the generated data and indexes under --work")
    parser.add_argument("--again", action="store_true", help="measure sizes already in results.json again")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--seconds", type=float, default=8.0,
                        help="length of each retrieval load (default %(default)s)")
    parser.add_argument("--query-repeats", type=int, default=3,
                        help="the 1,805 NQ questions, this many times over, per load")
    parser.add_argument("--index-threads", type=int, default=2, help="`index build --threads` (default %(default)s)")
    parser.add_argument("--webshop-envs", type=int, default=64)
    parser.add_argument("--webshop-episodes", type=int, default=2, help="episodes per env for the latency figures")
    parser.add_argument("--alfworld-workers", type=int, default=2, help="panel generation processes")
    parser.add_argument("--alfworld-steps", type=int, default=3, help="random admissible steps per game and pass")
    parser.add_argument("--alfworld-game-cache", type=int, default=None,
                        help="games a process keeps compiled in memory (AGENTGYM_ALFWORLD_GAME_CACHE; default 512)")
    parser.add_argument("--child", nargs=2, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--workers", type=int, default=2, help=argparse.SUPPRESS)
    parser.add_argument("--json", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.child:
        kind, size = args.child[0], int(args.child[1])
        if kind == "alfworld-generate":
            alfworld_generate_child(size, args.workers)
        elif kind == "alfworld-play":
            alfworld_play_child(size, Path(args.json), args.alfworld_steps)
        return 0

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results_path = out / "results.json"
    results: dict[str, Any] = json.loads(results_path.read_text()) if results_path.exists() else {}
    results["machine"] = {"cpus": os.cpu_count(),
                          "memory_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)}
    results.setdefault("runs", {})
    plan = {"retrieval": args.retrieval, "webshop": args.webshop, "alfworld": args.alfworld}
    if args.quick:
        plan = {family: sorted(set(plan[family]) | set(QUICK[family])) for family in plan}
    if not any(plan.values()) and not args.report:
        parser.error("give sizes (--retrieval/--webshop/--alfworld), --quick, or --report")
    if args.report and not any(plan.values()) and not results["runs"]:
        parser.error(f"--report: no figures in {results_path}; measure first (--quick, or sizes) with the same --out")
    before = None
    if args.before:
        try:
            before = json.loads(Path(args.before).read_text())
        except (OSError, ValueError) as e:
            parser.error(f"--before {args.before}: not a results.json of this script ({e})")
    measure = {"retrieval": measure_retrieval, "webshop": measure_webshop, "alfworld": measure_alfworld}
    work = Path(args.work)
    command = benchmark_command("scale", argv)
    started = time.perf_counter()
    for family, sizes in plan.items():
        for n in sizes:
            if str(n) in results["runs"].get(family, {}) and not args.again:
                print(f"{family} {n:,}: in {results_path} already (--again measures it again)")
                continue
            work.mkdir(parents=True, exist_ok=True)
            free = shutil.disk_usage(work).free
            if free < NEEDS_BYTES[family] * n:
                print(f"{family} {n:,}: skipped, {free / 2**30:.1f} GiB free under {work}, about "
                      f"{NEEDS_BYTES[family] * n / 2**30:.1f} GiB needed (--work elsewhere)", flush=True)  # fmt: skip
                continue
            print(f"{family} {n:,} {UNITS[family]} (load average {os.getloadavg()[0]:.1f}) ...", flush=True)
            sampler = LoadSampler()
            t0 = time.perf_counter()
            figures = measure[family](n, work, args)
            figures["load"] = sampler.stop()
            figures["wall_s"] = round(time.perf_counter() - t0, 1)
            figures["command"] = command
            figures["commit"] = git_commit()
            figures["measured_at"] = time.strftime("%Y-%m-%d %H:%M:%S")
            results["runs"].setdefault(family, {})[str(n)] = figures
            atomic_write_json(results_path, results)
    text = write_report(results, out, before, command=command)
    print(text)
    print(f"\n{out / 'scale.md'} and the PNGs beside it; every figure in {results_path} "
          f"({time.perf_counter() - started:.0f} s)")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
