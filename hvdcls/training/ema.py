"""Model EMA: when to update the averaged copy of the weights and with which decay.

The backend keeps the copy (parameters and floating buffers) and applies
    ema = decay x ema + (1 - decay) x weights
every `training.ema_steps` optimizer steps; the core decides the decay, as torchvision's
reference does (`--model-ema`, `--model-ema-steps`, `--model-ema-decay`): the configured decay
is for one image of a one-epoch run, scaled to the images one update spans,
    alpha = min(1, (1 - decay) x images per step x ema_steps / epochs),  decay' = 1 - alpha,
so the same `training.ema_decay` means the same averaging horizon (in epochs) at any batch and
world size; and during the learning-rate warmup the copy follows the weights exactly
(decay' = 0), since torchvision restarts its average at every warmup update. Ranks agree:
the weights are identical after every step, and the backend averages the buffers' copies
with the buffers at each epoch end.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np

from hvdcls.config import Config
from hvdcls.training.schedule import warmup_epochs


@dataclass(frozen=True)
class EmaSchedule:
    decay: float  # training.ema_decay: torchvision's --model-ema-decay
    every: int  # optimizer steps between updates
    images_per_step: int  # global batch: batch x workers x backward passes
    epochs: int
    warmup_epochs: float

    @property
    def per_update(self) -> float:
        """The decay one update applies."""
        alpha = (1.0 - self.decay) * self.images_per_step * self.every / self.epochs
        return 1.0 - min(1.0, alpha)

    def due(self, global_step: int) -> bool:
        """After optimizer step `global_step` (0-based, over the run)?"""
        return (global_step + 1) % self.every == 0

    def decay_at(self, epoch: int) -> float:
        """0 (copy the weights) during the warmup epochs, else per_update."""
        return 0.0 if epoch < self.warmup_epochs else self.per_update


def schedule_for(config: Config, images_per_step: int) -> Optional[EmaSchedule]:
    """The run's EMA schedule; None when training.ema_decay is unset."""
    training = config.training
    if training.ema_decay is None:
        return None
    return EmaSchedule(training.ema_decay, training.ema_steps, images_per_step, training.epochs,
                       warmup_epochs(config.schedule, training.epochs))


def update(ema: dict, weights: dict, decay: float) -> dict:
    """The update on numpy arrays by name: the reference the backends' in-place ones follow."""
    return {name: decay * ema[name] + (1.0 - decay) * np.asarray(weights[name]) for name in ema}
