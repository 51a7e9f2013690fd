"""training.activation_checkpointing for the PyTorch backend: torch.utils.checkpoint (the
non-reentrant kind) per encoder block of torchvision's ViT and per stage of its ResNets
(layer1..layer4). Activations inside a segment are dropped after the forward pass and
recomputed in the backward pass; only each segment's input is kept.

The segments stay where they were: their containers become nn.Sequential subclasses holding
the same children under the same names, so state dicts and checkpoints do not change.
Mirror: tf_backend/recompute.py.
"""
from __future__ import annotations

from collections import OrderedDict
from contextlib import contextmanager, nullcontext

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from hvdcls.errors import UserError

RESNET_STAGES = ("layer1", "layer2", "layer3", "layer4")


@contextmanager
def buffers_kept(module: nn.Module):
    """Around the recomputation: it runs the segment's forward a second time in training mode,
    and batch norm would update its running statistics (and their count) twice; put back
    what the first forward left. The output does not depend on them (batch statistics)."""
    saved = [(buffer, buffer.detach().clone()) for buffer in module.buffers()]
    try:
        yield
    finally:
        with torch.no_grad():
            for buffer, value in saved:
                buffer.copy_(value)


def recomputed(module: nn.Module, function, x: torch.Tensor) -> torch.Tensor:
    """function(x), checkpointed when it would be differentiated, else run plainly (eval)."""
    if not (module.training and torch.is_grad_enabled()):
        return function(x)
    return checkpoint(function, x, use_reentrant=False,
                      context_fn=lambda: (nullcontext(), buffers_kept(module)))


class CheckpointedBlocks(nn.Sequential):
    """Each child one segment (the ViT's encoder blocks)."""

    def forward(self, x):
        for block in self:
            x = recomputed(block, block, x)
        return x


class CheckpointedStage(nn.Sequential):
    """The whole sequence one segment (a ResNet stage)."""

    def forward(self, x):
        return recomputed(self, super().forward, x)


def segment_names(model: nn.Module) -> list[str]:
    """The segments enable() checkpoints, by module name (whether it did or not): [] for a
    model it does not know (training.zero=3 cuts its blocks by them)."""
    from torchvision.models import ResNet
    from torchvision.models.vision_transformer import VisionTransformer

    if isinstance(model, VisionTransformer):
        return [f"encoder.layers.{name}" for name, _ in model.encoder.layers.named_children()]
    if isinstance(model, ResNet):
        return list(RESNET_STAGES)
    return []


def checkpointed(model: nn.Module) -> list[str]:
    """The segments enable() did checkpoint in `model` (by module name; [] when it did not)."""
    return [name for name in segment_names(model)
            if isinstance(model.get_submodule(name), CheckpointedStage)
            or isinstance(model.get_submodule(name.rpartition(".")[0] or name), CheckpointedBlocks)]


def enable(model: nn.Module, name: str) -> nn.Module:
    """Checkpoint `model` in place (and return it); a model without segments we know is a
    one-line UserError."""
    from torchvision.models import ResNet  # here: torchvision costs every rank ~0.1 s to import
    from torchvision.models.vision_transformer import VisionTransformer

    if isinstance(model, VisionTransformer):
        model.encoder.layers = CheckpointedBlocks(OrderedDict(model.encoder.layers.named_children()))
    elif isinstance(model, ResNet):
        for stage in RESNET_STAGES:
            setattr(model, stage, CheckpointedStage(OrderedDict(getattr(model, stage).named_children())))
    else:
        raise UserError(f"training.activation_checkpointing=true: the torch backend checkpoints the "
                        f"ViTs' encoder blocks and the ResNets' stages, not model {name!r}")
    return model
