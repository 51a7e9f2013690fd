"""Test-only fault hooks: ways to make one process misbehave on purpose, at a chosen moment, so
that tests/parallel and tests/cases can check what a real failure does to a real job.

Each hook is inert unless its environment variable is set; nobody sets them outside tests.

    HVDCLS_TEST_STALL=RANK:STEP         rank RANK stops submitting tensors: before training step
                                        STEP of its first epoch it sleeps instead (until killed)
    HVDCLS_TEST_SLOW=RANK:FACTOR        rank RANK computes FACTOR times slower: after each training
                                        step it sleeps (FACTOR - 1) x the step's compute time
                                        (a slow rank for training.balance, without root)
    HVDCLS_TEST_HOLD_CHECKPOINT=EPOCH   the writer of checkpoint EPOCH stops inside the write,
                                        once the backend's files are in the temporary directory
                                        and before the rename; it creates HELD_MARKER there and
                                        sleeps (until killed)

A held process sleeps at most HOLD_SECONDS and then exits with status 3, so a test that fails
to kill it still cannot leave it behind.
"""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path

STALL = "HVDCLS_TEST_STALL"
SLOW = "HVDCLS_TEST_SLOW"
HOLD_CHECKPOINT = "HVDCLS_TEST_HOLD_CHECKPOINT"
HELD_MARKER = "test-hook-held"
HOLD_SECONDS = 300


def _hold(reason: str) -> None:
    print(f"hvdcls: test hook: {reason}; holding until killed", file=sys.stderr, flush=True)
    deadline = time.monotonic() + HOLD_SECONDS
    while time.monotonic() < deadline:
        time.sleep(0.5)
    os._exit(3)


def stall_point(rank: int, step: int, first_epoch: bool) -> None:
    """Called before every training step; holds rank RANK at STEP when HVDCLS_TEST_STALL is set."""
    wanted = os.environ.get(STALL)
    if not wanted or not first_epoch:
        return
    stall_rank, _, stall_step = wanted.partition(":")
    if rank == int(stall_rank) and step == int(stall_step or 0):
        _hold(f"rank {rank} stops submitting tensors before step {step}")


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
