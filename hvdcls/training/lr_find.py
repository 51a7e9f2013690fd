"""optimizer.lr=auto: the learning-rate range test's decisions, framework-free and pure.

The test (Smith 2017, "Cyclical learning rates", section 3.3; fastai's lr_find) trains for
about a hundred steps at rates rising exponentially from a small one to a large one and
watches the loss. This module holds everything but the training: the rates of the sweep,
the smoothing, when to stop, and the rule that reads the curve. hvdcls.training.lr_sweep
drives the steps on a backend and puts the model back afterwards.

The rule (issue 46 measured it on sets of 50 images a class,
benchmarks/results/2026-12-06-lr-auto-small/): the start level is the mean loss of the first
SETTLE steps, whose rates are too small to move the weights. The valley is the smoothed curve
from there until it first climbs back RISE of the way from its lowest point to the start (or
diverges): later dips are past the point where training broke down, and a lucky batch there
must not be read as a minimum. The rate chosen is the one at which the smoothed loss has first
made NEAR_BOTTOM of the valley's descent, times BELOW. That point lies on the steep side of
the valley, so noise moves it little, where the valley's lowest point can wander along a flat
bottom by a decade (the old rule, a tenth of the minimum's rate, picked 3.0 per 256 on the
issue's 500 images, where 0.2 was best, after such a dip). Then two guards:
- noise: the smoothed curve's own noise (the step losses' noise, scaled by what the average
  keeps of it) must be under 1 / NOISE_RATIO of the descent; a noisier curve cannot place the
  point (noise alone can end its "valley" or make it), and the fallback rate is taken
  (`reason: noisy`);
- a short schedule: a run of fewer optimizer steps than SHORT_STEPS has no time to settle
  after large steps, so the rate shrinks in proportion (`shrink` in the Choice).
The cases the rule does not cover, each named in the Choice's `reason`:
- no descent (the smoothed loss never fell `MIN_DROP` below its start) and no divergence: the
  curve says nothing about the rate; the caller's fallback rate (the schema's default rule);
- no descent before it diverged: even the smallest rates were too large; the smallest swept.

The smoothing is a bias-corrected exponential moving average with beta 0.9 where fastai has
0.98: an average looks back about 1 / (1 - beta) steps, and at 0.98 that is 50 of a
hundred-step sweep over six decades, three decades of lag; at 0.9 it is ten steps (0.6 of a
decade) and still cuts a step's noise to a quarter. The divergence test (smoothed loss above
4x the best so far, or not finite) is fastai's.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Optional, Sequence

SMOOTHING = 0.9  # beta of the exponential moving average of the step losses
DIVERGED = 4.0  # smoothed loss above this x the best seen: the rate is too large, stop
MIN_DROP = 0.05  # a descent: the valley's lowest point at least this fraction below the start
SETTLE = 10  # the first steps: their mean is the start level; the average is still forming
RISE = 0.5  # the valley ends where the smoothed loss has climbed back this much of its descent
RISE_NOISE = 3.0  # ... and by more than this many times the smoothed curve's noise
NORMAL_MEDIAN_ABS = 0.6745  # the median of |x| for x standard normal
NEAR_BOTTOM = 0.9  # the rate read: where this fraction of the descent is first made
BELOW = 0.4  # ... times this
NOISE_RATIO = 5.0  # the descent must be this many times the smoothed curve's noise
SHORT_STEPS = 100  # a schedule of fewer optimizer steps shrinks the rate in proportion
RULE = (f"{BELOW:g}x the rate where the smoothed loss first made {NEAR_BOTTOM:.0%} of its descent to "
        f"the valley's lowest point; the default when the descent is under {NOISE_RATIO:g}x the "
        f"curve's noise; x steps/{SHORT_STEPS} for a schedule shorter than {SHORT_STEPS} steps")


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
class Valley:
    """What the rule reads off a curve: the start level, the valley's steps [first, end), its
    lowest smoothed loss and the smoothed curve's noise."""

    start: float
    first: int
    end: int
    bottom: float
    noise: float  # of the smoothed curve (noise())

    @property
    def descent(self) -> float:
        return self.start - self.bottom


@dataclass(frozen=True)
class Choice:
    lr: float
    reason: str  # "valley", "noisy", "flat", "diverged at once"
    at: Optional[int]  # the index of the point read (None: no point used)
    diverged: bool
    shrink: float = 1.0  # the short schedule's factor, already in `lr`
    noise: Optional[float] = None  # the smoothed curve's noise / the descent (None: not measured)


def valley(losses: Sequence[float], smoothed: Sequence[float]) -> Optional[Valley]:
    """The first valley of a sweep's curve (as far as it ran, a diverged last point
    excluded); None when it has too few settled points to read. A rise ends it only when it
    is also beyond RISE_NOISE x the curve's noise: a wiggle early in a slow descent is not the
    valley's end."""
    usable = len(smoothed) - 1 if _diverged(smoothed) else len(smoothed)
    settle = min(SETTLE, usable // 4)  # a short sweep (tests, a few rates) settles sooner
    finite = [v for v in losses[:max(settle, 1)] if math.isfinite(v)]
    if usable - settle < 1 or not finite:
        return None
    start, low, sigma = statistics.fmean(finite), math.inf, noise(losses[:usable])
    for i in range(settle, usable):
        value = smoothed[i]
        if not math.isfinite(value):
            return Valley(start, settle, i, low, sigma) if i > settle else None
        low = min(low, value)
        if low <= (1 - MIN_DROP) * start and value > low + max(RISE * (start - low), RISE_NOISE * sigma):
            return Valley(start, settle, i, low, sigma)
    return Valley(start, settle, usable, low, sigma)


def noise(losses: Sequence[float], beta: float = SMOOTHING) -> float:
    """The smoothed curve's own noise: a step loss's noise, from the typical (median) jump
    between neighbouring steps, which the curve's slope and a diverging tail hardly move,
    times what an exponential average of independent values keeps of it."""
    finite = [v for v in losses if math.isfinite(v)]
    jumps = [abs(b - a) for a, b in zip(finite, finite[1:])]
    if not jumps:
        return 0.0
    per_step = statistics.median(jumps) / (NORMAL_MEDIAN_ABS * math.sqrt(2))
    return per_step * math.sqrt((1 - beta) / (1 + beta))


def shrink(schedule_steps: Optional[int]) -> float:
    """The factor a schedule of `schedule_steps` optimizer steps takes of the rate read."""
    if not schedule_steps or schedule_steps >= SHORT_STEPS:
        return 1.0
    return schedule_steps / SHORT_STEPS


def choose(lrs: Sequence[float], losses: Sequence[float], smoothed: Sequence[float], fallback: float,
           schedule_steps: Optional[int] = None) -> Choice:
    """The rate to train with, from a sweep's rates, step losses and smoothed losses (as far
    as the sweep ran, its diverged last point included); `fallback` when the curve tells
    nothing; `schedule_steps`: the optimizer steps of the training to come (None: long)."""
    diverged = bool(smoothed) and _diverged(smoothed)
    found = valley(losses, smoothed)
    if found is None or found.bottom > (1 - MIN_DROP) * found.start:
        if diverged:
            return Choice(lrs[0], "diverged at once", None, True)
        return Choice(fallback, "flat", None, False)
    at = next(i for i in range(found.first, found.end)
              if smoothed[i] <= found.start - NEAR_BOTTOM * found.descent)
    factor = shrink(schedule_steps)
    spread = found.noise / found.descent
    lr = lrs[at] * BELOW * factor
    if spread * NOISE_RATIO > 1:
        return Choice(fallback, "noisy", at, diverged, factor, spread)
    return Choice(lr, "valley", at, diverged, factor, spread)


def _diverged(smoothed: Sequence[float]) -> bool:
    """Did the sweep end because its last point diverged (the test Smoother.diverged makes)?"""
    last, before = smoothed[-1], [v for v in smoothed[:-1] if math.isfinite(v)]
    return not math.isfinite(last) or (bool(before) and last > DIVERGED * min(before))


def table(lrs: Sequence[float], smoothed: Sequence[float], every: int = 1) -> list[list[str]]:
    """The curve's rows for hvdcls.tables: lr and smoothed loss, every `every`-th point and the last."""
    keep = [i for i in range(len(smoothed)) if i % every == 0 or i == len(smoothed) - 1]
    return [[f"{lrs[i]:.3g}", f"{smoothed[i]:.4f}"] for i in keep]
