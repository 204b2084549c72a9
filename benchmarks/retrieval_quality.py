"""Retrieval quality of the BM25 index on the shared real data (and on the embedded synthetic set).

One Lucene index of the whole ../shared/data/wiki folder (12,033 passages: 10,033 Wikipedia vital-article
summaries, 1,000 DPR wiki-2018 passages, the 1,000 paragraphs of the HotpotQA distractor sample), searched
with each question as the query, top-10:

- answer recall@1/3/10 for NQ-open, TriviaQA, HotpotQA (simplified dev list and the distractor sample):
  the share of questions whose top-k passages contain a gold answer (SQuAD-normalised, whole words);
  "in corpus" is the share whose answer occurs in any passage at all: the ceiling for this small corpus;
- supporting-paragraph recall@k for the HotpotQA distractor sample: the share of supporting paragraphs
  (by title) in the top k, and the share of questions with both in the top k;
- the same supporting recall for the synthetic set over its own index (single-hop: the answer passage;
  two-hop: the first hop, which is all a question-as-query search can find).

    .venv/bin/python -m benchmarks.retrieval_quality [--out runs/retrieval_quality] [--page]

Writes results.json, a table (stdout) and recall.png (recall@k curves); `--page` also writes the tables
and the plot to docs/benchmarks/retrieval_quality.md.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

from agentgym_opsd.io import atomic_write_json
from benchmarks.common import (SHARED_DATA, add_page_argument, benchmark_command, load_average, markdown_table,
                               page_plot, save_png, write_results_page)
from environments.searchqa.data import load_questions
from environments.searchqa.metrics import normalize_answer
from environments.searchqa.synthetic import ensure_synthetic_index, synthetic_questions
from retrieval_index.corpus import split_title
from retrieval_index.lucene import BM25Searcher, build_index
from retrieval_index.testing import wiki_slice_records

K = 10
QA_FILES = {
    "NQ-open dev": ("nq", "nq_open_dev_part1.jsonl"),
    "TriviaQA": ("triviaqa", "triviaqa_sm_sub_part1.jsonl"),
    "HotpotQA dev (simplified)": ("hotpotqa", "hotpot_dev_v1_simplified_part1.json"),
    "HotpotQA distractor sample": ("hotpotqa", "hotpotqa_distractor_dev_sample_100.jsonl"),
}


def _padded(text: str) -> str:
    return f" {normalize_answer(text)} "


def has_answer(passage_norm: str, answers_norm: list[str]) -> bool:
    """A gold answer occurs in the passage as whole words (both SQuAD-normalised and space-padded)."""
    return any(a.strip() and a in passage_norm for a in answers_norm)


def answer_recall(examples, results, corpus_norm: str | None) -> dict:
    rows = []
    for ex, hits in zip(examples, results, strict=True):
        answers = [_padded(a) for a in ex.answers]
        first = next((rank for rank, h in enumerate(hits, start=1) if has_answer(_padded(h.contents), answers)), None)
        rows.append(first)
    n = len(rows)
    out = {"questions": n}
    for k in range(1, K + 1):
        out[f"recall@{k}"] = round(sum(r is not None and r <= k for r in rows) / n, 4)
    if corpus_norm is not None:
        out["answer_in_corpus"] = round(sum(has_answer(corpus_norm, [_padded(a) for a in ex.answers])
                                            for ex in examples) / n, 4)
    return out


def support_recall(examples, results) -> dict:
    per_k = {k: [0, 0, 0] for k in range(1, K + 1)}  # found titles, all titles, questions with all found
    for ex, hits in zip(examples, results, strict=True):
        titles = ex.supporting_titles
        got = [split_title(h.contents)[0] for h in hits]
        for k in range(1, K + 1):
            found = sum(t in got[:k] for t in titles)
            per_k[k][0] += found
            per_k[k][1] += len(titles)
            per_k[k][2] += found == len(titles)
    out = {"questions": len(examples)}
    for k, (found, total, complete) in per_k.items():
        out[f"support_recall@{k}"] = round(found / max(total, 1), 4)
        out[f"all_support@{k}"] = round(complete / max(len(examples), 1), 4)
    return out


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    ks = list(range(1, K + 1))
    for name, r in results["answer_recall"].items():
        a.plot(ks, [r[f"recall@{k}"] for k in ks], marker="o", label=f"{name} (in corpus {r['answer_in_corpus']:.0%})")
    a.set(title="Answer recall@k (12k-passage shared wiki)", xlabel="k", ylabel="share of questions", ylim=(0, 1))
    a.legend(fontsize=7)
    for name, r in results["support_recall"].items():
        b.plot(ks, [r[f"support_recall@{k}"] for k in ks], marker="o", label=f"{name}: paragraphs")
        b.plot(ks, [r[f"all_support@{k}"] for k in ks], marker="x", linestyle="--",
               label=f"{name}: all of a question's")
    b.set(title="Supporting-passage recall@k", xlabel="k", ylabel="share", ylim=(0, 1))
    b.legend(fontsize=7)
    fig.tight_layout()
    save_png(fig, path)


def results_page_body(results: dict) -> str:
    """The results page's figures: answer recall@k per question set and supporting-passage recall@k
    (`results` as results.json holds it)."""
    answers = [[name, r["questions"], *(f"{r[f'recall@{k}']:.3f}" for k in (1, 3, 10)),
                f"{r['answer_in_corpus']:.3f}"] for name, r in results["answer_recall"].items()]
    support = [[name, r["questions"], *(f"{r[f'support_recall@{k}']:.3f}" for k in (1, 3, 10)),
                f"{r['all_support@3']:.3f}", f"{r['all_support@10']:.3f}"]
               for name, r in results["support_recall"].items()]
    return (f"One BM25 index of {results['corpus']['passages']:,} passages, each question as the query.\n\n"
            "Answer recall (the share of questions whose top k passages hold a gold answer; \"in corpus\": in any "
            "passage, the ceiling):\n\n"
            + markdown_table(["question set", "n", "@1", "@3", "@10", "in corpus"], answers)
            + "\n\nSupporting passages (the share found in the top k; all@k: questions with all of theirs found):\n\n"
            + markdown_table(["question set", "n", "@1", "@3", "@10", "all@3", "all@10"], support))


def main() -> int:
    work = Path(tempfile.mkdtemp(prefix=f"{Path(__file__).stem.replace('_', '-')}-"))
    try:
        return run(work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def run(work: Path) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="runs/retrieval_quality", help="folder for results.json and recall.png")
    parser.add_argument("--threads", type=int, default=2)
    add_page_argument(parser)
    args = parser.parse_args()
    load_before = load_average()
    command = benchmark_command("retrieval_quality")  # before anything can change sys.argv (alfworld's code does)
    if not (SHARED_DATA / "wiki").is_dir():
        print(f"needs {SHARED_DATA} (the shared data folder beside the repo)", file=sys.stderr)
        return 2

    records = list(wiki_slice_records(SHARED_DATA / "wiki", {name: None for name in
                                                        ("hotpotqa_distractor_paragraphs.jsonl",
                                                         "flashrag_wiki18_sample_1000.jsonl",
                                                         "wikipedia_vital_articles_summaries_en.jsonl")}))  # fmt: skip
    t0 = time.perf_counter()
    build_index(records, work / "wiki", threads=args.threads, progress=False)
    print(f"indexed {len(records)} passages in {time.perf_counter() - t0:.1f} s")
    corpus_norm = "\n".join(_padded(r["contents"]) for r in records)

    results: dict = {"corpus": {"passages": len(records),
                                "files": sorted(p.name for p in (SHARED_DATA / "wiki").glob("*.jsonl"))},
                     "answer_recall": {}, "support_recall": {}}  # fmt: skip
    with BM25Searcher(work / "wiki") as searcher:
        for name, (dataset, filename) in QA_FILES.items():
            examples = load_questions(SHARED_DATA / "qa" / filename, dataset=dataset)
            hits = searcher.batch_search([e.question for e in examples], K, threads=args.threads)
            results["answer_recall"][name] = answer_recall(examples, hits, corpus_norm)
            if examples[0].supporting:
                results["support_recall"][name] = support_recall(examples, hits)
    synthetic_index = ensure_synthetic_index(work / "synthetic")
    with BM25Searcher(synthetic_index) as searcher:
        for kind in ("single-hop", "two-hop"):
            examples = [q for q in synthetic_questions("all") if q.question_type == kind]
            hits = searcher.batch_search([e.question for e in examples], K, threads=args.threads)
            if kind == "two-hop":  # a question-as-query search can only find the first hop
                for e in examples:
                    e.supporting = e.supporting[:1]
            results["support_recall"][f"synthetic {kind}"] = support_recall(examples, hits)

    print(f"\n{'answer recall':<30}{'n':>6}{'@1':>8}{'@3':>8}{'@10':>8}{'in corpus':>11}")
    for name, r in results["answer_recall"].items():
        print(
            f"{name:<30}{r['questions']:>6}{r['recall@1']:>8.3f}{r['recall@3']:>8.3f}{r['recall@10']:>8.3f}{r['answer_in_corpus']:>11.3f}")
    print(f"\n{'supporting passages':<30}{'n':>6}{'@1':>8}{'@3':>8}{'@10':>8}{'all@3':>8}{'all@10':>8}")
    for name, r in results["support_recall"].items():
        print(f"{name:<30}{r['questions']:>6}{r['support_recall@1']:>8.3f}{r['support_recall@3']:>8.3f}"
              f"{r['support_recall@10']:>8.3f}{r['all_support@3']:>8.3f}{r['all_support@10']:>8.3f}")  # fmt: skip
    out = Path(args.out)
    atomic_write_json(out / "results.json", results)
    plot(results, out / "recall.png")
    print(f"\nwrote {out / 'results.json'} and {out / 'recall.png'}")
    if args.page:
        page = write_results_page(
            "retrieval_quality", "Retrieval quality of the BM25 index: answer and supporting-passage recall@k",
            results_page_body(results), command=command, threads=args.threads,
            load=[load_before[0], load_average()[0]], plots=page_plot(out / "recall.png", "retrieval_quality"))
        print(f"results page: {page}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
