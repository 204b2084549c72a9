"""A plug-in env gets every credit method without a line in trainer/: the example plug-in
(tests/data/example_plugin) registers its credit defaults and its skill note with its id, and one
StepOPSD and one AgentOPSD update train on it with them."""

from __future__ import annotations

from pathlib import Path

import pytest
from agentgym_example_plugin import CREDIT_DEFAULTS, SKILL_NOTE
from test_local_train import config

from trainer.local import LocalTrainer
from trainer.teacher import build_teacher_sequences

pytestmark = pytest.mark.float_sensitive  # also run under a second set of CPU kernels (.ci/run)


@pytest.mark.parametrize("method", ["stepopsd", "agentopsd"])
def test_the_example_plugin_trains_with_opsd_credit_and_its_own_skill_note(tmp_path: Path, method):
    run = LocalTrainer(config(tmp_path / method, env_id="example/GuessNumber-v0", method=method, steps=1,
                              max_new_tokens=12, tasks_per_step=2, group_size=2, sft_episodes=32, sft_epochs=40,
                              sft_lr=1e-2, temperature=0.7), progress=False)  # warm-started: it writes action blocks
    credit = run.credit
    if method == "stepopsd":  # the plug-in's registered defaults, not the trainer's generic ones
        assert (credit.span_mode, credit.invalid_coef, credit.lam_mix) == (
            CREDIT_DEFAULTS["span_mode"], CREDIT_DEFAULTS["invalid_coef"], CREDIT_DEFAULTS["lam_mix"])
    else:
        assert (credit.span_mode, credit.invalid_coef) == ("clean_step", CREDIT_DEFAULTS["invalid_coef"])
    run.start()
    episodes = run.rollout()
    rows = run.rows(episodes)
    sequences, _ = build_teacher_sequences(run.state.tokenizer, episodes, rows, credit, max_length=100_000)
    teacher_text = run.state.tokenizer.decode(sequences[0].ids.tolist())
    if method == "agentopsd":
        assert SKILL_NOTE in teacher_text  # the privileged note the plug-in wrote
    else:
        assert "<hindsight>" in teacher_text and "The number was" in teacher_text  # its own hindsight reference
    record = run.rl_step()
    assert record["step"] == 1 and record["teacher/tokens"] > 0 and record["credit/scored_tokens"] > 0
