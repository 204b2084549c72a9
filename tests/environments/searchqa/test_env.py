"""The Search-QA env against the real retrieval server (Lucene index of a ../shared/data/wiki slice)."""

from __future__ import annotations

import time
from pathlib import Path

import gymnasium as gym
import pytest

import agentgym_opsd
from agentgym_opsd.agents import make_agent
from agentgym_opsd.contract import EnvUnavailable
from agentgym_opsd.io import DataFileError
from agentgym_opsd.rollout import EpisodeRequest, run_episodes
from environments.searchqa.env import SearchQAEnv, format_information
from retrieval_index.client import RetrievalClient, RetrievalServerDown
from retrieval_index.corpus import split_title
from retrieval_index.process import RetrievalServer


@pytest.fixture
def hotpot_env(retrieval_server, shared_data):
    env = agentgym_opsd.make(
        "agentgym/SearchQA-HotpotQA-v0",
        data_file=str(shared_data("qa", "hotpotqa_distractor_dev_sample_100.jsonl")),
        server_url=retrieval_server.url,
    )
    yield env
    env.close()


def test_search_then_answer(hotpot_env, retrieval_server) -> None:
    raw: SearchQAEnv = hotpot_env.unwrapped
    obs, info = hotpot_env.reset(seed=0)
    example = raw.example
    assert obs == f"Question: {example.question}" and info["step"].task_type == "hotpotqa"
    assert "<search>" in raw.instructions and "<answer>" in raw.instructions and "4 turns" in raw.instructions

    obs, reward, terminated, truncated, info = hotpot_env.step(
        f"<think>Find the first entity.</think>\n<search>{example.supporting[0]['title']}</search>"
    )
    expected = RetrievalClient(retrieval_server.url).search(example.supporting[0]["title"], 3)
    assert obs == format_information(expected)
    assert obs.startswith("<information>Doc 1(Title: ") and obs.endswith("</information>")
    title, text = split_title(expected[0].contents)
    assert obs.startswith(f"<information>Doc 1(Title: {title}) {text}")
    assert (reward, terminated, truncated) == (0.0, False, False)
    assert info["retrieved_ids"] == [h.docid for h in expected] and info["step"].action_kind == "search"

    obs, reward, terminated, truncated, info = hotpot_env.step(
        f"<think>Done.</think><answer> {example.answers[0].upper()}! </answer>")
    assert (reward, terminated, truncated) == (1.0, True, False)
    assert info["em"] == 1.0 and info["f1"] == 1.0 and info["subem"] == 1.0
    hs = info["hindsight"]
    assert hs.success and hs.score == 1.0
    assert hs.details["gold_answers"] == example.answers and hs.details["question_type"] in ("bridge", "comparison")
    assert hs.details["supporting_titles"] == example.supporting_titles
    assert [f["sentence"] for f in hs.details["supporting_sentences"]] == [f["sentence"] for f in example.supporting]
    assert example.supporting[0]["sentence"] in hs.reference and example.answers[0] in hs.reference
    assert hs.details["searches"] == [example.supporting[0]["title"]]


def test_wrong_answer_partial_credit_and_truncation(hotpot_env) -> None:
    raw: SearchQAEnv = hotpot_env.unwrapped
    hotpot_env.reset(options={"task_id": "5a7613c15542994ccc9186bf"})  # gold: Gesellschaft mit beschränkter Haftung
    *_, info = hotpot_env.step("<answer>Gesellschaft</answer>")
    assert info["em"] == 0.0 and info["f1"] == pytest.approx(0.4) and info["subem"] == 0.0
    assert not info["hindsight"].success and info["hindsight"].score == pytest.approx(0.4)

    hotpot_env.reset(seed=1)
    for turn in range(1, raw.max_turns + 1):
        obs, reward, terminated, truncated, info = hotpot_env.step(f"<search>query {turn}</search>")
        assert not terminated
    assert truncated and turn == 4 and reward == 0.0 and info["hindsight"].details["final_answer"] is None


@pytest.mark.parametrize(
    "turn,error",
    [
        ("I think it is Paris.", "missing"),
        ("<search>a</search><answer>b</answer>", "multiple action blocks"),
        ("<search>a</search> then <search>b</search>", "multiple action blocks"),
        ("<think>hmm <answer>x</answer></think>", "missing"),  # tags inside <think> do not count
        ("<answer>  </answer>", "empty <answer>"),
        ("<search>open", "unclosed <search>"),
    ],
)
def test_malformed_turns_are_invalid_steps(hotpot_env, turn: str, error: str) -> None:
    hotpot_env.reset(seed=2)
    key = hotpot_env.unwrapped.state_key()
    obs, reward, terminated, truncated, info = hotpot_env.step(turn)
    step = info["step"]
    assert not step.format_ok and error in step.format_error and step.admissible is False
    assert (reward, terminated) == (0.0, False) and obs.startswith("Invalid turn")
    assert hotpot_env.unwrapped.state_key() == key  # nothing happened


def test_state_key_tracks_what_was_found(retrieval_server, shared_data) -> None:
    kwargs = {"data_file": str(shared_data("qa", "nq_open_dev_part1.jsonl")), "server_url": retrieval_server.url}
    a, b = agentgym_opsd.make("agentgym/SearchQA-NQ-v0",
                              **kwargs), agentgym_opsd.make("agentgym/SearchQA-NQ-v0", **kwargs)
    _, ia = a.reset(seed=5)
    _, ib = b.reset(seed=5)
    assert ia["step"].state_key == ib["step"].state_key
    start = ia["step"].state_key
    _, _, _, _, ia = a.step("<search>moon landing</search>")
    _, _, _, _, ib = b.step("<search>  moon landing </search>")
    assert ia["step"].state_key == ib["step"].state_key  # same question, same passages found
    assert ia["step"].state_key != start  # passages were found: a new state
    _, _, _, _, ib2 = b.step("<search>Apollo programme astronauts</search>")
    assert ib2["step"].state_key != ib["step"].state_key  # new passages: a new state
    _, _, _, _, ia2 = a.step("<search>zzzz qqqq</search>")  # nothing found: the same state
    assert ia2["step"].state_key == ia["step"].state_key


def test_long_queries_are_cut_not_refused(retrieval_server, shared_data) -> None:
    env = agentgym_opsd.make("agentgym/SearchQA-TriviaQA-v0",
                             data_file=str(shared_data("qa", "triviaqa_sm_sub_part1.jsonl")),
                             server_url=retrieval_server.url, max_query_chars=50)  # fmt: skip
    env.reset(seed=0)
    obs, _, _, _, info = env.step("<search>" + "onion vegetable " * 900 + "</search>")
    assert len(info["search_query"]) == 50 and obs.startswith("<information>")
    env.close()


def test_data_and_server_errors_are_clear(retrieval_server, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("AGENTGYM_OPSD_CACHE", str(tmp_path / "home"))
    with pytest.raises(EnvUnavailable, match="agentgym-opsd searchqa-data fetch nq --split test"):
        agentgym_opsd.make("agentgym/SearchQA-NQ-v0", server_url=retrieval_server.url)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "q", "answer": ["a"]}\n{"question": 3, "answer": ["a"]}\n')
    with pytest.raises(DataFileError, match=r"bad\.jsonl:2"):
        agentgym_opsd.make("agentgym/SearchQA-NQ-v0", data_file=str(bad), server_url=retrieval_server.url)
    good = tmp_path / "good.jsonl"
    good.write_text('{"question": "q", "answer": ["a"]}\n')
    with pytest.raises(RetrievalServerDown, match=r"agentgym-opsd serve-retrieval --index DIR --port 9"):
        agentgym_opsd.make("agentgym/SearchQA-NQ-v0", data_file=str(good), server_url="http://127.0.0.1:9")


def test_server_killed_mid_episode_then_restarted(wiki_index: Path, shared_data) -> None:
    server = RetrievalServer(wiki_index).start()
    try:
        env = agentgym_opsd.make("agentgym/SearchQA-NQ-v0", data_file=str(shared_data("qa", "nq_open_dev_part1.jsonl")),
                                 server_url=server.url)  # fmt: skip
        env.reset(seed=3)
        env.step("<search>moon landing</search>")
        server.kill()
        t0 = time.perf_counter()
        with pytest.raises(RetrievalServerDown,
                           match=f"{server.url}.*agentgym-opsd serve-retrieval --index DIR --port {server.port}"):
            env.step("<search>Apollo 17</search>")
        assert time.perf_counter() - t0 < 10, "the env must fail fast, not hang"
        server.start()  # same port
        obs, *_ = env.step("<search>Apollo 17</search>")  # the same episode goes on
        assert obs.startswith("<information>Doc 1")
        obs, _ = env.reset(seed=4)  # and new ones work
        assert env.step("<search>moon</search>")[0].startswith("<information>")
        env.close()
    finally:
        server.stop()


def test_rollout_records_a_dead_server_as_an_errored_episode(wiki_index: Path, shared_data) -> None:
    server = RetrievalServer(wiki_index).start()
    url = server.url
    data_file = str(shared_data("qa", "nq_open_dev_part1.jsonl"))
    factory = lambda: agentgym_opsd.make("agentgym/SearchQA-NQ-v0", data_file=data_file,  # noqa: E731
                                         server_url=url, check_server=False)
    server.kill()
    episodes = run_episodes(factory, make_agent("searchqa-baseline"), [EpisodeRequest(seed=0)], num_envs=1)
    assert episodes[0].error and "agentgym-opsd serve-retrieval" in episodes[0].error


def test_synthetic_env_serves_its_own_index(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("AGENTGYM_OPSD_CACHE", str(tmp_path))
    env = gym.make("agentgym/SearchQA-Synthetic-v0", split="train")
    raw: SearchQAEnv = env.unwrapped
    assert raw.num_tasks == 370 and "127.0.0.1" in raw.server_url
    assert list((tmp_path / "searchqa" / "synthetic").glob("index-v*"))  # built under the data folder
    obs, _ = env.reset(seed=0)
    single = next(i for i, e in enumerate(raw.examples) if e.question_type == "single-hop")
    env.reset(options={"task_index": single})
    obs, *_ = env.step(f"<search>{raw.example.question}</search>")
    assert raw.example.supporting[0]["title"] in obs
    env.close()
