"""The bench's guard on its own figures: how much CPU something other than the bench used while
a cell was measured.

A cell measured while other work loaded the cores reports nonsense (a `make bench` run beside a
test suite once showed hvdcls at 2.5x raw Horovod and scaling efficiencies above 3). The guard
reads the machine's busy CPU time from /proc/stat around the cell and subtracts what the bench's
own processes used (this process, and its children once reaped: getrusage(RUSAGE_CHILDREN)
includes every descendant the launcher waited for). What is left was used by outside
processes; a cell where that exceeds BUSY_SHARE of the machine is flagged.
"""
from __future__ import annotations

import os
import resource
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

BUSY_SHARE = 0.10  # outside CPU above this share of the machine's capacity: the cell is flagged
PROC_STAT = Path("/proc/stat")


def busy_seconds(stat: Path = PROC_STAT) -> Optional[float]:
    """CPU seconds the whole machine has spent busy since boot (all but idle and iowait)."""
    try:
        fields = stat.read_text().splitlines()[0].split()
    except OSError:
        return None
    ticks = [int(v) for v in fields[1:9]]  # user nice system idle iowait irq softirq steal
    return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")


def own_seconds() -> float:
    """CPU seconds of this process and of its reaped descendants."""
    me, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + children.ru_utime + children.ru_stime


def process_seconds(pid: int) -> float:
    """CPU seconds of process `pid` and of its reaped descendants (0.0 when it is gone)."""
    import psutil  # Horovod's launcher needs it too; imported here, where the bench asks

    try:
        times = psutil.Process(pid).cpu_times()
    except psutil.Error:  # gone (or never ours to read): nothing to add
        return 0.0
    return times.user + times.system + times.children_user + times.children_system


@dataclass
class Outside:
    """One guarded stretch: wall seconds, and CPU seconds used outside the bench during it."""

    wall_seconds: float
    cpu_seconds: Optional[float]  # None: /proc/stat unreadable (not Linux)
    cores: int

    @property
    def share(self) -> Optional[float]:
        """Outside CPU as a share of what the machine could give in that time."""
        if self.cpu_seconds is None or self.wall_seconds <= 0:
            return None
        return self.cpu_seconds / (self.wall_seconds * self.cores)


class CpuGuard:
    """with CpuGuard() as guard: ...; then guard.outside (an Outside). `ours`: CPU seconds used
    so far by what is measured (default: this process and its reaped descendants; a bench whose
    ranks run in containers adds theirs, which are no descendants of it)."""

    def __init__(self, stat: Path = PROC_STAT, ours: Callable[[], float] = own_seconds):
        self.stat, self.ours = stat, ours
        self.outside: Optional[Outside] = None

    def __enter__(self) -> "CpuGuard":
        self.started, self.busy, self.own = time.perf_counter(), busy_seconds(self.stat), self.ours()
        return self

    def __exit__(self, *exc) -> None:
        busy = busy_seconds(self.stat)
        used = None if busy is None or self.busy is None else busy - self.busy - (self.ours() - self.own)
        self.outside = Outside(time.perf_counter() - self.started,
                               None if used is None else max(used, 0.0), os.cpu_count() or 1)


def summarise(stretches: list[Outside]) -> dict:
    """bench.json's record of a cell's guarded launches (one per round): the worst share, and
    `busy` when any launch exceeded BUSY_SHARE."""
    shares = [s.share for s in stretches if s.share is not None]
    seconds = [s.cpu_seconds for s in stretches if s.cpu_seconds is not None]
    worst = max(shares) if shares else None
    return {"outside_cpu_seconds": sum(seconds) if seconds else None, "outside_cpu_share": worst,
            "busy": worst is not None and worst > BUSY_SHARE}
