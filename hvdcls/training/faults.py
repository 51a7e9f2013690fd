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
    HVDCLS_TEST_KILL=RANK:STEP:MARKER   elastic training: rank RANK SIGKILLs itself after global
                                        step STEP, once per job (it writes the file MARKER, and
                                        a replacement worker finding it lives)
    HVDCLS_TEST_HOLD_CHECKPOINT=EPOCH   the writer of checkpoint EPOCH stops inside the write,
                                        once the backend's files are in the temporary directory
                                        and before the rename; it creates HELD_MARKER there and
                                        sleeps (until killed)

The per-step hooks are read once, when a Trainer starts (StepHooks.read): a step reads no
environment. A held process sleeps at most HOLD_SECONDS and then exits with status 3, so a
test that fails to kill it still cannot leave it behind; a held loader worker exits as soon
as its parent has.
"""
from __future__ import annotations

import os
import signal
import sys
import time
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Mapping, Optional

from hvdcls.data.batches import EpochBatches

STALL = "HVDCLS_TEST_STALL"
FREEZE = "HVDCLS_TEST_FREEZE"
SLOW = "HVDCLS_TEST_SLOW"
KILL = "HVDCLS_TEST_KILL"
HOLD_CHECKPOINT = "HVDCLS_TEST_HOLD_CHECKPOINT"
HELD_MARKER = "test-hook-held"
HOLD_SECONDS = 300


def _hold(reason: str) -> None:
    print(f"hvdcls: test hook: {reason}; holding until killed", file=sys.stderr, flush=True)
    parent, deadline = os.getppid(), time.monotonic() + HOLD_SECONDS
    while time.monotonic() < deadline and os.getppid() == parent:  # a worker outlives no one
        time.sleep(0.5)
    os._exit(3)


def _wanted(value: Optional[str], rank: int) -> Optional[list[str]]:
    """The fields after RANK of a "RANK:...:..." hook when it names this rank; else None."""
    if not value:
        return None
    hook_rank, _, rest = value.partition(":")
    return rest.split(":", 1) if int(hook_rank) == rank else None


@dataclass
class StallingBatches(EpochBatches):
    """EpochBatches whose batch `hold_at` is never read: its reader holds (`_hold`)."""

    hold_at: int = -1
    reason: str = ""

    def _read(self, k: int, uint8: bool = False):
        if k == self.hold_at:
            _hold(self.reason)
        return super()._read(k, uint8)


@dataclass(frozen=True)
class StepHooks:
    """This rank's per-step hooks, parsed from the environment once (StepHooks.read); all
    inert by default. A step then compares numbers, it does not look at the environment."""

    rank: int
    stall_step: Optional[int] = None  # STALL
    freeze_step: Optional[int] = None  # FREEZE ...
    freeze_pid_file: str = ""  # ... and where the frozen rank writes its process id
    slow_factor: float = 1.0  # SLOW
    kill_step: Optional[int] = None  # KILL (elastic) ...
    kill_marker: str = ""  # ... and the file recording that it happened

    @classmethod
    def read(cls, rank: int, environ: Mapping[str, str] = os.environ) -> "StepHooks":
        stall, freeze, slow, kill = (_wanted(environ.get(name), rank)
                                     for name in (STALL, FREEZE, SLOW, KILL))
        return cls(rank,
                   stall_step=int(stall[0] or 0) if stall else None,
                   freeze_step=int(freeze[0] or 0) if freeze else None,
                   freeze_pid_file=freeze[1] if freeze and len(freeze) > 1 else "",
                   slow_factor=float(slow[0]) if slow else 1.0,
                   kill_step=int(kill[0]) if kill else None,
                   kill_marker=kill[1] if kill else "")

    def stalling(self, batches: EpochBatches, first_step: int, passes: int,
                 first_epoch: bool) -> EpochBatches:
        """The step loop's micro-batches (`passes` a step, numbered from `first_step`); when
        STALL names this rank, the read of its step's first micro-batch holds (in the loader
        worker that reads it, where there is one: the loop is then reading data)."""
        step = self.stall_step if first_epoch else None
        if step is None or not 0 <= (step - first_step) * passes < len(batches):
            return batches
        return StallingBatches(**{f.name: getattr(batches, f.name) for f in fields(EpochBatches)},
                               hold_at=(step - first_step) * passes,
                               reason=f"rank {self.rank} stops submitting tensors: reading the "
                                      f"data of step {step} never returns")

    def freeze_point(self, step: int, first_epoch: bool) -> None:
        """Called before every training step; SIGSTOPs this rank at FREEZE's step."""
        if first_epoch and self.freeze_step == step:
            Path(self.freeze_pid_file).write_text(str(os.getpid()))
            print(f"hvdcls: test hook: rank {self.rank} stops itself (SIGSTOP) before step {step}",
                  file=sys.stderr, flush=True)
            os.kill(os.getpid(), signal.SIGSTOP)

    def slow_point(self, compute_seconds: float) -> None:
        """Called after every training step; stretches this rank's compute by SLOW's factor."""
        if self.slow_factor != 1.0:
            time.sleep(max(self.slow_factor - 1.0, 0.0) * compute_seconds)

    def kill_point(self, global_step: int) -> None:
        """Called after every elastic step; SIGKILLs this rank after KILL's step, once per job."""
        if global_step == self.kill_step and not Path(self.kill_marker).exists():
            Path(self.kill_marker).write_text(f"rank {self.rank} killed after step {global_step}\n")
            os.kill(os.getpid(), signal.SIGKILL)


def checkpoint_point(epoch: int, tmp: Path) -> None:
    """Called inside checkpoint writing; holds the writer of checkpoint EPOCH when asked."""
    wanted = os.environ.get(HOLD_CHECKPOINT)
    if wanted and int(wanted) == epoch:
        (tmp / HELD_MARKER).touch()
        _hold(f"checkpoint {epoch} half-written in {tmp}")
