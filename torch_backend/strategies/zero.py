"""training.zero=1 or 2: torch_backend.zero.ShardedOptimizer in place of hvd.DistributedOptimizer.
Its gradient hooks start each bucket's reduction in backward (armed per step), synchronize()
leaves each rank its slice, the clipping norm is summed over the ranks' slices; checkpoints hold
the optimizer's state gathered to rank 0 or in per-rank shard files (torch_backend/zero.py).

Mirror: tf_backend/strategies/zero.py.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Optional

import torch

from hvdcls.config import Config
from torch_backend import zero
from torch_backend.strategies.plain import MakeOptimizer, Plain, refuse_parameter_shards


class Zero(Plain):
    name = "zero"
    optimizer: zero.ShardedOptimizer

    @property
    def sharded(self) -> zero.ShardedOptimizer:
        return self.optimizer

    def make(self, config: Config, groups: list, make_optimizer: MakeOptimizer) -> Any:
        # one flat slice per bucket, every layer's parameters: no groups (the config refuses layer_decay)
        return zero.ShardedOptimizer([p for _, p in self.parameters], make_optimizer, config.training.zero,
                                     fp16=config.horovod.compression == "fp16", wait_asleep=self.host.wait_asleep)

    def begin(self, passes: int) -> None:
        self.optimizer.zero_grad()
        self.optimizer.arm(passes)  # each bucket's reduction starts in backward

    def step(self, grads: Optional[list] = None) -> Optional[float]:
        self.host.waiting_for_allreduce()
        started = time.perf_counter()
        self.optimizer.synchronize()  # Horovod: the buckets' reductions (it naps itself if asked)
        waited = time.perf_counter() - started
        self.host.unscale_and_clip()
        self.host.scaler.step(self.optimizer)
        self.counter.add(self.step_bytes)
        return waited

    def clip_grad_norm_(self, max_norm: float) -> None:
        self.optimizer.clip_grad_norm_(max_norm)  # the global norm, over every rank's slices

    def saved(self) -> None:
        self.optimizer.gathered = None  # the unsharded copy lives until it is written

    def load_state(self, state: dict, directory: Path) -> None:
        refuse_parameter_shards(state, directory)
        self.optimizer.load_checkpoint(state["optimizer"], directory)  # it may name the ranks' shard files

    def broadcast_state(self) -> None:
        self.optimizer.broadcast_state()  # each rank its slices of rank 0's (loaded) state

    def prepare_checkpoint(self, shard_dir: Optional[Path] = None) -> None:
        self.optimizer.prepare_checkpoint(shard_dir)  # Horovod: each rank's slices to shard_dir, or gathered to rank 0

    def held_grads(self) -> list[torch.Tensor]:
        return self.optimizer.held_grads()
