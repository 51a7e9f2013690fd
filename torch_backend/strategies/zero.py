"""training.zero=1 or 2: torch_backend.zero.ShardedOptimizer in place of hvd.DistributedOptimizer.
Its gradient hooks start each bucket's reduction in backward (armed per step), synchronize()
leaves each rank its slice, the clipping norm is summed over the ranks' slices; checkpoints hold
the optimizer's state in per-rank shard files (torch_backend/zero.py).

Under parallel.tensor it shards and averages over the ranks holding the same slices (the
replicas' data set) and saves in the tensor split's whole layout, like the plain strategy: each
data set gathers its slices' state to its replica-0 rank, replica 0's group gathers the split,
rank 0 writes torchvision's keys; a resume (at any split and world) cuts rank 0's whole state.

Mirror: tf_backend/strategies/zero.py.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Optional

import horovod.torch as hvd
import torch

from hvdcls.config import Config
from hvdcls.errors import UserError
from torch_backend import zero
from torch_backend.strategies.plain import MakeOptimizer, Plain, refuse_parameter_shards
from torch_backend.weights import CHECKPOINT_FILE


class Zero(Plain):
    name = "zero"
    optimizer: zero.ShardedOptimizer
    whole_optimizer: Optional[dict] = None  # parallel.tensor, rank 0: a checkpoint's, until dealt

    @property
    def sharded(self) -> zero.ShardedOptimizer:
        return self.optimizer

    def make(self, config: Config, groups: list, make_optimizer: MakeOptimizer) -> Any:
        # one flat slice per bucket, every layer's parameters: no groups (the config refuses layer_decay)
        replicas = self.replicas
        return zero.ShardedOptimizer([p for _, p in self.parameters], make_optimizer, config.training.zero,
                                     fp16=config.horovod.compression == "fp16", wait_asleep=self.host.wait_asleep,
                                     process_set=replicas.data_set if replicas else None,
                                     norm_shares=replicas.norm_shares(self.keys()) if replicas else None)

    def keys(self) -> list[str]:
        """The parameters' model names, in the sharded optimizer's order."""
        return [name for name, _ in self.parameters]

    def begin(self, passes: int) -> None:
        self.optimizer.zero_grad()
        self.optimizer.arm(passes)  # each bucket's reduction starts in backward
        if self.replicas:
            self.replicas.channel.take()  # not an evaluation's: the step's alone

    def step(self, grads: Optional[list] = None) -> Optional[float]:
        self.host.waiting_for_allreduce()
        started = time.perf_counter()
        self.optimizer.synchronize()  # Horovod: the buckets' reductions (it naps itself if asked)
        waited = time.perf_counter() - started
        self.host.unscale_and_clip()
        self.host.scaler.step(self.optimizer)
        self.counter.add(self.step_bytes)
        if self.replicas:
            self.activation_bytes, self.activation_seconds = self.replicas.channel.take()
        return waited

    def clip_grad_norm_(self, max_norm: float) -> torch.Tensor:
        return self.optimizer.clip_grad_norm_(max_norm)  # the global norm, over every rank's slices

    def saved(self) -> None:
        self.optimizer.gathered = None  # the unsharded copy lives until it is written
        self.whole = None

    def load_state(self, state: dict, directory: Path) -> None:
        refuse_parameter_shards(state, directory)
        if self.replicas:  # rank 0: the whole state, cut for every rank by broadcast_state
            if zero.IN_SHARD_FILES in state["optimizer"]:
                raise UserError(f"cannot load {directory / CHECKPOINT_FILE} at parallel.tensor="
                                f"{self.replicas.layout.tensor}: its optimizer state is in training.zero's "
                                "per-rank shard files; resume it at parallel.tensor=1")
            self.whole_optimizer = state["optimizer"]
            return
        self.optimizer.load_checkpoint(state["optimizer"], directory)  # it may name the ranks' shard files

    def broadcast_state(self) -> None:
        if self.replicas and self.replicas.dealing():
            self._deal_over_replicas()
            return
        self.optimizer.broadcast_state()  # each rank its slices of rank 0's (loaded) state, or a first step

    def _deal_over_replicas(self) -> None:
        """parallel.tensor, after rank 0 read a checkpoint: every rank's slices of its model (the
        tensor split's) and of its optimizer's state (the split's, then the data set's slice)."""
        replicas = self.replicas
        whole = replicas.whole
        replicas.deal(list(self.host.model.state_dict().items()), whole["model"] if whole else None)
        full = hvd.broadcast_object(self.whole_optimizer if hvd.rank() == 0 else None,
                                    root_rank=0, name="zero.tp.optimizer")  # Horovod
        self.optimizer.load_state_dict(replicas.split_optimizer_state(full, self.keys()))
        self.optimizer.loaded, self.whole_optimizer, replicas.whole = None, None, None

    def prepare_checkpoint(self, shard_dir: Optional[Path] = None) -> None:
        if not self.replicas:
            self.optimizer.prepare_checkpoint(shard_dir)  # Horovod: each rank's slices to shard_dir
            return
        # parallel.tensor: each data set's slices gathered to its replica-0 rank, whose group
        # gathers the split (a collective of replica 0's group); rank 0 saves the whole state
        self.optimizer.prepare_checkpoint(None)
        if self.replicas.layout.replica(hvd.rank()) == 0:
            state = self.optimizer.gathered
            assert state is not None
            whole = {"model": self.full_state(self.host.model),
                     "optimizer": self.replicas.gather_optimizer_state(state, self.keys())}
            self.whole = whole if hvd.rank() == 0 else None  # the others only helped gather
        self.optimizer.gathered = None

    def held_grads(self) -> list[torch.Tensor]:
        return self.optimizer.held_grads()
