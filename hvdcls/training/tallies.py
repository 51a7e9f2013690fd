"""What the step loop counts: a stretch of steps' sums (`Tally`), an epoch's timings
(`EpochTimes`), and metrics reduced over the ranks (`Reduced`), with the floats the reductions
carry. Apart from hvdcls.training.loop so that its callbacks (hvdcls.training.callbacks) can
name them without importing the loop."""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from hvdcls.backend import TOP_K, EvalSums, Sums, add
from hvdcls.observe.monitor import StepSample


def as_floats(total: Optional[Sums]) -> list[float]:
    return [0.0, 0.0, 0.0] if total is None else [float(v) for v in total]


def eval_floats(total, classes: int) -> list[float]:
    """A validation's sums as floats for the all-reduce: loss, correct, count, top-5 hits, then
    the classes x classes confusion counts (zeros for a rank that had no batch; a backend
    whose eval_step gives plain Sums gives no counts)."""
    if total is None:
        return [0.0] * (4 + classes * classes)
    if not isinstance(total, EvalSums):
        return as_floats(total)
    counts = np.asarray(total.confusion, np.float64).ravel()
    return [float(total.loss), float(total.correct), float(total.count), float(total.top5), *counts]


@dataclass
class Reduced:
    loss: float
    accuracy: float
    count: int
    top5: Optional[float] = None  # None: no more classes than TOP_K (or no counts)
    confusion: Optional[np.ndarray] = None  # classes x classes, summed over ranks

    @classmethod
    def from_sums(cls, sums: list[float]) -> "Reduced":
        loss, correct, count = sums[:3]
        reduced = cls(loss / max(count, 1), correct / max(count, 1), int(round(count)))
        classes = int(round((len(sums) - 4) ** 0.5)) if len(sums) > 3 else 0
        if classes:
            reduced.confusion = np.rint(np.asarray(sums[4:])).astype(np.int64).reshape(classes, classes)
            reduced.top5 = sums[3] / max(count, 1) if classes > TOP_K else None
        return reduced


@dataclass
class EpochTimes:
    """Rank 0's sums over one epoch's steps (see hvdcls.observe.monitor for their meaning)."""

    data_wait: float = 0.0
    step: float = 0.0
    allreduce: Optional[float] = None  # None: the backend cannot separate it
    sent_before: Optional[tuple] = None  # (gradient bytes, steps) counted before the epoch
    bytes_per_step: Optional[float] = None  # gradient bytes all-reduced per step this epoch

    def add(self, sample: StepSample) -> None:
        self.data_wait += sample.data_wait
        self.step += sample.seconds
        if sample.allreduce is not None:
            self.allreduce = (self.allreduce or 0.0) + sample.allreduce

    def close(self, sent_after: Optional[tuple]) -> None:
        if self.sent_before and sent_after and sent_after[1] > self.sent_before[1]:
            self.bytes_per_step = (sent_after[0] - self.sent_before[0]) / (sent_after[1] - self.sent_before[1])


@dataclass
class Tally:
    """The step loop's running account: since the loop began, or since a hook restarted it."""

    total: Optional[Sums] = None  # framework scalars, reduced over ranks by whoever folds them
    steps: int = 0
    lr: float = 0.0  # the last step's learning rate
    started: float = field(default_factory=time.perf_counter)

    def add(self, sums: Sums, lr: float) -> None:
        self.total, self.steps, self.lr = add(self.total, sums), self.steps + 1, lr

    def merge(self, later: "Tally") -> None:
        """Fold in a tally of the steps that followed (balancing: one per plan in force)."""
        if later.steps and later.total is not None:
            self.total, self.lr = add(self.total, later.total), later.lr
            self.steps += later.steps

    def seconds(self) -> float:
        return time.perf_counter() - self.started

    def restart(self) -> None:
        """Count afresh from now (elastic: after a commit, whose time is not training)."""
        self.total, self.steps, self.started = None, 0, time.perf_counter()
