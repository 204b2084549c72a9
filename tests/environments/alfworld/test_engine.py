"""The engine's own rules: the state key, the game-file checks, the translation cache, library reuse."""

from __future__ import annotations

import gzip
import json
import re
import sys
from collections import OrderedDict
from pathlib import Path

import pytest

from environments.alfworld import compiled as compiled_module
from environments.alfworld import grammar as grammar_module
from environments.alfworld.compiled import compile_game, modernize_game_data, read_game_file
from environments.alfworld.engine import BOOKKEEPING_PREDICATES, AlfredEngine
from environments.alfworld.grammar import GameFileError
from environments.alfworld.paths import alfworld_package_dir


def test_bookkeeping_predicates_are_never_read() -> None:
    """The state key leaves out `checked`/`examined`: no precondition, goal or text condition reads them."""
    domain = (alfworld_package_dir() / "data" / "alfred.pddl").read_text()
    grammar = (alfworld_package_dir() / "data" / "alfred.twl2").read_text()
    for block in re.split(r"\(:action ", domain)[1:]:
        precondition = block.split(":effect")[0]
        for predicate in BOOKKEEPING_PREDICATES:
            assert f"({predicate} " not in precondition.lower(), block.splitlines()[0]
    conditions = re.findall(r'"condition"\s*:\s*"([^"]*)"', grammar) + re.findall(r"\|([^}]*)\}", grammar)
    assert len(conditions) > 10
    for text in conditions:
        for predicate in BOOKKEEPING_PREDICATES:
            assert predicate not in text.lower(), text
    from environments.alfworld.paths import import_alfworld

    goals = import_alfworld("alfworld.gen.goal_library").gdict
    for goal in goals.values():
        for predicate in BOOKKEEPING_PREDICATES:
            assert f"({predicate} " not in goal["pddl"].lower()


def test_state_key_is_the_state_not_the_history(real_game: Path) -> None:
    engine = AlfredEngine()
    try:
        engine.load(compile_game(real_game))
        engine.reset()
        start = engine.state_key_parts()
        for command in ("look", "inventory", "help", "examine countertop 1", "take the moon"):
            engine.step(command)
        assert engine.state_key_parts() == start  # looking and junk change nothing that matters

        engine.step("go to fridge 1")
        at_fridge = engine.state_key_parts()
        assert at_fridge != start
        engine.step("go to microwave 1")
        engine.step("go to fridge 1")  # TextWorld now also holds not_atlocation(agent, microwave)
        assert engine.state_key_parts() == at_fridge
        engine.step("open fridge 1")
        opened = engine.state_key_parts()
        engine.step("close fridge 1")
        assert engine.state_key_parts() == at_fridge != opened

        engine.reset()  # a new episode of the same game starts from the same key
        assert engine.state_key_parts() == start
    finally:
        engine.close()


def test_read_game_file_errors_name_the_file(tmp_path: Path) -> None:
    with pytest.raises(GameFileError, match="no such game file"):
        read_game_file(tmp_path / "missing.tw-pddl")
    bad = tmp_path / "bad.tw-pddl"
    bad.write_text("{not json")
    with pytest.raises(GameFileError, match="bad.tw-pddl:1: not a game.tw-pddl JSON"):
        read_game_file(bad)
    partial = tmp_path / "partial.tw-pddl"
    partial.write_text(json.dumps({"pddl_domain": "x"}))
    with pytest.raises(GameFileError, match="lacks grammar, pddl_problem"):
        read_game_file(partial)


def test_broken_pddl_is_a_game_file_error(real_game: Path) -> None:
    data = json.loads(real_game.read_text())
    for problem in (data["pddl_problem"][:5000], data["pddl_problem"].replace("agent1 - agent", "agent1 - robot")):
        with pytest.raises(GameFileError, match="fast-downward could not translate"):
            compile_game(dict(data, pddl_problem=problem), disk_cache=False)


def test_modernize_leaves_modern_games_alone(real_game: Path) -> None:
    data = json.loads(real_game.read_text())
    out, changed = modernize_game_data(data)
    assert out is data and not changed


def test_translation_is_cached_on_disk_and_argv_is_kept(real_game: Path, tmp_path: Path, monkeypatch) -> None:
    argv = list(sys.argv)
    monkeypatch.setattr(compiled_module, "_COMPILED", OrderedDict())
    first = compile_game(real_game, cache_dir=tmp_path)
    assert sys.argv == argv  # fast-downward's translator overwrites sys.argv; it is put back
    cached = list((tmp_path / "compiled").glob("*.json.gz"))
    assert [p.name for p in cached] == [f"{first.key}.json.gz"]

    # A new process (empty in-memory cache) reads the translation instead of translating again.
    monkeypatch.setattr(compiled_module, "_COMPILED", OrderedDict())
    monkeypatch.setattr(compiled_module, "_translate", lambda *a: pytest.fail("translated again"))
    second = compile_game(real_game, cache_dir=tmp_path)
    assert second is not first and second.sas == first.sas
    engine = AlfredEngine()
    try:
        engine.load(second)
        intro = engine.reset()
        assert "Your task is to: heat some potato and put it in sinkbasin." in intro
        for command in second.walkthrough:
            engine.step(command)
        assert engine.won
    finally:
        engine.close()

    # A damaged cache file is translated again, not an error.
    monkeypatch.undo()
    monkeypatch.setattr(compiled_module, "_COMPILED", OrderedDict())
    cached[0].write_bytes(gzip.compress(b"{truncated"))
    third = compile_game(real_game, cache_dir=tmp_path)
    assert third.sas == first.sas


def test_closed_engines_hand_their_library_back(real_game: Path) -> None:
    game = compile_game(real_game)
    a = AlfredEngine()
    a.load(game)
    a.reset()
    lib = a._lib
    a.close()
    b = AlfredEngine()
    try:
        b.load(game)
        b.reset()
        assert b._lib is lib  # reused, not another 33 MB copy of fast-downward
        c = AlfredEngine()
        c.load(game)
        c.reset()
        assert c._lib is not lib  # two live engines never share one
        c.step("go to fridge 1")
        assert "fridge" in b.step("go to fridge 1") and not b.step("go to cabinet 1").startswith("Nothing")
        c.close()
    finally:
        b.close()


def _walk_command(rng, admissible: list[str], origin: dict[str, str]) -> str:
    """A random walk step that moves objects around and often puts them back where they started (so
    that walks come back to earlier states along other histories)."""
    moves = [c for c in admissible if c.startswith("move ")]
    takes = [c for c in admissible if c.startswith("take ")]
    back = [c for c in moves if origin.get(c[5:].split(" to ")[0]) == c.split(" to ")[1]]
    if back and rng.random() < 0.3:
        command = back[0]
    elif moves and rng.random() < 0.9:
        command = rng.choice(moves)
    elif takes and rng.random() < 0.9:
        command = rng.choice(takes)
    else:
        command = rng.choice(admissible)
    if command.startswith("take "):
        obj, source = command[5:].split(" from ")
        origin.setdefault(obj, source)
    return command


def test_equal_state_keys_show_equal_text_along_random_walks(make_env, real_data: Path) -> None:
    """GiGPO groups turns by the state key: two steps with equal keys must look the same to the agent
    (the text of `look` and the admissible commands), whatever the history that led there."""
    import random

    from environments.alfworld.env import AlfWorldEnv

    envs = [make_env(split="train"), AlfWorldEnv(source="alfworld", data_dir=str(real_data))]
    compared = 0
    try:
        for env in envs:
            for game in range(env.num_tasks):
                seen: dict[str, tuple[str, tuple[str, ...]]] = {}
                for walk in range(4):
                    rng = random.Random(f"{game}-{walk}")
                    env.reset(seed=game)
                    origin: dict[str, str] = {}
                    for _ in range(60):
                        key, admissible = env.state_key(), tuple(env.admissible_actions())
                        view = (env.engine.step("look"), admissible)  # look changes nothing the key holds
                        assert env.state_key() == key
                        if key in seen:
                            compared += 1
                            assert view == seen[key], env.games[game].task_id
                        seen.setdefault(key, view)
                        _, _, terminated, truncated, _ = env.step(_walk_command(rng, list(admissible), origin))
                        if terminated or truncated:
                            break
    finally:
        for env in envs:
            env.close()
    assert compared > 500  # the walks do come back to earlier states


def test_state_key_keeps_the_deleted_atoms_the_text_reads(real_game: Path) -> None:
    from environments.alfworld.compiled import negated_predicates_read

    grammar = (alfworld_package_dir() / "data" / "alfred.twl2").read_text()
    assert negated_predicates_read(grammar) == {"not_inreceptacle", "not_istoggled"}
    assert compile_game(real_game).negated_read == {"not_inreceptacle", "not_istoggled"}


def test_first_loads_and_grammar_parses_are_safe_under_threads(make_env, monkeypatch) -> None:
    """8 threads reset the same 6 games at once, each game for the first time in the process (empty
    game, grammar and condition caches): every reset gives the game's intro and admissible commands."""
    import threading

    probe = make_env(split="train")
    expected = []
    for seed in range(6):
        obs, info = probe.reset(seed=seed)
        expected.append((obs, tuple(info["step"].admissible_actions)))
    probe.close()
    for module, name in ((compiled_module, "_COMPILED"), (grammar_module, "_GRAMMARS"),
                         (grammar_module, "_CONDITIONS")):
        monkeypatch.setattr(module, name, type(getattr(module, name))())

    n_threads = 8
    barrier = threading.Barrier(n_threads)
    results: dict[int, list] = {}

    def play(worker: int) -> None:
        env = make_env(split="train")
        out = []
        try:
            for seed in range(6):
                barrier.wait(timeout=60)
                try:
                    obs, info = env.reset(seed=seed)
                    out.append((obs, tuple(info["step"].admissible_actions)))
                except Exception as e:  # recorded, so that the assertion shows what went wrong
                    out.append(f"{type(e).__name__}: {e}")
        finally:
            env.close()
            results[worker] = out

    threads = [threading.Thread(target=play, args=(k,)) for k in range(n_threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert sorted(results) == list(range(n_threads))
    for worker, out in results.items():
        errors = [r for r in out if isinstance(r, str)]
        assert not errors, f"thread {worker}: {errors[:2]}"
        assert out == expected
