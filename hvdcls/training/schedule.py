"""Learning-rate schedule maths, once for both backends.

The core asks for the rate of every optimizer step and hands it to the backend, so the two
frameworks follow exactly the same curve. Scaling follows Goyal et al. (2017), as Horovod's
examples do: by default (`scale_lr=per256`) the configured rate is for 256 images and the peak
is lr x global batch / 256 (global batch: per-worker batch x workers x backward passes);
`scale_lr=linear` takes the rate as one worker's batch's and multiplies it by the number of
workers and backward passes. A warmup (one epoch unless set) ramps up to that peak so the
large effective batch does not diverge in the first epochs.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from hvdcls.config import (
    OptimizerConfig,
    ScheduleConfig,
    peak_lr,  # the scaling rule: config's, shared with worker_lr
)


@dataclass(frozen=True)
class LRSchedule:
    peak: float
    steps_per_epoch: int
    epochs: int
    config: ScheduleConfig

    @property
    def warmup_steps(self) -> int:
        return round(warmup_epochs(self.config, self.epochs) * self.steps_per_epoch)

    @property
    def total_steps(self) -> int:
        return self.epochs * self.steps_per_epoch

    def __call__(self, step: int) -> float:
        """The rate for optimizer step `step` (0-based, counted over the whole run)."""
        warmup = self.warmup_steps
        if step < warmup:
            start = self.config.warmup_start_factor
            return self.peak * (start + (1 - start) * step / warmup)
        return self.peak * self._decay(step, warmup)

    def _decay(self, step: int, warmup: int) -> float:
        name, cfg = self.config.name, self.config
        epoch = step // self.steps_per_epoch
        if name == "cosine":
            span = max(1, self.total_steps - warmup)
            progress = min(1.0, (step - warmup) / span)
            floor = cfg.min_lr_factor
            return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))
        if name == "step":
            return cfg.gamma ** (epoch // cfg.step_size)
        if name == "multistep":
            return cfg.gamma ** sum(epoch >= milestone for milestone in cfg.milestones)
        return 1.0  # constant


def warmup_epochs(schedule: ScheduleConfig, epochs: int) -> float:
    """schedule.warmup_epochs, or when unset one epoch (a tenth of a run shorter than 10)."""
    if schedule.warmup_epochs is not None:
        return schedule.warmup_epochs
    return min(1.0, epochs / 10)


def build(optimizer: OptimizerConfig, schedule: ScheduleConfig, *, world_size: int,
          backward_passes: int, steps_per_epoch: int, epochs: int, batch_size: int) -> LRSchedule:
    return LRSchedule(peak_lr(optimizer, world_size, backward_passes, batch_size), steps_per_epoch,
                      epochs, schedule)
