"""The command line: list, eval, play, and one-line errors for bad arguments."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from agentgym_opsd.app.cli import main
from agentgym_opsd.usage import UsageError, parse_options

EXAMPLE_PLUGIN = Path(__file__).resolve().parents[1] / "data" / "example_plugin"


def run_cli(*args: str, input: str | None = None) -> subprocess.CompletedProcess:
    """The real console script in a subprocess, with the example plug-in installed on its path."""
    env = dict(os.environ, PYTHONPATH=str(EXAMPLE_PLUGIN) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    exe = Path(sys.executable).with_name("agentgym-opsd")
    return subprocess.run([str(exe), *args], capture_output=True, text=True, env=env, input=input, timeout=300)


def test_list_shows_plugin_with_sizes() -> None:
    r = run_cli("list")
    assert r.returncode == 0, r.stderr
    line = next(l for l in r.stdout.splitlines() if l.startswith("example/GuessNumber-v0"))
    assert "test (20)" in line and "Example" in line


def test_eval_writes_episodes_and_summary(tmp_path) -> None:
    out = tmp_path / "run"
    assert main(["eval", "example/GuessNumber-v0", "--agent", "expert", "--episodes", "7", "--seed", "2", "--out", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    for key in ("env_id", "agent", "episodes", "success_rate", "mean_score", "mean_turns", "invalid_rate", "by_task_type"):
        assert key in summary
    assert summary["episodes"] == 7 and summary["success_rate"] == 1.0 and summary["invalid_rate"] == 0.0
    assert summary["by_task_type"]["guess"]["episodes"] == 7
    lines = (out / "episodes.jsonl").read_text().splitlines()
    assert sorted(json.loads(l)["seed"] for l in lines) == list(range(2, 9))

    # --resume keeps the finished episodes and plays only the missing ones
    kept = lines[:3]
    (out / "episodes.jsonl").write_text("\n".join(kept) + "\n")
    assert main(["eval", "example/GuessNumber-v0", "--agent", "expert", "--episodes", "7", "--seed", "2", "--out", str(out), "--resume"]) == 0
    again = (out / "episodes.jsonl").read_text().splitlines()
    assert again[:3] == kept and len(again) == 7


def test_random_agent_summary_counts_invalid_and_failures(tmp_path) -> None:
    out = tmp_path / "rand"
    main(["eval", "example/GuessNumber-v0", "--agent", "random", "--episodes", "20", "--out", str(out), "--option", "max_turns=2"])
    s = json.loads((out / "summary.json").read_text())
    assert 0.0 < s["success_rate"] < 0.5 and s["mean_turns"] <= 2.0


@pytest.mark.parametrize(
    "args, message",
    [
        (["eval", "nope/Missing-v0", "--agent", "expert", "--out", "x"], "no env registered as 'nope/Missing-v0'"),
        (["eval", "example/GuessNumber-v0", "--agent", "wizard", "--episodes", "1", "--out", "{tmp}"], "unknown agent 'wizard'"),
        (["eval", "example/GuessNumber-v0", "--agent", "expert", "--episodes", "0", "--out", "x"], "--episodes must be >= 1"),
        (["eval", "example/GuessNumber-v0", "--agent", "expert", "--out", "{tmp}", "--option", "colour=red"],
         "example/GuessNumber-v0 has no option 'colour'; its options: high, max_turns, allow_bare_action, render_mode"),
        (["eval", "example/GuessNumber-v0", "--agent", "expert", "--out", "{tmp}", "--option", "max_turns=abc"],
         "option max_turns='abc': max_turns takes an integer or null"),
        (["eval", "example/GuessNumber-v0", "--agent", "expert", "--out", "{tmp}", "--option", "max_turns=0"],
         "max_turns must be >= 1, got 0 (options: max_turns=0;"),
        (["eval", "example/GuessNumber-v0", "--agent", "expert", "--out", "{tmp}", "--option", "noequals"], "KEY=VALUE"),
        (["eval", "example/GuessNumber-v0", "--agent", "expert", "--out", "{tmp}", "--context", "windows"], "window:K"),
        (["eval", "example/GuessNumber-v0"], "required: --agent, --out"),
        (["frobnicate"], "invalid choice"),
    ],
)
def test_bad_arguments_give_one_line_errors(tmp_path, args, message) -> None:
    r = run_cli(*[a.replace("{tmp}", str(tmp_path / "o")) for a in args])
    assert r.returncode == 2
    err = r.stderr.strip()
    assert len(err.splitlines()) == 1, err
    assert message in err and "Traceback" not in err


def test_play_reads_turns_from_stdin() -> None:
    r = run_cli("play", "example/GuessNumber-v0", "--seed", "4", input="guess 3\n<action>guess 5</action>\n")
    assert r.returncode == 0, r.stderr
    assert "Find the hidden number" in r.stdout and "Invalid action" in r.stdout and "Correct!" in r.stdout


def test_parse_options_reads_json_values() -> None:
    assert parse_options(["a=3", "b=0.5", "c=true", "d=hello world", "e=[1,2]", "max-turns=4"]) == {
        "a": 3, "b": 0.5, "c": True, "d": "hello world", "e": [1, 2], "max_turns": 4,
    }
    with pytest.raises(UsageError):
        parse_options(["=3"])


def test_list_options_shows_an_envs_keywords_with_defaults_and_meaning() -> None:
    r = run_cli("list", "--options", "example/GuessNumber-v0")
    assert r.returncode == 0, r.stderr
    rows = {line.split()[0]: line for line in r.stdout.splitlines()[2:]}
    assert set(rows) == {"high", "max_turns", "allow_bare_action", "render_mode", "turn_labels"} and rows["high"].split()[1] == "20"
    assert "turns before the episode is truncated" in rows["max_turns"]  # TextEnv's docstring
    r = run_cli("list", "--options", "example/GuesNumber-v0")
    assert r.returncode == 2 and "did you mean example/GuessNumber-v0" in r.stderr
