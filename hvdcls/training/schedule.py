"""Learning-rate schedule maths, once for both backends.

The core asks for the rate of every optimizer step and hands it to the backend, so the two
frameworks follow exactly the same curve. Scaling follows Goyal et al. (2017), as Horovod's
examples do: the configured rate is for one worker's batch, and `scale_lr=linear` multiplies
it by the number of workers and by the backward passes accumulated per step; a warmup ramps
up to that peak so the large effective batch does not diverge in the first epochs.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from hvdcls.config import OptimizerConfig, ScheduleConfig


def peak_lr(optimizer: OptimizerConfig, world_size: int, backward_passes: int = 1) -> float:
    if optimizer.scale_lr == "linear":
        return optimizer.lr * world_size * backward_passes
    return optimizer.lr


@dataclass(frozen=True)
class LRSchedule:
    peak: float
    steps_per_epoch: int
    epochs: int
    config: ScheduleConfig

    @property
    def warmup_steps(self) -> int:
        return round(self.config.warmup_epochs * self.steps_per_epoch)

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


def build(optimizer: OptimizerConfig, schedule: ScheduleConfig, *, world_size: int,
          backward_passes: int, steps_per_epoch: int, epochs: int) -> LRSchedule:
    return LRSchedule(peak_lr(optimizer, world_size, backward_passes), steps_per_epoch, epochs,
                      schedule)
