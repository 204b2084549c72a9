"""The command line: list, eval, play, and one-line errors for bad arguments."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from agentgym_app.cli import COMMANDS, main
from agentgym_opsd.usage import UsageError, format_option, parse_options

EXAMPLE_PLUGIN = Path(__file__).resolve().parents[1] / "data" / "example_plugin"


def run_cli(*args: str, input: str | None = None, columns: int | None = None) -> subprocess.CompletedProcess:
    """The real console script in a subprocess, with the example plug-in installed on its path (its
    output is a pipe: text is wrapped to `columns`, else to 100)."""
    env = dict(os.environ, PYTHONPATH=str(EXAMPLE_PLUGIN) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("COLUMNS", None)
    if columns is not None:
        env["COLUMNS"] = str(columns)
    exe = Path(sys.executable).with_name("agentgym-opsd")
    return subprocess.run([str(exe), *args], check=False, capture_output=True, text=True, env=env, input=input,
                          timeout=300)


def test_list_fits_the_width_and_describes_a_plugin_registered_as_the_readme_shows() -> None:
    """The example plug-in registers without `description` and `sizes` (as the README's example):
    `list` reads its class docstring and counts its tasks; every line fits 100 columns (a pipe) or
    the terminal's width."""
    for columns in (None, 72):
        r = run_cli("list", columns=columns)
        assert r.returncode == 0, r.stderr
        lines = r.stdout.splitlines()
        assert max(len(line) for line in lines) <= (columns or 100), max(lines, key=len)
        # the id's row and its wrapped lines (splits, description)
        def block(env_id: str, lines: list[str] = lines) -> str:
            start = next(i for i, line in enumerate(lines) if line.startswith(env_id + " "))
            end = next((i for i in range(start + 1, len(lines)) if not lines[i].startswith(" ")), len(lines))
            return " ".join(" ".join(line.split()) for line in lines[start:end])

        assert block("example/GuessNumber-v0").startswith("example/GuessNumber-v0 Example guess test (20) "
                                                          "Find a hidden number in [1, high];")
        # a long row wraps: every split of NQ is there, none cut
        assert all(f"{split} (" in block("agentgym/SearchQA-NQ-v0") for split in ("train", "dev", "test"))


def test_eval_writes_episodes_and_summary(tmp_path, capsys) -> None:
    out = tmp_path / "run"
    assert main(["eval", "example/GuessNumber-v0", "--agent", "expert", "--episodes", "7", "--seed", "2", "--out",
                 str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    for key in ("env_id", "agent", "episodes", "success_rate", "mean_score", "mean_turns", "invalid_rate",
                "by_task_type"):
        assert key in summary
    assert summary["episodes"] == 7 and summary["success_rate"] == 1.0 and summary["invalid_rate"] == 0.0
    assert summary["by_task_type"]["guess"]["episodes"] == 7
    lines = (out / "episodes.jsonl").read_text().splitlines()
    assert sorted(json.loads(line)["seed"] for line in lines) == list(range(2, 9))

    # --resume keeps the finished episodes and plays only the missing ones
    kept = lines[:3]
    (out / "episodes.jsonl").write_text("\n".join(kept) + "\n")
    assert main(["eval", "example/GuessNumber-v0", "--agent", "expert", "--episodes", "7", "--seed", "2", "--out",
                 str(out), "--resume"]) == 0
    again = (out / "episodes.jsonl").read_text().splitlines()
    assert again[:3] == kept and len(again) == 7
    assert "resuming: 3 of 7 episodes done\n" in capsys.readouterr().out


def test_eval_checks_the_agent_before_the_env_generates_its_games(tmp_path) -> None:
    """A model folder that is not there is refused before ALFWorld generates a game (it spent a
    minute generating 120 games before saying so)."""
    cache = tmp_path / "cache"
    common = ["--option", f"cache_dir={cache}", "--option", "panel_size=1", "--option", "panel_own_types=true",
              "--out", str(tmp_path / "out")]
    r = run_cli("eval", "agentgym/ALFWorld-Pick-v0", "--agent", f"hf:{tmp_path}/nope/model", *common)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.strip() == (f"agentgym-opsd: error: hf:{tmp_path}/nope/model: no such folder; give a local model "
                                "folder (a Qwen2.5/Qwen3 download, or a trainer run's OUT/model) or a named model "
                                "(smollm2-135m)")
    assert not cache.exists() or not any(cache.rglob("*.tw-pddl"))
    r = run_cli("eval", "agentgym/ALFWorld-Pick-v0", "--agent", "hf:x?temprature=0", *common)
    assert r.returncode == 2 and "unknown option(s) ['temprature']" in r.stderr
    assert not cache.exists() or not any(cache.rglob("*.tw-pddl"))


def test_random_agent_summary_counts_invalid_and_failures(tmp_path) -> None:
    out = tmp_path / "rand"
    main(["eval", "example/GuessNumber-v0", "--agent", "random", "--episodes", "20", "--out", str(out), "--option",
          "max_turns=2"])
    s = json.loads((out / "summary.json").read_text())
    assert 0.0 < s["success_rate"] < 0.5 and s["mean_turns"] <= 2.0


@pytest.mark.parametrize(
    "args, message",
    [
        (["eval", "nope/Missing-v0", "--agent", "expert", "--out", "x"], "no env registered as 'nope/Missing-v0'"),
        (["eval", "example/GuessNumber-v0", "--agent", "wizard", "--episodes", "1", "--out", "{tmp}"],
         "unknown agent 'wizard'"),
        (["eval", "example/GuessNumber-v0", "--agent", "expert", "--episodes", "0", "--out", "x"],
         "--episodes must be >= 1"),
        (["eval", "example/GuessNumber-v0", "--agent", "expert", "--out", "{tmp}", "--option", "colour=red"],
         "example/GuessNumber-v0 has no option 'colour'; its options: high, max_turns, allow_bare_action, render_mode"),
        (["eval", "example/GuessNumber-v0", "--agent", "expert", "--out", "{tmp}", "--option", "max_turns=abc"],
         "option max_turns='abc': max_turns takes an integer or null"),
        (["eval", "example/GuessNumber-v0", "--agent", "expert", "--out", "{tmp}", "--option", "max_turns=0"],
         "max_turns must be >= 1, got 0 (options: max_turns=0;"),
        (["eval", "example/GuessNumber-v0", "--agent", "expert", "--out", "{tmp}", "--option", "noequals"],
         "KEY=VALUE"),
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


def test_play_reads_turns_from_stdin_and_takes_a_bare_command_in_every_env() -> None:
    """`play` sends a bare command in the env's action format, in an env that refuses bare commands
    from agents (the plug-in) as in one that accepts them (ALFWorld); a turn with tags goes as it is."""
    r = run_cli("play", "example/GuessNumber-v0", "--seed", "4", input="guess 3\n<action>guess 4\nguess 5\n")
    assert r.returncode == 0, r.stderr
    assert "Find the hidden number" in r.stdout and "Correct!" in r.stdout
    assert "(sent as <action>guess 3</action>)" in r.stdout and "(sent as <action>guess 5</action>)" in r.stdout
    assert r.stdout.count("Invalid action") == 1 and "unclosed <action>" in r.stdout  # a broken tag is still invalid
    assert "return 1" in r.stdout


def test_play_wraps_bare_commands_in_the_envs_own_tag() -> None:
    from agentgym_app.env_commands import as_played_turn
    from agentgym_opsd.contract import TextEnv

    class Search(TextEnv):
        action_tags = ("search", "answer")

    class Bare(TextEnv):
        allow_bare_action = True

    for env in (Search(), Bare(), Search(allow_bare_action=True)):
        tag = env.action_tags[0]
        assert as_played_turn(env, "  go to fridge 1 ") == f"<{tag}>go to fridge 1</{tag}>"
        assert as_played_turn(env, "<answer>x</answer>") == "<answer>x</answer>"  # tags: as typed
        assert as_played_turn(env, "<think>hm</think>") == "<think>hm</think>"  # no action: the env says so


@pytest.mark.parametrize("command", list(COMMANDS))
def test_every_command_of_the_table_has_its_help(command, capsys) -> None:
    """Each command's module is imported by name when it runs: every name in the table resolves, and
    its parser prints its help (with argparse's %-formatting of each help line)."""
    with pytest.raises(SystemExit) as stop:
        main([command, "--help"])
    assert stop.value.code == 0
    assert capsys.readouterr().out.startswith(f"usage: agentgym-opsd {command} ")


def test_help_list_and_the_heavy_commands_help_start_without_torch() -> None:
    """`--help` lists every command from the table alone and `list` imports its own module: neither
    loads torch nor another command's module; `demo --help` and `train --help` load their arguments,
    not the demo or the trainer (the table names the function that runs them)."""
    check = ("import sys\n"
             "from agentgym_app.cli import main\n"
             "try:\n    main(sys.argv[1:])\nexcept SystemExit:\n    pass\n"
             "print('loaded', sorted(m for m in sys.modules if m in ('torch', 'transformers', 'agentgym_app.bench',\n"
             "      'agentgym_app.demo', 'trainer.train_cli', 'trainer.local', 'retrieval_index.cli')))\n")
    expected = {"--help": [], "list": [], "demo": ["agentgym_app.bench"], "train": ["trainer.train_cli"]}
    for args in (["--help"], ["list", "--no-sizes"], ["demo", "--help"], ["train", "--help"]):
        r = subprocess.run([sys.executable, "-c", check, *args], capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr
        assert f"loaded {expected[args[0]]}" in r.stdout, (args, r.stdout[-300:])
        if args == ["--help"]:
            assert all(name in r.stdout for name in COMMANDS)


def test_parse_options_reads_json_values() -> None:
    assert parse_options(["a=3", "b=0.5", "c=true", "d=hello world", "e=[1,2]", "max-turns=4"]) == {
        "a": 3, "b": 0.5, "c": True, "d": "hello world", "e": [1, 2], "max_turns": 4,
    }
    with pytest.raises(UsageError):
        parse_options(["=3"])
    # format_option writes what parse_options reads back (the report's eval commands use it)
    for value in ("small", "3", "true", "null", "NaN", " x ", "a=b", 'say "hi"', 3, 0.5, True, None, {"train": 200},
                  [1, 2]):
        assert parse_options([format_option("key", value)]) == {"key": value}
    assert format_option("room", "small") == "room=small" and format_option("name", "3") == 'name="3"'


def _option_blocks(stdout: str) -> dict[str, tuple[str, str]]:
    """`list --options` output -> {name: (default, description)} (a block per option: `  name =
    default`, then the description's lines indented by six)."""
    blocks: dict[str, tuple[str, str]] = {}
    name = None
    for line in stdout.splitlines():
        if line.startswith("  ") and not line.startswith("   ") and " = " in line:
            name, _, default = line.strip().partition(" = ")
            blocks[name] = (default, "")
        elif line.startswith("      ") and name is not None:
            default, text = blocks[name]
            blocks[name] = (default, (text + " " + line.strip()).strip())
    return blocks


def test_list_options_shows_an_envs_keywords_with_defaults_and_meaning() -> None:
    r = run_cli("list", "--options", "example/GuessNumber-v0")
    assert r.returncode == 0, r.stderr
    rows = _option_blocks(r.stdout)
    assert set(rows) == {"high", "max_turns", "allow_bare_action", "render_mode",
                         "turn_labels"} and rows["high"][0] == "20"
    # TextEnv's docstring
    assert rows["max_turns"] == ("null (the env's own: 10)", "turns before the episode is truncated.")
    assert rows["high"][1].startswith("the largest number") and "`ansi`" in rows["render_mode"][1]
    r = run_cli("list", "--options", "example/GuesNumber-v0")
    assert r.returncode == 2 and "did you mean example/GuessNumber-v0" in r.stderr


def test_list_options_gives_every_option_its_own_whole_description() -> None:
    """No description is cut, none is missing, and options documented together in one docstring line
    (the panel's seed, room and size) each get their own text: what `room=small` means is there."""
    r = run_cli("list", "--options", "agentgym/ALFWorld-Pick-v0", columns=90)
    assert r.returncode == 0, r.stderr
    assert "…" not in r.stdout and max(len(line) for line in r.stdout.splitlines()) <= 90
    rows = _option_blocks(r.stdout)
    assert {"panel_seed", "room", "panel_size", "progress", "render_mode", "split"} <= set(rows)
    assert all(text and text != "(not documented)" and not text.lower().startswith("see `")
               for _, text in rows.values()), rows
    texts = [rows[n][1] for n in ("panel_seed", "room", "panel_size")]
    assert len(set(texts)) == 3
    assert "`small`" in rows["room"][1] and "at most 6 receptacles" in rows["room"][1]
    assert rows["panel_size"][1].count("games per task type") == 1 and "seed" in rows["panel_seed"][1]
