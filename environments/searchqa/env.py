"""Search-QA: answer an open-domain question by searching a BM25 retrieval server (Search-R1 style).

Each turn the agent reasons in `<think>`, then writes exactly one `<search>query</search>` (the server's
top-k passages come back as `<information>Doc 1(Title: ...) text ...</information>`) or one
`<answer>...</answer>`, which ends the episode. Reward: 1.0 when the answer matches a gold answer
exactly after SQuAD normalisation, else 0.0; F1 and substring match are in `info`. Episodes are
truncated after `max_turns` (4) turns. Hindsight: the gold answers, the question type and, for
HotpotQA and the synthetic set, the supporting passages' titles and sentences.

Where passages come from (first that applies): `server_url=`; `index_dir=` (a server over that
index is started in a child process, shared by every env of the process); for the synthetic set, its
own cached index, served the same way; otherwise $AGENTGYM_RETRIEVAL_URL or http://127.0.0.1:8000.
A server that is down or dies mid-episode raises `RetrievalServerDown` (an `EnvUnavailable`) that
says how to start it; it never hangs (bounded retries and timeouts).

Turn labels (`turn_labels=True`; privileged, for evaluating credit): `hindsight().details["turn_labels"]`
holds one dict per turn: `progress` (a search whose top-k passages contain a gold answer, as whole words
after SQuAD normalisation, or an exactly correct answer), `delta` (-1 for progress, 0 otherwise), `event`
(`search_found_answer`, `correct_answer`, `wrong_answer` or None), `answer_rank` (the rank of the first
passage holding a gold answer, for searches), `supporting_titles_hit` (the supporting passages' titles
this search returned, for multi-hop sets) and `expert_action` (the oracle's query or answer).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from agentgym_opsd.contract import EnvUnavailable, Hindsight, TextEnv, Transition, hash_state
from agentgym_opsd.io import DataFileError
from agentgym_opsd.parsing import ParsedAction
from environments.searchqa.data import DATASETS, QAExample, default_data_file, load_questions
from environments.searchqa.metrics import normalize_answer, score_answer
from environments.searchqa.synthetic import ensure_synthetic_index, synthetic_questions
from retrieval_index.client import RetrievalClient, default_url
from retrieval_index.corpus import Hit, split_title
from retrieval_index.process import ServerStartError, shared_server

__all__ = ["SearchQAEnv", "DATASETS", "format_information", "build_instructions"]

def build_instructions(max_turns: int, topk: int) -> str:
    """The system prompt: the task and the action format (our own wording of Search-R1's protocol)."""
    return (
        "You answer questions by searching a collection of encyclopedia passages.\n"
        "On every turn, first think step by step inside <think> ... </think>. Then end the turn with exactly one of:\n"
        "  <search> your query </search>  to look something up. The top "
        f"{topk} passages come back inside <information> ... </information>;\n"
        "  <answer> your final answer </answer>  to finish. Give only the answer itself, a few words with no "
        "explanation, e.g. <answer> Paris </answer>.\n"
        "Search as often as you need, one search per turn: if the passages do not contain the answer, search "
        "again with a better query, and for questions that depend on another fact, find that fact first.\n"
        f"You have at most {max_turns} turns; an answer is required before they run out. A turn without exactly "
        "one <search> or <answer> block is wasted."
    )


def format_information(hits: list[Hit]) -> str:
    """Passages as the agent sees them: `<information>Doc 1(Title: T) text\\n...</information>`."""
    if not hits:
        return "<information>No passages matched the query.</information>"
    lines = []
    for rank, hit in enumerate(hits, start=1):
        title, text = split_title(hit.contents)
        lines.append(f"Doc {rank}(Title: {title}) {text}")
    return "<information>" + "\n".join(lines) + "</information>"


class SearchQAEnv(TextEnv):
    """Open-domain question answering with a search tool.

    Args:
        dataset: `nq`, `triviaqa`, `hotpotqa`, `synthetic` (the embedded, generated set) or any name for a
            question file given by `data_file`.
        split: which split to read (default per dataset; with `data_file` it only names the set).
        data_file: a question file in any supported format (see `data.py`); default: where
            `agentgym-opsd searchqa-data fetch` puts the dataset's split.
        server_url: the retrieval server (`http://host:port`).
        index_dir: serve this index from a child process shared by the process's envs.
        topk: passages per search.
        max_turns: turns before truncation (4).
        max_query_chars: longer queries are cut to this length before searching.
        limit: keep the first `limit` questions.
        check_server: ask the server's /health when the env is built (a clear error early).
        turn_labels: label every turn in `hindsight().details["turn_labels"]` (see the module docstring).
    """

    action_tags = ("search", "answer")
    max_turns = 4

    def __init__(
        self,
        *,
        dataset: str = "nq",
        split: str | None = None,
        data_file: str | None = None,
        server_url: str | None = None,
        index_dir: str | None = None,
        topk: int = 3,
        max_turns: int | None = None,
        max_query_chars: int = 1000,
        limit: int | None = None,
        check_server: bool = True,
        turn_labels: bool = False,
        render_mode: str | None = None,
    ) -> None:
        super().__init__(max_turns=max_turns, render_mode=render_mode, turn_labels=turn_labels)
        if not 1 <= int(topk) <= 100:
            raise ValueError(f"topk must be in [1, 100], got {topk}")
        if int(max_query_chars) < 1:
            raise ValueError(f"max_query_chars must be >= 1, got {max_query_chars}")
        self.dataset = str(dataset)
        self.topk = int(topk)
        self.max_query_chars = int(max_query_chars)
        splits, default_split = DATASETS.get(self.dataset, ((split or "test",), split or "test"))
        self.split = split or default_split
        self.examples = self._load_examples(data_file, limit, splits)
        self._by_id = {e.id: i for i, e in enumerate(self.examples)}
        self.server_url = self._resolve_server(server_url, index_dir)
        self.client = RetrievalClient(self.server_url)
        if check_server:
            self.client.health()  # RetrievalServerDown names the fix
        self.instructions = build_instructions(self.max_turns, self.topk)
        self.example: QAExample | None = None
        self.searches: list[str] = []
        self.seen_ids: list[str] = []
        self.seen_passages: list[str] = []
        self.final_answer: str | None = None
        self.scores: dict[str, float] | None = None

    # ------------------------------------------------------------------------------------------

    def _load_examples(self, data_file: str | None, limit: int | None, splits: tuple[str, ...]) -> list[QAExample]:
        if self.dataset == "synthetic" and data_file is None:
            examples = synthetic_questions(self.split)
            return examples[:limit] if limit is not None else examples
        if data_file is None:
            if self.split not in splits:
                raise ValueError(f"{self.dataset}: split {self.split!r} not in {splits}")
            path = default_data_file(self.dataset, self.split)
            if not path.is_file():
                raise EnvUnavailable(
                    f"no {self.dataset} {self.split} questions at {path}: pass data_file=PATH (NQ-open, TriviaQA, "
                    f"HotpotQA or FlashRAG jsonl), or fetch them with "
                    f"`agentgym-opsd searchqa-data fetch {self.dataset} --split {self.split}`"
                )
            data_file = str(path)
        try:
            return load_questions(data_file, dataset=self.dataset, limit=limit)
        except DataFileError as e:
            if "no such file" in str(e):
                raise EnvUnavailable(f"{e}; pass data_file= the path of a question file") from None
            raise

    def _resolve_server(self, server_url: str | None, index_dir: str | None) -> str:
        if server_url:
            return server_url
        if index_dir is not None or self.dataset == "synthetic":
            if index_dir is None:
                index_dir = str(ensure_synthetic_index())
            try:
                return shared_server(index_dir).url
            except ServerStartError as e:
                raise EnvUnavailable(f"could not start a retrieval server for {index_dir}: {e}") from None
        return default_url()

    # ------------------------------------------------------------------------------------------
    # TextEnv

    @property
    def num_tasks(self) -> int:
        return len(self.examples)

    def task_index(self, task_id: str) -> int:
        try:
            return self._by_id[task_id]
        except KeyError:
            raise KeyError(f"no question with id {task_id!r} in {self.dataset} {self.split}") from None

    def _load_task(self, index: int, options: dict[str, Any]) -> str:
        self.example = self.examples[index]
        self.task_id = self.example.id
        self.task_type = self.example.dataset
        self.searches, self.seen_ids, self.seen_passages = [], [], []
        self.final_answer, self.scores = None, None
        return f"Question: {self.example.question}"

    def _apply(self, action: ParsedAction) -> Transition:
        assert self.example is not None and action.content is not None
        if action.kind == "search":
            query = action.content[: self.max_query_chars]
            hits = self.client.search(query, self.topk)  # RetrievalServerDown propagates: a clear error
            self.searches.append(query)
            for hit in hits:
                if hit.docid not in self.seen_ids:
                    self.seen_ids.append(hit.docid)
                    self.seen_passages.append(hit.contents)
            info = {"search_query": query, "retrieved_ids": [h.docid for h in hits]}
            return Transition(format_information(hits), 0.0, False, admissible=True, info=info)
        # <answer>
        self.final_answer = action.content
        self.scores = score_answer(action.content, self.example.answers)
        return Transition(f"Answer received: {action.content}", self.scores["em"], True, admissible=True,
                          info={"answer": action.content, **self.scores})  # fmt: skip

    def _invalid(self, parsed: ParsedAction) -> str:
        return (
            f"Invalid turn ({parsed.error}). Think inside <think> ... </think>, then end the turn with exactly one "
            "<search> query </search> or <answer> answer </answer>."
        )

    def state_key(self) -> str:
        # The true state: the question, the passages found so far, and the answer once given.
        answer = None if self.final_answer is None else normalize_answer(self.final_answer)
        return hash_state("searchqa", self.task_id, tuple(sorted(self.seen_ids)), answer)

    def hindsight(self) -> Hindsight:
        ex = self.example
        if ex is None:
            return Hindsight(False, 0.0, "", {})
        scores = self.scores or {"em": 0.0, "f1": 0.0, "subem": 0.0}
        gold_norm = [normalize_answer(a) for a in ex.answers]
        answer_seen = any(g and g in normalize_answer(p) for p in self.seen_passages for g in gold_norm)
        support_found = [t for t in ex.supporting_titles if any(split_title(p)[0] == t for p in self.seen_passages)]
        lines = [f"Question: {ex.question}", f"Gold answers: {' | '.join(ex.answers)}",
                 f"Question type: {ex.question_type}"]
        if ex.supporting:
            lines.append("Supporting passages:")
            lines.extend(f"- {f['title']}: {f['sentence']}" for f in ex.supporting)
        details = {
            "dataset": ex.dataset,
            "question": ex.question,
            "gold_answers": list(ex.answers),
            "question_type": ex.question_type,
            "level": ex.level,
            "supporting_titles": ex.supporting_titles,
            "supporting_sentences": [dict(f) for f in ex.supporting],
            "final_answer": self.final_answer,
            "em": scores["em"],
            "f1": scores["f1"],
            "subem": scores["subem"],
            "searches": list(self.searches),
            "retrieved_ids": list(self.seen_ids),
            "answer_in_retrieved": answer_seen,
            "supporting_titles_retrieved": support_found,
        }
        if self.turn_labels is not None:
            details["turn_labels"] = [dict(label) for label in self.turn_labels]
        return Hindsight(scores["em"] == 1.0, float(scores["f1"]), "\n".join(lines), details)

    def _label_context(self) -> str | None:
        turn = self.expert_action()
        return None if turn is None else self.parse_action(turn).content

    def _label_turn(self, parsed: ParsedAction, transition: Transition, before: str | None) -> dict[str, Any]:
        assert self.example is not None
        label: dict[str, Any] = {
            "expert_action": before, "event": None, "answer_rank": None, "supporting_titles_hit": []
        }  # fmt: skip
        if parsed.ok and parsed.kind == "search":
            passages = dict(zip(self.seen_ids, self.seen_passages, strict=True))
            hits = [passages[docid] for docid in transition.info["retrieved_ids"]]
            # Gold answers as whole words: " 1 " is in " born on 1 may " but not in " born in 1990 ".
            gold = [f" {g} " for g in (normalize_answer(a) for a in self.example.answers) if g]
            texts = [f" {normalize_answer(p)} " for p in hits]
            rank = next((i for i, text in enumerate(texts, 1) if any(g in text for g in gold)), None)
            titles = {split_title(p)[0] for p in hits}
            label["answer_rank"] = rank
            label["supporting_titles_hit"] = [t for t in self.example.supporting_titles if t in titles]
            label["event"] = None if rank is None else "search_found_answer"
        elif parsed.ok:  # an answer
            label["event"] = "correct_answer" if (self.scores or {}).get("em") == 1.0 else "wrong_answer"
        progress = label["event"] in ("search_found_answer", "correct_answer")
        return {"progress": progress, "delta": -1 if progress else 0, **label}

    def expert_action(self) -> str | None:
        """The oracle: search the question once (checks retrieval end to end), then give the gold answer."""
        if self.example is None or self.done:
            return None
        if not self.searches:
            return f"<think>I should look this up first.</think>\n<search>{self.example.question}</search>"
        gold = self.example.answers[0]
        return f"<think>The answer is {gold}.</think>\n<answer>{gold}</answer>"

    def random_action(self, rng: np.random.Generator) -> str:
        """A few random words of the question and the last passages (a search, or a guess on the last turn)."""
        words = ((self.example.question if self.example else "") + " " + self.last_observation).split()
        words = [w.strip("<>()[]{}.,;:!?\"'") for w in words] or ["question"]
        words = [w for w in words if w] or ["question"]
        n = int(rng.integers(1, 4))
        return " ".join(words[int(i)] for i in rng.integers(0, len(words), size=n))

    def format_action(self, action: str, kind: str | None = None) -> str:
        """`<search>action</search>`, or `<answer>action</answer>` on the last turn (or when asked)."""
        if kind is None:
            kind = "answer" if self.turn >= self.max_turns - 1 else "search"
        return f"<{kind}>{action}</{kind}>"

    def close(self) -> None:
        self.client.close()
        super().close()
