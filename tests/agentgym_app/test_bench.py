"""`agentgym-opsd bench`: configs, parallel runs, resuming after a SIGKILL, tables and charts."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import agentgym_opsd
from agentgym_app.bench import run_bench
from agentgym_app.bench_config import ConfigError, config_from_dict, load_config
from agentgym_app.cli import main
from agentgym_opsd.episode import load_episodes

REPO = Path(__file__).resolve().parents[2]
PLUGINS = [REPO / "tests" / "data" / "example_plugin", REPO / "tests" / "data" / "bench_plugin"]

CONFIG = """\
name = "resume"
agents = ["expert", "random"]
seeds = [0, 1]
episodes = 8
workers = 2

[[envs]]
family = "Tally"
options = { delay = 0.004 }

[[envs]]
id = "example/GuessNumber-v0"
episodes = 5
"""
PLANNED = 2 * 2 * (8 + 8 + 5)


@pytest.fixture(scope="module", autouse=True)
def bench_envs():
    """The Tally test envs, registered through their entry point (tests/conftest.py registers the
    example plug-in the same way)."""
    if str(PLUGINS[1]) not in sys.path:
        sys.path.insert(0, str(PLUGINS[1]))
    agentgym_opsd.load_plugins(reload=True)


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([*map(str, PLUGINS), env.get("PYTHONPATH", "")])
    return env


def _bench(config: Path, out: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "agentgym_app.cli", "bench", str(config), "--out", str(out), "--quiet",
         "--no-report"],
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _lines(path: Path) -> int:
    try:
        return path.read_bytes().count(b"\n")
    except FileNotFoundError:
        return 0


def _by_key(run: Path) -> dict[str, dict]:
    out = {}
    for e in load_episodes(run / "episodes.jsonl", skip_torn_lines=True):
        out[e.meta["bench_key"]] = e.to_dict()
    return out


def test_a_run_killed_mid_way_resumes_to_the_results_of_an_unbroken_run(tmp_path):
    config = tmp_path / "resume.toml"
    config.write_text(CONFIG)
    broken, whole = tmp_path / "broken", tmp_path / "whole"

    first = _bench(config, broken)
    try:
        deadline = time.monotonic() + 120
        while _lines(broken / "episodes.jsonl") < 20:
            assert first.poll() is None, f"the bench ended before it was killed: {first.communicate()[1][-2000:]}"
            assert time.monotonic() < deadline, "the bench wrote no episodes"
            time.sleep(0.02)
        first.send_signal(signal.SIGKILL)
    finally:
        first.kill()
        first.wait()
    assert first.returncode == -signal.SIGKILL
    played_before_kill = _lines(broken / "episodes.jsonl")
    assert 20 <= played_before_kill < PLANNED, "the kill did not land mid-way"
    assert not (broken / "results.json").exists()

    resumed = _bench(config, broken)
    out, err = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, err[-2000:]
    # It says what it found (a line torn by the kill is not an episode).
    found = re.search(r"^resuming: (\d+) of (\d+) episodes done$", out, re.MULTILINE)
    assert found and int(found.group(2)) == PLANNED and played_before_kill - 1 <= int(
        found.group(1)) <= played_before_kill, out
    unbroken = _bench(config, whole)
    out, err = unbroken.communicate(timeout=300)
    assert unbroken.returncode == 0, err[-2000:]

    assert json.loads((broken / "results.json").read_text()) == json.loads((whole / "results.json").read_text())
    episodes_broken, episodes_whole = _by_key(broken), _by_key(whole)
    assert len(episodes_whole) == PLANNED
    assert episodes_broken == episodes_whole
    # The resume played only what was missing (a line torn by the kill may be played again).
    assert _lines(broken / "episodes.jsonl") <= PLANNED + 1
    assert (broken / "results.md").read_text() == (whole / "results.md").read_text()


def test_bench_writes_tables_and_charts_that_match_the_episodes(tmp_path):
    config = config_from_dict(
        {
            "name": "small",
            "agents": ["expert", {"name": "chance", "agent": "random"}],
            "seeds": [3],
            "episodes": 12,
            "envs": [{"family": "Tally"}],
        }
    )
    results = run_bench(config, tmp_path, progress=False)
    rows = {(r["agent"], r["subset"]): r for r in results["results"]}
    assert set(rows) == {(a, s) for a in ("expert", "chance") for s in ("small", "large")}
    episodes = load_episodes(tmp_path / "episodes.jsonl")
    assert len(episodes) == 48
    assert {(e.agent, e.meta["agent_spec"]) for e in episodes} == {("expert", "expert"), ("chance", "random")}
    for (agent, subset), row in rows.items():
        mine = [e for e in episodes if e.agent == agent and e.task_type == subset]
        wins = sum(e.success for e in mine)
        assert row["episodes"] == len(mine) == 12
        assert row["success_rate"] == pytest.approx(wins / 12)
        low, high = row["success_ci95"]
        assert low <= wins / 12 <= high and high - low > 0.05
        assert row["mean_turns"] == pytest.approx(sum(e.num_turns for e in mine) / 12)
    assert rows[("expert", "large")]["success_rate"] == 1.0
    assert rows[("chance", "large")]["success_rate"] < 1.0  # overshooting is easy at random
    table = (tmp_path / "tables" / "Tally.md").read_text()
    expert_large = rows[("expert", "large")]
    assert f"| large | test | expert | 12 | 100.0 | [{100 * expert_large['success_ci95'][0]:.1f}, 100.0] |" in table
    random_large = rows[("chance", "large")]
    assert f"| large | test | chance | 12 | {100 * random_large['success_rate']:.1f} |" in table
    charts = sorted(p.name for p in (tmp_path / "plots").glob("*.png"))
    assert charts == ["Tally-large.png", "Tally-small.png"]
    for chart in charts:
        assert (tmp_path / "plots" / chart).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_workers_and_in_process_runs_give_the_same_results(tmp_path):
    base = {"agents": ["random"], "seeds": [0], "episodes": 10,
            "envs": ["benchtest/Tally-Large-v0", "example/GuessNumber-v0"]}
    a = run_bench(config_from_dict({**base, "workers": 0}), tmp_path / "a", progress=False)
    b = run_bench(config_from_dict({**base, "workers": 3}), tmp_path / "b", progress=False)
    assert a == b
    assert _by_key(tmp_path / "a") == _by_key(tmp_path / "b")


def test_errored_episodes_are_reported_and_played_again_on_resume(tmp_path, capsys):
    plan = {"agents": ["expert"], "episodes": 4, "workers": 2,
            "envs": [{"id": "benchtest/Tally-Small-v0", "options": {"delay": 0.6}}]}
    results = run_bench(config_from_dict({**plan, "step_timeout": 0.2}), tmp_path, progress=False)
    [row] = results["results"]
    assert row["errors"] == 4 and row["success_rate"] == 0.0
    errors = {e.error for e in load_episodes(tmp_path / "episodes.jsonl")}
    assert errors == {"step timed out after 0.2s (worker killed)"}
    # The same plan with a looser timeout resumes the folder: the errored keys are played again.
    capsys.readouterr()
    results = run_bench(config_from_dict({**plan, "step_timeout": 30}), tmp_path, progress=False)
    assert "resuming: 0 of 4 episodes done; 4 errored episodes are played again\n" in capsys.readouterr().out
    [row] = results["results"]
    assert row["errors"] == 0 and row["success_rate"] == 1.0 and row["episodes"] == 4
    assert len(load_episodes(tmp_path / "episodes.jsonl")) == 8  # both attempts are kept in the file


def test_a_wrong_agent_is_refused_before_any_env_is_built_or_episode_played(tmp_path, capsys):
    """`hf:` folders are checked first: the expert does not play its episodes, nor does the env
    load its data, before the bench finds that the second agent's folder holds no model."""
    (tmp_path / "empty").mkdir()
    for path, why in ((tmp_path / "nope" / "model", "no such folder"),
                      (tmp_path / "empty", "the folder holds no transformers model (no config.json)")):
        config = tmp_path / "b.toml"
        config.write_text(f'agents = ["expert", {{ name = "tiny", agent = "hf:{path}?temperature=0" }}]\n'
                          'envs = ["example/GuessNumber-v0"]\nepisodes = 3\n')
        out = tmp_path / "run"
        assert main(["bench", str(config), "--out", str(out), "--quiet"]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith(
            f"agentgym-opsd: error: {config}: agents: 'tiny': hf:{path}: {why}; give a local model folder"), err
        assert not (out / "episodes.jsonl").exists()


def test_config_errors_name_the_problem(tmp_path):
    cases = {
        'agents = ["expert"]\nenvs = ["example/GuessNumber-v0"]\nepisods = 3\n': "unknown setting(s) ['episods']",
        'agents = ["expert"]\nenvs = ["example/GuessNumber-v0"]\nepisodes = 0\n': "episodes must be a positive integer",
        'agents = ["expert"]\n[[envs]]\nid = "example/GuessNumber-v0"\nsplits = ["train"]\n': "has no split 'train'",
        'agents = ["expert"]\n[[envs]]\nfamily = "NoSuchFamily"\n': "no env of family 'NoSuchFamily'",
        'agents = []\nenvs = ["example/GuessNumber-v0"]\n': "agents must be a list",
        'agents = [{ name = "x" }]\nenvs = ["example/GuessNumber-v0"]\n': "give a name",
        'agents = ["random", { name = "random", agent = "expert" }]\nenvs = ["example/GuessNumber-v0"]\n': "same name",
        'agents = ["expert"]\nenvs = ["example/GuessNumber-v0"]\ncontext = "window:0"\n': "context policy",
        'agents = ["expert"\n': "c.toml:1: invalid TOML",
        'agents = ["expert"]\nenvs = ["example/GuessNumber-v0"]\nheadline = { id = "benchtest/Tally-Small-v0" }\n':
            "headline: 'benchtest/Tally-Small-v0' is not among the envs",
        'agents = ["expert"]\nenvs = ["example/GuessNumber-v0"]\nheadline = { id = "example/GuessNumber-v0", split = '
        '"dev" }\n':
            "headline: example/GuessNumber-v0 is played on ['test'], not on 'dev'",
        'agents = ["expert"]\nenvs = ["example/GuessNumber-v0"]\nheadline = { id = "example/GuessNumber-v0", '
        'row = 1 }\n':
            "headline: give a table with id (and split, label, note)",
    }
    for text, message in cases.items():
        path = tmp_path / "c.toml"
        path.write_text(text)
        with pytest.raises(ConfigError, match=".*" + message.replace("[", r"\[").replace("]", r"\]").replace(
            "(", r"\(").replace(")", r"\)")):
            load_config(path)
    path = tmp_path / "c.toml"
    path.write_text('agents = ["expert"]\nenvs = ["example/GuessNumbr-v0"]\n')
    with pytest.raises(ConfigError, match=r"c.toml: envs\[1\]: .*did you mean example/GuessNumber-v0"):
        load_config(path)
    path = tmp_path / "c.yaml"  # YAML keys need not be strings; env options are keyword arguments
    path.write_text("agents: [expert]\nenvs:\n  - id: example/GuessNumber-v0\n    options: {0: x}\n")
    with pytest.raises(ConfigError, match=r"c.yaml: envs\[1\]: options: 0 is not a keyword name"):
        load_config(path)


def test_cli_yaml_config_resume_guard_and_restart(tmp_path, capsys):
    config = tmp_path / "b.yaml"
    config.write_text("name: yaml-run\nagents: [expert]\nepisodes: 3\nenvs:\n  - id: example/GuessNumber-v0\n")
    out = tmp_path / "run"
    assert main(["bench", str(config), "--out", str(out), "--quiet"]) == 0
    printed = capsys.readouterr().out
    assert "| guess | test | expert | 3 | 100.0 |" in printed
    assert (out / "report.html").exists()
    # Another plan in the same folder is refused with the fix; --restart starts it over.
    config.write_text("name: yaml-run\nagents: [expert]\nepisodes: 4\nenvs:\n  - id: example/GuessNumber-v0\n")
    assert main(["bench", str(config), "--out", str(out), "--quiet"]) == 2
    assert "pass --restart" in capsys.readouterr().err
    assert main(["bench", str(config), "--out", str(out), "--quiet", "--restart"]) == 0
    assert len(load_episodes(out / "episodes.jsonl")) == 4
    # `report` rebuilds results and the page from the folder alone.
    (out / "results.json").unlink()
    (out / "report.html").unlink()
    assert main(["report", str(out)]) == 0
    assert json.loads((out / "results.json").read_text())["results"][0]["episodes"] == 4
    assert (out / "report.html").exists()


def test_run_seeds_play_different_tasks_and_replays_count_once_in_the_interval(tmp_path):
    # 30 tasks, 5 episodes per seed: seed s plays tasks 5s .. 5s+4, all different.
    config = config_from_dict({"agents": ["expert"], "seeds": [0, 1, 2], "episodes": 5,
                               "envs": ["benchtest/Tally-Small-v0"]})
    run_bench(config, tmp_path / "distinct", progress=False)
    episodes = load_episodes(tmp_path / "distinct" / "episodes.jsonl")
    assert len(episodes) == 15 and len({e.task_id for e in episodes}) == 15
    assert {e.task_id for e in episodes
            if e.meta["bench_key"].endswith(", 1]")} == {f"tally-small-{i}" for i in range(5, 10)}

    # 4 tasks, 2 seeds x 4 episodes: every task is played twice; the deterministic expert plays it
    # the same way both times, so the interval counts 4 outcomes, not 8.
    config = config_from_dict({"agents": ["expert", "random"], "seeds": [0, 1], "episodes": 4,
                               "envs": [{"id": "benchtest/Tally-Small-v0", "options": {"tasks": 4}}]})
    results = run_bench(config, tmp_path / "repeated", progress=False)
    rows = {r["agent"]: r for r in results["results"]}
    from agentgym_opsd.summary import wilson_interval

    expert = rows["expert"]
    assert expert["episodes"] == 8 and expert["outcomes"] == 4 and expert["success_rate"] == 1.0
    assert expert["success_ci95"] == pytest.approx(list(wilson_interval(4, 4)))
    assert expert["success_ci95"][0] < wilson_interval(8, 8)[0]  # wider than 8 plays would claim
    shown = rows["random"]
    distinct = {(e.task_id, tuple(t.response for t in e.turns))
                for e in load_episodes(tmp_path / "repeated" / "episodes.jsonl") if e.agent == "random"}
    assert shown["outcomes"] == len(distinct)
    results_md = (tmp_path / "repeated" / "results.md").read_text()
    assert "| small | test | expert | 8 (4 distinct) | 100.0 |" in results_md
    assert "Wilson's interval over distinct outcomes" in results_md and "seed s starts s x N tasks on" in results_md


@pytest.mark.parametrize(
    "options, message",
    [
        ('{ catalogue = "x" }',
         "c.toml: envs[1]: options: benchtest/Tally-Small-v0 has no option 'catalogue'; its options: subset, "
         "tasks, delay"),
        ('{ tasks = "many" }',
         "c.toml: envs[1]: options: benchtest/Tally-Small-v0: option tasks='many': tasks takes an integer"),
        ('{ subset = "huge" }',
         "c.toml: envs: benchtest/Tally-Small-v0 (test): subset must be small or large, got 'huge' (options: "
         "subset='huge';"),
    ],
)
def test_a_bad_env_option_in_a_bench_config_is_one_line(tmp_path, options, message):
    config = tmp_path / "c.toml"
    config.write_text(f'agents = ["expert"]\n[[envs]]\nid = "benchtest/Tally-Small-v0"\noptions = {options}\n')
    run = subprocess.run([sys.executable, "-m", "agentgym_app.cli", "bench", "c.toml", "--out",
                          str(tmp_path / "out"), "--quiet"],
                         env=_env(), check=False, capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert run.returncode == 2
    err = run.stderr.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert message in err, err


def test_ctrl_c_stops_a_bench_quietly_and_says_how_to_resume(tmp_path):
    config = tmp_path / "slow.toml"
    config.write_text('agents = ["expert"]\nepisodes = 30\nworkers = 2\n[[envs]]\nid = "benchtest/Tally-Small-v0"\n'
                      "options = { delay = 0.05 }\n")
    out = tmp_path / "run"
    bench = subprocess.Popen(
        [sys.executable, "-m", "agentgym_app.cli", "bench", str(config), "--out", str(out), "--quiet",
         "--no-report"],
        env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT,
                                         signal.SIG_DFL),  # noqa: PLW1509 (a background shell may ignore SIGINT)
    )
    try:
        deadline = time.monotonic() + 120
        while _lines(out / "episodes.jsonl") < 4:
            assert bench.poll() is None, bench.communicate()[1][-2000:]
            assert time.monotonic() < deadline, "the bench wrote no episodes"
            time.sleep(0.02)
        os.killpg(bench.pid, signal.SIGINT)  # what Ctrl-C in a terminal does: the whole process group
        _, err = bench.communicate(timeout=120)  # returns once every writer of stderr (the workers too) is gone
    finally:
        if bench.poll() is None:
            os.killpg(bench.pid, signal.SIGKILL)
            bench.wait()
    assert bench.returncode == 130
    assert err.strip() == "agentgym-opsd: interrupted; run the same command to resume", err[-3000:]
    resumed = _bench(config, out)
    _, err = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, err[-2000:]
    assert len(_by_key(out)) == 30
