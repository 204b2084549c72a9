"""The local trainer end to end on a tiny Qwen3: updates, credit wiring, exact resume, the CLI."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

import trainer.credit as credit_core
from agentgym_opsd import Hindsight, TextEnv, Transition, hash_state, register_env
from agentgym_app.cli import main
from agentgym_opsd.episode import load_episodes
from agentgym_opsd.io import read_jsonl
from trainer.local import LocalTrainer, TrainConfig, TrainError
from trainer.loss import clipped_pg_loss, micro_batches

pytestmark = pytest.mark.float_sensitive  # also run under a second set of CPU kernels (.ci/run)


class ParityEnv(TextEnv):
    """Two turns of free text; the episode succeeds when their actions' total length is even.

    An untrained policy wins about half of its episodes, so every group of a few episodes has mixed
    outcomes and non-zero advantages from the first update."""

    instructions = "Write anything in <action>...</action>, twice. An even total length wins."
    allow_bare_action = True
    max_turns = 2

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.index, self.lengths = 0, []

    @property
    def num_tasks(self) -> int:
        return 4

    def _load_task(self, index, options):
        self.index, self.lengths = index, []
        self.task_id, self.task_type = f"parity-{index}", "parity"
        return f"Task {index}: write your first text."

    def _apply(self, action):
        self.lengths.append(len(action.content))
        if len(self.lengths) < 2:
            return Transition("Now your second text.", admissible=True)
        won = sum(self.lengths) % 2 == 0
        return Transition("You won." if won else "You lost.", reward=float(won), terminated=True, admissible=True)

    def state_key(self):
        return hash_state(self.index, tuple(self.lengths))

    def hindsight(self):
        won = len(self.lengths) == 2 and sum(self.lengths) % 2 == 0
        return Hindsight(won, float(won), "An even total length of the two actions wins.", {})

    def expert_action(self):
        return self.format_action("ab")


register_env("trainertest/Parity-v0", ParityEnv, family="TrainerTest", subset="parity",
             description="two turns; an even total length wins (trainer tests)")


def config(out: Path, **changes) -> TrainConfig:
    base = dict(
        env_id="trainertest/Parity-v0", out=str(out), method="grpo", tokenizer="trained", vocab_size=300,
        tiny_hidden=32, tiny_layers=1, steps=2, tasks_per_step=2, group_size=4, max_new_tokens=6, lr=3e-3,
        eval_episodes=0, seed=1, micro_batch_tokens=512,
    )
    base.update(changes)
    return TrainConfig(**base)


def test_micro_batches_pack_rows_within_the_token_budget() -> None:
    lengths = [5, 30, 7, 12, 40, 3]
    batches = micro_batches(lengths, 40)
    assert sorted(i for b in batches for i in b) == list(range(6))
    for b in batches:
        assert len(b) == 1 or max(lengths[i] for i in b) * len(b) <= 40
    assert micro_batches(lengths, 1) == [[5], [0], [2], [3], [1], [4]]  # each row alone, shortest first


def test_clipped_loss_is_ppo() -> None:
    old = torch.tensor([[0.0, -1.0, -1.0, -1.0]])
    new = torch.tensor([[0.0, -1.0, -0.5, -1.5]])
    adv = torch.tensor([[0.0, 1.0, 1.0, -1.0]])
    mask = torch.tensor([[False, True, True, True]])
    loss, clipped, _ = clipped_pg_loss(new, old, adv, mask, 0.2)
    r = torch.exp(torch.tensor([0.0, 0.5, -0.5]))
    # token 2: r = 1.65 > 1.2 with A > 0 -> clipped to 1.2; token 3: r = 0.61 < 0.8 with A < 0 -> 0.8
    want = float(-(1.0 * r[0]) - 1.2 * 1.0 - (-1.0 * 0.8))
    assert torch.isclose(loss, torch.tensor(want)) and int(clipped) == 2


def test_two_updates_change_loss_and_parameters_with_the_credit_cores_advantages(tmp_path, monkeypatch) -> None:
    produced, consumed, snapshots = [], [], []
    real = credit_core.compute_advantages

    def spy(batch, cfg, step, **kw):
        out = real(batch, cfg, step, **kw)
        produced.append((batch, out[0]))
        return out

    monkeypatch.setattr("trainer.local.compute_advantages", spy)  # the name the trainer calls
    run = LocalTrainer(config(tmp_path / "run"), progress=False)
    real_update = run.update

    def update(rows, old_logp, advantages, ref_logp):
        consumed.append(advantages)
        snapshots.append({k: v.detach().clone() for k, v in run.state.model.state_dict().items()})
        return real_update(rows, old_logp, advantages, ref_logp)

    episodes = []
    run.update = update
    run.hooks["after_rollout"].append(lambda tr, eps: episodes.append(eps))
    records = []
    run.hooks["after_update"].append(lambda tr, rec: records.append(rec))
    run.run()

    assert len(produced) == len(consumed) == 2
    for (batch, adv), used, eps in zip(produced, consumed, episodes):
        assert used is adv  # the loss used exactly the credit core's tensor
        assert adv.abs().sum() > 0
        # and that tensor is GRPO of the episodes' outcomes: (R - mean_g) / (std_g + 1e-6) on generated tokens
        rewards = torch.tensor([float(e.success) - 0.1 * e.invalid_turns for e in eps], dtype=torch.float64)
        groups = {}
        for i, e in enumerate(eps):
            groups.setdefault(e.group, []).append(i)
        want = torch.zeros(len(eps), dtype=torch.float64)
        for members in groups.values():
            x = rewards[members]
            want[members] = (x - x.mean()) / (x.std() + 1e-6)
        for r in range(adv.shape[0]):
            generated = batch.turn_id[r] >= 0
            episode = int(batch.row_episode[r])
            assert torch.allclose(adv[r][generated].double(), want[episode].expand(int(generated.sum())), atol=1e-5)
            assert (adv[r][~generated] == 0).all()
    final = run.state.model.state_dict()
    for before, after in zip(snapshots, snapshots[1:] + [final]):
        assert any(not torch.equal(before[k], after[k]) for k in before)  # each update moved the weights
    assert records[0]["loss"] != 0 and records[1]["loss"] != 0 and records[0]["loss"] != records[1]["loss"]
    assert records[0]["grad_norm"] > 0 and records[0]["update/tokens"] > 0
    assert "credit/reward_mean" in records[0] and records[0]["credit/success_rate"] == records[0]["train/success"]
    out = tmp_path / "run"
    lines = list(read_jsonl(out / "metrics.jsonl"))
    assert [r["step"] for r in lines if r["kind"] == "train"] == [1, 2]
    if sys.platform.startswith("linux"):  # each update logs its own resident peak: at least the model it holds
        weights_gb = sum(p.numel() * p.element_size() for p in run.state.model.parameters()) / 2**30
        for r in (r for r in lines if r["kind"] == "train"):
            phases = [r[f"memory/{phase}_peak_gb"] for phase in ("rollout", "scoring", "update")]
            assert all(weights_gb < peak < 64 for peak in phases), r
            assert r["memory/peak_gb"] == max(phases)  # the update's peak is its largest phase's
    for name in ("success.png", "reward.png", "kl.png", "credit.png"):
        assert (out / "curves" / name).stat().st_size > 1000
    assert (out / "model" / "config.json").exists() and (out / "report.json").exists()
    assert any((out / "tb").iterdir())


class Killed(Exception):
    pass


WEIGHTS = {  # which weights train (trainer.trainable): all, the top layer, LoRA adapters
    "all": {},
    "top-layer": {"tiny_layers": 2, "train_layers": 1},
    "lora": {"tiny_layers": 2, "lora_rank": 4},
}


@pytest.mark.parametrize("weights", list(WEIGHTS))
@pytest.mark.parametrize("method", ["stepopsd"])
def test_a_killed_and_resumed_run_equals_an_unbroken_one(tmp_path, method, weights) -> None:
    """Killed in the middle of update 3 (after its rollout), then resumed from the update-2
    checkpoint: model, optimizer, teacher snapshot, KL reference, RNG and metrics all match; with
    only some weights trained, the checkpoint holds only those."""
    changes = dict(method=method, steps=4, kl_coef=0.05, eval_episodes=4, eval_every=2, mini_batches=2,
                   sft_episodes=4, sft_epochs=1, credit={"teacher_refresh": 3}, save_every=1, **WEIGHTS[weights])
    unbroken = LocalTrainer(config(tmp_path / "a", **changes), progress=False)
    unbroken.run()

    broken = LocalTrainer(config(tmp_path / "b", **changes), progress=False)

    def kill(tr, eps):
        if tr.state.step == 2:
            raise Killed()

    broken.hooks["after_rollout"].append(kill)
    with pytest.raises(Killed):
        broken.run()
    assert broken.state.step == 2
    resumed = LocalTrainer(config(tmp_path / "b", **changes), resume=True, progress=False)
    resumed.run()

    a, b = unbroken.state, resumed.state
    for x, y in [(a.model, b.model), (a.teacher_model, b.teacher_model), (a.reference_model, b.reference_model)]:
        sx, sy = x.state_dict(), y.state_dict()
        assert all(torch.equal(sx[k], sy[k]) for k in sx)
    assert not all(torch.equal(unbroken.state.model.state_dict()[k], unbroken.state.teacher_model.state_dict()[k])
                   for k in unbroken.state.model.state_dict())  # the snapshot is stale: it was taken at update 3
    oa, ob = unbroken.state.optimizer.state_dict()["state"], resumed.state.optimizer.state_dict()["state"]
    assert all(torch.equal(oa[k]["exp_avg_sq"], ob[k]["exp_avg_sq"]) for k in oa)
    assert unbroken.state.rng.bit_generator.state == resumed.state.rng.bit_generator.state

    def stable(path):
        return [{k: v for k, v in r.items()
                 if not (k.startswith(("time", "memory")) or "seconds" in k or "per_s" in k)}
                for r in read_jsonl(path)]

    assert stable(tmp_path / "a" / "metrics.jsonl") == stable(tmp_path / "b" / "metrics.jsonl")
    updates = [r for r in read_jsonl(tmp_path / "a" / "metrics.jsonl") if "optimizer_steps" in r]
    assert len(updates) == 4 and all(r["optimizer_steps"] == 2 for r in updates)  # two mini-batches each
    a_eps = (tmp_path / "a" / "episodes" / "update_00004.jsonl").read_text()
    assert a_eps == (tmp_path / "b" / "episodes" / "update_00004.jsonl").read_text()
    saved = torch.load(tmp_path / "b" / "checkpoint.pt", weights_only=True)
    trained = {n for n, p in resumed.state.model.named_parameters() if p.requires_grad}
    assert set(saved["model"]) == (set(resumed.state.model.state_dict()) if weights == "all" else trained)
    assert set(saved["teacher"]) == set(saved["reference"]) == set(saved["model"])


def test_resume_refuses_other_settings_and_a_fresh_run_refuses_an_old_directory(tmp_path) -> None:
    LocalTrainer(config(tmp_path / "r", steps=1), progress=False).run()
    with pytest.raises(TrainError, match="--resume"):
        LocalTrainer(config(tmp_path / "r", steps=1), progress=False).run()
    with pytest.raises(TrainError, match="other settings.*lr"):
        LocalTrainer(config(tmp_path / "r", steps=2, lr=1e-2), resume=True, progress=False).run()
    report = LocalTrainer(config(tmp_path / "r", steps=2), resume=True, progress=False).run()
    assert report["steps"] == 2


def test_resume_refuses_a_checkpoint_of_another_format_and_names_the_fix(tmp_path) -> None:
    from trainer.checkpoint import CHECKPOINT, FORMAT

    LocalTrainer(config(tmp_path / "r", steps=1), progress=False).run()
    saved = torch.load(tmp_path / "r" / CHECKPOINT, weights_only=True)
    assert saved["format"] == FORMAT
    torch.save({**saved, "format": FORMAT + 1}, tmp_path / "r" / CHECKPOINT)
    with pytest.raises(TrainError, match=f"format {FORMAT + 1}.*start a new run with another --out"):
        LocalTrainer(config(tmp_path / "r", steps=2), resume=True, progress=False).run()


def test_cli_train_and_resume(tmp_path, capsys) -> None:
    out = tmp_path / "cli"
    args = ["train", "--env", "trainertest/Parity-v0", "--method", "gigpo", "--model", "tiny", "--tokenizer", "trained",
            "--vocab-size", "300", "--tiny-hidden", "32", "--tiny-layers", "1", "--steps", "1", "--group-size", "2",
            "--tasks-per-step", "2", "--max-new-tokens", "4", "--eval-episodes", "2", "--sft-episodes", "2",
            "--sft-epochs", "1", "--out", str(out), "--no-progress"]
    assert main(args) == 0
    assert "held-out success" in capsys.readouterr().out
    saved = json.loads((out / "config.json").read_text())
    assert saved["method"] == "gigpo" and saved["group_size"] == 2
    assert main(args) == 2 and "--resume" in capsys.readouterr().err
    assert main(["train", "--out", str(out), "--resume", "--steps", "2", "--no-progress"]) == 0
    assert json.loads((out / "report.json").read_text())["steps"] == 2
    assert main(["train", "--out", str(out), "--resume", "--lr", "1", "--no-progress"]) == 2
    assert "other settings" in capsys.readouterr().err
    assert main(["train", "--env", "nope/Nope-v0", "--out", str(tmp_path / "x")]) == 2
    assert "no env registered" in capsys.readouterr().err
    assert main(["train", "--env", "trainertest/Parity-v0", "--method", "ppo", "--out", str(tmp_path / "x")]) == 2
    assert main(["train", "--env", "trainertest/Parity-v0", "--credit", "lam_mixx=1", "--out", str(tmp_path / "x")]) \
        == 2
    assert "lam_mixx" in capsys.readouterr().err
    assert main(["train", "--out", str(tmp_path / "y")]) == 2 and "--env is required" in capsys.readouterr().err


@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("context", ["full", "window:1"])
def test_rows_hold_exactly_the_ids_the_policy_sampled_and_was_conditioned_on(tmp_path, monkeypatch, context,
                                                                            temperature):
    """Token-in, token-out, with an untrained policy (whose samples are often not what its tokenizer
    would make of their text): turn by turn, the row's tokens before a turn are exactly the ids the
    policy was conditioned on, and the turn's tokens are exactly the ids it sampled (its stop id
    included); the old log-probs, at the sampling temperature, equal the sampling log-probs."""
    from trainer.local import sampling_consistency
    from trainer.sampling import HFPolicyAgent

    seen: dict[str, list[tuple[list[int], list[int], list[float]]]] = {}
    original = HFPolicyAgent._sample

    def recording(self, prompts, keys=None, *rest):
        result = original(self, prompts, keys, *rest)
        for prompt, key, (ids, lps, _) in zip(prompts, keys, result, strict=True):
            seen.setdefault(key, []).append((list(prompt), list(ids), list(lps)))
        return result

    monkeypatch.setattr(HFPolicyAgent, "_sample", recording)
    cfg = config(tmp_path / "run", context=context, max_new_tokens=8, temperature=temperature)
    run = LocalTrainer(cfg, progress=False)
    run.start()
    episodes = run.rollout()
    rows = run.rows(episodes)
    tok = run.state.tokenizer
    checked = retokenized_same = 0
    for r in range(rows.num_rows):
        episode = episodes[int(rows.row_episode[r])]
        turns = [int(rows.row_turn[r])] if context != "full" else range(episode.num_turns)
        for k in turns:
            conditioned_on, sampled, _ = seen[episode.episode_id][k]
            positions = (rows.turn_id[r] == k).nonzero().squeeze(1)
            start = int(positions[0])
            assert rows.input_ids[r, :start].tolist() == conditioned_on
            assert rows.input_ids[r, positions].tolist() == sampled
            assert positions.tolist() == list(range(start, start + len(sampled)))
            content = sampled[:-1] if sampled[-1] in run.state.rollout_agent.stop_ids else sampled
            retokenized_same += tok(episode.turns[k].response, add_special_tokens=False)["input_ids"] == content
            checked += 1
    assert checked == sum(e.num_turns for e in episodes) == 16
    if temperature == 1.0:  # the test can fail: re-tokenizing the text would not give these ids
        assert retokenized_same < checked
    old = run.logprobs(run.state.model, rows)
    stats = sampling_consistency(rows, old)
    assert stats["rollout/recorded_turns"] == 1.0
    assert stats["rollout/logprob_gap"] < 1e-4
    assert rows.num_rows == (8 if context == "full" else 16)


def test_perturbed_expert_detours_are_seeded_and_recovered_from() -> None:
    from agentgym_opsd import EpisodeRequest, make, run_episodes
    from trainer.warm_start import PerturbedExpert

    def play(num_envs, noise, seed=0):
        agent = PerturbedExpert(noise, seed=seed)
        requests = [EpisodeRequest(s, episode_id=f"e{s}") for s in range(12)]
        eps = run_episodes(lambda: make("example/GuessNumber-v0"), agent, requests, num_envs=num_envs, progress=False)
        return eps, agent.detours

    clean, none = play(4, 0.0)
    one, detours_one = play(1, 0.5)
    four, detours_four = play(4, 0.5)
    other, detours_other = play(4, 0.5, seed=1)
    assert not none and detours_one and detours_one == detours_four != detours_other
    assert [e.to_dict() for e in one] == [e.to_dict() for e in four]  # batching does not change the draws
    assert all(e.success for e in one)  # the expert replans after each detour and still wins
    assert sum(e.num_turns for e in one) > sum(e.num_turns for e in clean)
    for episode_id, k in detours_one:  # a detour is one of the actions admissible in the state it was taken in
        episode = next(e for e in one if e.episode_id == episode_id)
        state = episode.initial if k == 0 else episode.turns[k - 1].step
        assert episode.turns[k].action in state.admissible_actions


def test_sft_with_detours_trains_only_on_the_experts_turns(tmp_path) -> None:
    out = tmp_path / "sft"
    run = LocalTrainer(config(out, env_id="example/GuessNumber-v0", sft_episodes=8, sft_epochs=2, sft_noise=0.5,
                              steps=0, eval_episodes=0), progress=False)
    run.start()
    done = next(r for r in read_jsonl(out / "metrics.jsonl") if r["kind"] == "sft_done")
    from agentgym_opsd import load_episodes

    episodes = load_episodes(out / "episodes" / "sft_expert.jsonl")
    rows = run.rows(episodes)
    generated = int((rows.turn_id >= 0).sum())
    assert done["sft/detour_turns"] > 0 and 0 < done["sft/generated_tokens"] < generated
    losses = [r["sft/loss"] for r in read_jsonl(out / "metrics.jsonl") if r["kind"] == "sft"]
    assert len(losses) == 2 and losses[1] < losses[0]


def test_linear_lr_schedule_decays_from_lr_to_lr_over_steps(tmp_path) -> None:
    from trainer.optim import rl_learning_rate

    cfg = config(tmp_path / "lr", lr=1e-3, steps=4, lr_schedule="linear")
    rates = [rl_learning_rate(cfg, k) for k in range(1, 5)]
    assert rates == pytest.approx([1e-3, 7.5e-4, 5e-4, 2.5e-4])
    constant = config(tmp_path / "lr", lr=1e-3, steps=4)
    assert rl_learning_rate(constant, 4) == 1e-3
    with pytest.raises(TrainError, match="lr-schedule"):
        config(tmp_path / "lr", lr_schedule="cosine").validate()


def test_a_fixed_list_of_tasks_is_played_in_order_and_the_kl_floor_is_rounding(tmp_path) -> None:
    """`train_seeds` makes every update play the same tasks (T per update, cycling through the list);
    `kl_floor` is the KL between the old log-probs and the update's own first forward, before any
    optimizer step: the same policy through two code paths, so rounding, far below what a step moves."""
    run = LocalTrainer(config(tmp_path, steps=3, tasks_per_step=2, train_seeds=[2, 0, 1], eval_episodes=0,
                              mini_batches=2), progress=False)
    run.run()
    tasks = [sorted({e.task_id for e in load_episodes(tmp_path / "episodes" / f"update_{u:05d}.jsonl")})
             for u in (1, 2, 3)]
    assert tasks == [["parity-0", "parity-2"], ["parity-1", "parity-2"], ["parity-0", "parity-1"]]
    updates = [r for r in read_jsonl(tmp_path / "metrics.jsonl") if r["kind"] == "train"]
    assert all(0 <= r["kl_floor"] < 1e-6 for r in updates)
    assert all(r["kl_old_new"] > 100 * max(r["kl_floor"], 1e-9) for r in updates)
    with pytest.raises(TrainError, match="train_seeds"):
        config(tmp_path / "bad", train_seeds=[-1]).validate()
