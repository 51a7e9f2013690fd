"""Per-rank batch sizes by speed (`training.balance`): the planner, and the speed it plans from.

Synchronous data parallelism waits for its slowest rank. With `balance=dynamic` each rank's
batch b_i is sized by its measured compute time so that every rank's step takes about as long:
in proportion to its speed (images per second of compute), refined by a fixed cost per step
once two batch sizes have been timed (RankCost); with `balance=fixed` the shares come from the
config. The global batch B = sum(b_i) stays training.batch_size x ranks whatever the plan, so
the optimisation (learning rate, its scaling and warmup) does not move; the backends multiply
each rank's mean loss by ranks x b_i / B (Plan.weight), so Horovod's average of the gradients
is the mean gradient over the global batch. docs/balancing.md tells the whole story.

Everything here is plain Python on numbers every rank holds alike (the config, and speeds
allgathered from every rank), so every rank computes the same plan without another message.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence

from hvdcls.config import Config
from hvdcls.errors import UserError


@dataclass(frozen=True)
class Bounds:
    """What a plan must respect: its sum, each batch's range, and the quantum it rounds to."""

    total: int  # B, per backward pass, all ranks together
    min_batch: int = 1
    max_batch: Optional[int] = None  # None: up to `total`
    quantum: int = 1

    @property
    def high(self) -> int:
        return self.total if self.max_batch is None else min(self.max_batch, self.total)

    def problem(self, ranks: int) -> Optional[str]:
        """Why no plan for `ranks` ranks fits, or None when one does."""
        if ranks * self.min_batch > self.total:
            return (f"{ranks} ranks x training.balancing.min_batch={self.min_batch} exceeds the "
                    f"global batch {self.total}")
        if ranks * self.high < self.total:
            return (f"{ranks} ranks x training.balancing.max_batch={self.max_batch} cannot hold "
                    f"the global batch {self.total}")
        return None


Line = tuple  # (fixed seconds, seconds per sample): a rank's step time t(b) = fixed + b x per_sample


def equal_time_shares(total: int, lines: Sequence[Line], low: int, high: int) -> list[float]:
    """Batches (real numbers) summing to `total` under which every rank's predicted time is the
    same, T = fixed_i + b_i x per_sample_i, each within [low, high]: a rank that would fall
    outside is held at its bound and T solved again for the rest. With no fixed times the
    batches are proportional to speed (1 / per_sample)."""
    shares: list[Optional[float]] = [None] * len(lines)
    while True:
        free = [i for i, s in enumerate(shares) if s is None]
        if not free:
            return [float(s) for s in shares if s is not None]
        left = total - sum(s for s in shares if s is not None)
        rate = sum(1.0 / lines[i][1] for i in free)
        target = (left + sum(lines[i][0] / lines[i][1] for i in free)) / rate
        proposal = {i: (target - lines[i][0]) / lines[i][1] for i in free}
        clipped = {i: min(max(x, low), high) for i, x in proposal.items() if not low <= x <= high}
        if not clipped:
            for i, x in proposal.items():
                shares[i] = x
            return [float(s) for s in shares if s is not None]
        for i, x in clipped.items():
            shares[i] = x


def rounded(ideal: Sequence[float], bounds: Bounds) -> list[int]:
    """Integer batches near `ideal`, multiples of the quantum where the sum and the bounds allow
    (the remainder moves in the largest steps that fit), within bounds, summing to the total."""
    q, low, high = bounds.quantum, bounds.min_batch, bounds.high
    batches = [min(max(q * int(x // q), low), high) for x in ideal]
    while (missing := bounds.total - sum(batches)) != 0:
        if missing > 0:  # give to the rank furthest below its ideal that has room
            room = [i for i in range(len(batches)) if batches[i] < high]
            i = max(room, key=lambda k: (ideal[k] - batches[k], -k))
            batches[i] += min(q, missing, high - batches[i])
        else:  # take from the rank furthest above its ideal that can give
            room = [i for i in range(len(batches)) if batches[i] > low]
            i = max(room, key=lambda k: (batches[k] - ideal[k], -k))
            batches[i] -= min(q, -missing, batches[i] - low)
    return batches


def plan(weights: Sequence[float], bounds: Bounds) -> list[int]:
    """Per-rank batches proportional to `weights` (speeds or configured shares)."""
    return plan_for([(0.0, 1.0 / w) for w in weights], bounds)


def plan_for(lines: Sequence[Line], bounds: Bounds) -> list[int]:
    """Per-rank batches that equalise the ranks' predicted step times."""
    return rounded(equal_time_shares(bounds.total, lines, bounds.min_batch, bounds.high), bounds)


def step_time(batches: Sequence[int], lines: Sequence[Line]) -> float:
    """Predicted compute time of a step: the slowest rank's (the others wait for it)."""
    return max(fixed + b * per_sample for b, (fixed, per_sample) in zip(batches, lines))


def gain(current: Sequence[int], proposed: Sequence[int], lines: Sequence[Line]) -> float:
    """Predicted fraction of the step time `proposed` saves over `current`."""
    before = step_time(current, lines)
    return 1.0 - step_time(proposed, lines) / before if before > 0 else 0.0


@dataclass
class RankCost:
    """One rank's seconds per backward pass against its batch: smoothed times at the last few
    batch sizes it ran, and the line through them. Speed alone (images/s at one batch) ends
    at equal step times too, but where a rank has a fixed cost per step (launches, Python) it
    looks slower the smaller its batch, and the plan creeps there one re-plan (one loader
    restart, one retrace) at a time; two batch sizes separate the fixed cost."""

    smoothing: float
    points: dict = field(default_factory=dict)  # batch -> smoothed seconds per pass
    KEEP = 3  # batch sizes remembered: the most recent
    SPREAD = 0.25  # fit a line only over batch sizes this far apart (share of the largest)

    def add(self, batch: int, seconds: float) -> None:
        old = self.points.pop(batch, None)  # re-inserted: the dict's order is recency
        a = self.smoothing
        self.points[batch] = seconds if old is None else a * seconds + (1 - a) * old
        while len(self.points) > self.KEEP:
            self.points.pop(next(iter(self.points)))

    def line(self, batch: int) -> Line:
        """(fixed, per_sample); proportional through the time at `batch` until two sizes fit
        a line with a positive slope and a fixed part >= 0."""
        proportional = (0.0, self.points[batch] / batch)
        bs, ts = list(self.points), list(self.points.values())
        if len(bs) < 2 or max(bs) - min(bs) < self.SPREAD * max(bs):
            return proportional  # sizes too close: noise would decide the slope
        mean_b, mean_t = sum(bs) / len(bs), sum(ts) / len(ts)
        spread = sum((b - mean_b) ** 2 for b in bs)
        slope = sum((b - mean_b) * (t - mean_t) for b, t in zip(bs, ts)) / spread
        fixed = mean_t - slope * mean_b
        return (fixed, slope) if slope > 0 and fixed >= 0 else proportional


@dataclass(frozen=True)
class Settings:
    mode: str  # off | dynamic | fixed
    bounds: Bounds
    shares: tuple = ()
    threshold: float = 0.05
    smoothing: float = 0.5
    every: int = 5


def settings(config: Config, ranks: int, on_gpu: bool) -> Settings:
    """The balancing settings for `ranks` ranks (parallel.tensor: the replicas, each of whose T
    ranks reads one batch); a UserError (one line, on every rank alike) when they cannot hold
    the global batch or the shares do not fit the world."""
    training, bal = config.training, config.training.balancing
    # GPUs: multiples of 8 where the batch allows, so that equal batches stay equal (batch 12: 4)
    quantum = bal.quantum or (math.gcd(8, training.batch_size) if on_gpu else 1)
    bounds = Bounds(training.batch_size * ranks, bal.min_batch, bal.max_batch, quantum)
    if training.balance != "off":
        problem = bounds.problem(ranks)
        if problem:
            raise UserError(f"config training.balance={training.balance}: {problem}")
    if training.balance == "fixed" and len(bal.shares) != ranks:
        unit = "replica" if config.parallel.tensor > 1 else "rank"
        raise UserError(f"config training.balancing.shares={list(bal.shares)}: {len(bal.shares)} "
                        f"shares for {ranks} {unit}s (one per {unit})")
    return Settings(training.balance, bounds, tuple(bal.shares), bal.threshold, bal.smoothing,
                    bal.every)


@dataclass(frozen=True)
class Plan:
    """Per-rank batches in force from global step `step` on, and the speeds that chose them."""

    batches: tuple
    step: int = 0
    speeds: Optional[tuple] = None  # images/s per rank (smoothed); None: not measured

    def weight(self, rank: int) -> float:
        """Rank's gradient weight for an averaging all-reduce: ranks x b_i / B, so that the
        average of weighted local mean gradients is the mean over the global batch."""
        return len(self.batches) * self.batches[rank] / sum(self.batches)

    def as_dict(self) -> dict:
        speeds = None if self.speeds is None else [round(s, 3) for s in self.speeds]
        return {"step": self.step, "batches": list(self.batches), "speeds": speeds}


def initial_plan(config: Settings, ranks: int, step: int = 0) -> Plan:
    """Before any measurement (a run's start, a resume, an elastic reset): the shares, or equal."""
    if config.mode == "fixed":
        return Plan(tuple(plan(config.shares, config.bounds)), step)
    return Plan(tuple(plan([1.0] * ranks, config.bounds)), step)


@dataclass
class Balancer:
    """The plan in force and each rank's measured cost; `observe` may replace the plan. Every
    rank holds one and feeds it the same gathered numbers, so all hold the same plan."""

    config: Settings
    ranks: int
    plan: Plan = None  # type: ignore[assignment]
    speeds: Optional[list] = None  # images/s per rank at the plan in force (smoothed)
    history: list = field(default_factory=list)  # every plan in force so far
    # Exchanges in a row that must predict the gain before a new plan is adopted: one noisy
    # measurement (a busy host, a scheduler hiccup) does not move the plan.
    PATIENCE = 2
    pending: int = 0

    def __post_init__(self):
        if self.plan is None:
            self.plan = initial_plan(self.config, self.ranks)
        self.history.append(self.plan)
        self.costs = [RankCost(self.config.smoothing) for _ in range(self.ranks)]

    @property
    def dynamic(self) -> bool:
        return self.config.mode == "dynamic"

    def observe(self, measured: Sequence[tuple], next_step: int) -> Optional[Plan]:
        """Fold every rank's (images, compute seconds) since the last call into its cost;
        returns the new plan (from `next_step` on) when it has predicted more than the
        threshold's gain PATIENCE exchanges in a row, else None."""
        if any(images <= 0 or seconds <= 0 for images, seconds in measured):
            return None  # a rank measured nothing: keep what we have
        batches = self.plan.batches
        for cost, batch, (images, seconds) in zip(self.costs, batches, measured):
            cost.add(batch, seconds * batch / images)  # seconds per pass at this batch
        lines = [cost.line(batch) for cost, batch in zip(self.costs, batches)]
        self.speeds = [batch / cost.points[batch] for cost, batch in zip(self.costs, batches)]
        proposed = tuple(plan_for(lines, self.config.bounds))
        if proposed == batches or gain(batches, proposed, lines) <= self.config.threshold:
            self.pending = 0
            return None
        self.pending += 1
        if self.pending < self.PATIENCE:
            return None
        self.pending = 0
        self.plan = Plan(proposed, next_step, tuple(self.speeds))
        self.history.append(self.plan)
        return self.plan

    def summary(self) -> dict:
        """summary.json's `balance` section."""
        speeds = None if self.speeds is None else [round(s, 3) for s in self.speeds]
        return {"mode": self.config.mode, "batches": list(self.plan.batches), "speeds": speeds,
                "plans": [p.as_dict() for p in self.history]}


class SpeedMeter:
    """This rank's compute since the last exchange: images, and seconds of its steps less the
    all-reduce wait (the data wait is outside the step already). The first step after a plan
    change is left out: new shapes cost a retrace (TensorFlow) or autotuning (cuDNN)."""

    def __init__(self, every: int):
        self.every = every
        self.reset(skip_first=True)

    def reset(self, skip_first: bool) -> None:
        self.images, self.seconds, self.steps, self.skip = 0, 0.0, 0, skip_first

    def add(self, images: int, step_seconds: float, allreduce: Optional[float]) -> bool:
        """Count one step; True when an exchange is due (the same step on every rank)."""
        if self.skip:
            self.skip = False
            return False
        self.images += images
        self.seconds += max(step_seconds - (allreduce or 0.0), 0.0)
        self.steps += 1
        return self.steps >= self.every

    def take(self) -> tuple:
        taken = (self.images, self.seconds)
        self.reset(skip_first=False)
        return taken


class Rebalancer:
    """Dynamic balancing between the steps of any step loop (the trainer's, the bench's): count
    this rank's compute after each step and, when an exchange is due (the same step on every
    rank), gather every rank's and maybe adopt a new plan."""

    def __init__(self, config: Settings, ranks: int, rank: int, start_step: int = 0):
        """`start_step`: the global step the first plan applies from (elastic: the reset's)."""
        self.balancer = Balancer(config, ranks, initial_plan(config, ranks, start_step))
        self.rank = rank
        self.meter = SpeedMeter(config.every)

    @property
    def plan(self) -> Plan:
        return self.balancer.plan

    def after_step(self, passes: int, seconds: float, allreduce: Optional[float],
                   gather: Callable[[tuple], list], next_step: int) -> Optional[Plan]:
        """`seconds`: the step's time, `allreduce`: its wait for the other ranks (None: not
        separable), `gather`: (images, seconds) of this rank -> every rank's (a collective).
        Returns the plan that applies from `next_step` on when it changed, else None."""
        if not self.balancer.dynamic:
            return None
        if not self.meter.add(self.plan.batches[self.rank] * passes, seconds, allreduce):
            return None
        new = self.balancer.observe(gather(self.meter.take()), next_step)
        if new is not None:
            self.meter.reset(skip_first=True)
        return new


def describe(new: Plan, rank_count: int, unit: str = "rank") -> str:
    """The line logged when a plan changes (`unit`: parallel.tensor's are per replica)."""
    speeds = "" if new.speeds is None else " at " + ", ".join(f"{s:.1f}" for s in new.speeds) + " img/s"
    batches = ", ".join(str(b) for b in new.batches)
    return f"balance: per-{unit} batches {batches} from step {new.step}{speeds} ({rank_count} {unit}s)"
