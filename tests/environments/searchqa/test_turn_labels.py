"""Search-QA's turn labels (`turn_labels=True`): a search whose top-k holds a gold answer, or a correct
answer; privileged (only in hindsight), and nothing the agent sees changes when they are on. Against
the embedded synthetic set, served by a real retrieval server over its own Lucene index."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

import agentgym_opsd
from environments.searchqa.env import SearchQAEnv
from environments.searchqa.metrics import normalize_answer
from environments.searchqa.synthetic import ensure_synthetic_index
from retrieval_index.client import RetrievalClient
from retrieval_index.corpus import split_title

ENV_ID = "agentgym/SearchQA-Synthetic-v0"


@pytest.fixture(scope="module")
def index_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(ensure_synthetic_index(tmp_path_factory.mktemp("synthetic")))


@pytest.fixture(scope="module")
def env(index_dir: str) -> SearchQAEnv:
    e = agentgym_opsd.make(ENV_ID, index_dir=index_dir, split="all", turn_labels=True, max_turns=6).unwrapped
    yield e
    e.close()


def holds_gold(passage: str, answers: list[str]) -> bool:
    words = normalize_answer(passage).split()
    golds = [g.split() for g in map(normalize_answer, answers) if g]
    return any(g == words[i : i + len(g)] for g in golds for i in range(len(words)))


def search(env: SearchQAEnv, query: str) -> tuple[dict, list[str]]:
    """Search `query` in the env; its label and the passages the server returns for it (asked directly)."""
    expert = env.parse_action(env.expert_action()).content
    env.step(f"<think>Look it up.</think>\n<search>{query}</search>")
    label = env.hindsight().details["turn_labels"][-1]
    assert label["expert_action"] == expert and label["turn"] == env.turn
    passages = [h.contents for h in RetrievalClient(env.server_url).search(query, env.topk)]
    return label, passages


def test_searches_are_progress_when_their_top_k_holds_a_gold_answer(env) -> None:
    found = {"first hop": 0, "second hop": 0}
    two_hop = [i for i, ex in enumerate(env.examples) if ex.question_type == "two-hop"][:25]
    for index in two_hop:
        env.reset(options={"task_index": index})
        ex = env.example
        first, second = ex.supporting_titles[:2]
        for hop, title in (("first hop", first), ("second hop", second)):
            label, passages = search(env, title)
            expected = any(holds_gold(p, ex.answers) for p in passages)
            assert label["progress"] is expected and label["delta"] == (-1 if expected else 0), (ex.question, hop)
            assert label["event"] == ("search_found_answer" if expected else None)
            rank = next((i for i, p in enumerate(passages, 1) if holds_gold(p, ex.answers)), None)
            assert label["answer_rank"] == rank
            titles = [split_title(p)[0] for p in passages]
            assert label["supporting_titles_hit"] == [t for t in ex.supporting_titles if t in titles]
            found[hop] += expected
    # The synthetic two-hop questions are written so that the first passage never holds the answer.
    assert found["second hop"] >= 0.8 * len(two_hop) and found["first hop"] < found["second hop"], found


def test_oracle_answers_and_invalid_turns(env) -> None:
    env.reset(seed=4)
    ex = env.example
    assert env.parse_action(env.expert_action()).content == ex.question
    env.step("<think>no block</think>")
    env.step("<search>a</search><answer>b</answer>")  # two blocks: malformed
    env.step(env.expert_action())  # the oracle searches the question
    label, _ = search(env, "zzzz qqqq xxxx")  # after a search, the oracle would answer
    assert label["expert_action"] == ex.answers[0]
    env.step("<answer>certainly not the answer</answer>")
    labels = env.hindsight().details["turn_labels"]
    for malformed in labels[:2]:
        assert malformed == {"turn": malformed["turn"], "progress": False, "delta": 0, "expert_action": ex.question,
                             "event": None, "answer_rank": None, "supporting_titles_hit": []}  # fmt: skip
    assert labels[2]["expert_action"] == ex.question
    wrong = {"progress": False, "delta": 0, "event": "wrong_answer", "expert_action": ex.answers[0]}
    assert labels[4] == {**labels[4], **wrong}

    env.reset(seed=4)
    env.step(env.expert_action())
    _, reward, terminated, _, info = env.step(f"<answer> {ex.answers[0].upper()} </answer>")
    assert reward == 1.0 and terminated
    labels = info["hindsight"].details["turn_labels"]
    correct = {"progress": True, "delta": -1, "event": "correct_answer", "expert_action": ex.answers[0]}
    assert labels[1] == {**labels[1], **correct}
    json.loads(json.dumps(info["hindsight"].to_dict()))


def test_a_gold_answer_counts_only_as_whole_words(env) -> None:
    env.reset(seed=0)
    title = env.example.supporting_titles[0]
    word = next(w for w in title.split() if len(w) > 4)
    env.example = dataclasses.replace(env.example, answers=[word[:-2]])  # a word's prefix: not the answer
    label, passages = search(env, title)
    assert word[:-2].lower() in " ".join(passages).lower() and not label["progress"] and label["answer_rank"] is None
    env.example = dataclasses.replace(env.example, answers=[word])
    label, _ = search(env, title)
    assert label["progress"] and label["answer_rank"] is not None


def test_labels_change_nothing_the_agent_sees(index_dir: str) -> None:
    plain = agentgym_opsd.make(ENV_ID, index_dir=index_dir, split="all").unwrapped
    labelled = agentgym_opsd.make(ENV_ID, index_dir=index_dir, split="all", turn_labels=True).unwrapped
    rng = np.random.default_rng(7)
    try:
        for seed in range(0, 60, 6):
            plain_obs, plain_info = plain.reset(seed=seed)
            obs, info = labelled.reset(seed=seed)
            assert obs == plain_obs and info == plain_info
            for k in range(1, plain.max_turns + 1):
                roll = rng.random()
                turn = (plain.expert_action() if roll < 0.4 else "<think>hm</think>" if roll < 0.5
                        else plain.format_action(plain.random_action(rng)))  # fmt: skip
                plain_out, out = plain.step(turn), labelled.step(turn)
                assert out[:4] == plain_out[:4], (seed, k, turn)
                hs, plain_hs = out[4].pop("hindsight", None), plain_out[4].pop("hindsight", None)
                assert out[4] == plain_out[4]
                if out[2] or out[3]:
                    break
            assert "turn_labels" not in plain_hs.details and len(hs.details.pop("turn_labels")) == k
            assert hs == plain_hs
    finally:
        plain.close()
        labelled.close()
