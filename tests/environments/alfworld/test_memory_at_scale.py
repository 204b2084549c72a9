"""What a process keeps per ALFWorld game, so that cycling through ALFWorld's 3,553 training games holds.

benchmarks/scale.py measures it at 240 to 3,552 games; these tests pin the causes it found: TextWorld's
process-wide interning of propositions (never emptied), games kept in memory with their parsed JSON and
uncompressed SAS text, every reset reading its game file again, and whole traj_data.json files cached.
"""

from __future__ import annotations

import gc
import tracemalloc
from collections import OrderedDict
from pathlib import Path


from environments.alfworld import compiled as compiled_module
from environments.alfworld import data as data_module
from environments.alfworld.compiled import compile_game
from environments.alfworld.grammar import TextWorldImports


def interned_propositions() -> int:
    import mementos.core

    proposition = TextWorldImports.load().Proposition
    return sum(1 for key in list(mementos.core._memento_cache) if type(key) is tuple and key and key[0] is proposition)


def test_interned_propositions_do_not_pile_up_game_after_game(make_env, monkeypatch) -> None:
    """TextWorld interns every proposition in a table it never empties (about 1 MB per game). Played one
    after another, with the bound at 0, the table holds no more than the game being played made: what
    earlier games interned is gone. (Before the bound, game k's count included every earlier game's.)"""
    import mementos.core

    env = make_env(split="train")
    games = range(min(env.num_tasks, 5))
    monkeypatch.setattr(compiled_module, "MAX_INTERNED_PROPOSITIONS", 0)
    alone = []
    for seed in games:  # each game alone: its own propositions
        monkeypatch.setattr(compiled_module, "_COMPILED", OrderedDict())
        monkeypatch.setattr(mementos.core, "_memento_cache", {})
        env.reset(seed=seed)
        alone.append(interned_propositions())
    monkeypatch.setattr(compiled_module, "_COMPILED", OrderedDict())
    monkeypatch.setattr(mementos.core, "_memento_cache", {})
    in_a_row = []
    for seed in games:
        env.reset(seed=seed)
        in_a_row.append(interned_propositions())
    assert all(n > 0 for n in alone)
    assert in_a_row == alone, (in_a_row, alone)
    env.close()


def test_bound_keeps_other_interned_objects_and_propositions_stay_equal(make_env, monkeypatch) -> None:
    """Forgetting interned propositions changes no game: propositions compare by value, signatures
    (TextWorld's other interned objects) stay, and a game replayed after the bound plays the same."""
    import mementos.core

    env = make_env(split="train")
    first, _ = env.reset(seed=1)
    commands = env.admissible_actions()[:3]
    before = [env.step(c)[0] for c in commands]
    monkeypatch.setattr(compiled_module, "_COMPILED", OrderedDict())
    signatures = sum(1 for k in mementos.core._memento_cache if isinstance(k, tuple) and k
                     and getattr(k[0], "__name__", "") == "Signature")
    forgotten = compiled_module.bound_interned_propositions(0)
    assert forgotten > 0 and interned_propositions() == 0
    assert sum(1 for k in mementos.core._memento_cache if isinstance(k, tuple) and k
               and getattr(k[0], "__name__", "") == "Signature") == signatures
    again, _ = env.reset(seed=1)
    assert again == first and [env.step(c)[0] for c in commands] == before
    env.close()


def _retained_bytes(fn) -> tuple[object, int]:
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        result = fn()
        gc.collect()
        return result, tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()


def test_a_game_in_memory_costs_less_than_its_translation_text(real_game: Path, monkeypatch) -> None:
    """A compiled game keeps what resets and steps read: not the game file's JSON, and the SAS
    translation compressed. (It used to keep both as read: more than the SAS text alone.)"""
    compile_game(real_game)  # the translation on disk, the grammar parsed: what every later game finds
    monkeypatch.setattr(compiled_module, "_COMPILED", OrderedDict())
    monkeypatch.setattr(compiled_module, "MAX_INTERNED_PROPOSITIONS", 0)
    game, retained = _retained_bytes(lambda: compile_game(real_game))
    sas = game.sas  # type: ignore[attr-defined]
    assert sas.startswith(b"begin_version")
    assert retained < len(sas), f"a compiled game holds {retained} bytes; its SAS text is {len(sas)}"


def test_a_reset_of_a_game_in_memory_reads_no_file(make_env, monkeypatch, tmp_path: Path) -> None:
    """The second reset of a game finds it by its file's identity (path, time, size, inode) without
    reading and hashing the file again; a file that changed is read again."""
    env = make_env(split="train")
    first, _ = env.reset(seed=0)

    def no_read(path):
        raise AssertionError(f"{path} read again")

    monkeypatch.setattr(compiled_module, "read_game_file", no_read)
    again, _ = env.reset(seed=0)
    assert again == first
    monkeypatch.undo()

    reads = []
    real_read = compiled_module.read_game_file
    monkeypatch.setattr(compiled_module, "read_game_file", lambda path: reads.append(path) or real_read(path))
    copy = tmp_path / "game.tw-pddl"
    text = env.games[0].game_file.read_text()
    copy.write_text(text)
    game = compile_game(copy)
    assert compile_game(copy) is game and len(reads) == 1
    copy.write_text(text + "  ")  # another size: another identity, read again (the same game inside)
    assert compile_game(copy) is game and len(reads) == 2
    env.close()


def test_cached_translations_check_engine_versions_once_per_process(make_env, monkeypatch) -> None:
    """Whether a cached translation matches the installed engine is asked of importlib.metadata once
    per process, not at every game's first load (each lookup scans the installed distributions)."""
    from importlib import metadata

    compiled_module._engine_versions.cache_clear()
    calls = []
    real_version = metadata.version
    monkeypatch.setattr(metadata, "version", lambda name: calls.append(name) or real_version(name))
    env = make_env(split="train")
    for seed in range(min(env.num_tasks, 4)):
        monkeypatch.setattr(compiled_module, "_COMPILED", OrderedDict())
        env.reset(seed=seed)
    assert sorted(calls) == ["fast-downward-textworld", "textworld"]
    env.close()


def test_task_params_keep_two_fields_of_traj_data(real_game: Path) -> None:
    """A reset needs the task type and pddl_params of a trial's traj_data.json; the process keeps those,
    not the whole file (278 kB for the real game, about a MB parsed; a process cycling through ALFWorld's
    3,553 games used to keep them all)."""
    trial = real_game.parent
    size = (trial / "traj_data.json").stat().st_size
    data_module._task_params.cache_clear()
    (task_type, params), retained = _retained_bytes(lambda: data_module.read_task_params(trial))
    assert task_type == "pick_heat_then_place_in_recep" and params["object_target"] == "Potato"
    assert data_module.read_task_params(trial) == (task_type, params)
    assert retained < size / 20, f"{retained} bytes kept for a {size}-byte traj_data.json"
    full = data_module.read_traj_data(trial)
    assert full is not None and full["pddl_params"] == params
