"""optimizer.lr=auto: the learning-rate range test's decisions, framework-free and pure.

The test (Smith 2017, "Cyclical learning rates", section 3.3; fastai's lr_find) trains for
about a hundred steps at rates rising exponentially from a small one to a large one and
watches the loss. This module holds everything but the training: the rates of the sweep,
the smoothing, when to stop, and the rule that reads the curve. hvdcls.training.lr_sweep
drives the steps on a backend and puts the model back afterwards.

The rule: one tenth of the rate at the minimum of the smoothed loss (fastai's `lr_min`).
At the minimum the loss stops falling because the rate is already too large to keep
descending; a tenth of it is still on the steep part of the curve, an order of magnitude
from divergence. We chose it over "the steepest descent of the smoothed loss" because a
minimum is read off the curve's values, a steepest slope off their differences: over a
hundred noisy single-batch losses, the differences are far noisier than the values, and the
steepest point jumps between runs while the minimum moves little. The divergence test
(smoothed loss above 4x the best so far, or not finite) is fastai's too. The smoothing is an
exponential moving average, bias-corrected, with beta 0.9 where fastai has 0.98: an average
looks back about 1 / (1 - beta) steps, and at 0.98 that is 50 of a hundred-step sweep over
six decades, three decades of lag that put the smoothed minimum far above the real one;
at 0.9 it is ten steps (0.6 of a decade) and still cuts a step's noise to a quarter.

The cases the rule alone does not cover, each named in the Choice's `reason`:
- no descent (the smoothed loss never fell `MIN_DROP` below its start) and no divergence: the
  curve says nothing about the rate; the caller's fallback rate (the schema's default rule);
- no descent before it diverged: even the smallest rates were too large; the smallest swept.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Sequence

SMOOTHING = 0.9  # beta of the exponential moving average of the step losses
DIVERGED = 4.0  # smoothed loss above this x the best seen: the rate is too large, stop
MIN_DROP = 0.05  # a descent: the smoothed minimum at least this fraction below the start
RULE = "a tenth of the rate at the smoothed loss's minimum (stops when it exceeds 4x its best)"


def rates(low: float, high: float, steps: int) -> list[float]:
    """`steps` rates from `low` to `high`, each the last times one constant factor."""
    if steps < 2:
        return [low]
    ratio = (high / low) ** (1.0 / (steps - 1))
    return [low * ratio**i for i in range(steps)]


class Smoother:
    """The bias-corrected exponential moving average of the step losses, and the best of it."""

    def __init__(self, beta: float = SMOOTHING):
        self.beta, self.average, self.count = beta, 0.0, 0
        self.best = math.inf

    def add(self, loss: float) -> float:
        """Fold in one step's loss; returns the smoothed value at this step."""
        self.count += 1
        self.average = self.beta * self.average + (1 - self.beta) * loss
        smoothed = self.average / (1 - self.beta**self.count)
        if math.isfinite(smoothed):
            self.best = min(self.best, smoothed)
        return smoothed

    def diverged(self, smoothed: float) -> bool:
        """The loss has run away: stop the sweep (every rank decides alike from the same value)."""
        return not math.isfinite(smoothed) or smoothed > DIVERGED * self.best


def smooth(losses: Sequence[float], beta: float = SMOOTHING) -> list[float]:
    """The smoothed curve of `losses`, up to and including the first diverged point."""
    smoother, out = Smoother(beta), []
    for loss in losses:
        out.append(smoother.add(loss))
        if smoother.diverged(out[-1]):
            break
    return out


@dataclass(frozen=True)
class Choice:
    lr: float
    reason: str  # "valley", "flat", "diverged at once"
    at: Optional[int]  # the index of the curve's minimum (None: no minimum used)
    diverged: bool


def choose(lrs: Sequence[float], smoothed: Sequence[float], fallback: float) -> Choice:
    """The rate to train with, from a sweep's rates and smoothed losses (as far as the sweep
    ran, its diverged last point included); `fallback` when the curve tells nothing."""
    if not smoothed:
        return Choice(fallback, "flat", None, False)
    diverged = _diverged(smoothed)
    usable = smoothed[:-1] if diverged else smoothed  # the diverged point is no candidate
    finite = [(i, loss) for i, loss in enumerate(usable) if math.isfinite(loss)]
    if finite:
        at, lowest = min(finite, key=lambda item: item[1])
        if lowest <= (1 - MIN_DROP) * finite[0][1]:
            return Choice(lrs[at] / 10, "valley", at, diverged)
    if diverged:
        return Choice(lrs[0], "diverged at once", None, True)
    return Choice(fallback, "flat", None, False)


def _diverged(smoothed: Sequence[float]) -> bool:
    """Did the sweep end because its last point diverged (the test Smoother.diverged makes)?"""
    last, before = smoothed[-1], [v for v in smoothed[:-1] if math.isfinite(v)]
    return not math.isfinite(last) or (bool(before) and last > DIVERGED * min(before))


def table(lrs: Sequence[float], smoothed: Sequence[float], every: int = 1) -> list[list[str]]:
    """The curve's rows for hvdcls.tables: lr and smoothed loss, every `every`-th point and the last."""
    keep = [i for i in range(len(smoothed)) if i % every == 0 or i == len(smoothed) - 1]
    return [[f"{lrs[i]:.3g}", f"{smoothed[i]:.4f}"] for i in keep]
