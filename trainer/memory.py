"""The process's memory between the phases of a run: give freed heap back, and read the peak.

A CPU run allocates and frees gigabytes per phase (the update's activations, the scoring's logits).
glibc keeps what is freed in its heap for reuse, scattered between live blocks, so without a trim the
process's resident memory stays at its high-water mark long after the phase that needed it, and runs
side by side add up their peaks instead of their live memory.

`release_freed_memory()` returns that free heap to the system (glibc's `malloc_trim(0)`; elsewhere a
no-op), so a process holds its live memory between phases, not its last peak. It changes no value a
run computes: only where freed memory goes. `trainer.run_state.compute_context` calls it when each phase ends.

`reset_peak_memory()` / `peak_memory_gb()`: the resident high-water mark since the last reset (Linux
`VmHWM`, reset through `/proc/self/clear_refs`), so each update can log the peak it reached itself.
`PhasePeaks` reads them phase by phase, and gives no phase peak where the reset before it failed (the
mark would then be the process's lifetime peak, not the phase's).
"""

from __future__ import annotations

import ctypes
import functools
import sys

__all__ = ["PhasePeaks", "release_freed_memory", "reset_peak_memory", "peak_memory_gb", "resident_memory_gb"]


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


class PhasePeaks:
    """The resident high-water mark of consecutive phases: `end(name)` closes the phase that began at the
    previous call (or at construction) and starts the next.

    `peaks`: name -> GB for each phase whose starting reset succeeded. `complete`: every phase has one;
    where none could be reset (no `/proc/self/clear_refs`), `lifetime_gb` is the process's peak so far,
    which is all there is to say."""

    def __init__(self) -> None:
        self.peaks: dict[str, float] = {}
        self.complete = True
        self._reset = reset_peak_memory()

    def end(self, name: str) -> None:
        peak = peak_memory_gb()
        if self._reset and peak is not None:
            self.peaks[name] = peak
        else:
            self.complete = False
        self._reset = reset_peak_memory()

    @property
    def lifetime_gb(self) -> float | None:
        return None if self.peaks else peak_memory_gb()

    def record(self) -> dict[str, float]:
        """The metrics an update logs: `memory/peak_gb` (the largest phase's) and `memory/<phase>_peak_gb`
        when every phase was measured; else `memory/lifetime_peak_gb` alone, named as what it is."""
        if self.complete and self.peaks:
            return {"memory/peak_gb": max(self.peaks.values()),
                    **{f"memory/{name}_peak_gb": peak for name, peak in self.peaks.items()}}
        lifetime = peak_memory_gb()
        return {} if lifetime is None else {"memory/lifetime_peak_gb": lifetime}
