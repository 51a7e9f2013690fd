"""Batches for the PyTorch backend: the core's EpochBatches behind torch's DataLoader.

Mirror: tf_backend/data.py. Which samples form which batch, and every pixel in them, is
decided by the core; DataLoader adds parallel workers and prefetching.
"""
from __future__ import annotations

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
