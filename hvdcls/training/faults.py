"""Test-only fault hooks: ways to make one process misbehave on purpose, at a chosen moment, so
that tests/parallel and tests/cases can check what a real failure does to a real job.

Each hook is inert unless its environment variable is set; nobody sets them outside tests.

    HVDCLS_TEST_STALL=RANK:STEP         rank RANK stops submitting tensors: the read of training
                                        step STEP's (first micro-)batch in its first epoch
                                        sleeps instead (until killed), as a loader that blocks
                                        for ever would; in whichever reads it: a loader worker
                                        (process or thread), or the training thread itself
    HVDCLS_TEST_FREEZE=RANK:STEP:PIDFILE  rank RANK writes its process id to PIDFILE and stops
                                        itself whole (SIGSTOP) before training step STEP of its
                                        first epoch, as a host that vanished would; the test
                                        kills it
    HVDCLS_TEST_SLOW=RANK:FACTOR        rank RANK computes FACTOR times slower: after each training
                                        step it sleeps (FACTOR - 1) x the step's compute time
                                        (a slow rank for training.balance, without root)
    HVDCLS_TEST_HOLD_CHECKPOINT=EPOCH   the writer of checkpoint EPOCH stops inside the write,
                                        once the backend's files are in the temporary directory
                                        and before the rename; it creates HELD_MARKER there and
                                        sleeps (until killed)

A held process sleeps at most HOLD_SECONDS and then exits with status 3, so a test that fails
to kill it still cannot leave it behind; a held loader worker exits as soon as its parent has.
"""
from __future__ import annotations

import os
import signal
import sys
import time
from dataclasses import dataclass, fields
from pathlib import Path

from hvdcls.data.batches import EpochBatches

STALL = "HVDCLS_TEST_STALL"
FREEZE = "HVDCLS_TEST_FREEZE"
SLOW = "HVDCLS_TEST_SLOW"
HOLD_CHECKPOINT = "HVDCLS_TEST_HOLD_CHECKPOINT"
HELD_MARKER = "test-hook-held"
HOLD_SECONDS = 300


def _hold(reason: str) -> None:
    print(f"hvdcls: test hook: {reason}; holding until killed", file=sys.stderr, flush=True)
    parent, deadline = os.getppid(), time.monotonic() + HOLD_SECONDS
    while time.monotonic() < deadline and os.getppid() == parent:  # a worker outlives no one
        time.sleep(0.5)
    os._exit(3)


def _wanted_step(variable: str, rank: int) -> int | None:
    """The step a "RANK:STEP[:...]" hook names for this rank; None: not this rank, or unset."""
    wanted = os.environ.get(variable)
    if not wanted:
        return None
    hook_rank, _, rest = wanted.partition(":")
    return int(rest.split(":")[0] or 0) if int(hook_rank) == rank else None


@dataclass
class StallingBatches(EpochBatches):
    """EpochBatches whose batch `hold_at` is never read: its reader holds (`_hold`)."""

    hold_at: int = -1
    reason: str = ""

    def _read(self, k: int):
        if k == self.hold_at:
            _hold(self.reason)
        return super()._read(k)


def stalling(batches: EpochBatches, rank: int, first_step: int, passes: int,
             first_epoch: bool) -> EpochBatches:
    """The step loop's micro-batches (`passes` a step, numbered from `first_step`); when
    HVDCLS_TEST_STALL names this rank, the read of its step's first micro-batch holds."""
    step = _wanted_step(STALL, rank) if first_epoch else None
    if step is None or not 0 <= (step - first_step) * passes < len(batches):
        return batches
    return StallingBatches(**{f.name: getattr(batches, f.name) for f in fields(EpochBatches)},
                           hold_at=(step - first_step) * passes,
                           reason=f"rank {rank} stops submitting tensors: reading the data of "
                                  f"step {step} never returns")


def freeze_point(rank: int, step: int, first_epoch: bool) -> None:
    """Called before every training step; SIGSTOPs rank RANK at STEP when HVDCLS_TEST_FREEZE is set."""
    if first_epoch and _wanted_step(FREEZE, rank) == step:
        pid_file = os.environ[FREEZE].split(":", 2)[2]
        Path(pid_file).write_text(str(os.getpid()))
        print(f"hvdcls: test hook: rank {rank} stops itself (SIGSTOP) before step {step}",
              file=sys.stderr, flush=True)
        os.kill(os.getpid(), signal.SIGSTOP)


def slow_point(rank: int, compute_seconds: float) -> None:
    """Called after every training step; stretches rank RANK's compute when HVDCLS_TEST_SLOW is set."""
    wanted = os.environ.get(SLOW)
    if not wanted:
        return
    slow_rank, _, factor = wanted.partition(":")
    if rank == int(slow_rank):
        time.sleep(max(float(factor) - 1.0, 0.0) * compute_seconds)


def checkpoint_point(epoch: int, tmp: Path) -> None:
    """Called inside checkpoint writing; holds the writer of checkpoint EPOCH when asked."""
    wanted = os.environ.get(HOLD_CHECKPOINT)
    if wanted and int(wanted) == epoch:
        (tmp / HELD_MARKER).touch()
        _hold(f"checkpoint {epoch} half-written in {tmp}")
