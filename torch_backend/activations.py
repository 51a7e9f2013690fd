"""What a training step's forward keeps for its backward (hvdcls bench's activation memory,
Backend.saved_activation_bytes), counted with autograd's saved-tensor hooks as the step runs.

Mirror: tf_backend/activations.py.
"""
from __future__ import annotations

from typing import Any, Callable

import torch


def saved_bytes(model: torch.nn.Module, step: Callable[[], Any]) -> int:
    """Runs `step` and returns the bytes of the tensors autograd saved during it for backward: a
    storage once however many views of it are saved, a parameter's not at all."""
    weights = {p.untyped_storage().data_ptr() for p in model.parameters()}
    saved: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in weights:
            saved[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        step()
    return sum(saved.values())
