"""Teacher contexts (StepOPSD hindsight block, AgentOPSD skill note) and teacher scoring with a seeded,
randomly initialised tiny Qwen3 on the real Qwen3 tokenizer."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch
from episodes_for_tests import UNICODE_RESPONSES, make_episode
from tolerances import assert_close_to_scale

from trainer.credit import compute_advantages
from trainer.env_knowledge import SKILLS_DIR, credit_config, skill_text
from trainer.forward import row_logprobs
from trainer.rows import build_rows, episode_messages, render_prompt
from trainer.teacher import (
    SKILL_HEADER,
    build_teacher_sequences,
    hindsight_block,
    peer_episodes,
    privileged_messages,
    score_teacher,
)

pytestmark = pytest.mark.float_sensitive  # also run under a second set of CPU kernels (.ci/run)

ALFWORLD = "agentgym/ALFWorld-Heat-v0"


@pytest.fixture(scope="session")
def tiny(qwen3):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(
        vocab_size=len(qwen3), hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, max_position_embeddings=4096, tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    return Qwen3ForCausalLM(config).eval()


def group():
    """A mixed group (one success, two failures) and an all-failure group, four turns each at most."""
    return [
        make_episode(UNICODE_RESPONSES, success=True, episode_id="win", group="A"),
        make_episode(UNICODE_RESPONSES[::-1], success=False, episode_id="lose1", group="A"),
        make_episode(UNICODE_RESPONSES[:2], success=False, episode_id="lose2", group="A"),
        make_episode(UNICODE_RESPONSES[1:3], success=False, episode_id="other", group="B"),
    ]


def reference_logprobs(model, ids: list[int]) -> torch.Tensor:
    """Plain HF forward, full logits: lp[t] = log p(ids[t] | ids[<t]) (lp[0] = 0)."""
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0].float()
    lp = torch.log_softmax(logits[:-1], dim=-1).gather(1, torch.tensor(ids[1:]).unsqueeze(1)).squeeze(1)
    return torch.cat([torch.zeros(1), lp])


# ---------------------------------------------------------------------------------------------
# Skill notes


REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    "env_id,family,types",
    [
        ("agentgym/ALFWorld-All-v0", "alfworld", ["pick", "look", "clean", "heat", "cool", "pick_two"]),
        ("agentgym/WebShop-v0", "webshop", ["beauty", "electronics", "fashion", "garden", "grocery"]),
        ("agentgym/SearchQA-NQ-v0", "searchqa", ["single_hop", "multi_hop"]),
    ],
)
def test_every_task_type_has_its_own_skill_note_in_its_env_package(env_id, family, types):
    general = (SKILLS_DIR / "general.txt").read_text().strip()
    texts = set()
    for t in types:
        path = REPO / "environments" / family / "skills" / f"{t}.txt"
        assert path.is_file() and len(path.read_text().split()) >= 30, path
        text = skill_text(env_id, t)
        assert text.startswith(general) and text.endswith(path.read_text().strip())
        texts.add(text)
    assert len(texts) == len(types)


@pytest.mark.parametrize(
    "env_id,task_type,file",
    [
        ("agentgym/ALFWorld-Heat-v0", "pick_heat_then_place_in_recep", "alfworld/skills/heat.txt"),
        ("agentgym/ALFWorld-PickTwo-v0", "pick_two_obj_and_place", "alfworld/skills/pick_two.txt"),
        ("agentgym/WebShop-v0", "food", "webshop/skills/grocery.txt"),
        ("agentgym/SearchQA-HotpotQA-v0", "hotpotqa", "searchqa/skills/multi_hop.txt"),
        ("agentgym/SearchQA-NQ-v0", "nq", "searchqa/skills/single_hop.txt"),
    ],
)
def test_skill_aliases(env_id, task_type, file):
    assert skill_text(env_id, task_type).endswith((REPO / "environments" / file).read_text().strip())


def test_unknown_task_gets_the_general_note_and_a_user_folder_replaces_ours(tmp_path):
    assert skill_text("agentgym/ALFWorld-Heat-v0", "juggling") == (SKILLS_DIR / "general.txt").read_text().strip()
    (tmp_path / "general.txt").write_text("Be brief.")
    (tmp_path / "heat.txt").write_text("Use the microwave.")
    assert skill_text(ALFWORLD, "heat", tmp_path) == "Be brief.\n\nUse the microwave."
    assert skill_text(ALFWORLD, "cool", tmp_path).startswith("Be brief.\n\nTask family: cool")  # the env's own note
    (tmp_path / "general.txt").unlink()
    with pytest.raises(FileNotFoundError, match="general.txt"):
        skill_text(ALFWORLD, "heat", tmp_path)


def test_privileged_messages_prepend_the_skill_to_the_system_prompt():
    ep = make_episode(UNICODE_RESPONSES[:2])
    messages = episode_messages(ep, 1)
    out = privileged_messages(messages, "SKILL")
    assert out[0]["content"] == SKILL_HEADER + "SKILL\n\n" + messages[0]["content"]
    assert out[1:] == messages[1:] and messages[0]["content"] == ep.instructions  # input untouched


# ---------------------------------------------------------------------------------------------
# Hindsight block


def test_peer_goes_only_to_failed_episodes_of_mixed_groups():
    episodes = group()
    episodes.append(make_episode(UNICODE_RESPONSES[:1], success=True, episode_id="win2", group="A"))
    assert peer_episodes(episodes) == {1: 0, 2: 0}  # the first success; group B has none


def test_hindsight_block_contents():
    episodes = group()
    config = credit_config(ALFWORLD, "stepopsd")
    text, cut = hindsight_block(episodes[1], episodes[0], config)
    assert not cut
    assert text.startswith(
        "<hindsight>\nfinal_correctness: incorrect\npeer_correct_trajectory: <peer_correct_trajectory>\n"
    )
    assert "step 1: go to fridge 1\nstep 2: take egg 1 from fridge 1\n" in text  # the peer's actions (default)
    assert "observation:" not in text
    assert "step 4: (invalid turn)" in text  # the winner's last turn had no action
    with_obs, _ = hindsight_block(episodes[1], episodes[0], config.replace(peer_format="actions_observations"))
    assert "step 1: go to fridge 1\nobservation: Observation 1." in with_obs and len(with_obs) > len(text)
    assert text.endswith(f"reference: {episodes[1].hindsight.reference}\n</hindsight>\n")
    text, _ = hindsight_block(episodes[0], None, config)
    reference = episodes[0].hindsight.reference
    assert text == f"<hindsight>\nfinal_correctness: correct\nreference: {reference}\n</hindsight>\n"
    bare = config.replace(hindsight_reference=False, hindsight_peer=False)
    assert hindsight_block(episodes[1], episodes[0], bare)[0] == \
        "<hindsight>\nfinal_correctness: incorrect\n</hindsight>\n"
    short = config.replace(peer_max_chars=20)
    text, cut = hindsight_block(episodes[1], episodes[0], short)
    assert cut and "characters cut]" in text


# ---------------------------------------------------------------------------------------------
# Teacher sequences


def test_stepopsd_teacher_sequence_is_prefix_block_span(qwen3):
    episodes = group()
    config = credit_config(ALFWORLD, "stepopsd")
    rows = build_rows(episodes, qwen3, span_mode=config.span_mode)
    seqs, counters = build_teacher_sequences(qwen3, episodes, rows, config, max_length=4096, packing=False)
    assert counters == {"truncated": 0, "truncated_tokens": 0, "peer_dropped": 0, "peer_cut": 0}
    peers = peer_episodes(episodes)
    n_spans = 0
    for seq in seqs:
        r = seq.row
        i = int(rows.row_episode[r])
        s = int(seq.row_pos[0])
        k = int(rows.turn_id[r, s])
        block = hindsight_block(episodes[i], episodes[peers[i]] if i in peers else None, config)[0]
        turn = episodes[i].turns[k]
        a, b = turn.step.action_span
        text = qwen3.decode(seq.ids.tolist())
        prefix = qwen3.decode(rows.input_ids[r, :s].tolist())
        assert text.startswith(prefix + block)
        assert turn.response[a:b] in text[len(prefix + block) :]
        # Targets are the row's own span tokens.
        assert torch.equal(seq.ids[seq.target], rows.input_ids[r, seq.row_pos])
        assert bool(rows.span[r, seq.row_pos].all())
        n_spans += 1
    assert n_spans == sum(1 for e in episodes for t in e.turns if t.step.action_span is not None)


def test_agentopsd_teacher_sequence_is_skill_prompt_then_the_row(qwen3):
    episodes = group()
    config = credit_config(ALFWORLD, "agentopsd")
    rows = build_rows(episodes, qwen3, span_mode=config.span_mode)
    seqs, _ = build_teacher_sequences(qwen3, episodes, rows, config, max_length=4096)
    assert len(seqs) == rows.num_rows  # one sequence (forward) per row
    for seq in seqs:
        r = seq.row
        ep = episodes[int(rows.row_episode[r])]
        skill = skill_text(ep.env_id, ep.task_type)
        teacher_prompt = render_prompt(qwen3, privileged_messages(episode_messages(ep, 0), skill))
        rest = qwen3.decode(rows.input_ids[r, int(rows.prompt_len[r]) : int(rows.length[r])].tolist())
        assert qwen3.decode(seq.ids.tolist()) == teacher_prompt + rest
        assert torch.equal(seq.ids[seq.target], rows.input_ids[r, seq.row_pos])
        assert torch.equal(seq.row_pos, rows.span[r].nonzero().squeeze(1))


def test_span_mode_mismatch_is_refused(qwen3):
    episodes = group()
    rows = build_rows(episodes, qwen3, span_mode="action_only")
    with pytest.raises(ValueError, match="span_mode"):
        build_teacher_sequences(qwen3, episodes, rows, credit_config(ALFWORLD, "agentopsd"), max_length=4096)


# ---------------------------------------------------------------------------------------------
# Scoring with the tiny Qwen3


def test_row_logprobs_match_a_plain_forward(qwen3, tiny):
    episodes = group()[:2]
    rows = build_rows(episodes, qwen3, span_mode="clean_step")
    lp = row_logprobs(tiny, rows, micro_batch_tokens=512)
    for r in range(rows.num_rows):
        L = int(rows.length[r])
        ref = reference_logprobs(tiny, rows.input_ids[r, :L].tolist())
        gen = rows.turn_id[r, :L] >= 0
        assert_close_to_scale(lp[r, :L][gen], ref[gen])
        assert bool((lp[r, :L][~gen] == 0).all())


@pytest.mark.parametrize("context", ["full", "window:2"])
@pytest.mark.parametrize("peer", [True, False])
def test_stepopsd_strategies_give_the_per_turn_log_probs(qwen3, tiny, context, peer):
    """The prefix-cache and the packed teacher give, to 1e-5, what one sequence per turn (the student's
    prefix, the hindsight block, the span) gives, in float32, with and without the peer block."""
    episodes = group() if context == "full" else [
        make_episode(UNICODE_RESPONSES, success=i == 0, episode_id=f"w{i}", group="W", context=context)
        for i in range(3)]
    config = credit_config(ALFWORLD, "stepopsd", hindsight_peer=peer)
    rows = build_rows(episodes, qwen3, span_mode=config.span_mode)
    single = score_teacher(tiny, qwen3, episodes, rows, config, strategy="per-turn")
    n_turns = sum(1 for e in episodes for t in e.turns if t.step.action_span is not None)
    assert single.sequences == n_turns
    assert torch.equal(single.scored, rows.span & (torch.arange(rows.span.shape[1]) >= 1))
    for strategy in ("prefix", "packed"):
        scores = score_teacher(tiny, qwen3, episodes, rows, config, strategy=strategy, micro_batch_tokens=700)
        assert torch.equal(scores.scored, single.scored)
        assert_close_to_scale(scores.logprobs, single.logprobs)
        if context == "full" or strategy == "prefix":
            # the prefix is not run once per turn; `prefix` also runs the rows' common prefix (the
            # system prompt) once, so window rows (one turn each) share it too
            assert scores.tokens < single.tokens
        else:
            assert scores.tokens == single.tokens  # one turn per row: nothing to share within a row
    # An independent check of one turn: full logits of prefix + block + span through the plain model.
    seqs, _ = build_teacher_sequences(qwen3, episodes, rows, config, max_length=4096, packing=False)
    seq = seqs[1]
    ref = reference_logprobs(tiny, seq.ids.tolist())
    assert_close_to_scale(single.logprobs[seq.row, seq.row_pos], ref[seq.target])


def test_stepopsd_prefix_runs_the_last_layer_only_where_log_probs_are_read(qwen3, tiny):
    """In the prefix strategy's segment forwards the last layer's MLP sees only the positions whose
    outputs give the span's log-probs (not the hindsight block before them), its cache-only forwards
    none, the first layer's MLP every position; the log-probs stay the per-turn ones."""
    episodes = group()
    config = credit_config(ALFWORLD, "stepopsd")
    rows = build_rows(episodes, qwen3, span_mode=config.span_mode)
    seen = {0: [], 1: []}
    hooks = [tiny.model.layers[i].mlp.register_forward_hook(
        lambda module, args, out, i=i: seen[i].append(args[0].shape[1])) for i in (0, 1)]
    try:
        scores = score_teacher(tiny, qwen3, episodes, rows, config, strategy="prefix", micro_batch_tokens=700)
    finally:
        for hook in hooks:
            hook.remove()
    single = score_teacher(tiny, qwen3, episodes, rows, config, strategy="per-turn")
    assert_close_to_scale(scores.logprobs, single.logprobs)
    assert sum(seen[1]) > 0
    assert sum(seen[1]) * 4 < sum(seen[0])  # the blocks (most of each segment) skipped
    assert type(tiny.model.layers[1].mlp).__name__ == "Qwen3MLP"  # the swap is undone afterwards


def test_stepopsd_strategies_agree_at_the_length_limit(qwen3, tiny):
    """Turns whose context does not fit are dropped (or lose the peer block) the same way whatever the
    strategy, and the scored ones have the same log-probs."""
    episodes = group()
    config = credit_config(ALFWORLD, "stepopsd")
    rows = build_rows(episodes, qwen3, span_mode=config.span_mode)
    seqs, _ = build_teacher_sequences(qwen3, episodes, rows, config, max_length=100_000, packing=False)
    limit = sorted(s.length for s in seqs)[len(seqs) // 2]
    single = score_teacher(tiny, qwen3, episodes, rows, config, strategy="per-turn", max_length=limit)
    prefix = score_teacher(tiny, qwen3, episodes, rows, config, strategy="prefix", max_length=limit)
    assert single.truncated > 0 and (prefix.truncated, prefix.peer_dropped) == (single.truncated, single.peer_dropped)
    assert torch.equal(prefix.scored, single.scored)
    assert_close_to_scale(prefix.logprobs, single.logprobs)
    with pytest.raises(ValueError, match="teacher strategy"):
        score_teacher(tiny, qwen3, episodes, rows, config, strategy="fastest")


def test_agentopsd_scoring_equals_a_plain_forward(qwen3, tiny):
    episodes = group()
    config = credit_config(ALFWORLD, "agentopsd")
    rows = build_rows(episodes, qwen3, span_mode=config.span_mode)
    per_row = score_teacher(tiny, qwen3, episodes, rows, config, micro_batch_tokens=1, strategy="per-turn")
    assert per_row.forwards == rows.num_rows == per_row.sequences  # one forward per row
    scores = score_teacher(tiny, qwen3, episodes, rows, config, micro_batch_tokens=1)  # the note once, then each row
    assert scores.forwards == 1 + rows.num_rows and scores.sequences == rows.num_rows
    seqs, _ = build_teacher_sequences(qwen3, episodes, rows, config, max_length=4096)
    for seq in seqs:
        ref = reference_logprobs(tiny, seq.ids.tolist())
        assert_close_to_scale(per_row.logprobs[seq.row, seq.row_pos], ref[seq.target])
        assert_close_to_scale(scores.logprobs[seq.row, seq.row_pos], ref[seq.target])
    # The privileged note changes the teacher's view: its log-probs differ from the student's.
    student = row_logprobs(tiny, rows)
    assert float((scores.logprobs - student)[scores.scored].abs().max()) > 1e-4


@pytest.mark.parametrize("context", ["full", "window:2"])
def test_agentopsd_shared_note_gives_the_one_sequence_per_row_log_probs(qwen3, tiny, context):
    """The skill note's keys and values computed once per distinct note and reused for every row give,
    to 1e-5 in float32, what one sequence per row gives: rows of different lengths, two task types
    (two notes), rows cut at the length limit, micro-batches of several rows and of one."""
    heat = group()
    cool = [make_episode(UNICODE_RESPONSES[i:], success=i == 1, episode_id=f"cool{i}", group="C", task_type="cool")
            for i in range(3)]
    episodes = heat + cool
    if context != "full":
        episodes = [make_episode(UNICODE_RESPONSES[: 4 - i % 3], success=i % 2 == 0, episode_id=f"w{i}",
                                 group=f"W{i % 2}", task_type=("heat", "cool")[i % 2], context=context)
                    for i in range(4)]
    config = credit_config(ALFWORLD, "agentopsd")
    rows = build_rows(episodes, qwen3, span_mode=config.span_mode)
    assert len(set(rows.length.tolist())) > 2  # rows of different lengths
    seqs, _ = build_teacher_sequences(qwen3, episodes, rows, config, max_length=100_000)
    for limit in (100_000, sorted(s.length for s in seqs)[len(seqs) // 2] - 3):
        per_row = score_teacher(tiny, qwen3, episodes, rows, config, strategy="per-turn", max_length=limit)
        for budget in (16384, 1):
            shared = score_teacher(tiny, qwen3, episodes, rows, config, max_length=limit, micro_batch_tokens=budget)
            assert (shared.truncated, shared.truncated_tokens) == (per_row.truncated, per_row.truncated_tokens)
            assert torch.equal(shared.scored, per_row.scored) and bool(shared.scored.any())
            assert_close_to_scale(shared.logprobs, per_row.logprobs)
            assert shared.tokens < per_row.tokens  # each note's prefix runs once, not once per row
        if limit < 100_000:
            assert per_row.truncated > 0
    notes = {(e.env_id, e.task_type) for e in episodes}
    # micro_batch_tokens=1: one forward per row with a token left to score, plus one per note
    prefix_forwards = shared.forwards - int(shared.scored.any(dim=1).sum())
    assert prefix_forwards == len(notes)
    # The shared prefix is the rows' common token prefix: at least the note, never a scored token.
    note = qwen3(SKILL_HEADER + skill_text(ALFWORLD, "heat"), add_special_tokens=False)["input_ids"]
    assert shared.tokens <= per_row.tokens - (rows.num_rows - len(notes)) * (len(note) - 2)


def test_agentopsd_truncation_keeps_the_skill_and_counts_the_tail(qwen3, tiny, caplog):
    episodes = group()[:1]
    config = credit_config(ALFWORLD, "agentopsd")
    rows = build_rows(episodes, qwen3, span_mode=config.span_mode)
    full, _ = build_teacher_sequences(qwen3, episodes, rows, config, max_length=4096)
    limit = full[0].length - 20
    with caplog.at_level(logging.WARNING, logger="trainer.teacher"):
        scores = score_teacher(tiny, qwen3, episodes, rows, config, max_length=limit)
    assert scores.truncated == 1 and scores.truncated_tokens > 0
    assert int(scores.scored.sum()) == int(rows.span[:, 1:].sum()) - scores.truncated_tokens
    last = int(rows.length[0]) - 1
    assert not bool(scores.scored[0, last]) and bool(scores.scored[0, int(rows.prompt_len[0])])
    seqs, _ = build_teacher_sequences(qwen3, episodes, rows, config, max_length=limit)
    assert skill_text(ALFWORLD, "heat") in qwen3.decode(seqs[0].ids.tolist())  # never cut
    assert "did not fit" in caplog.text


def test_stepopsd_drops_the_peer_first_then_counts_unscored_turns(qwen3, tiny):
    episodes = group()
    config = credit_config(ALFWORLD, "stepopsd")
    rows = build_rows(episodes, qwen3, span_mode=config.span_mode)
    seqs, _ = build_teacher_sequences(qwen3, episodes, rows, config, max_length=100_000, packing=False)
    lose1 = [s for s in seqs if int(rows.row_episode[s.row]) == 1]
    need_with_peer = min(s.length for s in lose1)
    short = make_episode(UNICODE_RESPONSES, success=False, episode_id="x")
    need_without = need_with_peer - (
        len(qwen3(hindsight_block(episodes[1], episodes[0], config)[0])["input_ids"])
        - len(qwen3(hindsight_block(short, None, config)[0])["input_ids"])
    )
    limit = need_without  # fits only without the peer trajectory
    scores = score_teacher(tiny, qwen3, episodes, rows, config, max_length=limit, strategy="per-turn")
    assert scores.peer_dropped >= 1
    tiny_limit = 40  # nothing fits: every turn unscored and counted
    scores = score_teacher(tiny, qwen3, episodes, rows, config, max_length=tiny_limit)
    assert scores.truncated == sum(1 for e in episodes for t in e.turns if t.step.action_span is not None)
    assert not bool(scores.scored.any())
    batch = rows.credit_batch(row_logprobs(tiny, rows), scores.logprobs, scores.scored, scores.truncated)
    adv, diag = compute_advantages(batch, config, 0)
    assert diag["credit/teacher_truncated"] == scores.truncated and diag["credit/scored_tokens"] == 0
    torch.testing.assert_close(adv, compute_advantages(batch, config.replace(method="grpo"), 0)[0])


@pytest.mark.parametrize("method", ["stepopsd", "agentopsd"])
def test_window_rows_end_to_end(qwen3, tiny, method):
    episodes = [make_episode(UNICODE_RESPONSES, success=i == 0, episode_id=f"w{i}", context="window:2")
                for i in range(3)]
    config = credit_config(ALFWORLD, method)
    rows = build_rows(episodes, qwen3, span_mode=config.span_mode)
    scores = score_teacher(tiny, qwen3, episodes, rows, config)
    assert scores.sequences == int(rows.span.any(dim=1).sum())  # one insertion point per window row
    batch = rows.credit_batch(row_logprobs(tiny, rows), scores.logprobs, scores.scored, scores.truncated)
    adv, diag = compute_advantages(batch, config, 0)
    assert bool(torch.isfinite(adv).all()) and diag["credit/scored_tokens"] == int(scores.scored.sum())
    base = compute_advantages(batch, config.replace(method="grpo"), 0)[0]
    assert torch.equal(torch.sign(adv), torch.sign(base)) and not torch.equal(adv, base)
