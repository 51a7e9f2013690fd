"""Batches as numpy arrays: the hand-off point between the core's data and a backend's loader.

A backend wraps `EpochBatches` in its framework's loader (torch's DataLoader, tf.data) for
parallel workers and prefetching; what is in each batch is decided here, once.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Iterable, Iterator, Optional

import numpy as np

from hvdcls.data.mixing import BatchMix
from hvdcls.data.sources import ImageSource
from hvdcls.data.transforms import Preprocess


@dataclass
class EpochBatches:
    """Batch k of one epoch on this rank: (images float32 NHWC, labels int64), or with batch
    mixing on, (mixed images, targets float32 (N, classes)); `read(k, uint8=True)`: the
    images as uint8 pixels, normalised by the backend after the hand-over."""

    source: ImageSource
    batches: list[np.ndarray]  # sample indices per batch, from hvdcls.data.sharding
    preprocess: Preprocess
    epoch: int
    train: bool
    mix: Optional[BatchMix] = None  # training batches only
    # batch k -> the native id of the thread reading it now: a loader whose workers are
    # threads of this process (tf.data) can then say which one holds the batch waited for.
    readers: dict = field(default_factory=dict, repr=False, compare=False)

    @property
    def soft_classes(self) -> Optional[int]:
        """The targets' width when they are soft (mixed), else None (int labels)."""
        return self.mix.num_classes if self.train and self.mix and self.mix.enabled else None

    def __len__(self) -> int:
        return len(self.batches)

    @property
    def uint8_ok(self) -> bool:
        """Whether batches can be handed over as uint8 pixels (`read`): not when something
        must run on the normalised floats in the worker (random erasing, batch mixing)."""
        return not self.soft_classes and not self.preprocess.floats_only(self.train)

    def __getitem__(self, k: int) -> tuple[np.ndarray, np.ndarray]:
        return self.read(k)

    def read(self, k: int, uint8: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """Batch k; with `uint8` (the caller checked uint8_ok) its images as uint8 NHWC pixels,
        which the backend normalises after the hand-over to Preprocess.normalise's floats."""
        self.readers[k] = threading.get_native_id()
        try:
            return self._read(k, uint8 and self.uint8_ok)
        finally:
            self.readers.pop(k, None)

    def _read(self, k: int, uint8: bool = False) -> tuple[np.ndarray, np.ndarray]:
        indices = self.batches[k]
        images = np.stack([self._one(int(i), uint8) for i in indices])
        labels = np.asarray([self.source.label(int(i)) for i in indices], np.int64)
        if self.soft_classes and self.mix is not None:
            return self.mix(images, labels, self.epoch, int(indices[0]))
        return images, labels

    def _one(self, index: int, uint8: bool) -> np.ndarray:
        plan = self.preprocess.plan(self.epoch, index, self.train)  # JPEGs decode only what the crop needs
        return plan.finish(self.source.image(index, plan.draft), uint8)


class LoaderWait:
    """Wraps a loader and adds up the time spent blocked in its `next()`: the data wait."""

    def __init__(self, loader: Iterable):
        self.loader, self.waited = loader, 0.0
        # For the watchdog: the loader's live iterator and how many batches it gave, so
        # `taken` is the index of the batch being waited for (the loaders keep order).
        self.iterator: Optional[Iterator] = None
        self.taken = 0

    def __iter__(self) -> Iterator:
        batches = self.iterator = iter(self.loader)
        while True:
            started = time.perf_counter()
            try:
                batch = next(batches)
            except StopIteration:
                return
            finally:
                self.waited += time.perf_counter() - started
            self.taken += 1
            yield batch

    def take(self) -> float:
        """Seconds waited since the last take()."""
        waited, self.waited = self.waited, 0.0
        return waited
