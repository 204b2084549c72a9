"""benchmarks.credit_quality's placebo contexts and cache (its statistics: tests/trainer/test_credit_auc.py).

The placebo hindsight block holds another task's real reference and peer.
"""

from __future__ import annotations

import shutil
import sys

import numpy as np
import pytest

import benchmarks.credit_quality
from benchmarks.common import REPO


@pytest.fixture(scope="module")
def cq():
    return benchmarks.credit_quality


@pytest.fixture(scope="module")
def alfworld_episodes():
    import agentgym_opsd
    from agentgym_opsd.rollout import EpisodeRequest, run_episodes
    from trainer.warm_start import PerturbedExpert

    options = {"room": "small", "panel_own_types": True, "panel_size": {"train": 6, "valid_seen": 0, "valid_unseen": 0},
               "progress": False, "max_turns": 8}
    make_env = lambda: agentgym_opsd.make("agentgym/ALFWorld-Pick-v0", **options, turn_labels=True)  # noqa: E731
    # seeds 0..6 of six games: tasks t0 and t6 are the same game, which must not lend t0 its reference
    requests = [EpisodeRequest(seed=t, episode_id=f"t{t}-g{i}", group=f"t{t}") for t in range(7) for i in range(4)]
    return run_episodes(make_env, PerturbedExpert(0.5, seed=0), requests, num_envs=4, context="full", progress=False)


def test_the_placebo_block_reads_another_tasks_reference_and_peer(cq, alfworld_episodes):
    from trainer.env_knowledge import credit_config
    from trainer.teacher import hindsight_block, peer_episodes

    episodes = alfworld_episodes
    outcomes = {(e.group_key, e.success) for e in episodes}
    mixed = {g for g, ok in outcomes if (g, not ok) in outcomes}
    assert mixed and len({g for g, _ in outcomes}) >= 3, "the seeds should give mixed groups"
    placebo = cq.placebo_episodes(episodes)
    config = credit_config("agentgym/ALFWorld-Pick-v0", "stepopsd")
    own_refs = {e.task_id: {x.hindsight.reference for x in episodes if x.task_id == e.task_id} for e in episodes}
    peers, placebo_peers = peer_episodes(episodes), peer_episodes(placebo)
    assert peers == placebo_peers  # the same episodes read a peer: the outcome is kept
    for i, (real, fake) in enumerate(zip(episodes, placebo, strict=True)):
        assert fake.success == real.success and fake.episode_id == real.episode_id
        ref = fake.hindsight.reference
        assert ref and ref not in own_refs[real.task_id]
        donor = next(e for e in episodes if e.hindsight.reference == ref)
        assert donor.task_id != real.task_id and donor.success == real.success
        block, _ = hindsight_block(fake, placebo[placebo_peers[i]] if i in placebo_peers else None, config)
        assert ref in block and real.hindsight.reference not in block
        if i in peers:  # a failed episode of a mixed group: its peer's actions are another task's winner's
            real_peer, fake_peer = episodes[peers[i]], placebo[placebo_peers[i]]
            source = next(e for e in episodes if e.turns == fake_peer.turns)
            assert source.success and source.task_id != real.task_id
            assert [t.action for t in fake_peer.turns] != [t.action for t in real_peer.turns]
    # the placebo references have the real ones' lengths, outcome by outcome
    for ok in (True, False):
        real_lengths = sorted(len(e.hindsight.reference) for e in episodes if e.success == ok)
        fake_lengths = sorted(len(e.hindsight.reference) for e in placebo if e.success == ok)
        assert abs(np.mean(real_lengths) - np.mean(fake_lengths)) < 0.25 * np.mean(real_lengths)


def test_the_placebo_note_is_another_familys_of_similar_length(cq, tmp_path):
    from trainer.env_knowledge import skill_text

    spec = cq.FAMILIES["alfworld"]
    sources = cq.write_placebo_notes(tmp_path, spec, ["pick", "pick"])
    assert list(sources) == ["pick"] and not sources["pick"].startswith("alfworld:")
    real, fake = skill_text(spec.env, "pick"), skill_text(spec.env, "pick", tmp_path)
    general = skill_text(spec.env, "no such type")
    assert real.startswith(general) and fake.startswith(general)  # the general note stays
    real_note, fake_note = real[len(general):], fake[len(general):]
    assert fake_note.strip() and fake_note != real_note
    assert abs(len(fake_note) - len(real_note)) < 0.3 * len(real_note)
    # the whole-note placebo replaces the general note too, with another family's note
    sources_all = cq.write_placebo_notes(tmp_path / "all", spec, ["pick"], general=True)
    assert set(sources_all) == {"general", "pick"} and sources_all["general"] != sources_all["pick"]
    whole = skill_text(spec.env, "pick", tmp_path / "all")
    assert general not in whole and real_note.strip() not in whole
    assert abs(len(whole) - len(real)) < 0.3 * len(real)


def test_search_qa_detours_are_the_envs_random_actions(contract_options_searchqa):
    """Search-QA lists no admissible actions: the benchmark's expert detours there with the env's own random
    action (`free_form_detours`), a search of random words, a guess on the last turn; without the flag the
    expert takes no detour at all."""
    import agentgym_opsd
    from agentgym_opsd.rollout import EpisodeRequest, run_episodes
    from trainer.warm_start import PerturbedExpert

    env_id = "agentgym/SearchQA-Synthetic-v0"
    options = contract_options_searchqa(env_id)
    make_env = lambda: agentgym_opsd.make(env_id, **options, split="train", turn_labels=True)  # noqa: E731
    requests = [EpisodeRequest(seed=s, episode_id=f"q{s}") for s in range(3)]
    always = PerturbedExpert(1.0, seed=0, free_form_detours=True)
    detoured = run_episodes(make_env, always, requests, num_envs=3, context="full", progress=False)
    plain = PerturbedExpert(1.0, seed=0)
    expert = run_episodes(make_env, plain, requests, num_envs=3, context="full", progress=False)
    assert not plain.detours and all(e.success for e in expert)
    for episode in detoured:
        assert episode.num_turns == 4 and not episode.success
        assert {(episode.episode_id, k) for k in range(4)} <= always.detours
        kinds = [t.step.action_kind for t in episode.turns]
        assert kinds == ["search", "search", "search", "answer"]
        labels = episode.hindsight.details["turn_labels"]
        assert [t.action for t in episode.turns] != [lab["expert_action"] for lab in labels]


def test_a_rerun_reads_every_forward_from_the_cache(tiny_qwen3, tmp_path):
    """The whole benchmark on a small random model: every row of the table is there, and a rerun (or a run
    after a torn cache file) recomputes only what is missing and gives the same numbers."""
    import json
    import os
    import subprocess

    out = tmp_path / "cq"
    args = [sys.executable, "-m", "benchmarks.credit_quality", "--model", str(tiny_qwen3), "--family", "alfworld",
            "--train-games", "6", "--tasks", "3", "--group-size", "3", "--bootstrap", "40", "--out", str(out),
            "--no-progress"]
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false"}
    first = subprocess.run(args, capture_output=True, text=True, timeout=600, env=env, cwd=REPO)
    assert first.returncode == 0, first.stderr[-3000:]
    report_file = out / f"credit_quality-{tiny_qwen3.name}-alfworld.json"
    report = json.loads(report_file.read_text())
    rows = set(report["results"])
    for row in ("grpo", "gigpo", "stepopsd", "stepopsd outcome only", "stepopsd placebo", "stepopsd-nobudget",
                "agentopsd", "agentopsd placebo family note", "agentopsd placebo note", "rlsd",
                "evidence: hindsight full", "evidence: hindsight outcome only", "evidence: hindsight placebo",
                "evidence: skill note", "evidence: placebo family note", "evidence: placebo note",
                "beyond lp_S: hindsight full", "beyond lp_S: placebo note", "student log-prob"):
        assert row in rows, row
    assert report["results"]["grpo"]["turn/success/within"]["auc"] in (0.5, None)  # one credit per episode
    assert (out / f"credit_quality-{tiny_qwen3.name}-alfworld.txt").read_text().startswith("agentgym/ALFWorld-Pick-v0")
    (cache,) = (out / "cache").iterdir()
    files = {p.name: p.stat().st_mtime_ns for p in cache.glob("*.pt")}
    assert set(files) == {"student.pt", "teacher-full.pt", "teacher-outcome.pt", "teacher-placebo.pt",
                          "teacher-skills.pt", "teacher-skills-placebo.pt", "teacher-skills-placebo-all.pt"}
    torn = cache / "teacher-placebo.pt"
    torn.write_bytes(torn.read_bytes()[:100])
    second = subprocess.run(args, capture_output=True, text=True, timeout=600, env=env, cwd=REPO)
    assert second.returncode == 0, second.stderr[-3000:]
    again = json.loads(report_file.read_text())
    assert again["results"] == report["results"]
    for name, mtime in files.items():
        changed = (cache / name).stat().st_mtime_ns != mtime
        assert changed == (name == "teacher-placebo.pt"), name
    # --teacher-model: another model scores the teacher's contexts (its passes cached under its own name, the
    # student's pass and episodes reused). A teacher with the student's very weights gives the same figures.
    twin = tmp_path / "twin-teacher"
    shutil.copytree(tiny_qwen3, twin)
    third = subprocess.run([*args, "--teacher-model", str(twin)], capture_output=True, text=True, timeout=600,
                           env=env, cwd=REPO)
    assert third.returncode == 0, third.stderr[-3000:]
    twin_report = json.loads((out / f"credit_quality-{tiny_qwen3.name}@twin-teacher-alfworld.json").read_text())
    assert twin_report["teacher"] == "twin-teacher" and twin_report["results"] == report["results"]
    assert (cache / "student.pt").stat().st_mtime_ns == files["student.pt"]
    assert {p.name for p in cache.glob("teacher-*@twin-teacher.pt")} == {
        name.replace(".pt", "@twin-teacher.pt") for name in files if name.startswith("teacher-")}


def test_policy_groups_replay_the_expert_groups_games_and_a_game_is_one_bootstrap_unit(cq, tiny_qwen3):
    """--policy-episodes: policy group t plays expert group t's game; the bootstrap draws games, so the two
    groups that played one game are always drawn together (and two seeds on one game of a small panel too)."""
    from trainer.credit_auc import resample_counts
    from trainer.policy import load_policy

    model, tokenizer = load_policy(str(tiny_qwen3), device="cpu", dtype="float32")
    options = {"room": "small", "panel_own_types": True, "panel_size": {"train": 6, "valid_seen": 0, "valid_unseen": 0},
               "progress": False, "max_turns": 2}
    settings = {"env": "agentgym/ALFWorld-Pick-v0", "options": options, "tasks": 3, "group_size": 2, "detour": 0.5,
                "free_form_detours": False, "policy_episodes": 6, "seed": 0}
    episodes = cq.play_episodes(settings, model, tokenizer, progress=False)
    game = {}
    for e in episodes:
        game.setdefault(e.group, set()).add(e.task_id)
    assert all(len(tasks) == 1 for tasks in game.values())
    assert {f"p{t}" for t in range(3)} <= set(game)
    for t in range(3):
        assert game[f"p{t}"] == game[f"t{t}"]  # the same game, a group of its own
    units = cq.bootstrap_units(episodes)
    assert len(set(units)) == 3 and len({e.group_key for e in episodes}) == 6
    counts = resample_counts(units, 200, np.random.default_rng(0))
    for t in range(3):
        expert = [i for i, e in enumerate(episodes) if e.group == f"t{t}"]
        policy = [i for i, e in enumerate(episodes) if e.group == f"p{t}"]
        assert (counts[:, expert] == counts[:, policy[:1]]).all() and (counts[:, policy] == counts[:, policy[:1]]).all()
    # by group (as before) the two groups of one game would be drawn apart in some draws
    by_group = resample_counts([e.group_key for e in episodes], 200, np.random.default_rng(0))
    assert (by_group[:, [episodes.index(next(e for e in episodes if e.group == "t0"))]]
            != by_group[:, [episodes.index(next(e for e in episodes if e.group == "p0"))]]).any()
