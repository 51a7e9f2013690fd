"""RUN_DIR/status.json on rank 0 (its format: hvdcls.files.status_file): phase, epoch and step,
progress, the last epoch's metrics, the world, the metrics endpoint.

Every phase change, the run's start in each world and each epoch's end are written at once;
steps at most every WRITE_INTERVAL_SECONDS. One write is a small JSON file written to a
temporary name and renamed (hvdcls.files.fileio), so a reader never sees it torn; only the last one
(done, failed) is fsync'd, as the next write replaces any other within a second and an fsync
costs milliseconds (3-6 ms on this project's test machines' local disks, more on a network
file system where a run directory often lives: 3-4 writes an epoch of the digits at np=2, a
few percent of an epoch that takes under a second). A step can take far less, so
writing every step could cost a fast run a visible share of its time. Once a second keeps
what a reader sees at most a second behind the run, which is finer than anything that reads
it needs (hang limits are minutes, a progress display a second). A step between writes is
written with the next one; closing writes nothing, because a rank 0 that closes its watchers
while the run goes on is handing them to a new rank 0 after an elastic reset, whose status
must not be overwritten by the old one's.
"""
from __future__ import annotations

import dataclasses
import os
import socket
import sys
import time
from pathlib import Path
from typing import Callable, Optional

from hvdcls.files import status_file
from hvdcls.files.fileio import write_json_atomic
from hvdcls.files.status_file import RunStatus
from hvdcls.observe.monitor import RunInfo, Sink, StepSample

WRITE_INTERVAL_SECONDS = 1.0


def write_status(path: Path, status: dict) -> None:
    """Atomic always; durable (fsync'd) only for a status no later write will replace."""
    write_json_atomic(path, status, durable=status.get("phase") in (status_file.DONE, status_file.FAILED))


class StatusSink(Sink):
    def __init__(self, run_dir: Path, backend: str, endpoint: Optional[str] = None,
                 phase: str = status_file.STARTING, clock: Callable[[], float] = time.time,
                 interval: float = WRITE_INTERVAL_SECONDS,
                 write: Callable[[Path, dict], None] = write_status):
        """`phase` RESETTING: a process that became rank 0 takes the file over, keeping what
        its predecessor recorded of the epochs before (their metrics)."""
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / status_file.STATUS_FILE
        self.clock, self.interval, self.write_file = clock, interval, write
        self.info: Optional[RunInfo] = None
        self.written_at: Optional[float] = None
        self.warned = False
        before = status_file.read(self.run_dir) if phase == status_file.RESETTING else None
        self.status = RunStatus(phase=phase, phase_since=clock(), backend=backend, endpoint=endpoint,
                                pid=os.getpid(), host=socket.gethostname(),
                                metrics=before.metrics if before else None,
                                epochs_done=before.epochs_done if before else 0)
        self.write()

    def start(self, info: RunInfo) -> None:
        """This world's start (the run's, or an elastic attempt's): its size and hosts."""
        self.info = info
        done = info.start_epoch
        # A resumed run's latest metrics are its checkpoint's last epoch's: a job requeued after
        # its last checkpoint trains no epoch, and its status must still say how it ended.
        self.update(metrics=info.last_epoch or self.status.metrics,
                    world_size=info.world_size, hosts=dict(info.hosts) if info.hosts else None,
                    epochs=info.epochs, steps_per_epoch=info.steps_per_epoch, epochs_done=done,
                    epoch=min(done + 1, info.epochs), step=0,
                    fraction=done / info.epochs if info.epochs else None)
        self.write()

    def step(self, sample: StepSample) -> None:
        info, now = self.info, self.clock()
        assert info is not None, "the monitor starts a sink before its first step"
        steps = info.steps_per_epoch
        self.update(epoch=sample.epoch + 1, step=sample.step + 1, last_step_at=now,
                    fraction=min(1.0, (sample.epoch * steps + sample.step + 1) / (info.epochs * steps)))
        if self.status.phase != status_file.TRAINING:
            self.phase(status_file.TRAINING)
        elif self.written_at is None or now - self.written_at >= self.interval:
            self.write()

    def epoch(self, record: dict, history: list[dict]) -> None:
        self.update(metrics=record, epochs_done=record["epoch"])
        self.write()

    def phase(self, name: str) -> None:
        self.update(phase=name, phase_since=self.clock())
        self.write()

    def finish(self) -> None:
        self.update(fraction=1.0)
        self.phase(status_file.DONE)

    def failed(self, error: str) -> None:
        self.update(error=error)
        self.phase(status_file.FAILED)

    def update(self, **changes) -> None:
        self.status = dataclasses.replace(self.status, **changes)

    def write(self) -> None:
        """The status as it is now, whole; a failing disk costs the status, not the run."""
        now = self.clock()
        self.update(updated_at=now)
        try:
            self.write_file(self.path, self.status.as_dict())
        except OSError as err:
            if not self.warned:
                print(f"status: cannot write {self.path}: {err.strerror or err}; training goes on",
                      file=sys.stderr, flush=True)
                self.warned = True
        self.written_at = now
