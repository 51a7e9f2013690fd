"""Fine-tuning for the PyTorch backend: the frozen part (training.freeze_epochs), the
layer-decay param groups (optimizer.layer_decay) and the class-weighted loss
(training.class_weights), on hvdcls.finetune's rules.

Mirror: tf_backend/finetune.py. The head is what torch_backend/weights.py's head_modules finds.
Frozen means requires_grad False: no gradient is computed, so torch's optimizers skip the
parameter (no weight decay, no momentum) and no gradient hook fires. Horovod's
DistributedOptimizer (0.28.1) registers its hooks when it is built, for every parameter that
then required a gradient, and its synchronize() (Adasum's step()) all-reduces each of those
whose hook did not fire: built with everything trainable (every hook registered, for the
unfreezing), its set of them (`_requires_update`) is kept to the parameters that train.
"""
from __future__ import annotations

from typing import Iterable, Optional, Sequence

import horovod.torch as hvd
import torch
from torch import nn

from hvdcls import finetune
from torch_backend.weights import head_modules, output_count


def head_flags(model: nn.Module) -> list[bool]:
    """For each of model.named_parameters(): whether it is the classifier head's."""
    heads = head_modules(model, output_count(model))
    return [name.rpartition(".")[0] in heads for name, _ in model.named_parameters()]


def parameter_groups(model: nn.Module, model_name: str, decay: Optional[float]) -> tuple[list, list[float]]:
    """What the optimizer is built on and each param group's rate multiplier: the parameters
    (one group, 1.0) without layer decay, else one group per multiplier, the bottom's first."""
    named = list(model.named_parameters())
    if not finetune.decay_in_force(decay):
        return [p for _, p in named], [1.0]
    scales = finetune.layer_scales([name for name, _ in named], head_flags(model), model_name, decay)
    groups: dict[float, list] = {}
    for (_, p), scale in zip(named, scales):
        groups.setdefault(scale, []).append(p)
    order = sorted(groups)
    return [{"params": groups[scale]} for scale in order], order


def criterion(weights: Optional[Sequence[float]], smoothing: float, device: torch.device) -> nn.Module:
    """The training loss: cross-entropy, class-weighted when `weights` are given."""
    weight = None if weights is None else torch.tensor(list(weights), dtype=torch.float32, device=device)
    return nn.CrossEntropyLoss(weight=weight, label_smoothing=smoothing)


class Freezer:
    """Switches everything but the head between frozen and trained, with `optimizer` (Horovod's
    wrapper, or a plain optimizer that PowerSGD feeds) built while all of it trained."""

    def __init__(self, model: nn.Module, optimizer):
        named = list(model.named_parameters())  # none left under training.zero=3 (which refuses freezing)
        self.backbone = [p for (_, p), head in zip(named, head_flags(model)) if not head] if named else []
        self.optimizer = optimizer
        # Horovod: the parameters its synchronize() reduces (empty: no hooks, one process)
        self.hooked = set(getattr(optimizer, "_requires_update", ()))
        self.frozen = False

    def set(self, frozen: bool) -> None:
        if frozen == self.frozen:
            return
        for p in self.backbone:
            p.requires_grad_(not frozen)
            p.grad = None  # Adasum's wrapper gives each parameter a zero gradient: none, no step
        if self.hooked:  # Horovod: only what trains is all-reduced
            self.optimizer._requires_update = {p for p in self.hooked if p.requires_grad}
        self.frozen = frozen


def hold_state_like_root(optimizer) -> None:
    """Horovod's broadcast_optimizer_state sends each rank's own state entries, in order, so
    every rank must hold state for the same parameters: rank 0 of a resumed fine-tuning run
    may hold the backbone's (checkpointed after unfreezing) where the others, built frozen, do
    not, or the other way round. Every rank takes rank 0's list: entries it lacks are made by
    one step at rate 0 on zero gradients of those parameters alone (the broadcast then
    overwrites them), entries rank 0 lacks are dropped. A collective."""
    params = [p for group in optimizer.param_groups for p in group["params"]]
    held = [i for i, p in enumerate(params) if p in optimizer.state]
    wanted = set(hvd.broadcast_object(held, root_rank=0, name="optimizer.held"))  # Horovod
    for i in set(held) - wanted:
        del optimizer.state[params[i]]
    make_state(optimizer, [params[i] for i in sorted(wanted - set(held))])


@torch.no_grad()
def make_state(optimizer, params: Iterable[torch.Tensor]) -> None:
    """The optimizer's state entries for `params`, made by a step that moves nothing."""
    missing = {id(p) for p in params}
    if not missing:
        return
    every = [p for group in optimizer.param_groups for p in group["params"]]
    grads = [p.grad for p in every]
    settings = [(group["lr"], group.get("weight_decay")) for group in optimizer.param_groups]
    try:
        for p in every:
            p.grad = torch.zeros_like(p) if id(p) in missing else None
        for group in optimizer.param_groups:
            group["lr"] = 0.0
            if "weight_decay" in group:
                group["weight_decay"] = 0.0
        plain_step(optimizer)
    finally:
        for p, grad in zip(every, grads):
            p.grad = grad
        for group, (lr, decay) in zip(optimizer.param_groups, settings):
            group["lr"] = lr
            if decay is not None:
                group["weight_decay"] = decay


def plain_step(optimizer) -> None:
    """The wrapped optimizer's own step: Horovod's would all-reduce first (as its own
    broadcast_optimizer_state avoids, the same way)."""
    if type(optimizer).__module__ == hvd.DistributedOptimizer.__module__:
        super(type(optimizer), optimizer).step()  # Horovod: the class it was made from
    else:
        optimizer.step()
