"""Side by side with alfworld's own engine: the same text, the same admissible commands, the same `won`.

- the real ALFWorld game (../shared/data/alfworld) against alfworld's `AlfredTWEnv`, along detours and
  the expert's actions;
- generated games of every task type against TextWorld's `PddlEnv` + alfworld's `AlfredDemangler` (the
  engine inside AlfredTWEnv), along random walks with non-admissible commands;
- a json_2.1.1-era copy of the real game (old "put X in/on Y" grammar): alfworld's hand-coded expert
  cannot win it as it is, and wins once our loader has brought it up to date.
"""

from __future__ import annotations

import json
import random
import re
import shutil
from pathlib import Path


from environments.alfworld.compiled import compile_game, modernize_game_data
from environments.alfworld.env import AlfWorldEnv
from environments.alfworld.expert import TASK_TYPES


def command_of(turn: str) -> str:
    return re.search(r"<action>(.*)</action>", turn).group(1)


def test_real_game_matches_alfredtwenv_along_detours_and_expert(real_data: Path, alfred_tw_env) -> None:
    env = AlfWorldEnv(source="alfworld", data_dir=str(real_data), split="train")
    tw = alfred_tw_env(real_data / "json_2.1.1" / "train")
    try:
        obs, info = env.reset(seed=0)
        tw_obs, tw_infos = tw.reset()
        assert obs == tw_obs[0]
        assert obs.startswith("-= Welcome to TextWorld, ALFRED! =-")
        assert info["step"].admissible_actions == tw_infos["admissible_commands"][0]
        rng = random.Random(5)
        played = 0
        terminated = False
        while not terminated and played < 40:
            if played < 4:
                command = rng.choice(env.admissible_actions())
            elif played == 4:
                command = "put the moon in the fridge 1"  # not admissible: "Nothing happens." in both
            else:
                command = command_of(env.expert_action())
            obs, reward, terminated, truncated, info = env.step(f"<think>...</think><action>{command}</action>")
            tw_obs, tw_scores, tw_dones, tw_infos = tw.step([command])
            played += 1
            assert obs == tw_obs[0], command
            assert info["step"].admissible_actions == sorted(tw_infos["admissible_commands"][0]), command
            assert set(info["step"].admissible_actions) == set(tw_infos["admissible_commands"][0])
            assert info["won"] == tw_infos["won"][0], command
            assert info["step"].admissible is (played != 5)
            assert info["step"].format_ok
        assert played > 5
        assert terminated and info["won"] and reward == 1.0
        assert tw_infos["won"][0] and tw_dones[0]
        assert info["hindsight"].success
    finally:
        env.close()
        tw.close()


def test_generated_games_match_textworld_pddl_env(make_env) -> None:
    import textworld
    from alfworld.agents.environment.alfred_tw_env import AlfredDemangler, AlfredInfos
    from textworld.envs import PddlEnv

    raw = AlfredInfos(AlfredDemangler(PddlEnv(textworld.EnvInfos(admissible_commands=True, won=True)), shuffle=False))
    env = make_env(split="valid_unseen")
    rng = random.Random(11)
    steps = 0
    try:
        assert {e.task_type for e in env.games} == set(TASK_TYPES)
        for index, entry in enumerate(env.games):
            obs, info = env.reset(seed=index)
            raw.load(str(entry.game_file))
            state = raw.reset()
            assert obs == state.feedback
            terminated = False
            for k in range(30):
                if k < 4:
                    command = rng.choice(
                        state["admissible_commands"]) if rng.random() < 0.85 else "cool the sun with fridge 1"
                else:
                    command = command_of(env.expert_action())
                obs, _, terminated, _, info = env.step(command)
                state, _, _ = raw.step(command)
                steps += 1
                assert obs == state.feedback, (entry.task_id, command)
                assert info["step"].admissible_actions == state["admissible_commands"], (entry.task_id, command)
                assert info["won"] == state["won"]
                if terminated:
                    break
            assert terminated and state["won"], entry.task_id
        assert steps > 40
    finally:
        env.close()


def make_legacy_copy(real_game: Path, dest: Path) -> Path:
    """The real game as json_2.1.1-era files had it: "put X in/on Y", "You arrive at loc N", no help."""
    data = json.loads(real_game.read_text())
    grammar = data["grammar"]
    grammar = grammar.replace("move {o} to {r}", "put {o} in/on {r}")
    grammar = grammar.replace("You move the {o.name} to the {r.name}.", "You put the {o.name} in/on the {r.name}.")
    grammar = grammar.replace("You arrive at {r.name}.", "You arrive at {lend.name}.")
    grammar = grammar[: grammar.index("\naction help {")] + "\n"
    domain = data["pddl_domain"]
    start = domain.index("(:action help")
    end = domain.index("\n)\n", start) + 3
    domain = domain[:start] + domain[end:]
    legacy = dict(data, grammar=grammar, pddl_domain=domain)
    legacy["walkthrough"] = [re.sub(r"^move (.*) to (.*)$", r"put \1 in/on \2", a) for a in data["walkthrough"]]
    trial = dest / "json_2.1.1" / "train" / real_game.parent.parent.name / real_game.parent.name
    trial.mkdir(parents=True)
    shutil.copy(real_game.parent / "traj_data.json", trial / "traj_data.json")
    (trial / "game.tw-pddl").write_text(json.dumps(legacy))
    return trial / "game.tw-pddl"


def play_handcoded_expert(tw, max_steps: int) -> tuple[bool, list[str]]:
    """alfworld's hand-coded expert (AlfredTWEnv's dagger wrapper) until it wins or max_steps."""
    random.seed(0)  # the hand-coded expert picks among objects with the global random
    _, infos = tw.reset()
    actions: list[str] = []
    for _ in range(max_steps):
        action = infos["extra.expert_plan"][0][0]
        actions.append(action)
        _, _, dones, infos = tw.step([action])
        if infos["won"][0]:
            return True, actions
    return False, actions


def test_legacy_put_grammar_is_modernized_so_alfworlds_expert_wins(
        real_game: Path, tmp_path: Path, alfred_tw_env) -> None:
    legacy_game = make_legacy_copy(real_game, tmp_path / "legacy")
    legacy = json.loads(legacy_game.read_text())
    assert "put {o} in/on {r}" in legacy["grammar"] and "(:action help" not in legacy["pddl_domain"]

    # As it is, alfworld's hand-coded expert (which says "move X to Y") cannot place anything in the old
    # game: its move is never admissible there (it may still stumble on a win through its random fallback).
    tw = alfred_tw_env(tmp_path / "legacy" / "json_2.1.1" / "train", "dagger")
    try:
        _, actions = play_handcoded_expert(tw, 30)
    finally:
        tw.close()
    assert not any(a.startswith("move ") for a in actions)

    # Our loader rewrites it to exactly the game alfworld 0.4.2 generates.
    modern, changed = modernize_game_data(legacy)
    assert changed and modernize_game_data(modern) == (modern, False)
    original = json.loads(real_game.read_text())
    assert modern["grammar"].strip() == original["grammar"].strip()
    assert modern["pddl_domain"].split() == original["pddl_domain"].split()  # same tokens (layout differs)

    # alfworld's hand-coded expert wins the rewritten files in AlfredTWEnv.
    rewritten = tmp_path / "rewritten" / "json_2.1.1" / "train" / real_game.parent.parent.name / real_game.parent.name
    rewritten.mkdir(parents=True)
    shutil.copy(real_game.parent / "traj_data.json", rewritten / "traj_data.json")
    (rewritten / "game.tw-pddl").write_text(json.dumps(modern))
    tw = alfred_tw_env(tmp_path / "rewritten" / "json_2.1.1" / "train", "dagger")
    try:
        won, actions = play_handcoded_expert(tw, 60)
    finally:
        tw.close()
    assert won and actions[-1].startswith("move ")

    # Our env plays the old folder directly (data_dir), with the new commands, and our expert wins it.
    env = AlfWorldEnv(source="alfworld", data_dir=str(tmp_path / "legacy"))
    try:
        env.reset(seed=0)
        assert compile_game(legacy_game).modernized
        assert not any(" in/on " in c for c in env.admissible_actions())
        for _ in range(20):
            _, reward, terminated, _, info = env.step(env.expert_action())
            if terminated:
                break
        assert terminated and reward == 1.0
        assert any(t.startswith("move ") for t in info["hindsight"].details["expert_plan_from_start"])
    finally:
        env.close()


def test_engine_answers_non_commands_like_pddl_env(real_game: Path) -> None:
    import textworld
    from alfworld.agents.environment.alfred_tw_env import AlfredDemangler
    from textworld.envs import PddlEnv

    from environments.alfworld.engine import AlfredEngine

    raw = AlfredDemangler(PddlEnv(textworld.EnvInfos(admissible_commands=True)), shuffle=False)
    raw.load(str(real_game))
    state = raw.reset()
    engine = AlfredEngine()
    try:
        engine.load(compile_game(real_game))
        engine.reset()
        before = engine.state_key_parts()
        for command in ["", "   ", "go to", "go to cabinet 99", "GO TO CABINET 1", "look\nlook", "\x00"]:
            assert engine.step(command) == raw.step(command)[0].feedback == "Nothing happens.", repr(command)
            assert engine.state_key_parts() == before
            assert engine.admissible_commands == state["admissible_commands"]
        # surrounding whitespace is stripped by both
        assert engine.step("  go to fridge 1 ") == raw.step("  go to fridge 1 ")[0].feedback
    finally:
        engine.close()


def _unnumbered_game() -> dict:
    from environments.alfworld.paths import alfworld_package_dir

    pkg = alfworld_package_dir() / "data"
    problem = (Path(__file__).resolve().parents[2] / "data" / "alfworld" / "unnumbered_problem.pddl").read_text()
    grammar = (pkg / "alfred.twl2").read_text().replace("UNKNOWN GOAL", "find a cellphone")
    return {"pddl_domain": (pkg / "alfred.pddl").read_text(), "grammar": grammar, "pddl_problem": problem,
            "solvable": True, "walkthrough": ["go to drawer", "open drawer", "take cellphone from drawer"]}  # fmt: skip


def test_a_game_whose_objects_have_no_numeric_ids_plays_as_in_textworld(tmp_path: Path) -> None:
    """A hand-written problem names objects "Desk", "Book1": TextWorld's PddlEnv plays it with those names;
    so do we (not "go to desk " with a trailing space that no command matches)."""
    import textworld
    from textworld.envs import PddlEnv

    data = _unnumbered_game()
    raw = PddlEnv(textworld.EnvInfos(admissible_commands=True, won=True))
    raw.load(data)
    state = raw.reset()
    game = tmp_path / "json_2.1.1" / "train" / "pick_and_place_simple-CellPhone-None-Drawer-0" / "trial_0"
    game.mkdir(parents=True)
    (game / "game.tw-pddl").write_text(json.dumps(data))
    env = AlfWorldEnv(source="alfworld", data_dir=str(tmp_path), split="train")
    try:
        obs, info = env.reset(seed=0)
        assert obs == state.feedback and "a bed, a desk, and a drawer." in obs
        assert info["step"].admissible_actions == sorted(state["admissible_commands"])
        assert all(c == c.strip() for c in info["step"].admissible_actions)
        for command in ["go to desk", "take book1 from desk", "move book1 to desk", "go to bed", *data["walkthrough"]]:
            obs, reward, terminated, _, info = env.step(f"<action>{command}</action>")
            state, _, _ = raw.step(command)
            assert info["step"].admissible, command
            assert obs == state.feedback, command
            assert info["step"].admissible_actions == sorted(state["admissible_commands"]), command
            assert info["won"] == state["won"]
        assert terminated and reward == 1.0
    finally:
        env.close()
        raw.close()
