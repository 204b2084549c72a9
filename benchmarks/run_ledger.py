"""A ledger of a benchmark's finished runs, kept in the repository beside its results page.

A benchmark grid that takes longer than one sitting (`benchmarks/learning.py`'s 3 warm starts x 4 methods
x 3 seeds is about 12 hours on two cores) outlives the folders its runs write: a new checkout has no `runs/`.
The ledger keeps what the table needs of each finished run (held-out outcome per game, step costs,
provenance) as one JSON line, so the next invocation, in any checkout, counts it and runs only what is
missing. It never holds weights: a warm start the remaining runs need is trained again, and its weights'
SHA-256 must equal the ledger's, else new runs would be paired with runs from another model (another CPU's
kernels or another thread count can round differently), and the benchmark stops and says so.

Each record names its design (`design`: a hash of every setting that changes what a run measures); records
of other designs in the same file are kept as they are and not counted.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import tempfile
import time
from pathlib import Path
from typing import Any

from agentgym_opsd.io import atomic_write_text, read_jsonl


def design_key(settings: dict[str, Any]) -> str:
    """A short stable hash of `settings` (JSON-able): two invocations share runs only when theirs match."""
    return hashlib.sha256(json.dumps(settings, sort_keys=True, default=str).encode()).hexdigest()[:16]


def weights_sha256(model_dir: Path) -> str:
    """The SHA-256 of a saved model's weight files (`*.safetensors`, `*.bin`), in name order: equal for the
    same weights saved the same way, whatever the folder is called."""
    digest = hashlib.sha256()
    files = sorted(p for p in Path(model_dir).iterdir() if p.suffix in (".safetensors", ".bin"))
    if not files:
        raise FileNotFoundError(f"{model_dir}: no weight files (*.safetensors, *.bin) to fingerprint")
    for path in files:
        digest.update(path.name.encode())
        with path.open("rb") as handle:
            for block in iter(lambda: handle.read(1 << 22), b""):
                digest.update(block)
    return digest.hexdigest()


def outcome_bits(outcomes: list[int]) -> str:
    """Per-game success as a string of 0s and 1s, in the panel's order."""
    return "".join("1" if o else "0" for o in outcomes)


class LedgerMismatch(RuntimeError):
    """A warm start trained here differs from the one the ledger's runs started from."""


class RunLedger:
    """The finished warm starts and runs of one design in a JSON-lines file (created on the first record).

    A warm start's record: `{"design", "warm", "outcomes", "weights_sha256", "settings", provenance}`; a run's:
    `{"design", "warm", "method", "seed", "outcomes", "costs", provenance}`; provenance is `commit` (the
    checkout that recorded it: the one that ran it when it finished in an invocation with this ledger, else a
    later one), `cpu`, `threads`, `seconds` (None where the run finished in an invocation without the ledger)
    and `date`.
    """

    def __init__(self, path: str | Path, settings: dict[str, Any]):
        self.path = Path(path)
        self.settings = settings
        self.key = design_key(settings)
        self._reload()

    def warm(self, warm: int) -> dict | None:
        return next((r for r in self.records if r["warm"] == warm and "method" not in r), None)

    def run(self, method: str, warm: int, seed: int) -> dict | None:
        return next((r for r in self.records if (r.get("method"), r["warm"], r.get("seed")) == (method, warm, seed)),
                    None)

    def warm_starts(self) -> list[int]:
        return sorted(r["warm"] for r in self.records if "method" not in r)

    def seeds(self, method: str, warm: int) -> list[int]:
        return sorted(r["seed"] for r in self.records if r.get("method") == method and r["warm"] == warm)

    def _reload(self) -> None:
        self._all = list(read_jsonl(self.path)) if self.path.exists() else []
        self.records = [r for r in self._all if r.get("design") == self.key]
        self.other_designs = len(self._all) - len(self.records)

    def cpus(self) -> list[str]:
        """The CPUs named in the settings of every design's warm starts in the file (this design's too)."""
        return sorted({r["settings"]["cpu"] for r in self._all if "cpu" in r.get("settings", {})})

    def add(self, record: dict[str, Any]) -> dict[str, Any]:
        """Record a finished warm start (no `method`) or run, stamped with this design and the date, and rewrite
        the file atomically (a crash leaves the old file or the new one, never half a line). Two invocations
        may share a ledger: under a lock, the file is read again first, and a record it already holds (the
        same warm start, method and seed) is kept rather than written twice."""
        record = {"design": self.key, **record, "date": time.strftime("%Y-%m-%d")}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        lock = Path(tempfile.gettempdir()) / f"run-ledger-{design_key({'path': str(self.path.resolve())})}.lock"
        with lock.open("w") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            self._reload()
            same = next((r for r in self.records if (r["warm"], r.get("method"), r.get("seed"))
                         == (record["warm"], record.get("method"), record.get("seed"))), None)
            if same is not None:
                return same
            self._all.append(record)
            self.records.append(record)
            atomic_write_text(self.path, "".join(json.dumps(r, sort_keys=True) + "\n" for r in self._all))
        return record
