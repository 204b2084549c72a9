"""Token rows with the real Qwen3 tokenizer: exact char -> token spans, verbatim responses, turn ids."""

from __future__ import annotations

import logging

import pytest
import torch
from episodes_for_tests import UNICODE_RESPONSES, make_episode

import agentgym_opsd
from agentgym_opsd import EpisodeRequest, RandomAgent, run_episodes
from trainer.credit import compute_advantages
from trainer.env_knowledge import credit_config
from trainer.rows import build_rows, episode_messages, render_prompt


def row_text(tok, rows, r, mask=None):
    ids = rows.input_ids[r, : int(rows.length[r])]
    if mask is not None:
        ids = ids[mask[r, : int(rows.length[r])]]
    return tok.decode(ids.tolist())


def offsets_of(tok, text):
    enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
    return enc["input_ids"], enc["offset_mapping"]


def test_full_rows_hold_each_response_verbatim_with_its_end_of_turn(qwen3):
    ep = make_episode(UNICODE_RESPONSES)
    rows = build_rows([ep], qwen3, span_mode="clean_step")
    assert rows.num_rows == 1 and rows.row_turn.tolist() == [-1]
    for k, turn in enumerate(ep.turns):
        assert row_text(qwen3, rows, 0, rows.turn_id == k) == turn.response + "<|im_end|>"
        # The span under clean_step is every generated token of the turn.
        assert torch.equal(rows.span[0] & (rows.turn_id[0] == k), rows.turn_id[0] == k)
    # Nothing else is marked generated: the generated tokens are exactly the responses + eots.
    generated = rows.turn_id[0] >= 0
    assert row_text(qwen3, rows, 0, rows.turn_id >= 0) == "".join(t.response + "<|im_end|>" for t in ep.turns)
    assert int(generated.sum()) == sum(len(offsets_of(qwen3, t.response)[0]) + 1 for t in ep.turns)
    # The row ends right after the last end-of-turn, padding has turn_id -1.
    assert row_text(qwen3, rows, 0).endswith(ep.turns[-1].response + "<|im_end|>")


def test_context_before_each_turn_is_the_rendered_prompt(qwen3):
    ep = make_episode(UNICODE_RESPONSES)
    rows = build_rows([ep], qwen3, span_mode="clean_step")
    ids = rows.input_ids[0]
    for k in range(len(ep.turns)):
        start = int((rows.turn_id[0] == k).nonzero()[0])
        prefix = qwen3.decode(ids[:start].tolist())
        assert prefix == render_prompt(qwen3, episode_messages(ep, k))
        if k == 0:  # no earlier assistant turn: the template's own rendering
            assert prefix == qwen3.apply_chat_template(episode_messages(ep, 0), tokenize=False,
                                                       add_generation_prompt=True)


def test_qwen3_reasoning_of_earlier_turns_is_kept(qwen3):
    """Qwen3's template drops earlier turns' <think> blocks; the rows keep what was generated."""
    ep = make_episode(UNICODE_RESPONSES)
    whole = qwen3.apply_chat_template(episode_messages(ep, len(ep.turns)), tokenize=False)
    assert "我想一想" not in whole  # the template rewrote turn 0
    rows = build_rows([ep], qwen3, span_mode="clean_step")
    assert "我想一想……先去冰箱🍳" in row_text(qwen3, rows, 0)


@pytest.mark.parametrize("context", ["full", "window:2"])
def test_action_span_maps_to_tokens_exactly(qwen3, context):
    ep = make_episode(UNICODE_RESPONSES, context=context)
    rows = build_rows([ep], qwen3, span_mode="action_only")
    for k, turn in enumerate(ep.turns):
        r = 0 if context == "full" else k
        in_turn = rows.turn_id[r] == k
        span = rows.span[r] & in_turn
        # The response's own tokens and offsets: the row holds exactly these ids for turn k.
        ids, offsets = offsets_of(qwen3, turn.response)
        assert rows.input_ids[r][in_turn].tolist() == ids + [qwen3.convert_tokens_to_ids("<|im_end|>")]
        if turn.step.action_span is None:
            assert not bool(span.any())  # no valid action: empty span
            continue
        a, b = turn.step.action_span
        expected = [(s < b and e > a) for s, e in offsets] + [False]  # eot is never in the action span
        assert span[in_turn].tolist() == expected
        # The span covers the whole block, tags included, and nothing beyond its overlapping tokens.
        covered = qwen3.decode(rows.input_ids[r][span].tolist())
        assert turn.response[a:b] in covered
        first = expected.index(True)
        last = len(expected) - 1 - expected[::-1].index(True)
        assert offsets[first][0] <= a < offsets[first][1] and offsets[last][0] < b <= offsets[last][1]


def test_tags_split_and_merged_across_tokens(qwen3):
    """`<action>` is several tokens, and `：<` is one token straddling the span start."""
    ep = make_episode(["好的：<action>去厨房🍳</action>"], context="window:1")
    response = ep.turns[0].response
    ids, offsets = offsets_of(qwen3, response)
    a, b = ep.turns[0].step.action_span
    assert response[a:b] == "<action>去厨房🍳</action>"
    straddling = [i for i, (s, e) in enumerate(offsets) if s < a < e]
    assert straddling, "the test text must have a token straddling the span start"
    assert len([i for i, (s, e) in enumerate(offsets) if a <= s and e <= a + len("<action>")]) >= 2  # tag split
    rows = build_rows([ep], qwen3, span_mode="action_only")
    span_ids = rows.input_ids[0][rows.span[0]].tolist()
    assert span_ids == [ids[i] for i, (s, e) in enumerate(offsets) if s < b and e > a]
    assert ids[straddling[0]] in span_ids
    assert qwen3.decode(span_ids).endswith("<action>去厨房🍳</action>")


def test_response_starting_with_newlines_is_not_merged_with_the_template(qwen3):
    ep = make_episode(["\n\n<action>look</action>"], context="window:1")
    rows = build_rows([ep], qwen3, span_mode="clean_step")
    first = int((rows.turn_id[0] == 0).nonzero()[0])
    assert qwen3.decode(rows.input_ids[0, :first].tolist()).endswith("<|im_start|>assistant\n")
    assert qwen3.decode(rows.input_ids[0, first : first + 1].tolist()) == "\n\n"


def test_window_rows_one_per_turn_with_the_templates_prompt(qwen3):
    ep = make_episode(UNICODE_RESPONSES, context="window:2")
    rows = build_rows([ep], qwen3, span_mode="clean_step")
    assert rows.row_turn.tolist() == [0, 1, 2, 3] and rows.row_episode.tolist() == [0, 0, 0, 0]
    for k in range(4):
        assert set(rows.turn_id[k].unique().tolist()) == {-1, k}
        prompt = qwen3.decode(rows.input_ids[k, : int(rows.prompt_len[k])].tolist())
        assert prompt == qwen3.apply_chat_template(episode_messages(ep, k), tokenize=False, add_generation_prompt=True)


def test_context_override_and_mixed_contexts(qwen3):
    a = make_episode(UNICODE_RESPONSES[:2], context="full", episode_id="a")
    b = make_episode(UNICODE_RESPONSES[:3], context="window:1", episode_id="b")
    rows = build_rows([a, b], qwen3, span_mode="clean_step")
    assert rows.row_episode.tolist() == [0, 1, 1, 1] and rows.row_turn.tolist() == [-1, 0, 1, 2]
    assert rows.contexts == ["full", "window:1"]
    rows = build_rows([a, b], qwen3, span_mode="clean_step", context="full")
    assert rows.row_episode.tolist() == [0, 1] and rows.contexts == ["full", "full"]


def test_template_that_alters_the_generation_prompt_is_followed_in_token_space(qwen3):
    """enable_thinking=False adds an empty think block to the generation prompt only (a re-rendered
    chat would not show it before earlier turns); the rows hold what a rollout fed the policy: every
    turn's context ends with that generation prompt."""
    ep = make_episode(UNICODE_RESPONSES[:3])
    rows = build_rows([ep], qwen3, chat_template_kwargs={"enable_thinking": False})
    for k in range(3):
        start = int((rows.turn_id[0] == k).nonzero()[0])
        assert qwen3.decode(rows.input_ids[0,
                                           :start].tolist()).endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    rows = build_rows([ep], qwen3, context="window:1", chat_template_kwargs={"enable_thinking": False})
    assert qwen3.decode(rows.input_ids[0, : int(rows.prompt_len[0])].tolist()).endswith("<think>\n\n</think>\n\n")


def test_turn_cut_at_its_token_cap_did_not_emit_the_end_of_turn(qwen3):
    ep = make_episode(UNICODE_RESPONSES[:3])
    ep.turns[1].info["finish_reason"] = "length"
    ep.turns[2].info["finish_reason"] = "length"
    rows = build_rows([ep], qwen3, span_mode="clean_step")
    assert row_text(qwen3, rows, 0, rows.turn_id == 0).endswith("<|im_end|>")
    assert row_text(qwen3, rows, 0, rows.turn_id == 1) == ep.turns[1].response  # no eot generated
    assert "<|im_end|>\n<|im_start|>user\nObservation 2." in row_text(qwen3, rows, 0)  # still in the context
    assert row_text(qwen3, rows, 0).endswith(ep.turns[2].response)  # the last one's is dropped


def test_truncation_is_counted_and_logged(qwen3, caplog):
    ep = make_episode(UNICODE_RESPONSES)
    full = build_rows([ep], qwen3, span_mode="clean_step")
    cut_at = int((full.turn_id[0] == 2).nonzero()[3])  # inside turn 2
    with caplog.at_level(logging.WARNING, logger="trainer.rows"):
        rows = build_rows([ep], qwen3, span_mode="clean_step", max_length=cut_at)
    assert rows.input_ids.shape[1] == cut_at
    lost = full.turn_id[0, cut_at:]
    assert rows.truncated_rows == 1 and rows.truncated_turns == 2
    assert rows.truncated_tokens == int((lost >= 0).sum())
    assert "cut at max_length" in caplog.text


def test_errored_episodes_are_refused(qwen3):
    ep = make_episode(UNICODE_RESPONSES[:1])
    ep.error = "step failed: boom"
    with pytest.raises(ValueError, match="errored"):
        build_rows([ep], qwen3)


def test_rows_from_a_played_env_feed_the_credit_core(qwen3):
    """GuessNumber (the example plug-in) played by a random agent, as a trainer would."""
    requests = [EpisodeRequest(seed=s % 3, group=f"task{s % 3}") for s in range(9)]
    episodes = run_episodes(lambda: agentgym_opsd.make("example/GuessNumber-v0"), RandomAgent(1), requests,
                            progress=False)
    rows = build_rows(episodes, qwen3, span_mode="action_only")
    assert rows.episode_group.tolist() == [0, 1, 2] * 3 and rows.group_names == ["task0", "task1", "task2"]
    # Equal env states share a state id (every episode starts from its task's initial state).
    first = rows.state_id[:, 0]
    assert first[0] == first[3] == first[6] and first[0] != first[1]
    assert rows.num_turns.tolist() == [len(e.turns) for e in episodes]
    assert rows.step_reward[:, :1].flatten().tolist() == [e.turns[0].reward for e in episodes]
    for r, e in enumerate(episodes):
        for k, turn in enumerate(e.turns):
            span = qwen3.decode(rows.input_ids[r][rows.span[r] & (rows.turn_id[r] == k)].tolist())
            assert span == turn.response  # the random agent writes only the action block

    g = torch.Generator().manual_seed(0)
    lp_S = -torch.rand(rows.input_ids.shape, generator=g)
    lp_T = lp_S + torch.randn(rows.input_ids.shape, generator=g)
    for method in ("grpo", "gigpo", "stepopsd", "agentopsd"):
        cfg = credit_config("example/GuessNumber-v0", method)
        rows_m = rows if cfg.span_mode == "action_only" else build_rows(episodes, qwen3, span_mode=cfg.span_mode)
        adv, _ = compute_advantages(rows_m.credit_batch(lp_S, lp_T), cfg, 0)
        assert bool((adv[rows_m.turn_id < 0] == 0).all())
        assert bool(torch.isfinite(adv).all())
