"""Crash safety: a process killed with SIGKILL in the middle of a write loses nothing already saved.

Real child processes write real files (tens of MB, so the kill lands inside the write) and are killed
with SIGKILL at several moments; the parent then reads what is on disk. A source scan checks that
result and checkpoint writers go through agentgym_opsd.io (temp file, fsync, rename; model folders
through `atomic_directory`).
"""

from __future__ import annotations

import hashlib
import json
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from agentgym_opsd.io import DataFileError, append_jsonl, atomic_write_bytes, read_jsonl

REPO = Path(__file__).resolve().parents[2]

WRITER = textwrap.dedent(
    """
    import hashlib, os, sys
    from agentgym_opsd.io import atomic_write_bytes
    path, size = sys.argv[1], int(sys.argv[2])
    for version in range(1, 1000):
        body = version.to_bytes(8, "big") + os.urandom(size)
        print(f"start {version}", flush=True)
        atomic_write_bytes(path, body + hashlib.sha256(body).digest())
        print(f"done {version}", flush=True)
    """
)

FOLDER_WRITER = textwrap.dedent(
    """
    import hashlib, os, sys
    from pathlib import Path
    from agentgym_opsd.io import atomic_directory
    path = sys.argv[1]
    for version in range(1, 1000):
        print(f"start {version}", flush=True)
        with atomic_directory(path) as tmp:  # what save_pretrained does: several files in a folder
            for part in range(4):
                body = version.to_bytes(8, "big") + os.urandom(6 * 2**20)
                (Path(tmp) / f"shard-{part}.bin").write_bytes(body + hashlib.sha256(body).digest())
        print(f"done {version}", flush=True)
    """
)

APPENDER = textwrap.dedent(
    """
    import sys
    from agentgym_opsd.io import append_jsonl
    path = sys.argv[1]
    for i in range(100000):
        append_jsonl(path, [{"i": i, "pad": "x" * 300000}])
        print(f"done {i}", flush=True)
    """
)


def _start(code: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-c", code, *args], stdout=subprocess.PIPE, text=True, cwd=REPO)


def _read_until(process: subprocess.Popen[str], prefix: str, timeout: float = 60.0) -> list[str]:
    """Lines the child printed up to and including the first one starting with `prefix`."""
    lines: list[str] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = process.stdout.readline().strip()  # type: ignore[union-attr]
        if not line and process.poll() is not None:
            break
        lines.append(line)
        if line.startswith(prefix):
            return lines
    raise AssertionError(f"the child never printed {prefix!r}; it printed {lines[-5:]}")


def _kill(process: subprocess.Popen[str]) -> list[str]:
    process.send_signal(signal.SIGKILL)
    rest = process.stdout.read().split()  # type: ignore[union-attr]
    process.stdout.close()  # type: ignore[union-attr]
    process.wait(10)
    assert process.returncode == -signal.SIGKILL
    return rest


def _verified_version(path: Path) -> int:
    data = path.read_bytes()
    body, digest = data[:-32], data[-32:]
    assert hashlib.sha256(body).digest() == digest, f"{path} is torn ({len(data)} bytes)"
    return int.from_bytes(body[:8], "big")


@pytest.mark.parametrize("delay", [0.0, 0.02, 0.08])
def test_sigkill_during_an_atomic_write_leaves_the_previous_file_whole(tmp_path: Path, delay: float) -> None:
    """Kill a writer while it replaces a 32 MB file: the file on disk is a whole version, and the
    newest one the writer had finished (or the one it was writing, if the rename got through)."""
    target = tmp_path / "checkpoint.bin"
    writer = _start(WRITER, str(target), str(32 * 2**20))
    try:
        _read_until(writer, "done 1")
        _read_until(writer, "start 2")
        time.sleep(delay)
        rest = _kill(writer)
    finally:
        writer.kill()
    done = [int(v) for word, v in zip(rest, rest[1:]) if word == "done"] or [1]
    version = _verified_version(target)
    # The newest finished version, or the next one if the kill came between its rename and the print.
    assert version in (max(done), max(done) + 1)
    # What a crash leaves besides the file is only hidden temp files, which the next write ignores.
    leftovers = [p.name for p in tmp_path.iterdir() if p != target]
    assert all(re.fullmatch(r"\.checkpoint\.bin\..+\.tmp", name) for name in leftovers), leftovers
    atomic_write_bytes(target, b"next")
    assert target.read_bytes() == b"next"


@pytest.mark.parametrize("delay", [0.0, 0.05, 0.15])
def test_sigkill_while_a_folder_is_saved_leaves_a_whole_previous_folder(tmp_path: Path, delay: float) -> None:
    """A model folder saved through `atomic_directory` (4 files of 6 MB) is whole after a SIGKILL at
    any moment: every file there, all of one version."""
    target = tmp_path / "model"
    writer = _start(FOLDER_WRITER, str(target))
    try:
        _read_until(writer, "done 1")
        _read_until(writer, "start 2")
        time.sleep(delay)
        rest = _kill(writer)
    finally:
        writer.kill()
    done = [int(v) for word, v in zip(rest, rest[1:]) if word == "done"] or [1]
    folder = target
    if not target.exists():  # killed between the two renames: the previous folder is aside, whole
        (folder,) = tmp_path.glob(".model.old-*")
    versions = {_verified_version(folder / f"shard-{part}.bin") for part in range(4)}
    assert len(versions) == 1 and versions.pop() in (max(done), max(done) + 1)
    assert sorted(p.name for p in folder.iterdir()) == [f"shard-{part}.bin" for part in range(4)]


def test_sigkill_during_jsonl_appends_loses_no_finished_record(tmp_path: Path) -> None:
    """Kill a process appending 300 kB records: every record it reported written reads back in order;
    at most the record being written is torn, the strict reader names the torn line, and the next append
    starts on a fresh line."""
    path = tmp_path / "results.jsonl"
    appender = _start(APPENDER, str(path))
    try:
        _read_until(appender, "done 5")
        time.sleep(0.013)
        _kill(appender)
    finally:
        appender.kill()
    records = [r["i"] for r in read_jsonl(path, skip_torn_lines=True)]
    assert records == list(range(len(records))) and len(records) >= 6
    raw = path.read_bytes()
    if not raw.endswith(b"\n"):  # killed mid-line: the strict reader names the file and the line
        with pytest.raises(DataFileError, match=rf"{re.escape(str(path))}:{len(records) + 1}: truncated last line"):
            list(read_jsonl(path))
    append_jsonl(path, [{"i": len(records), "after": "restart"}])
    again = [r["i"] for r in read_jsonl(path, skip_torn_lines=True)]
    assert again == list(range(len(records) + 1))


# ------------------------------------------------------------------------------------------------
# The local trainer's real checkpoint code.

TRAINER = textwrap.dedent(
    """
    import sys
    sys.path[:0] = [".", "tests/trainer"]
    import test_local_train as t  # registers trainertest/Parity-v0, a two-turn env
    from trainer.local import LocalTrainer
    out, steps, resume = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "resume"
    cfg = t.config(out, steps=steps, save_every=1, tiny_hidden=256, tiny_layers=2, sft_episodes=0, eval_episodes=0)
    LocalTrainer(cfg, resume=resume, progress=False).run()
    """
)


def test_sigkill_during_a_trainer_checkpoint_save_leaves_a_resumable_run(tmp_path: Path) -> None:
    """Train a tiny Qwen3 (24 MB checkpoints: model, optimizer, teacher, reference, RNG states), SIGKILL the
    process while a checkpoint is being written (its temporary file exists), then: the checkpoint on disk
    loads with torch.load(weights_only=True) and `--resume` finishes the run from it."""
    import torch

    out = tmp_path / "run"
    trainer = subprocess.Popen([sys.executable, "-c", TRAINER, str(out), "500", "new"], cwd=REPO,
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while not (out / "checkpoint.pt").exists():  # the first checkpoint (before any update)
            assert trainer.poll() is None and time.monotonic() < deadline, trainer.stderr.read()[
                -2000:] if trainer.poll() is not None else "no checkpoint"
            time.sleep(0.01)
        saves_seen = 0
        while saves_seen < 3:  # let a few updates pass, then kill during the next save
            assert trainer.poll() is None and time.monotonic() < deadline, "the trainer stopped or stalled"
            if any(out.glob(".checkpoint.pt.*.tmp")):
                saves_seen += 1
                while any(out.glob(".checkpoint.pt.*.tmp")) and saves_seen < 3:
                    time.sleep(0.001)
            time.sleep(0.0005)
        trainer.send_signal(signal.SIGKILL)
        trainer.wait(10)
    finally:
        trainer.kill()
        trainer.stderr.close()  # type: ignore[union-attr]
    assert trainer.returncode == -signal.SIGKILL
    state = torch.load(out / "checkpoint.pt", map_location="cpu", weights_only=True)
    step = int(state["step"])
    assert step >= 1 and state["model"] and state["optimizer"]["state"]
    resumed = subprocess.run([sys.executable, "-c", TRAINER, str(out), str(step + 1), "resume"], cwd=REPO,
                             capture_output=True, text=True, timeout=300)  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert json.loads((out / "report.json").read_text())["steps"] == step + 1
    assert (out / "model" / "config.json").exists()


# ------------------------------------------------------------------------------------------------
# Every writer of results and checkpoints uses agentgym_opsd.io.

# (file, pattern) -> why a direct write is fine there.
ALLOWED_DIRECT_WRITES = {
    ("agentgym_opsd/io.py", "open("): "the atomic writer itself",
    ("environments/searchqa/fetch.py",
     "open("): "a download streamed to a hidden .part file, fsynced, then renamed into place",
    ("environments/alfworld/panel.py", "open("): "the panel's lock file (its content is never read)",
    ("benchmarks/run_ledger.py", "open("): "the ledger's lock file (its content is never read)",
    ("retrieval_index/process.py", "open("): "the child server's log (appended, diagnostic only)",
    ("trainer/memory.py", "open("): "a command to the kernel (/proc/self/clear_refs), not a file",
    ("benchmarks/retrieval_speed.py", "open("): "a scratch corpus in a temporary folder, deleted after the run",
    ("benchmarks/budget_sweep.py",
     "open("): "a setting's child-process log (diagnostic only; its results come from learnability.json)",
    ("benchmarks/scale.py",
     "open("): "generated corpora and catalogs streamed into its --work folder, deleted after each size",
}
DIRECT_WRITE = re.compile(
    r"open\([^)]*['\"][wax]b?\+?['\"]|\.write_text\(|\.write_bytes\(|json\.dump\(|torch\.save\((?![^)]*buffer)|savefig\((?![^)]*buffer)|np\.save\(|\.tofile\("
    r"|\.save_pretrained\((?!tmp\b)"  # a model folder: save into `with atomic_directory(out) as tmp:`
)


def test_result_and_checkpoint_writers_go_through_the_atomic_io_layer() -> None:
    offenders = []
    for folder in ("agentgym_opsd", "environments", "retrieval_index", "trainer", "benchmarks"):
        for path in sorted((REPO / folder).rglob("*.py")):
            rel = path.relative_to(REPO).as_posix()
            for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
                match = DIRECT_WRITE.search(line)
                if match and (rel, "open(" if match.group(0).startswith("open(")
                              else match.group(0)) not in ALLOWED_DIRECT_WRITES:
                    offenders.append(f"{rel}:{number}: {line.strip()}")
    assert not offenders, "write these through agentgym_opsd.io (atomic_write_*, append_jsonl):\n" + "\n".join(
        offenders)
