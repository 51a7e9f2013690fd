"""Batches for the PyTorch backend: the core's EpochBatches behind torch's DataLoader.

Mirror: tf_backend/data.py. Which samples form which batch, and every pixel in them, is
decided by the core; DataLoader adds parallel workers and prefetching.
"""
from __future__ import annotations

from typing import Iterator, Optional

import torch
from torch.utils.data import DataLoader, Dataset

from hvdcls.data.batches import EpochBatches
from torch_backend.models import to_channels_first


class BatchDataset(Dataset):
    """Item k is the whole batch k, assembled inside a worker."""

    def __init__(self, batches: EpochBatches):
        self.batches = batches

    def __len__(self) -> int:
        return len(self.batches)

    def __getitem__(self, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        images, labels = self.batches[k]
        return to_channels_first(torch.from_numpy(images)), torch.from_numpy(labels)


def loader(batches: EpochBatches, workers: int, pin_memory: bool = False) -> DataLoader:
    return DataLoader(BatchDataset(batches), batch_size=None, shuffle=False, num_workers=workers,
                      pin_memory=pin_memory, prefetch_factor=2 if workers else None)


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
