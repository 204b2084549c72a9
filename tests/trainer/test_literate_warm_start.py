"""The literate warm start: some warm-start examples carry the privileged contexts the teacher reads
(the hindsight block before an action, the expert's correction after a detour; the skill note), on
the example plug-in env (GuessNumber: its expert halves the range, a detour is a random guess)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from test_local_train import config

from agentgym_opsd import EpisodeRequest, make, run_episodes
from trainer.env_knowledge import credit_config, skill_text
from trainer.forward import block_causal_mask, token_logprobs
from trainer.local import LocalTrainer
from trainer.warm_start import PerturbedExpert, privileged_examples

pytestmark = pytest.mark.float_sensitive  # also run under a second set of CPU kernels (.ci/run)

ENV = "example/GuessNumber-v0"


def test_detours_remember_the_experts_correction():
    expert = PerturbedExpert(0.5, seed=3)
    episodes = run_episodes(lambda: make(ENV), expert, [EpisodeRequest(s, episode_id=f"e{s}") for s in range(8)],
                            progress=False)
    assert expert.detours and set(expert.corrections) == expert.detours
    differs = 0
    for (eid, turn), correction in expert.corrections.items():
        episode = next(e for e in episodes if e.episode_id == eid)
        # the state the detour was taken in: the same task, replayed up to that turn
        env = make(ENV)
        env.reset(seed=episode.seed)
        for earlier in episode.turns[:turn]:
            env.step(earlier.response)
        # the correction is the expert's halving guess in that state, not the random detour
        assert correction == env.unwrapped.expert_action()
        differs += episode.turns[turn].response != correction
    assert differs >= len(expert.corrections) // 2  # most random guesses are not the expert's


def test_privileged_examples_hold_the_block_and_the_correction(tmp_path: Path):
    run = LocalTrainer(config(tmp_path / "run", env_id=ENV, steps=0, max_new_tokens=8), progress=False)
    run.setup()
    tok = run.state.tokenizer
    expert = PerturbedExpert(0.6, seed=1)
    played = run_episodes(lambda: make(ENV), expert, [EpisodeRequest(s, episode_id=f"e{s}") for s in range(6)],
                          progress=False)
    assert expert.detours
    hindsight = credit_config(ENV, "stepopsd")
    skills = credit_config(ENV, "agentopsd")
    examples = privileged_examples(tok, played, expert.corrections, hindsight_config=hindsight, skills_config=skills,
                                   max_length=100_000)
    plain = [one for x in examples for one in x.unpacked()]  # a packed example: one sequence per turn
    assert any(x.packed for x in examples) and len(plain) > len(examples)
    texts = [(tok.decode(x.ids.tolist()), tok.decode(x.ids[x.target].tolist())) for x in plain]
    with_block = [(t, target) for t, target in texts if "<hindsight>" in t]
    with_note = [(t, target) for t, target in texts if skill_text(ENV, "guess") in t]
    assert with_block and with_note
    # A block example ends with its target: an action; after a detour, the expert's correction.
    corrections = {c for c in expert.corrections.values()}
    assert all(target.startswith("<action>guess ") and t.endswith(target) for t, target in with_block)
    assert any(target in corrections for _, target in with_block)
    assert any("final_correctness: incorrect" in t for t, _ in with_block) or all(e.success for e in played)
    # A skill-note example trains the expert's own turns only, never a detour's random guess: as many
    # target tokens as the plain warm start's targets of that episode.
    from trainer.rows import build_rows
    from trainer.warm_start import sft_targets

    rows = build_rows(played, tok, span_mode="clean_step")
    own, _ = sft_targets(rows, played, expert.detours)
    note_masks = sorted(int(x.target.sum()) for x in plain if skill_text(ENV, "guess") in tok.decode(x.ids.tolist()))
    assert note_masks == sorted(int(own[r].sum()) for r in range(rows.num_rows) if bool(own[r].any()))


def test_a_packed_hindsight_example_has_the_loss_and_gradients_of_one_sequence_per_turn(tmp_path: Path):
    """An episode's hindsight turns go in one packed example (the conversation once, each turn's block
    and target reading the conversation before that turn): its summed cross-entropy and its gradients
    equal those of the separate sequences (prefix + block + target per turn), in float32."""
    run = LocalTrainer(config(tmp_path / "run", env_id=ENV, steps=0, max_new_tokens=8), progress=False)
    run.setup()
    model = run.state.model.float()
    expert = PerturbedExpert(0.6, seed=2)
    played = run_episodes(lambda: make(ENV), expert, [EpisodeRequest(s, episode_id=f"e{s}") for s in range(4)],
                          progress=False)
    examples = privileged_examples(run.state.tokenizer, played, expert.corrections,
                                   hindsight_config=credit_config(ENV, "stepopsd"), max_length=100_000,
                                   turns_per_episode=3)
    packed = [x for x in examples if x.packed and len(x.unpacked()) >= 2]
    assert packed, "no episode gave two or more hindsight turns"

    def loss_and_grads(ids, attention, target, positions=None):
        model.zero_grad(set_to_none=True)
        loss = -(token_logprobs(model, ids, attention, target, position_ids=positions) * target).sum()
        loss.backward()
        return float(loss.detach()), [p.grad.detach().clone() for p in model.parameters()]

    for x in packed[:2]:
        valid = torch.ones(1, x.length, dtype=torch.bool)
        mask = block_causal_mask(x.segment[None], x.prefix[None], valid, torch.float32)
        got, got_grads = loss_and_grads(x.ids[None], mask, x.target[None], x.positions[None])
        want, want_grads = 0.0, None
        for one in x.unpacked():
            value, grads = loss_and_grads(one.ids[None], torch.ones(1, one.length, dtype=torch.long), one.target[None])
            want += value
            want_grads = grads if want_grads is None else [a + b for a, b in zip(want_grads, grads, strict=True)]
        assert got == pytest.approx(want, rel=1e-5)
        for a, b in zip(got_grads, want_grads, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
        assert x.length < sum(one.length for one in x.unpacked())  # the point: fewer tokens


@pytest.mark.parametrize("context", ["both", "hindsight"])
def test_a_literate_warm_start_trains_on_the_extra_examples(tmp_path: Path, context):
    run = LocalTrainer(config(tmp_path / context, env_id=ENV, steps=0, sft_episodes=16, sft_epochs=1, sft_noise=0.3,
                              sft_privileged=1.0, sft_privileged_context=context), progress=False)
    run.run()
    record = [r for r in (tmp_path / context / "metrics.jsonl").read_text().splitlines() if "sft_done" in r][0]
    import json

    assert json.loads(record)["sft/privileged_examples"] > 0
    with pytest.raises(Exception, match="sft-privileged"):
        config(tmp_path / "bad", sft_privileged=1.5).validate()
