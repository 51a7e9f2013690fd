"""Batches for the PyTorch backend: the core's EpochBatches behind torch's DataLoader.

Mirror: tf_backend/data.py. Which samples form which batch, and every pixel in them, is
decided by the core; DataLoader adds parallel workers and prefetching. With `uint8` the
workers hand over uint8 pixels (a quarter of the bytes through the queue and the pinned
copy, no float work in the workers) and `normalise` makes them the core's floats on the
training device (TorchBackend.to_device).
"""
from __future__ import annotations

from typing import Iterator, Optional, Sequence, Union

import torch
from torch.utils.data import DataLoader, Dataset

from hvdcls.data import device_decode
from hvdcls.data.batches import EpochBatches
from hvdcls.data.device_decode import EncodedBatch
from torch_backend.models import to_channels_first


class BatchDataset(Dataset):
    """Item k is the whole batch k, assembled inside a worker (uint8 pixels where asked and
    the batches allow it: EpochBatches.uint8_ok); with `encoded` (data.decode on the device,
    hvdcls.data.device_decode.possible), its JPEGs' bytes and the core's choices for them."""

    def __init__(self, batches: EpochBatches, uint8: bool = False, encoded: bool = False):
        self.batches, self.uint8, self.encoded = batches, uint8, encoded

    def __len__(self) -> int:
        return len(self.batches)

    def __getitem__(self, k: int) -> tuple[Union[torch.Tensor, EncodedBatch], torch.Tensor]:
        if self.encoded:  # decoded by the training process (torch_backend/decode.py)
            batch, labels = device_decode.encode(self.batches, k)
            return batch, torch.from_numpy(labels)
        images, labels = self.batches.read(k, self.uint8) if self.uint8 else self.batches[k]
        return to_channels_first(torch.from_numpy(images)), torch.from_numpy(labels)


def loader(batches: EpochBatches, workers: int, pin_memory: bool = False, uint8: bool = False,
           encoded: bool = False) -> DataLoader:
    return DataLoader(BatchDataset(batches, uint8, encoded), batch_size=None, shuffle=False, num_workers=workers,
                      pin_memory=pin_memory, prefetch_factor=2 if workers else None)


def normalise(images: torch.Tensor, mean: Sequence[float], std: Sequence[float]) -> torch.Tensor:
    """uint8 NCHW pixels as hvdcls.data.transforms.Preprocess.normalise's float32 (its table
    is this arithmetic, in this order, in float32), on the images' device; float images pass."""
    if images.dtype != torch.uint8:
        return images
    shape = (1, -1, 1, 1)
    mean_t = torch.tensor(mean, dtype=torch.float32, device=images.device).view(shape)
    std_t = torch.tensor(std, dtype=torch.float32, device=images.device).view(shape)
    return images.float().div_(255.0).sub_(mean_t).div_(std_t)


def waited_worker(iterator: Optional[Iterator]) -> Optional[str]:
    """The worker process holding the batch a DataLoader `iterator` waits for. DataLoader
    returns batches in order, the next being `_rcvd_idx`, and notes the worker it sent each
    index to in `_task_info[index] = (worker,)` (a second item once the batch arrived).
    Private names of torch 2.x, read without a lock: None when they say nothing clear."""
    task_info, waited = getattr(iterator, "_task_info", None), getattr(iterator, "_rcvd_idx", None)
    task = task_info.get(waited) if isinstance(task_info, dict) else None
    workers = getattr(iterator, "_workers", None)
    if not task or len(task) != 1 or not workers:  # no workers, nothing sent yet, or already arrived
        return None
    worker = task[0]
    return f"loader worker {worker}, pid {workers[worker].pid}"
