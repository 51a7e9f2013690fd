"""Batches as numpy arrays: the hand-off point between the core's data and a backend's loader.

A backend wraps `EpochBatches` in its framework's loader (torch's DataLoader, tf.data) for
parallel workers and prefetching; what is in each batch is decided here, once.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hvdcls.datasets import ImageSource
from hvdcls.transforms import Preprocess


@dataclass
class EpochBatches:
    """Batch k of one epoch on this rank: (images float32 NHWC, labels int64)."""

    source: ImageSource
    batches: list[np.ndarray]  # sample indices per batch, from hvdcls.sharding
    preprocess: Preprocess
    epoch: int
    train: bool

    def __len__(self) -> int:
        return len(self.batches)

    def __getitem__(self, k: int) -> tuple[np.ndarray, np.ndarray]:
        indices = self.batches[k]
        images = [self._one(int(i)) for i in indices]
        labels = np.asarray([self.source.label(int(i)) for i in indices], np.int64)
        return np.stack(images), labels

    def _one(self, index: int) -> np.ndarray:
        image = self.source.image(index)
        if self.train:
            return self.preprocess.train(image, self.epoch, index)
        return self.preprocess.eval(image)
