"""horovod.compression=powersgd: after the backward passes our PowerSGDReducer averages the
gradients (blocking: nothing overlaps backward), then a plain local optimizer steps. Its Q,
error feedback and step count travel with the optimizer's state in checkpoints, snapshots and
broadcasts.

Mirror: tf_backend/strategies/powersgd.py.
"""
from __future__ import annotations

import copy
import time
from pathlib import Path
from typing import Any, Optional

import horovod.torch as hvd
import torch

from hvdcls.config import Config
from torch_backend.compression import PowerSGDReducer, horovod_exchange
from torch_backend.strategies.plain import MakeOptimizer, Plain


class Powersgd(Plain):
    name = "powersgd"

    def __init__(self, host: Any, config: Config, parameters: list[tuple[str, torch.nn.Parameter]],
                 groups: list, make_optimizer: MakeOptimizer):
        super().__init__(host, config, parameters, groups, make_optimizer)
        self.trained = [p for _, p in parameters if p.requires_grad]
        self.reducer = PowerSGDReducer([tuple(p.shape) for p in self.trained], config.horovod.powersgd,
                                       host.device, exchange=horovod_exchange(host.wait_asleep))
        self.counter = self.reducer.counter  # what the reducer sent, warm-up and compressed

    def make(self, config: Config, groups: list, make_optimizer: MakeOptimizer) -> Any:
        return make_optimizer(groups)  # our own reduction after backward, then a plain step

    def step(self, grads: Optional[list] = None) -> Optional[float]:
        """Horovod: PowerSGD averages the gradients; a frozen parameter's (None) takes no part."""
        for p in self.trained:
            if p.grad is None and p.requires_grad:  # an unused parameter still takes its part
                p.grad = torch.zeros_like(p)
        self.host.waiting_for_allreduce()
        started = time.perf_counter()
        scaler = self.host.scaler
        scale = scaler.get_scale() if scaler.is_enabled() else 1.0
        self.reducer.reduce_([p.grad if p.requires_grad else None for p in self.trained], scale)
        waited = time.perf_counter() - started
        self.host.unscale_and_clip()
        scaler.step(self.optimizer)
        return waited

    def save_state(self, state: dict) -> None:
        super().save_state(state)
        state["powersgd"] = self.reducer.state_dict()

    def load_state(self, state: dict, directory: Path) -> None:
        super().load_state(state, directory)
        self.reducer.load_state_dict(state["powersgd"])

    def snapshot(self) -> dict:
        # a copy: state_dict() hands out the live Q and error tensors
        return {**super().snapshot(), "powersgd": copy.deepcopy(self.reducer.state_dict())}

    def restore(self, snapshot: dict) -> None:
        super().restore(snapshot)
        self.reducer.load_state_dict(snapshot["powersgd"])  # it clones

    def broadcast_state(self) -> None:
        super().broadcast_state()
        for tensor in self.reducer.state_tensors():  # Horovod: rank 0's PowerSGD Q, error and step count
            hvd.broadcast_(tensor, root_rank=0)
        self.reducer.step = hvd.broadcast_object(self.reducer.step, root_rank=0, name="powersgd.step")

    def prepare_checkpoint(self, shard_dir: Optional[Path] = None) -> None:
        self.reducer.average_errors_()  # Horovod: one error for all ranks, training unchanged
