"""Context policies, Episode records and their JSONL files."""

from __future__ import annotations

import json

import pytest

import agentgym_opsd
from agentgym_opsd import (
    ContextPolicy,
    Episode,
    EpisodeRequest,
    ExpertAgent,
    load_episodes,
    run_episodes,
    save_episodes,
)
from agentgym_opsd.context import HistoryItem
from agentgym_opsd.io import DataFileError, append_jsonl, read_jsonl


def test_context_policy_parsing() -> None:
    assert str(ContextPolicy.parse("full")) == "full"
    assert ContextPolicy.parse("window:3") == ContextPolicy("window", 3)
    for bad in ("window:0", "window:x", "windows", ""):
        with pytest.raises(ValueError, match="use 'full' or 'window:K'"):
            ContextPolicy.parse(bad)


def test_full_and_window_messages() -> None:
    history = [HistoryItem(f"<action>a{i}</action>", f"a{i}", f"o{i}") for i in range(1, 5)]
    full = ContextPolicy.parse("full").messages("SYS", "START", history)
    assert [m["role"] for m in full] == ["system", "user"] + ["assistant", "user"] * 4
    assert full[2]["content"] == "<action>a1</action>" and full[-1]["content"] == "o4"

    window = ContextPolicy.parse("window:2").messages("SYS", "START", history)
    assert [m["role"] for m in window] == ["system", "user"]
    text = window[1]["content"]
    assert text.startswith("START") and "taken 4 step(s)" in text
    assert "a3" in text and "a4" in text and "a2" not in text and "o2" not in text
    assert text.rstrip().endswith("o4")
    # Before the first turn both policies show the same prompt.
    assert ContextPolicy.parse("window:2").messages("SYS", "START",
                                                    []) == ContextPolicy.parse("full").messages("SYS", "START", [])


class RecordingAgent(ExpertAgent):
    """The expert, remembering every prompt it was shown."""

    def __init__(self):
        super().__init__()
        self.seen: dict[str, list] = {}

    def act(self, messages, info, env):
        self.seen.setdefault(info["step"].episode_id, []).append(messages)
        return super().act(messages, info, env)


@pytest.mark.parametrize("context", ["full", "window:2"])
def test_episode_rebuilds_the_exact_prompts_the_agent_saw(context: str) -> None:
    agent = RecordingAgent()
    eps = run_episodes(
        lambda: agentgym_opsd.make("example/GuessNumber-v0"), agent, [EpisodeRequest(s) for s in range(6)],
        num_envs=3, context=context, progress=False,
    )
    for ep in eps:
        assert ep.success and ep.context == context
        assert [ep.messages(k) for k in range(ep.num_turns)] == agent.seen[ep.episode_id]


def test_jsonl_round_trip_is_exact(tmp_path) -> None:
    eps = run_episodes(
        lambda: agentgym_opsd.make("example/GuessNumber-v0"), agentgym_opsd.RandomAgent(1),
        [EpisodeRequest(s, group="g") for s in range(5)], progress=False,
    )
    eps[0].turns[0].info["note"] = "é中🙂 \u2028 \"quoted\""
    eps[0].meta["x"] = [1, 2.5, None]
    path = tmp_path / "eps.jsonl"
    save_episodes(path, eps)
    back = load_episodes(path)
    assert [e.to_dict() for e in back] == [e.to_dict() for e in eps]
    assert back[0].turns[0].step == eps[0].turns[0].step
    assert isinstance(back[0].turns[0].step.action_span, tuple)


def test_corrupt_and_torn_files_name_the_line(tmp_path) -> None:
    eps = run_episodes(lambda: agentgym_opsd.make("example/GuessNumber-v0"), ExpertAgent(), [EpisodeRequest(0)],
                       progress=False)
    path = tmp_path / "eps.jsonl"
    save_episodes(path, eps * 3)
    lines = path.read_text().splitlines()
    path.write_text("\n".join([lines[0], lines[1][:50], lines[2]]) + "\n")
    with pytest.raises(DataFileError, match=r"eps\.jsonl:2: invalid JSON"):
        load_episodes(path)
    assert len(load_episodes(path, skip_torn_lines=True)) == 2
    path.write_text(lines[0] + "\n" + json.dumps({"not": "an episode"}) + "\n")
    with pytest.raises(DataFileError, match=r"eps\.jsonl:2: not an episode record"):
        load_episodes(path)
    with pytest.raises(DataFileError, match="no such file"):
        load_episodes(tmp_path / "missing.jsonl")


def test_append_after_a_torn_line_starts_a_new_line(tmp_path) -> None:
    path = tmp_path / "log.jsonl"
    append_jsonl(path, [{"a": 1}])
    with open(path, "a") as f:
        f.write('{"b": ')  # a crash mid-append
    append_jsonl(path, [{"c": 3}])
    assert list(read_jsonl(path, skip_torn_lines=True)) == [{"a": 1}, {"c": 3}]


def test_episode_outcome_properties() -> None:
    ep = run_episodes(lambda: agentgym_opsd.make("example/GuessNumber-v0"), ExpertAgent(), [EpisodeRequest(0)],
                      progress=False)[0]
    assert ep.success and ep.score == 1.0 and ep.total_reward == 1.0 and ep.invalid_turns == 0
    keys = ep.state_keys_before()
    assert len(keys) == ep.num_turns and keys[0] == ep.initial.state_key
    assert keys[1:] == [t.step.state_key for t in ep.turns[:-1]]
    assert Episode.from_dict(ep.to_dict()).to_dict() == ep.to_dict()
