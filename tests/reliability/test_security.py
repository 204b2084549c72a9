"""Security basics: servers listen on loopback unless told otherwise; nothing unpickles data files.

The bind checks read the kernel's table of listening sockets (/proc/net/tcp{,6}) for the sockets the
server process holds (conftest.py), so they check where the real process listens, not what an
argument says.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def test_the_retrieval_server_listens_on_loopback_by_default(wiki_index: Path, tmp_path: Path,
                                                             assert_listens_on_loopback_only) -> None:
    """`python -m retrieval_index.server` with no --host, as a user would start it."""
    port_file = tmp_path / "port"
    server = subprocess.Popen(
        [sys.executable, "-m", "retrieval_index.server", "--index", str(wiki_index), "--port", "0", "--port-file",
         str(port_file), "--exit-with-parent", str(os.getpid())],  # fmt: skip
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        deadline = time.monotonic() + 120
        while not port_file.exists() and time.monotonic() < deadline and server.poll() is None:
            time.sleep(0.05)
        assert port_file.exists(), server.stdout.read() if server.poll() is not None else "no port file"
        assert_listens_on_loopback_only(server.pid)
    finally:
        server.kill()
        server.wait(10)
        server.stdout.close()


def test_server_helpers_and_commands_default_to_loopback(retrieval_server, assert_listens_on_loopback_only) -> None:
    """The child-process helper the envs and tests use, the serve() function and the CLI's option."""
    import argparse
    import inspect

    from retrieval_index import server as server_module
    from retrieval_index.process import RetrievalServer

    assert_listens_on_loopback_only(retrieval_server.process.pid)
    assert inspect.signature(RetrievalServer).parameters["host"].default == "127.0.0.1"
    assert inspect.signature(server_module.serve).parameters["host"].default == "127.0.0.1"
    parser = argparse.ArgumentParser()
    server_module.add_server_arguments(parser)
    assert parser.parse_args(["--index", "x"]).host == "127.0.0.1"


# ------------------------------------------------------------------------------------------------
# No pickles from data files.

UNSAFE_LOADS = re.compile(
    r"\bpickle\.loads?\(|\bcloudpickle\.loads?\(|\bdill\.loads?\(|\bjoblib\.load\(|\bshelve\.open\(|read_pickle\(|"
    r"allow_pickle\s*=\s*True|\byaml\.(unsafe_load|load)\(|Loader\s*=\s*yaml\.(Unsafe|Full)?Loader\b|"
    r"\btorch\.load\((?![^)]*weights_only\s*=\s*True)"
)
# (file, what) -> why it is not a data file being unpickled.
ALLOWED_UNSAFE = {
    ("agentgym_opsd/workers.py",
     "pickle.loads("): "checks that an exception object survives the pipe to its own worker "
                       "(pickle.loads(pickle.dumps(e)))",
}


def test_nothing_unpickles_data_files() -> None:
    offenders = []
    for folder in ("agentgym_opsd", "environments", "retrieval_index", "trainer", "benchmarks", "scripts"):
        for path in sorted((REPO / folder).rglob("*.py")) if (REPO / folder).is_dir() else []:
            rel = path.relative_to(REPO).as_posix()
            text = path.read_text(encoding="utf-8")
            # torch.load calls span lines: judge each call with its arguments joined.
            joined = re.sub(r"\(\s*\n\s*", "(", text)
            for match in UNSAFE_LOADS.finditer(joined):
                line = joined[: match.start()].count("\n") + 1
                if (rel, match.group(0)) not in ALLOWED_UNSAFE:
                    offenders.append(f"{rel}:{line}: {match.group(0)}")
    assert not offenders, ("load data with json / safetensors / torch.load(weights_only=True) / yaml.safe_load:\n"
                           + "\n".join(offenders))


@pytest.mark.parametrize("payload", ["pickle", "yaml"])
def test_loaders_refuse_code_hidden_in_data(tmp_path: Path, payload: str) -> None:
    """A question file or an episode file holding a pickle or a YAML object tag is a format error, not code."""
    import pickle

    from agentgym_opsd.episode import load_episodes
    from agentgym_opsd.io import DataFileError
    from environments.searchqa.data import load_questions

    marker = tmp_path / "pwned"
    if payload == "pickle":
        data = pickle.dumps(_Touch(str(marker)))
    else:
        data = f'!!python/object/apply:os.system ["touch {marker}"]\n'.encode()
    path = tmp_path / "data.jsonl"
    path.write_bytes(data)
    for load in (load_questions, load_episodes):
        with pytest.raises(DataFileError, match=re.escape(str(path))):
            load(path)
    assert not marker.exists()


class _Touch:
    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (Path.touch, (Path(self.path),))


# ------------------------------------------------------------------------------------------------
# Data paths from a config stay inside their root.


def test_config_paths_are_not_followed_outside_their_root(tmp_path: Path) -> None:
    from agentgym_opsd.paths import (
        PathOutsideRoot,
        contain_path_options,
        contained_path,
    )

    root = tmp_path / "data"
    (root / "qa").mkdir(parents=True)
    (root / "qa" / "nq.jsonl").write_text("{}\n")
    outside = tmp_path / "secret.txt"
    outside.write_text("secret")
    (root / "link").symlink_to(outside)
    (root / "qa" / "inner").symlink_to(root / "qa" / "nq.jsonl")

    assert contained_path("qa/nq.jsonl", root) == (root / "qa" / "nq.jsonl").resolve()
    assert contained_path(root / "qa", root) == (root / "qa").resolve()
    assert contained_path("qa/../qa/nq.jsonl", root) == (root / "qa" / "nq.jsonl").resolve()
    assert contained_path("qa/inner", root) == (root / "qa" / "nq.jsonl").resolve()  # a link that stays inside
    assert contained_path(".", root) == root.resolve()
    for escape in ("../secret.txt", str(outside), "link", "qa/../../secret.txt", "~/.ssh/id_rsa", "/etc/passwd"):
        with pytest.raises(PathOutsideRoot, match=r"envs\[1\]\.options\.data_file: .*outside the data root"):
            contain_path_options({"data_file": escape}, root, "bench.toml: envs[1].options")
    # Only path-valued options are resolved; others (URLs, numbers, names) pass as they are.
    options = contain_path_options({"data_file": "qa/nq.jsonl", "server_url": "http://127.0.0.1:8000", "topk": 3,
                                    "catalog": "qa", "split": "../x"}, root, "cfg")  # fmt: skip
    assert options == {"data_file": str((root / "qa" / "nq.jsonl").resolve()), "server_url": "http://127.0.0.1:8000",
                       "topk": 3, "catalog": str((root / "qa").resolve()), "split": "../x"}  # fmt: skip
    # A path option's built-in choices are names, not files (WebShop: catalog = "builtin", goals = "human").
    assert contain_path_options({"catalog": "builtin", "goals": "human", "index_dir": "auto"}, root, "cfg") == {
        "catalog": "builtin", "goals": "human", "index_dir": "auto"}


def test_bench_configs_keep_their_data_paths_inside_the_data_root(
        tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from agentgym_app.bench_config import ConfigError, load_config
    from agentgym_app.cli import main as cli_main

    root = tmp_path / "project"
    (root / "data").mkdir(parents=True)
    (root / "data" / "nq.jsonl").write_text('{"question": "q?", "answer": ["a"]}\n')
    (tmp_path / "private.jsonl").write_text('{"question": "secret?", "answer": ["s"]}\n')

    def config(data_file: str, name: str = "bench.toml") -> Path:
        path = root / name
        path.write_text(
            'agents = ["expert"]\n[[envs]]\nid = "agentgym/SearchQA-NQ-v0"\nsplits = ["test"]\n'
            f'options = {{ data_file = "{data_file}", server_url = "http://127.0.0.1:9" }}\n'
        )
        return path

    # Relative to the config's folder by default, resolved to an absolute path.
    loaded = load_config(config("data/nq.jsonl"))
    assert loaded.envs[0].options["data_file"] == str((root / "data" / "nq.jsonl").resolve())
    assert loaded.envs[0].options["server_url"] == "http://127.0.0.1:9"  # not a path: untouched
    (root / "data" / "escape.jsonl").symlink_to(tmp_path / "private.jsonl")
    for escape in ("../private.jsonl", str(tmp_path / "private.jsonl"), "data/escape.jsonl",
                   "data/../../private.jsonl"):
        with pytest.raises(ConfigError, match=r"bench.toml: envs\[1\]: options\.data_file: .* outside the data root"):
            load_config(config(escape))
    # A wider root is the user's choice, on the command line (never in the config itself); paths are
    # then relative to it.
    assert load_config(config("private.jsonl"),
                       data_root=tmp_path).envs[0].options["data_file"] == str((tmp_path / "private.jsonl").resolve())
    assert cli_main(["bench", str(config("../private.jsonl")), "--out", str(tmp_path / "run"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "outside the data root" in err and "--data-root" in err
    assert not (tmp_path / "run" / "episodes.jsonl").exists()  # refused before anything ran
