"""data.workers=auto: how many loader workers a rank runs, from what it measured.

A step needs `passes` batches; a worker reads one batch in `load` seconds; the step computes
for `compute` seconds (its time less what it waited for data). The loader keeps up when
workers x compute >= passes x load, so the count is ceil(HEADROOM x passes x load / compute),
at least 1 and at most the cores this rank has to itself less one for the training process
(its share of the host's cores: CPU affinity, divided among the ranks on the host).

The first epoch of a run reads with that most; its compute time per step is then measured,
and the load time of one batch too (two of the next epoch's batches read in this process,
once); the count chosen holds for the rest of the run. A run resumed measures afresh.
"""
from __future__ import annotations

import math
import os
import statistics
import time
from typing import Union

from hvdcls.config.schema import AUTO_WORKERS
from hvdcls.data.batches import EpochBatches

HEADROOM = 1.25  # a quarter more than keeps up: batches vary, and workers share the cores
LOAD_PROBES = 2  # batches read in this process to time one


def cores_per_rank(local_size: int) -> int:
    """The cores this process may run on, shared among the ranks on this host."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    return max(1, cores // max(1, local_size))


def needed(load_seconds: float, compute_seconds: float, passes: int, most: int) -> int:
    """Workers that keep a step of `passes` batches fed (the module's rule)."""
    if compute_seconds <= 0:
        return most
    return min(most, max(1, math.ceil(HEADROOM * passes * load_seconds / compute_seconds)))


def load_seconds(batches: EpochBatches, probes: int = LOAD_PROBES) -> float:
    """One batch's reading time in this process: the median of `probes` reads."""
    times = []
    for k in range(min(probes, len(batches))):
        started = time.perf_counter()
        batches[k]
        times.append(time.perf_counter() - started)
    return statistics.median(times) if times else 0.0


class LoaderWorkers:
    """The loader workers of a rank's run: data.workers as set, or chosen (auto)."""

    def __init__(self, setting: Union[int, str], local_size: int, passes: int):
        self.auto = setting == AUTO_WORKERS
        self.most = max(1, cores_per_rank(local_size) - 1)
        self.passes = passes
        self.count = self.most if self.auto else int(setting)
        self.chosen_from: dict = {}  # the measurements behind an auto count, once made

    @property
    def deciding(self) -> bool:
        return self.auto and not self.chosen_from

    def choose(self, next_batches: EpochBatches, train_seconds: float, data_wait_seconds: float,
               steps: int) -> str:
        """After the first epoch: the count for the rest of the run, and a line saying why."""
        compute = max(0.0, train_seconds - data_wait_seconds) / max(1, steps)
        load = load_seconds(next_batches)
        self.count = needed(load, compute, self.passes, self.most)
        self.chosen_from = {"load_seconds": round(load, 4), "compute_seconds": round(compute, 4),
                            "most": self.most, "workers": self.count}
        return (f"data.workers=auto: {self.count} loader worker(s) from here (a batch reads in "
                f"{load:.3f} s, a step of {self.passes} computes in {compute:.3f} s; at most {self.most})")
