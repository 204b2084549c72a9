"""The main job (`make demo`), in its quick size: every stage runs and the report holds each part."""

from __future__ import annotations

import json
import re

from agentgym_opsd.episode import load_episodes


def test_quick_demo_runs_every_stage_and_writes_one_report(tmp_path, capsys):
    from agentgym_opsd.app.demo import run_demo

    out = tmp_path / "demo"
    report = run_demo(out, quick=True, progress=False)
    assert report == out / "report.html"
    assert f"report: {report}" in capsys.readouterr().out

    # Benchmark: expert, random and the three tiny policies (the warm start and the model each RL
    # method produced) on the six ALFWorld subsets and on Search-QA.
    results = json.loads((out / "results.json").read_text())["results"]
    cells = {(r["agent"], r["subset"]): r for r in results}
    subsets = {"pick", "look", "clean", "heat", "cool", "picktwo", "synthetic"}
    policies = {"warm start": out / "warmstart" / "model", "grpo": out / "training" / "grpo" / "model",
                "stepopsd": out / "training" / "stepopsd" / "model"}
    assert set(cells) == {(a, s) for a in ("expert", "random", *policies) for s in subsets}
    assert cells[("expert", "synthetic")]["success_rate"] == 1.0
    expert = sum(cells[("expert", s)]["success_rate"] for s in subsets) / len(subsets)
    chance = sum(cells[("random", s)]["success_rate"] for s in subsets) / len(subsets)
    assert expert > 0.5 and expert > chance
    assert all(r["errors"] == 0 for r in results)
    episodes = load_episodes(out / "episodes.jsonl")
    config = json.loads((out / "config.json").read_text())["config"]
    assert {a["name"]: a["agent"].split("?")[0] for a in config["agents"] if a["agent"].startswith("hf:")} == {
        name: f"hf:{model}" for name, model in policies.items()
    }
    for name in policies:
        assert sum(1 for e in episodes if e.agent == name) == 6 + 3  # one per ALFWorld subset, three Search-QA
    for method in ("grpo", "stepopsd"):  # each RL run started from the warm start and saved its own model
        run = json.loads((out / "training" / method / "config.json").read_text())
        assert run["model"] == str(policies["warm start"]) and run["method"] == method

    # Training: GRPO and StepOPSD from one warm start; each trainer recorded the credit its updates used.
    for method in ("grpo", "stepopsd"):
        rows = [json.loads(line) for line in (out / "training" / method / "metrics.jsonl").read_text().splitlines()]
        updates = {r["step"] for r in rows if r.get("kind") == "train"}
        assert updates
        credit = [json.loads(line) for line in (out / "training" / method / "credit.jsonl").read_text().splitlines()]
        assert {r["method"] for r in credit} == {method} and {r["update"] for r in credit} == updates
    assert any("tokens" in t for r in credit for t in r["turns"])  # StepOPSD's token weights

    # One report with the tables, the charts, both training runs and the credit of their turns.
    page = report.read_text()
    # The header says what the tiny policies are and where the real figures are.
    about = (out / "about.txt").read_text()
    assert "smoke-sized" in about and "benchmarks/learning.py" in about and "benchmarks/credit_quality.py" in about
    assert '<p class="about">A smoke-sized run' in page and "<code>python benchmarks/learning.py</code>" in page
    # The training table and chart show the reward the update used beside the env's reward.
    assert "credit/reward_mean" in page and "train/reward" in page
    assert page.count("<h3>ALFWorld</h3>") == 1 and page.count("<h3>SearchQA</h3>") == 1
    assert len(re.findall(r'<img alt="ALFWorld-', page)) == 6
    assert "<td class=agent>grpo</td>" in page and "<td class=agent>stepopsd</td>" in page
    data = json.loads(re.search(r'<script type="application/json" id="report-data">(.*?)</script>', page, re.S).group(1))
    trained = [e for e in data["episodes"] if e["source"] == "train:stepopsd"]
    assert trained and all(set(e["credit"]) == {"stepopsd"} for e in trained)
    timings = json.loads((out / "demo.json").read_text())["stage_seconds"]
    assert list(timings) == ["ALFWorld panel", "Search-QA index and server", "warm start", "GRPO", "StepOPSD", "benchmark", "report"]
