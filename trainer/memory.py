"""The process's memory between the phases of a run: give freed heap back, and read the peak.

A CPU run allocates and frees gigabytes per phase: the sampler's key/value cache grows by one position
per decoding step (a new tensor per layer each time), the update's activations come and go. glibc keeps
what is freed in its heap for reuse, scattered between live blocks, so the process's resident memory
stays at its high-water mark long after the phase that needed it. Measured on this project's CPU machine
(2 cores, 24 GB): an RL run of SmolLM2-135M (benchmarks/learning.py) held 8.2 GB after an update, of
which 5.4 GB was free heap that `malloc_trim(0)` gave back (2.8 GB resident after it); two runs side by
side sat at 16 GB between their peaks, and a third process met the OOM killer.

`release_freed_memory()` returns that free heap to the system (glibc's `malloc_trim(0)`; elsewhere a
no-op), so a process holds its live memory between phases, not its last peak. It changes no value a
run computes: only where freed memory goes. `trainer.run_state.compute_context` calls it when each phase ends.

`reset_peak_memory()` / `peak_memory_gb()`: the resident high-water mark since the last reset (Linux
`VmHWM`, reset through `/proc/self/clear_refs`), so each update can log the peak it reached itself.
"""

from __future__ import annotations

import ctypes
import functools
import sys

__all__ = ["release_freed_memory", "reset_peak_memory", "peak_memory_gb", "resident_memory_gb"]


@functools.cache
def _malloc_trim():
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL("libc.so.6").malloc_trim  # glibc only (musl has no malloc_trim)
    except (OSError, AttributeError):
        return None


def release_freed_memory() -> bool:
    """Give the heap's free memory back to the system; False where the C library cannot (not glibc)."""
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True


def _status_kb(field: str) -> int | None:
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return None


def resident_memory_gb() -> float | None:
    """The process's resident memory now (GB), or None where /proc is not there."""
    kb = _status_kb("VmRSS")
    return None if kb is None else kb / 2**20


def peak_memory_gb() -> float | None:
    """The resident high-water mark (GB) since the process started or `reset_peak_memory()`; None off Linux."""
    kb = _status_kb("VmHWM")
    return None if kb is None else kb / 2**20


def reset_peak_memory() -> bool:
    """Start a new high-water mark at the current resident memory; False where the kernel does not allow it."""
    try:
        with open("/proc/self/clear_refs", "w") as refs:
            refs.write("5")
        return True
    except OSError:
        return False
