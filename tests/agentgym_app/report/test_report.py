"""The HTML report: credit records, the page's content, and a render in headless Chromium."""

from __future__ import annotations

import html
import itertools
import json
import math
import os
import re
import shutil
import subprocess
import sys
import urllib.parse
from pathlib import Path

import pytest

import agentgym_opsd
from agentgym_app.bench import run_bench
from agentgym_app.bench_config import config_from_dict
from agentgym_app.report import check_credit, credit_record, write_report
from agentgym_opsd.episode import load_episodes, save_episodes
from agentgym_opsd.io import append_jsonl

REPO = Path(__file__).resolve().parents[3]
PLUGINS = [REPO / "tests" / "data" / "example_plugin", REPO / "tests" / "data" / "bench_plugin"]
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
]
EVIL = "</script><script>document.title='pwned'</script><!-- & <b>bold</b>"


@pytest.fixture(scope="module", autouse=True)
def bench_envs():
    """The Tally test envs, registered through their entry point."""
    if str(PLUGINS[1]) not in sys.path:
        sys.path.insert(0, str(PLUGINS[1]))
    agentgym_opsd.load_plugins(reload=True)


def _tokens(text: str) -> list[str]:
    """Split an action block into token-like pieces (tags, words with their leading space)."""
    return re.findall(r"</?\w+>|\s*[^\s<]+|\s+", text)


def _stepopsd(advantage: float, gaps: list[float], alpha: float = 0.2) -> list[float]:
    """StepOPSD token weights w_t = clip(2 sigma(sign(A) delta_t), 1 - alpha, 1 + alpha)."""
    sign = 1.0 if advantage >= 0 else -1.0
    return [min(1 + alpha, max(1 - alpha, 2 / (1 + math.exp(-sign * g)))) for g in gaps]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    """A bench run (Tally, expert and random) plus a training folder whose episodes carry credit:
    StepOPSD token weights in Episode.meta, AgentOPSD beliefs in a credit.jsonl."""
    run = tmp_path_factory.mktemp("report") / "run"
    config = config_from_dict({"name": "report-test", "agents": ["expert", "random"], "episodes": 6,
                               "envs": [{"family": "Tally"}]})
    run_bench(config, run, progress=False)
    episodes = [e for e in load_episodes(run / "episodes.jsonl") if e.agent == "random" and e.num_turns >= 3][:4]
    assert len(episodes) >= 2
    episodes[0].turns[0].observation = EVIL  # text from an env is shown as text, never as markup
    records = []
    for n, episode in enumerate(episodes):
        advantage = 0.9 if episode.success else -0.7
        spans, tokens, gaps = [], [], []
        for k, turn in enumerate(episode.turns):
            start, end = turn.step.action_span
            pieces = _tokens(turn.response[start:end])
            deltas = [math.sin(1.3 * i + k + n) * 1.5 for i in range(len(pieces))]
            spans.append([start, end])
            tokens.append(list(zip(pieces, _stepopsd(advantage, deltas), deltas, strict=True)))
            gaps.append(sum(deltas))
        episode.meta["credit"] = {
            "stepopsd": credit_record(advantage=advantage, turns=episode.num_turns, gap=gaps, spans=spans,
                                      tokens=tokens, update=n)
        }
        belief, beliefs, deltas_b = 0.5, [], []
        for g in gaps:
            new = 1 / (1 + math.exp(-(math.log(belief / (1 - belief)) + 0.3 * g)))
            beliefs.append(new)
            deltas_b.append(new - belief)
            belief = new
        records.append(
            {
                "episode_id": episode.episode_id,
                "method": "agentopsd",
                **credit_record(advantage=advantage, turns=episode.num_turns, gap=gaps, belief=beliefs,
                                belief_delta=deltas_b, weight=[1 + 0.1 * d for d in deltas_b]),
            }
        )
    method_dir = run / "training" / "stepopsd"
    save_episodes(method_dir / "episodes.jsonl", episodes)
    append_jsonl(method_dir / "credit.jsonl", records)
    for method, slope in (("grpo", 0.03), ("stepopsd", 0.05)):
        append_jsonl(run / "training" / method / "metrics.jsonl",
                     [{"update": u, "success_rate": 0.3 + slope * u, "loss": 1.0 / (u + 1)} for u in range(6)])
    write_report(run)
    return run


def _payload(page: str) -> dict:
    match = re.search(r'<script type="application/json" id="report-data">(.*?)</script>', page, re.DOTALL)
    assert match, "the page has no data block"
    return json.loads(match.group(1))


def test_credit_records_are_checked():
    good = credit_record(advantage=0.5, turns=2, gap=[0.1, None], tokens=[[("go", 1.1, 0.2)], None])
    assert good["turns"][0] == {"gap": 0.1, "tokens": [["go", 1.1, 0.2]]} and good["turns"][1] == {}
    with pytest.raises(ValueError, match="gap has 1 entries for 2 turns"):
        credit_record(advantage=0.5, turns=2, gap=[0.1])
    with pytest.raises(ValueError, match=r"turns\[0\].gap: not finite"):
        check_credit({"advantage": 1.0, "turns": [{"gap": float("nan")}]})
    with pytest.raises(ValueError, match="unknown field"):
        check_credit({"advantage": 1.0, "turns": [{"gapp": 1.0}]})
    with pytest.raises(ValueError, match=r"tokens\[0\]: expected \[text, weight, gap\]"):
        check_credit({"advantage": 1.0, "turns": [{"tokens": [[1.0, "go"]]}]})
    with pytest.raises(ValueError, match="3 entries for an episode of 2 turns"):
        check_credit({"advantage": 1.0, "turns": [{}, {}, {}]}, num_turns=2)


def test_report_holds_tables_training_and_credit(run_dir):
    page = (run_dir / "report.html").read_text()
    results = json.loads((run_dir / "results.json").read_text())
    for row in results["results"]:
        assert f"<td>{row['subset']}</td><td>test</td><td class=agent>{row['agent']}</td><td class=num>6</td>" in page
        assert f"<b>{100 * row['success_rate']:.1f}</b>" in page
    assert page.count('<img alt="Tally-') == 2  # the per-subset charts, inlined
    assert 'alt="training curves"' in page and "success rate (first &rarr; last)" in page
    assert not re.search(r'(src|href)="(https?:)?//|url\(\s*["\']?https?:|@import', page)  # self-contained
    data = _payload(page)
    trained = [e for e in data["episodes"] if e["source"] == "train:stepopsd"]
    assert len(trained) >= 2
    for e in trained:
        assert set(e["credit"]) == {"stepopsd", "agentopsd"}  # meta and credit.jsonl merged
        for turn, credit in zip(e["turns"], e["credit"]["stepopsd"]["turns"], strict=True):
            start, end = credit["span"]
            assert "".join(t[0] for t in credit["tokens"]) == turn["response"][start:end]
            assert all(0.8 <= t[1] <= 1.2 for t in credit["tokens"])
        assert all(0 < t["belief"] < 1 for t in e["credit"]["agentopsd"]["turns"])
    assert trained[0]["turns"][0]["observation"] == EVIL
    assert EVIL not in page  # only its escaped form is in the page
    bench = [e for e in data["episodes"] if e["source"] == "bench"]
    assert {e["agent"] for e in bench} == {"expert", "random"}


def test_episode_links_are_unique_and_the_viewer_says_what_it_shows(run_dir):
    page = (run_dir / "report.html").read_text()
    episodes = _payload(page)["episodes"]
    keys = [e["key"] for e in episodes]
    assert len(set(keys)) == len(keys)
    # The expert and the random agent play the same episode ids; their links differ.
    shared = {e["id"] for e in episodes
              if e["agent"] == "expert"} & {e["id"] for e in episodes if e["agent"] == "random"}
    assert shared
    same = [e for e in episodes if e["id"] == next(iter(shared)) and e["source"] == "bench"]
    assert len({e["key"] for e in same}) == len(same) == 2
    total = len(load_episodes(run_dir / "episodes.jsonl"))
    shown = sum(1 for e in episodes if e["source"] == "bench")
    assert f"Shown: {shown} of the bench&#x27;s {total} episodes (up to 4 per agent, env and split" in page
    assert "every episode shown (" in page and "all episodes (" not in page


def _chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    pytest.skip(
        "needs a headless Chromium (Debian: apt-get update && apt-get install -y chromium; .ci/run installs it)")


def test_report_renders_in_headless_chromium(run_dir, tmp_path):
    chromium = _chromium()
    page = run_dir / "report.html"
    profile = tmp_path / "profile"
    common = [chromium, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "--window-size=1400,2400"]
    dom = subprocess.run([*common, "--dump-dom", page.as_uri()], check=False, capture_output=True, text=True,
                         timeout=120)
    assert dom.returncode == 0, dom.stderr[-2000:]
    html = dom.stdout
    # The viewer ran: it opened an episode with credit and drew the heat map over its action tokens.
    data = _payload(page.read_text())
    first = next(e for e in data["episodes"] if e["credit"].get("stepopsd"))
    expected_tokens = sum(len(t["tokens"]) for t in first["credit"]["stepopsd"]["turns"])
    heat = []
    for attrs in re.findall(r'<span class="tok"([^>]*)>', html):
        colour = re.search(r"background: ?rgba\((\d+), ?(\d+), ?(\d+), ?([\d.]+)\)", attrs)
        weight = re.search(r'title="w=([\d.]+)', attrs)
        assert colour and weight, attrs
        heat.append((*colour.groups(), weight.group(1)))
    assert len(heat) == expected_tokens
    colours = {(int(r), int(g), int(b)) for r, g, b, _, _ in heat}
    assert colours == {(31, 138, 76), (194, 65, 45)}  # weights both above and below 1
    for r, g, b, _, weight in heat:  # green above 1, red below
        assert (float(weight) >= 1) == ((int(r), int(g), int(b)) == (31, 138, 76)) or abs(float(weight) - 1) < 1e-3
    by_distance = sorted((abs(float(w) - 1), float(a)) for *_, a, w in heat)
    assert all(a1 <= a2 + 1e-3 for (_, a1), (_, a2) in itertools.pairwise(by_distance))  # stronger further from 1
    assert by_distance[0][1] < 0.2 and by_distance[-1][1] == pytest.approx(0.85)
    assert "<h3>Tally</h3>" in html and 'class="results"' in html and "credit-chart" in html
    # StepOPSD weighs tokens: its row of the credit table shows the turn's mean w_t, not "–".
    rows = re.findall(r"<tr><td>stepopsd</td>(.*?)</tr>", html)
    assert rows and all("(mean w_t)" in row for row in rows)
    # A link to an episode opens that episode, also when another agent played the same episode id.
    target = next(e for e in data["episodes"] if e["source"] == "bench" and e["agent"] == "random"
                  and any(o["id"] == e["id"] and o["agent"] == "expert" for o in data["episodes"]))
    linked = subprocess.run([*common, "--dump-dom", page.as_uri() + "#episode=" + urllib.parse.quote(target["key"])],
                            check=False, capture_output=True, text=True, timeout=120)
    head = re.search(r'<div class="ep-head">(.*?)</div>', linked.stdout, re.DOTALL).group(1)
    assert '<span class="tag">random</span>' in head and target["task"] in head
    assert "pwned" not in html.split("<main>")[0]  # the title was not rewritten by env text
    shot = tmp_path / "report.png"
    result = subprocess.run([*common, f"--screenshot={shot}", page.as_uri()], check=False, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0 and shot.exists(), result.stderr[-2000:]
    png = shot.read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big")
    assert (width, height) == (1400, 2400)
    keep = os.environ.get("AGENTGYM_REPORT_SCREENSHOT")
    if keep:  # to look at it: AGENTGYM_REPORT_SCREENSHOT=/tmp/report.png pytest ...
        shutil.copy(shot, keep)


LONG_NAME = "hf:runs/demo/training/stepopsd/model?temperature=0&max_new_tokens=24"


@pytest.fixture(scope="module")
def headline_run(tmp_path_factory) -> Path:
    """A bench with a headline (the Tally Large row, labelled held-out), an agent with a long name,
    a subset that only the expert wins (GuessNumber in one turn), and two training runs whose
    configs say how large their in-training evaluation is."""
    run = tmp_path_factory.mktemp("headline") / "run"
    config = config_from_dict({
        "name": "headline-test", "episodes": 6,
        "agents": ["expert", "random", {"name": LONG_NAME, "agent": "random"}],
        "envs": [{"family": "Tally"}, {"id": "example/GuessNumber-v0", "options": {"max_turns": 1, "high": 40}}],
        "headline": {"id": "benchtest/Tally-Large-v0", "label": "held-out", "note": "The `large` targets."},
    })
    run_bench(config, run, progress=False)
    for method in ("grpo", "stepopsd"):
        append_jsonl(run / "training" / method / "metrics.jsonl",
                     [{"kind": "eval", "step": u, "eval/success": 0.0} for u in (0, 4)]
                     + [{"kind": "train", "step": u, "train/success": 0.1 * u} for u in (1, 2, 3, 4)])
        (run / "training" / method / "config.json").write_text(json.dumps(
            {"env_id": "benchtest/Tally-Large-v0", "eval_episodes": 10, "eval_seeds": [], "eval_temperature": 0.0,
             "eval_env_options": {"subset": "large"}}))
    write_report(run)
    return run


def test_the_headline_comes_first_and_large_and_its_rows_are_marked(headline_run):
    from agentgym_app.results import chart_groups, says_something

    page = (headline_run / "report.html").read_text()
    main = page.split("<main>")[1]
    assert re.findall(r'<section id="(\w+)">', main)[:2] == ["headline", "results"]
    headline = main.split('<section id="results">')[0]
    assert '<div class="plots wide"><figure><img alt="headline"' in headline
    assert "<code>large</code> targets" in headline
    results = json.loads((headline_run / "results.json").read_text())["results"]
    for r in results:
        row = (f"<td class=agent>{html.escape(r['agent'])}</td><td class=num>6</td><td "
               f"class=num><b>{100 * r['success_rate']:.1f}</b>")
        in_headline = r["env_id"] == "benchtest/Tally-Large-v0"
        assert (f"<tr><td>{r['subset']}</td><td>test</td>{row}" in headline) == in_headline
        # marked among the results table's rows
        marked = f'<tr class=headline><td>{r["subset"]} <span class="mark">held-out</span></td><td>test</td>{row}'
        assert (marked in main.split('<section id="results">')[1]) == in_headline
    # and in results.md (what `bench` and the demo print)
    table = (headline_run / "results.md").read_text()
    assert table.count("| large **(held-out)** | test |") == 3 and "| small **(held-out)**" not in table
    # Charts: the ones that say something are drawn, the others named in one line; the headline's own
    # chart is the full-width one.
    groups = chart_groups({"results": results})
    drawn = {f"{family}-{subset}" for (family, subset), rows in groups.items() if says_something(rows)}
    silent = [f"{family} {subset}" for (family, subset), rows in groups.items() if not says_something(rows)]
    assert silent == ["Example guess"] and drawn  # GuessNumber in one turn: only the expert wins
    assert {p.stem for p in (headline_run / "plots").glob("*.png")} == drawn | {"headline"}
    assert set(re.findall(r'<img alt="([\w-]+)"',
                          main.split('<section id="results">')[1].split('<section id="training">')[0])) == drawn
    assert f"Not drawn: 1 chart in which no agent but the expert won an episode ({silent[0]})" in page


def test_the_headline_gives_the_eval_command_that_plays_its_episodes_again(headline_run, tmp_path):
    """Each agent's command parses, and `eval` plays the same tasks (the expert with the same outcome)."""
    import shlex

    from agentgym_app.cli import main

    page = (headline_run / "report.html").read_text()
    headline = page.split('<section id="headline">')[1].split("</section>")[0]
    commands = [html.unescape(c) for c in re.findall(r'<pre class="?command"?>(.*?)</pre>', headline, re.DOTALL)]
    assert len(commands) == 4 and commands[0] == commands[-1]  # the last agent's shown first, then one per agent
    bench = load_episodes(headline_run / "episodes.jsonl")
    for number, (command, name) in enumerate(zip(commands[1:], ("expert", "random", LONG_NAME), strict=True)):
        args = shlex.split(command)
        assert args[:3] == ["agentgym-opsd", "eval", "benchtest/Tally-Large-v0"]
        agent = args[args.index("--agent") + 1]
        assert agent == ("random" if name == LONG_NAME else name)
        args[args.index("--out") + 1] = str(tmp_path / str(number))
        assert main(args[1:]) == 0
        replayed = sorted(load_episodes(tmp_path / str(number) / "episodes.jsonl"), key=lambda e: e.seed)
        played = sorted((e for e in bench if e.env_id == "benchtest/Tally-Large-v0" and e.agent == name),
                        key=lambda e: json.loads(e.meta["bench_key"])[3])
        assert [e.task_id for e in replayed] == [e.task_id for e in played] and len(played) == 6
        if agent == "expert":
            assert [e.success for e in replayed] == [e.success for e in played]


def test_in_training_evaluation_says_how_many_episodes_a_point_is(headline_run):
    page = (headline_run / "report.html").read_text()
    training = page.split('<section id="training">')[1].split("</section>")[0]
    assert ("eval/success: each point is 10 greedy episodes on benchtest/Tally-Large-v0 (subset=large), the same "
            "games at every point. A policy that wins 5% of its games reads 0/10 there 60% of the time; the held-out "
            "result above (6 episodes per agent) is the measure") in training


def test_agent_names_are_wrapped_never_cut():
    from agentgym_app.charts import wrap_label

    for name in (LONG_NAME, "warm start", "x" * 70, "openai:http://127.0.0.1:8000/v1#qwen3-0.6b?temperature=0", ""):
        for width in (8, 22, 34):
            lines = wrap_label(name, width).split("\n")
            assert "".join(lines) == name and all(len(line) <= width for line in lines)
    assert wrap_label(LONG_NAME, 22).split("\n")[:2] == ["hf:runs/demo/training/", "stepopsd/model?"]
