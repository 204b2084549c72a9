"""The main job (`make demo`), in its quick size: every stage runs and the report holds each part."""

from __future__ import annotations

import html
import json
import re
import shlex

from agentgym_app.cli import main as main_cli
from agentgym_app.results import chart_groups, says_something
from agentgym_opsd.episode import load_episodes


def test_quick_demo_runs_every_stage_and_writes_one_report(tmp_path, capsys):
    from agentgym_app.demo import DemoSettings, run_demo

    out = tmp_path / "demo"
    report = run_demo(out, quick=True, progress=False)
    assert report == out / "report.html"
    assert f"report: {report}" in capsys.readouterr().out

    # Benchmark: expert, random and the three tiny policies (the warm start and the model each RL
    # method produced) on the held-out Pick games (unseen floor plans), the six ALFWorld subsets and
    # Search-QA.
    results = json.loads((out / "results.json").read_text())["results"]
    cells = {(r["agent"], r["subset"], r["split"]): r for r in results}
    subsets = {("pick", "valid_unseen"), ("synthetic", "test")} | {
        (s, "valid_seen") for s in ("pick", "look", "clean", "heat", "cool", "picktwo")}
    policies = {"warm start": out / "warmstart" / "model", "grpo": out / "training" / "grpo" / "model",
                "stepopsd": out / "training" / "stepopsd" / "model"}
    assert set(cells) == {(a, *s) for a in ("expert", "random", *policies) for s in subsets}
    assert cells[("expert", "synthetic", "test")]["success_rate"] == 1.0
    assert cells[("expert", "pick", "valid_unseen")]["episodes"] == DemoSettings.quick().held_out
    expert = sum(cells[("expert", *s)]["success_rate"] for s in subsets) / len(subsets)
    chance = sum(cells[("random", *s)]["success_rate"] for s in subsets) / len(subsets)
    assert expert > 0.5 and expert > chance
    assert all(r["errors"] == 0 for r in results)
    episodes = load_episodes(out / "episodes.jsonl")
    config = json.loads((out / "config.json").read_text())["config"]
    assert {a["name"]: a["agent"].split("?")[0] for a in config["agents"] if a["agent"].startswith("hf:")} == {
        name: f"hf:{model}" for name, model in policies.items()
    }
    for name in policies:
        # the held-out Pick games, one per ALFWorld subset, three Search-QA
        assert sum(1 for e in episodes if e.agent == name) == DemoSettings.quick().held_out + 6 + 3
    for method in ("grpo", "stepopsd"):  # each RL run started from the warm start and saved its own model
        run = json.loads((out / "training" / method / "config.json").read_text())
        assert run["model"] == str(policies["warm start"]) and run["method"] == method

    # Training: GRPO and StepOPSD from one warm start, on the Pick training games (not the held-out
    # ones); each trainer recorded the credit its updates used.
    for method in ("grpo", "stepopsd"):
        trained_on = {e.task_id for f in (out / "training" / method / "episodes").glob("update_*.jsonl")
                      for e in load_episodes(f)}
        assert trained_on and all(t.startswith("train/") for t in trained_on)
        held_out = {e.task_id for e in episodes if e.env_id.endswith("Pick-v0")
                    and e.task_id.startswith("valid_unseen")}
        assert held_out and not trained_on & held_out
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
    assert "valid_unseen" in about and "benchmarks.learning" in about and "benchmarks.credit_quality" in about
    # ... and what the held-out row shows, read from this run's results
    for name in ("random", *policies):
        r = cells[(name, "pick", "valid_unseen")]
        assert f"{name} {round(r['success_rate'] * r['episodes'])}/{r['episodes']} (" in about
    assert '<p class="about">A small run of the whole job' in page
    assert "<code>python -m benchmarks.learning</code>" in page
    # The training table and chart show the reward the update used beside the env's reward.
    assert "credit/reward_mean" in page and "train/reward" in page
    assert page.count("<h3>ALFWorld</h3>") == 1 and page.count("<h3>SearchQA</h3>") == 1
    # The held-out row first, its chart full width, and the command that plays its games again.
    main = page.split("<main>")[1]
    assert re.findall(r'<section id="(\w+)">', main)[:3] == ["headline", "results", "training"]
    headline = main.split('<section id="results">')[0]
    assert "<h2>Held-out</h2>" in headline and '<img alt="headline"' in headline
    # its five rows among the others
    assert page.count('<tr class=headline><td>pick <span class="mark">held-out</span></td><td>valid_unseen</td>') == 5
    groups = chart_groups({"results": results})
    drawn = {f"{f}-{s}" for (f, s), rows in groups.items() if says_something(rows)}
    assert set(re.findall(r'<img alt="((?:ALFWorld|SearchQA)-\w+)"', page)) == drawn
    command = html.unescape(re.search(r'<pre class="command">(.*?)</pre>', headline, re.DOTALL).group(1))
    args = shlex.split(command)
    assert args[:3] == ["agentgym-opsd", "eval",
                        "agentgym/ALFWorld-Pick-v0"] and "stepopsd" in args[args.index("--agent") + 1]
    args[args.index("--out") + 1] = str(tmp_path / "replay")
    assert main_cli(args[1:]) == 0
    replayed = sorted(load_episodes(tmp_path / "replay" / "episodes.jsonl"), key=lambda e: e.seed)
    played = sorted((e for e in episodes
                     if json.loads(e.meta["bench_key"])[1:3] == ["agentgym/ALFWorld-Pick-v0", "valid_unseen"]
                     and e.agent == "stepopsd"),
                    key=lambda e: json.loads(e.meta["bench_key"])[3])
    assert [(e.task_id, e.success, [t.action for t in e.turns]) for e in replayed] == \
        [(e.task_id, e.success, [t.action for t in e.turns]) for e in played]
    # The in-training evaluation says how many episodes a point is.
    assert f"eval/success: each point is {DemoSettings.quick().eval_episodes} greedy episode" in page
    assert "<td class=agent>grpo</td>" in page and "<td class=agent>stepopsd</td>" in page
    data = json.loads(re.search(r'<script type="application/json" id="report-data">(.*?)</script>', page,
                                re.DOTALL).group(1))
    trained = [e for e in data["episodes"] if e["source"] == "train:stepopsd"]
    assert trained and all(set(e["credit"]) == {"stepopsd"} for e in trained)
    timings = json.loads((out / "demo.json").read_text())["stage_seconds"]
    assert list(timings) == ["ALFWorld panel", "Search-QA index and server", "warm start", "GRPO", "StepOPSD",
                             "benchmark", "reading teacher", "report"]
    # A teacher that reads: the real model's credit on expert-with-detours Pick episodes, its AUC table after
    # the training, and those episodes in the viewer with both methods' credit.
    teacher = json.loads((out / "reading_teacher" / "summary.json").read_text())
    assert teacher["episodes"] == 2 and len(teacher["auc"]) == 4
    assert main.index('<section id="training">') < main.index('<section id="reading-teacher">') < main.index(
        '<section id="trajectories">')
    read = [e for e in data["episodes"] if e["source"].startswith("reading teacher")]
    assert len(read) == 2 and all(set(e["credit"]) == {"stepopsd", "agentopsd"} for e in read)


def test_the_held_out_rows_test_against_random_is_fishers_exact_test():
    from agentgym_app.demo import _fisher_greater

    # 5 of 10 against 0 of 10: the 5 wins all falling to the first agent, C(15, 5) / C(20, 10)
    assert abs(_fisher_greater(5, 10, 0, 10) - 3003 / 184756) < 1e-12
    assert abs(_fisher_greater(2, 100, 0, 100) - 100 * 99 / (200 * 199)) < 1e-12
    assert _fisher_greater(0, 100, 0, 100) == 1.0 and _fisher_greater(0, 5, 3, 5) == 1.0
    assert _fisher_greater(3, 5, 0, 5) < _fisher_greater(2, 5, 0, 5) < _fisher_greater(2, 5, 1, 5)


def test_the_in_training_evaluation_can_see_the_held_out_rows_rate():
    """The trainer's evaluation plays the first held-out games; at the ~5% a tiny policy reaches there,
    it must not read 0 most of the time (10 episodes read 0/10 with a chance of 60%)."""
    from agentgym_app.demo import DemoSettings

    settings = DemoSettings()
    assert settings.eval_episodes <= settings.held_out and 0.95 ** settings.eval_episodes < 0.05
