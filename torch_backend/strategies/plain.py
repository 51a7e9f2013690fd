"""The plain strategy: hvd.DistributedOptimizer averages every gradient (horovod.compression=fp16:
in float16 on the wire), its backward hooks starting each all-reduce as soon as the gradient
exists; the step waits for them, unscales, clips and steps.

Mirror: tf_backend/strategies/plain.py. The parameters it reduces are the ones it is given
(`parameters`), over every rank, or under parallel.tensor over the ranks holding the same slices
(`replicas`; hvdcls.strategy: a data-parallel strategy composes).
"""
from __future__ import annotations

import copy
import dataclasses
import time
from pathlib import Path
from typing import Any, Callable, Mapping, Optional

import horovod.torch as hvd
import torch

from hvdcls.config import Config
from hvdcls.errors import UserError
from hvdcls.horovod_backend import sleep_until_done
from hvdcls.maths import powersgd
from hvdcls.strategy import Strategy
from torch_backend import finetune, zero, zero3
from torch_backend.weights import CHECKPOINT_FILE

MakeOptimizer = Callable[[Any], torch.optim.Optimizer]


def refuse_parameter_shards(state: dict, directory: Path) -> None:
    """A zero=3 checkpoint (rank 0's file holds no parameter) for a strategy that keeps them whole."""
    if zero3.INDEX in state:
        raise UserError(f"cannot load {directory / CHECKPOINT_FILE}: its parameters are in training.zero=3's "
                        "per-rank shard files; resume it with training.zero=3")


class Plain(Strategy):
    name = "plain"
    op = hvd.Average

    def __init__(self, host: Any, config: Config, parameters: list[tuple[str, torch.nn.Parameter]],
                 groups: list, make_optimizer: MakeOptimizer, replicas: Any = None):
        """`host`: the backend (its model, scaler, clipping and the watchdog's mark); `parameters`:
        the named parameters reduced; `groups`: the optimizer's parameter groups (layer_decay);
        `replicas`: parallel.tensor's TensorParallel (torch_backend/tensor_parallel.py), whose
        data-parallel set it averages over; None: every rank."""
        hv = config.horovod
        self.host, self.parameters, self.replicas = host, parameters, replicas
        self.whole: Optional[dict] = None  # parallel.tensor: what rank 0 saves, gathered
        shapes = [tuple(p.shape) for _, p in parameters if p.requires_grad]
        self.counter = powersgd.ByteCounter(powersgd.dense_bytes(shapes))
        self.step_bytes = powersgd.communication(shapes, hv.compression)["bytes_per_step"]
        if replicas and replicas.layout.replicas == 1:
            self.step_bytes = 0  # parallel.tensor with one replica: nobody to average with
        self.activation_bytes = 0  # parallel.tensor: what the last step's blocks summed over the group
        self.activation_seconds = 0.0  # and the seconds those sums took (hvdcls bench's share)
        self.optimizer = self.make(config, groups, make_optimizer)

    def make(self, config: Config, groups: list, make_optimizer: MakeOptimizer) -> Any:
        hv = config.horovod
        # Horovod: average (or Adasum) the gradients over ranks every N backward passes.
        return hvd.DistributedOptimizer(
            make_optimizer(groups), named_parameters=self.parameters,
            compression=hvd.Compression.fp16 if hv.compression == "fp16" else hvd.Compression.none,
            op=self.op, backward_passes_per_step=hv.backward_passes_per_step,
            process_set=self.replicas.data_set if self.replicas else hvd.global_process_set)

    def begin(self, passes: int) -> None:
        self.optimizer.zero_grad()
        if self.replicas:
            self.replicas.channel.take()  # not an evaluation's: the step's alone

    def step(self, grads: Optional[list] = None) -> Optional[float]:
        host = self.host
        host.waiting_for_allreduce()
        started = time.perf_counter()
        if host.wait_asleep:
            self._sleep_until_reduced()
        self.optimizer.synchronize()  # Horovod: wait for the all-reduced gradients
        waited = time.perf_counter() - started
        host.unscale_and_clip()
        with self.optimizer.skip_synchronize():  # Horovod: already synchronised above
            host.scaler.step(self.optimizer)
        self.counter.add(self.step_bytes)  # Horovod sent every gradient, as configured
        if self.replicas:
            self.activation_bytes, self.activation_seconds = self.replicas.channel.take()
        return waited

    def _sleep_until_reduced(self) -> None:
        """horovod.wait=sleep: nap until every all-reduce the backward hooks started is done,
        so that DistributedOptimizer.synchronize() then collects them without its spin.
        Its `_handles` ({parameter or group: (handle, context)}, Horovod 0.28.1) is the one
        place those handles are kept; a hook that did not fire leaves None (synchronize()
        starts that one itself)."""
        pending = [handle for handle, _ in self.optimizer._handles.values() if isinstance(handle, int)]
        sleep_until_done(pending, hvd.poll)  # Horovod

    def clip_grad_norm_(self, max_norm: float) -> torch.Tensor:
        """The global norm (returned) clipped to `max_norm`; parallel.tensor: over the group's slices."""
        if self.replicas:
            return self.replicas.clip_grad_norm_(self.parameters, max_norm)
        return torch.nn.utils.clip_grad_norm_([p for _, p in self.parameters], max_norm)

    def prepare_checkpoint(self, shard_dir: Optional[Path] = None) -> None:
        """parallel.tensor: replica 0's tensor group gathers the model and the optimizer's state
        whole (torchvision's layout) for rank 0 to save; a collective of that group."""
        if self.replicas and self.replicas.layout.replica(hvd.rank()) == 0:
            whole = {"model": self.full_state(self.host.model),
                     "optimizer": self.replicas.gather_optimizer(self.optimizer, self.names())}
            self.whole = whole if hvd.rank() == 0 else None  # the others only helped gather

    def save_state(self, state: dict) -> None:
        state["optimizer"] = self.optimizer.state_dict()
        if self.whole:  # parallel.tensor: the gathered, whole state in place of this rank's slices
            state.update(self.whole)

    def saved(self) -> None:
        self.whole = None

    def names(self) -> dict[int, str]:
        return {id(p): name for name, p in self.parameters}

    def load_state(self, state: dict, directory: Path) -> None:
        refuse_parameter_shards(state, directory)
        if zero.IN_SHARD_FILES in state["optimizer"]:
            raise UserError(f"cannot load {directory / CHECKPOINT_FILE}: its optimizer state is in "
                            "training.zero's per-rank shard files; resume it with training.zero=1 or 2")
        stored = state["optimizer"]
        if self.replicas:  # rank 0's slices now; broadcast_state deals every rank its own
            stored = self.replicas.split_optimizer(stored, self.optimizer, self.names())
        self.optimizer.load_state_dict(stored)

    def snapshot(self) -> dict:
        # deepcopy: state_dict() hands out the live tensors, which the next steps change in place
        return {"optimizer": copy.deepcopy(self.optimizer.state_dict()), "counter": dataclasses.replace(self.counter)}

    def restore(self, snapshot: dict) -> None:
        # load_state_dict keeps the tensors it is given: a copy, so the snapshot stays as taken
        self.optimizer.load_state_dict(copy.deepcopy(snapshot["optimizer"]))
        vars(self.counter).update(vars(snapshot["counter"]))  # the reducer's counter too: one object

    def broadcast_state(self) -> None:
        if self.replicas:
            self._broadcast_over_replicas()
            return
        finetune.hold_state_like_root(self.optimizer)  # what rank 0 holds state for (a collective)
        hvd.broadcast_optimizer_state(self.optimizer, root_rank=0)  # Horovod

    def _broadcast_over_replicas(self) -> None:
        """parallel.tensor: what hvd.broadcast_optimizer_state does, over the ranks holding this
        rank's slices, from replica 0's: a fresh optimizer's state made first as Horovod makes it
        (a step of the inner optimizer on zero gradients), so that a step then is one process's."""
        optimizer = self.optimizer
        if not optimizer.state:
            for group in optimizer.param_groups:
                for p in group["params"]:
                    if p.requires_grad:
                        p.grad = torch.zeros_like(p)
            inner: Any = type(optimizer).__bases__[0]  # Horovod's class derives from the optimizer's
            inner.step(optimizer)  # its own step: no all-reduce
        if self.replicas.dealing():  # rank 0 read a checkpoint: every rank takes its slices of it
            self.replicas.deal_state(self.host.model, optimizer, self.names())
            return
        self.replicas.broadcast([(f"optimizer.{i}.{key}", value) for i, state in enumerate(optimizer.state.values())
                                 for key, value in state.items() if torch.is_tensor(value) and value.ndim > 0])

    def held_params(self) -> list[torch.Tensor]:
        """The parameter tensors this rank holds (Backend.memory): every one, unsharded."""
        return [p for _, p in self.parameters]

    def memory_extra(self) -> dict[str, int]:
        """What Backend.memory reports beside the parameters', gradients' and optimizer's bytes."""
        return {}

    def communication(self) -> Optional[dict]:
        summary = self.counter.summary()
        if self.replicas:  # parallel.tensor: the activations' sums within the group, beside
            summary["tensor_parallel_bytes_per_step"] = self.activation_bytes
            summary["tensor_parallel_seconds_per_step"] = self.activation_seconds
        return summary

    def full_state(self, model: torch.nn.Module) -> Mapping[str, torch.Tensor]:
        """The model's unsharded state by name (every rank calls it: a collective is allowed);
        parallel.tensor: its slices gathered into torchvision's layout (over the tensor group)."""
        state = model.state_dict()
        return self.replicas.gather(state) if self.replicas else state

    def held_grads(self) -> list[torch.Tensor]:
        # after a step, every trained parameter's (the next step's zero_grad frees them)
        return [p.grad for _, p in self.parameters if p.requires_grad and p.grad is not None]
