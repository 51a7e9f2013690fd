"""summary.json's `memory`: this rank's bytes in the model's tensors (the backend counts them,
hvdcls.backend.Backend.memory), the process's peak resident set, and that peak per phase of the
run (PEAKS: the set-up, the training, the checkpoint writes), with every rank's beside it
(`rank_memory`), so that what sharding saves per rank, and what a checkpoint write costs over a
training step, can be read off one file."""
from __future__ import annotations

import re
import resource
import sys
from typing import Optional

from hvdcls.backend import Backend

SETUP, TRAINING, CHECKPOINT = "setup", "training", "checkpoint"  # PhasePeaks' phases, in a run's order
_HWM = re.compile(r"^VmHWM:\s+(\d+) kB", re.MULTILINE)


def peak_rss_bytes() -> int:
    """This process's peak resident set so far (getrusage: KiB on Linux, bytes on macOS); the
    highest of the phases' too, since PhasePeaks resets the kernel's mark that getrusage reads."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return max(int(peak if sys.platform == "darwin" else peak * 1024), PEAKS.highest)


def _high_water_mark() -> Optional[int]:
    """The resident set's peak since the last reset (Linux's VmHWM), in bytes; None elsewhere."""
    try:
        with open("/proc/self/status") as status:
            found = _HWM.search(status.read())
    except OSError:
        return None
    return int(found.group(1)) * 1024 if found else None


def _reset_high_water_mark() -> bool:
    """Lower VmHWM to the resident set now (Linux >= 4.0: "5" to clear_refs), so the next
    reading is the next phase's own peak; False where the kernel does not let us."""
    try:
        with open("/proc/self/clear_refs", "w") as refs:
            refs.write("5")
    except OSError:
        return False
    return True


class PhasePeaks:
    """The resident set's peak per phase, one process-wide record (the kernel keeps one mark per
    process): enter() closes the phase so far at the mark and starts the next from the resident
    set now. Where the mark cannot be reset (not Linux), no phase is reported."""

    def __init__(self) -> None:
        self.phase = SETUP
        self.peaks: dict[str, int] = {}
        self.highest = 0
        self.working = _high_water_mark() is not None

    def restart(self) -> None:
        """A run starts in this process (tests run several): its set-up phase from now, the
        earlier runs' phases forgotten (their peaks stay in `highest`)."""
        self.enter(SETUP)
        self.peaks = {}

    def enter(self, phase: str) -> None:
        self.close()
        self.working = self.working and _reset_high_water_mark()
        self.phase = phase

    def close(self) -> None:
        mark = _high_water_mark() if self.working else None
        if mark is not None:
            self.peaks[self.phase] = max(self.peaks.get(self.phase, 0), mark)
            self.highest = max(self.highest, mark)

    def report(self) -> dict[str, int]:
        """peak_rss_<phase>_bytes for each phase seen (the current one up to now)."""
        self.close()
        return {f"peak_rss_{phase}_bytes": peak for phase, peak in self.peaks.items()} if self.working else {}


PEAKS = PhasePeaks()


def measure(backend: Backend) -> dict[str, int]:
    return {**backend.memory(), **PEAKS.report(), "peak_rss_bytes": peak_rss_bytes()}


def summarise(backend: Backend) -> tuple[dict[str, int], list[dict[str, int]]]:
    """(this rank's, every rank's in rank order): a collective, every rank calls it."""
    mine = measure(backend)
    return mine, backend.allgather_object(mine, "memory")
