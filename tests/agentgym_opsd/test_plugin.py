"""Plug-ins: a third-party package registers its env through the entry-point group, and gets the contract."""

from __future__ import annotations

import sys
import textwrap
import warnings

import gymnasium as gym

import agentgym_opsd
from agentgym_opsd.env_checker import check_text_env
from agentgym_opsd.registry import (
    ENTRY_POINT_GROUP,
    env_description,
    load_plugins,
    plugin_errors,
    registered_envs,
    task_count,
)


def test_example_plugin_is_registered_through_its_entry_point() -> None:
    from importlib import metadata

    names = {ep.value for ep in metadata.entry_points(group=ENTRY_POINT_GROUP)}
    assert "agentgym_example_plugin:register" in names
    entry = {e.id: e for e in registered_envs()}["example/GuessNumber-v0"]
    assert entry.family == "Example" and task_count(entry.id, "test") == 20  # no `sizes`: the env's num_tasks
    assert env_description(entry.id).startswith("Find a hidden number")  # no `description`: the class docstring
    env = gym.make("example/GuessNumber-v0")  # plain gymnasium works after `import agentgym_opsd`
    assert isinstance(env.unwrapped, agentgym_opsd.TextEnv)


def test_example_plugin_passes_the_contract() -> None:
    check_text_env(lambda: agentgym_opsd.make("example/GuessNumber-v0"))


def test_a_broken_plugin_is_reported_not_fatal(tmp_path, monkeypatch) -> None:
    pkg = tmp_path / "broken_plugin"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("raise ImportError('missing dependency frobnicate')\n")
    dist = tmp_path / "broken_plugin-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: broken-plugin\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(textwrap.dedent(f"""
        [{ENTRY_POINT_GROUP}]
        broken = broken_plugin:register
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        load_plugins(reload=True)
    assert any("frobnicate" in str(w.message) for w in caught)
    assert any("frobnicate" in err for err in plugin_errors().values())
    assert "example/GuessNumber-v0" in {e.id for e in registered_envs()}
    sys.modules.pop("broken_plugin", None)


def test_contract_catches_a_broken_env() -> None:
    from agentgym_example_plugin import GuessNumberEnv

    class NoHindsightOnJunk(GuessNumberEnv):
        def _invalid(self, parsed):
            raise RuntimeError("junk crashes me")

    try:
        check_text_env(lambda: NoHindsightOnJunk(), run_gymnasium_checker=False)
    except RuntimeError as e:
        assert "junk crashes me" in str(e)
    else:
        raise AssertionError("the contract should have failed")


def test_contract_reports_the_envs_own_exception_first() -> None:
    """An env whose step raises is reported by its own exception, not by what is missing after it
    (it used to read "seed 0: no hindsight at the end")."""
    import pytest
    from agentgym_example_plugin import GuessNumberEnv

    class DividesByZero(GuessNumberEnv):
        def _apply(self, action):
            return 1 / 0

    with pytest.raises(ZeroDivisionError) as caught:
        check_text_env(lambda: DividesByZero(), run_gymnasium_checker=False)
    assert any("raised by the env" in note for note in getattr(caught.value, "__notes__", []))
    assert any("_apply" in str(frame.name) for frame in caught.traceback)


def test_a_plugin_imported_before_the_package_registers_without_a_warning() -> None:
    # `import environments.alfworld` first: its own `from agentgym_opsd... import` runs the plug-ins while
    # the alfworld module is half-imported; its entry point must wait for it, not be reported broken.
    import subprocess

    code = ("import warnings; warnings.simplefilter('error')\n"
            "import environments.alfworld, agentgym_opsd\n"
            "from agentgym_opsd.registry import entry, plugin_errors\n"
            "print(entry('agentgym/ALFWorld-Pick-v0').family, plugin_errors())")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["ALFWorld", "{}"]
