"""Synchronised batch norm for the PyTorch backend, on CPU and GPU alike.

Mirror: tf_backend/sync_bn.py. Horovod's own `hvd.SyncBatchNorm` refuses CPU tensors, so this
one is written on Horovod's differentiable all-reduce: each rank contributes per-channel
sum, sum of squares and count; the reduced totals give the mean and variance of the global
batch; autograd all-reduces their gradient in the backward pass.
"""
from __future__ import annotations

import horovod.torch as hvd
import torch
from torch import nn


def global_moments(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Mean and biased variance per channel of the batch of every rank, and its size."""
    channels, dims = x.size(1), [0, *range(2, x.dim())]
    count = x.new_tensor([x.numel() / channels])
    local = torch.cat([x.sum(dims), (x * x).sum(dims), count])
    total = hvd.allreduce(local, op=hvd.Sum)  # Horovod: differentiable, sums over ranks
    n = total[-1]
    mean = total[:channels] / n
    variance = (total[channels:2 * channels] / n - mean * mean).clamp_min(0)
    return mean, variance, n


class SyncBatchNorm(nn.BatchNorm2d):
    """BatchNorm2d whose training statistics cover the global batch (same parameters and
    buffers as BatchNorm2d, so checkpoints move between the two)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or hvd.size() == 1:
            return super().forward(x)
        mean, variance, n = global_moments(x.float())
        if self.track_running_stats:
            self._update_running_stats(mean.detach(), variance.detach(), n.detach())
        shape = (1, -1) + (1,) * (x.dim() - 2)
        y = (x.float() - mean.view(shape)) * torch.rsqrt(variance.view(shape) + self.eps)
        if self.affine:
            y = y * self.weight.view(shape) + self.bias.view(shape)
        return y.to(x.dtype)

    @torch.no_grad()
    def _update_running_stats(self, mean, variance, n) -> None:
        assert self.num_batches_tracked is not None and self.running_mean is not None \
            and self.running_var is not None  # track_running_stats: the caller checked
        self.num_batches_tracked += 1
        momentum = self.momentum if self.momentum is not None else 1.0 / float(self.num_batches_tracked)
        unbiased = variance * n / (n - 1).clamp_min(1)  # as BatchNorm2d keeps it
        self.running_mean.lerp_(mean.to(self.running_mean.dtype), momentum)
        self.running_var.lerp_(unbiased.to(self.running_var.dtype), momentum)
