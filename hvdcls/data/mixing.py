"""Mixup (Zhang et al. 2018) and CutMix (Yun et al. 2019) on a whole batch, in numpy.

A batch is mixed with itself rolled by one sample, as torchvision's references do: image i
with image i-1, and its target becomes lam x one_hot(y_i) + (1 - lam) x one_hot(y_(i-1)).
The draws come from a generator seeded by (seed, epoch, the batch's first sample index), so
both backends and any number of loader workers mix the same batches the same way. Targets
become float32 (N, classes); the backends' losses take such soft targets (label smoothing
is applied on top), and train accuracy counts the dominant label.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from hvdcls.config import DataConfig

MIX_STREAM = 4243  # keeps the batch's generator apart from the per-sample ones


def batch_rng(seed: int, epoch: int, first_index: int) -> np.random.Generator:
    return np.random.default_rng([MIX_STREAM, seed, epoch, int(first_index)])


def one_hot(labels: np.ndarray, num_classes: int) -> np.ndarray:
    out = np.zeros((len(labels), num_classes), np.float32)
    out[np.arange(len(labels)), labels] = 1.0
    return out


def mixup(images: np.ndarray, targets: np.ndarray, lam: float) -> tuple[np.ndarray, np.ndarray]:
    """Every pixel and target: lam x its own + (1 - lam) x its rolled partner's."""
    mixed = lam * images + (1.0 - lam) * np.roll(images, 1, axis=0)
    mixed_targets = lam * targets + (1.0 - lam) * np.roll(targets, 1, axis=0)
    return mixed.astype(np.float32, copy=False), mixed_targets.astype(np.float32, copy=False)


def cutmix_box(height: int, width: int, lam: float, rng: np.random.Generator) -> tuple[int, int, int, int]:
    """(top, left, bottom, right): a box of about (1 - lam) of the area, centred at a uniform
    point and clipped to the image."""
    cut = math.sqrt(1.0 - lam)
    h, w = int(height * cut), int(width * cut)
    cy, cx = int(rng.integers(height)), int(rng.integers(width))
    return (max(cy - h // 2, 0), max(cx - w // 2, 0), min(cy + h // 2, height), min(cx + w // 2, width))


def cutmix(images: np.ndarray, targets: np.ndarray, lam: float,
           rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """The partner's pixels pasted into one box; lam becomes the area left (after clipping)."""
    height, width = images.shape[1:3]
    top, left, bottom, right = cutmix_box(height, width, lam, rng)
    mixed = images.copy()
    mixed[:, top:bottom, left:right] = np.roll(images[:, top:bottom, left:right], 1, axis=0)  # the box only
    kept = 1.0 - (bottom - top) * (right - left) / (height * width)
    return mixed, (kept * targets + (1.0 - kept) * np.roll(targets, 1, axis=0)).astype(np.float32)


@dataclass(frozen=True)
class BatchMix:
    """data.mixup_alpha / cutmix_alpha / mix_switch_prob applied to training batches."""

    config: DataConfig
    num_classes: int
    seed: int = 0

    @property
    def enabled(self) -> bool:
        return self.config.mixup_alpha > 0 or self.config.cutmix_alpha > 0

    def __call__(self, images: np.ndarray, labels: np.ndarray, epoch: int,
                 first_index: int) -> tuple[np.ndarray, np.ndarray]:
        """(images, labels int) -> (mixed images, float32 targets (N, classes))."""
        targets = one_hot(labels, self.num_classes)
        rng = batch_rng(self.seed, epoch, first_index)
        mix_alpha, cut_alpha = self.config.mixup_alpha, self.config.cutmix_alpha
        use_cutmix = cut_alpha > 0 and (mix_alpha <= 0 or rng.random() < self.config.mix_switch_prob)
        if use_cutmix:
            return cutmix(images, targets, float(rng.beta(cut_alpha, cut_alpha)), rng)
        return mixup(images, targets, float(rng.beta(mix_alpha, mix_alpha)))
