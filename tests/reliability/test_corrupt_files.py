"""Every loader answers a corrupt or truncated file with an error that names the file and the line.

Each loader reads a small slice of a real file (../shared/data, or episodes this suite plays); hypothesis
then truncates it, overwrites or deletes bytes, or inserts hazards (invalid UTF-8, NUL, JSON nested
past Python's recursion limit, integers past its digit limit) at a random place. The loader must
either read the file (a cut at a record boundary is still a valid file) or raise its documented error
(`DataFileError`; `CatalogError` for WebShop, `GameFileError` for ALFWorld games) naming the file and a line
(`path:N`, `line N`) or a record (`record N`), or, for a config whose syntax is fine but a value is wrong, the
section, never another exception.
"""

from __future__ import annotations

import itertools
import json
import re
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import example, given
from hypothesis import strategies as st
from reliability_fuzz import fuzz_settings

from agentgym_opsd.io import DataFileError

FUZZ = fuzz_settings(40)
PLACE = re.compile(r":\d+\b|\bline \d+|\brecord \d+")
WHOLE_FILE = re.compile(
    r": (catalog \S+: )?(no questions in the file|no products|expected a mapping with sections rollout, credit, "
    r"teacher)$")  # errors about no line in particular
# A config whose syntax is fine but a value is wrong names the setting instead of a line.
CONFIG_KEY = re.compile(
    r"^: (rollout|credit|teacher|unknown section|agents?\b|envs(\[\d+\])?|seeds|episodes|workers|num_envs|"
    r"step_timeout|context|"
    r"unknown setting|two agents|an env id|the config must be)"
)

HAZARDS = [b"\xff\xfe", b"\xc3", b"\x00", b"[" * 20_000, b"9" * 5000, b'{"', b"}", b'"', b"\n", b",", b"\\"]


@st.composite
def corruptions(draw) -> Callable[[bytes], bytes]:
    kind = draw(st.sampled_from(["truncate", "overwrite", "insert", "delete"]))
    where = draw(st.floats(0, 1))
    if kind == "truncate":
        return lambda data: data[: int(where * len(data))]
    if kind == "overwrite":
        junk = draw(st.binary(min_size=1, max_size=8))
        return lambda data: data[: int(where * len(data))] + junk + data[int(where * len(data)) + len(junk) :]
    if kind == "insert":
        junk = draw(st.sampled_from(HAZARDS) | st.binary(min_size=1, max_size=8))
        return lambda data: data[: int(where * len(data))] + junk + data[int(where * len(data)) :]
    span = draw(st.integers(1, 200))
    return lambda data: data[: int(where * len(data))] + data[int(where * len(data)) + span :]


# ------------------------------------------------------------------------------------------------
# The loaders, each with the slice of a real file it reads.


def _first_lines(path: Path, n: int) -> bytes:
    with open(path, "rb") as f:
        return b"".join(itertools.islice(f, n))


def _episodes_jsonl() -> bytes:
    import agentgym_opsd
    from agentgym_opsd import EpisodeRequest, run_episodes
    from agentgym_opsd.agents import RandomAgent
    from agentgym_opsd.episode import save_episodes

    episodes = run_episodes(lambda: agentgym_opsd.make("example/GuessNumber-v0"), RandomAgent(),
                            [EpisodeRequest(seed=s) for s in range(4)], progress=False)
    with tempfile.TemporaryDirectory() as tmp:
        save_episodes(Path(tmp) / "e.jsonl", episodes)
        return (Path(tmp) / "e.jsonl").read_bytes()


def _load_questions(path: Path):
    from environments.searchqa.data import load_questions

    return load_questions(path)


def _load_corpus(path: Path):
    from retrieval_index.corpus import iter_corpus

    return list(iter_corpus(path))


def _load_episodes(path: Path):
    from agentgym_opsd.episode import load_episodes

    return load_episodes(path)


def _load_jsonl(path: Path):
    from agentgym_opsd.io import read_jsonl

    return list(read_jsonl(path))


def _webshop_items(path: Path):
    from environments.webshop.catalog import Catalog

    return Catalog.from_files(path)


def _alfworld_game(path: Path):
    from environments.alfworld.compiled import read_game_file

    return read_game_file(path)


def _bridge_config(path: Path):
    from trainer.openrlhf.config import BridgeConfig

    return BridgeConfig.load(path)


BRIDGE_YAML = b"""# an OpenRLHF bridge config
rollout:
  turn_max_tokens: 512
  max_turns: 50
  chat_template_kwargs: {enable_thinking: false}
credit:
  method: stepopsd
  preset: default
  lam_mix: 0.2
teacher:
  max_len: 8192
  micro_batch_size: 4
"""


def _bench_config(path: Path):
    from agentgym_app.bench_config import load_config

    return load_config(path)


BENCH_TOML = b"""# a bench config
name = "fuzz"
agents = ["expert", "random"]
seeds = [0, 1]
episodes = 3
workers = 0

[[envs]]
id = "example/GuessNumber-v0"
splits = ["test"]
options = { high = 20 }
"""

BENCH_YAML = b"""# a bench config
name: fuzz
agents: [expert, random]
seeds: [0, 1]
episodes: 3
envs:
  - id: example/GuessNumber-v0
    splits: [test]
    options: {high: 20}
"""


LOADERS: dict[str, tuple[str, Callable[[Path], object]]] = {
    # name: (file name, loader); the file's clean content comes from `clean_files`.
    "searchqa-nq": ("nq.jsonl", _load_questions),
    "searchqa-triviaqa": ("triviaqa.jsonl", _load_questions),
    "searchqa-hotpotqa-distractor": ("hotpot_distractor.jsonl", _load_questions),
    "searchqa-hotpotqa-simplified-list": ("hotpot_simplified.json", _load_questions),
    "searchqa-flashrag": ("flashrag.jsonl", _load_questions),
    "corpus": ("corpus.jsonl", _load_corpus),
    "webshop-items": ("items_shuffle_10.json", _webshop_items),
    "webshop-documents": ("products_10_documents.jsonl", _webshop_items),
    "alfworld-game": ("game.tw-pddl", _alfworld_game),
    "openrlhf-bridge-config": ("bridge.yaml", _bridge_config),
    "bench-config-toml": ("bench.toml", _bench_config),
    "bench-config-yaml": ("bench.yaml", _bench_config),
    "episodes": ("episodes.jsonl", _load_episodes),
    "jsonl": ("episodes.jsonl", _load_jsonl),
}


@pytest.fixture(scope="module")
def clean_files(shared_data, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """File name -> a clean slice of a real file on disk."""
    qa, webshop = shared_data("qa"), shared_data("webshop")
    hotpot = json.loads((qa / "hotpot_dev_v1_simplified_part1.json").read_bytes())[:8]
    items = json.loads((webshop / "items_shuffle_100.json").read_bytes())[:10]
    contents = {
        "nq.jsonl": _first_lines(qa / "nq_open_dev_part1.jsonl", 20),
        "triviaqa.jsonl": _first_lines(qa / "triviaqa_sm_sub_part1.jsonl", 10),
        "hotpot_distractor.jsonl": _first_lines(qa / "hotpotqa_distractor_dev_sample_100.jsonl", 4),
        "hotpot_simplified.json": json.dumps(hotpot, indent=1).encode(),
        "flashrag.jsonl": _first_lines(qa / "flashrag_nq_test_16.jsonl", 16),
        "corpus.jsonl": _first_lines(shared_data("wiki") / "flashrag_wiki18_sample_1000.jsonl", 20),
        "items_shuffle_10.json": json.dumps(items, indent=1).encode(),
        "products_10_documents.jsonl": _first_lines(webshop / "products_100_documents.jsonl", 10),
        "episodes.jsonl": _episodes_jsonl(),
        "bridge.yaml": BRIDGE_YAML,
        "bench.toml": BENCH_TOML,
        "bench.yaml": BENCH_YAML,
        "game.tw-pddl": next((shared_data("alfworld") / "json_2.1.1").rglob("game.tw-pddl")).read_bytes(),
    }
    folder = tmp_path_factory.mktemp("clean")
    for name, data in contents.items():
        (folder / name).write_bytes(data)
    return {name: folder / name for name in contents}


def _expected_errors() -> tuple[type[BaseException], ...]:
    from agentgym_app.bench_config import ConfigError as BenchConfigError
    from environments.alfworld.grammar import GameFileError
    from environments.webshop.catalog import CatalogError
    from trainer.openrlhf.config import ConfigError

    return (DataFileError, CatalogError, GameFileError, ConfigError, BenchConfigError)


@pytest.mark.parametrize("loader", list(LOADERS))
def test_each_clean_slice_loads(clean_files, loader: str, tmp_path: Path) -> None:
    name, load = LOADERS[loader]
    path = tmp_path / name
    path.write_bytes(clean_files[name].read_bytes())
    assert load(path)  # the corruption test below starts from a file the loader reads


@pytest.mark.parametrize("loader", list(LOADERS))
@FUZZ
@given(corrupt=corruptions())
@example(corrupt=lambda data: data[: len(data) // 2])  # cut mid-record
@example(corrupt=lambda data: data[:-1] + b"\xff")  # invalid UTF-8 at the end
@example(corrupt=lambda data: data[:40] + b"\xff\xfe" + data[40:])  # invalid UTF-8 on the first line
@example(corrupt=lambda data: data[:40] + b"[" * 20_000 + data[40:])
@example(corrupt=lambda data: data[:40] + b"9" * 5000 + data[40:])
@example(corrupt=lambda data: data.replace(b"\n", b"\n\n[1, 2]\n", 1))  # a record that is not an object
def test_a_corrupt_file_gives_an_error_naming_the_file_and_the_line(clean_files, loader: str, corrupt) -> None:
    name, load = LOADERS[loader]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / name
        path.write_bytes(corrupt(clean_files[name].read_bytes()))
        try:
            load(path)
        except _expected_errors() as e:
            message = str(e)
            assert str(path) in message, message[:300]
            rest = message.split(str(path), 1)[1]
            assert PLACE.search(rest) or WHOLE_FILE.search(rest) or CONFIG_KEY.search(
                rest), f"no line or record in: {message[:300]}"
