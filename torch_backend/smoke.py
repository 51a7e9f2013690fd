"""Horovod smoke checks for the PyTorch backend; tf_backend/smoke.py is its mirror.

Each rank runs the same collectives and one DistributedOptimizer step and reports what it
observed; `hvdcls.checks.smoke` (framework-free) decides whether that is right. Every rank starts
from different weights and trains on different data on purpose, so a missing broadcast or
a missing gradient average shows up as weights that differ between ranks.
"""
from __future__ import annotations

import copy
import hashlib

import horovod.torch as hvd
import torch
import torch.nn.functional as F

from hvdcls.checks.smoke import CLASSES, FEATURES, HIDDEN, describe_world, smoke_batch


def make_model(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(FEATURES, HIDDEN), torch.nn.ReLU(),
                               torch.nn.Linear(HIDDEN, CLASSES))


def batch_of(rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    inputs, labels = smoke_batch(rank)
    return torch.from_numpy(inputs), torch.from_numpy(labels)


def flat_weights(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def spread_over_ranks(vector: torch.Tensor) -> float:
    """Largest difference of any element between any two ranks (0.0 when identical)."""
    gathered = hvd.allgather(vector.unsqueeze(0))  # Horovod: one row per rank
    return float((gathered.max(0).values - gathered.min(0).values).max())


def gradient_on(model: torch.nn.Module, rank: int) -> torch.Tensor:
    inputs, labels = batch_of(rank)
    loss = F.cross_entropy(model(inputs), labels)
    return torch.cat([g.reshape(-1) for g in torch.autograd.grad(loss, list(model.parameters()))])


def collectives(rank: int) -> dict:
    contribution = torch.full((4,), float(rank + 1))
    return {
        "allreduce_sum": hvd.allreduce(contribution, op=hvd.Sum).tolist(),
        "allreduce_average": hvd.allreduce(contribution, op=hvd.Average).tolist(),
        "broadcast": hvd.broadcast(torch.full((3,), 100.0 + rank), root_rank=0).tolist(),
        "allgather": hvd.allgather(torch.tensor([rank])).tolist(),
    }


def optimizer_step(rank: int, size: int, lr: float) -> dict:
    model = make_model(seed=1000 + rank)
    observed: dict[str, object] = {"spread_before_broadcast": spread_over_ranks(flat_weights(model))}
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)  # Horovod: same start everywhere
    start = flat_weights(model).clone()
    # What one step must give: the average of every rank's gradient, applied by plain SGD.
    reference = copy.deepcopy(model)
    mean_gradient = torch.stack([gradient_on(reference, r) for r in range(size)]).mean(0)
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=lr),
                                         named_parameters=model.named_parameters())
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    inputs, labels = batch_of(rank)
    optimizer.zero_grad()
    F.cross_entropy(model(inputs), labels).backward()
    optimizer.step()
    after = flat_weights(model)
    observed.update({
        "spread_after_broadcast": spread_over_ranks(start),
        "spread_after_step": spread_over_ranks(after),
        "step_size": float((after - start).abs().max()),
        "step_error": float((after - (start - lr * mean_gradient)).abs().max()),
        "weights_sha256": hashlib.sha256(after.numpy().tobytes()).hexdigest(),
    })
    return observed


def run(lr: float) -> dict:
    hvd.init()
    observed = describe_world(hvd, {"torch": torch.__version__})
    observed.update(collectives(observed["rank"]))
    observed.update(optimizer_step(observed["rank"], observed["size"], lr))
    hvd.shutdown()
    return observed
