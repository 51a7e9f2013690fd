"""`--profile-steps N`: the framework's own profiler around N training steps, on rank 0.

    hvdcls train --profile-steps 5            # RUN_DIR/profile/ holds the trace
    tensorboard --logdir RUN_DIR/profile      # TensorFlow's trace (Profile tab, with tensorboard-plugin-profile)
    # torch: open RUN_DIR/profile/torch_trace.json in chrome://tracing or https://ui.perfetto.dev

The backend does the profiling (`Backend.profiler`: torch.profiler or the TF profiler); the
core picks which steps: in this run's first epoch, skipping its first step (tracing,
allocation and warm-up make it unlike the others) when the epoch has room. The backend writes
into a hidden directory that is renamed to `profile/` once the trace is complete, so a
reader never sees half a trace.
"""
from __future__ import annotations

import contextlib
import shutil
from pathlib import Path
from typing import Callable, ContextManager

PROFILE_DIR = "profile"


def profiled_steps(steps_per_epoch: int, wanted: int) -> tuple[int, int]:
    """(first step, number of steps) to profile within one epoch."""
    first = 1 if steps_per_epoch > wanted else 0
    return first, min(wanted, steps_per_epoch - first)


class StepProfiler:
    def __init__(self, profiler: Callable[[Path], ContextManager], run_dir: Path, epoch: int,
                 steps_per_epoch: int, wanted: int, note: Callable[[str], None]):
        self.profiler, self.epoch, self.note = profiler, epoch, note
        self.first, self.count = profiled_steps(steps_per_epoch, wanted)
        self.final = Path(run_dir) / PROFILE_DIR
        self.working = Path(run_dir) / f".{PROFILE_DIR}.tmp"
        self.stack = contextlib.ExitStack()
        if self.count < wanted:
            note(f"profile: an epoch has {steps_per_epoch} steps; profiling {self.count}, not {wanted}")

    def before_step(self, epoch: int, step: int) -> None:
        if epoch == self.epoch and step == self.first:
            shutil.rmtree(self.working, ignore_errors=True)
            self.working.mkdir(parents=True)
            self.stack.enter_context(self.profiler(self.working))

    def after_step(self, epoch: int, step: int) -> None:
        if epoch == self.epoch and step == self.first + self.count - 1:
            self.stack.close()  # the backend writes its trace here
            shutil.rmtree(self.final, ignore_errors=True)  # a resumed run profiles anew
            self.working.rename(self.final)
            self.note(f"profile: steps {self.first + 1}-{self.first + self.count} of epoch "
                      f"{epoch + 1} -> {self.final}")
