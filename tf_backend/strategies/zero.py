"""training.zero=1 or 2: tf_backend.zero.ShardedOptimizer in place of the all-reduced update. In
the compiled step it reduces the gradients by slices, steps them and gathers them back (L2 and
clipping as the backend's update does them); checkpoints hold the optimizer's state gathered to
rank 0 or in per-rank shard files (tf_backend/zero.py).

Mirror: torch_backend/strategies/zero.py.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import numpy as np

from hvdcls.config import Config
from tf_backend import zero
from tf_backend.strategies import check_count, refuse_sharded_parameters
from tf_backend.strategies.plain import MakeOptimizer, Plain
from tf_backend.weights import CHECKPOINT_FILE


class Zero(Plain):
    name = "zero"
    reduces_in_tape = False  # reduced, stepped and gathered by slices

    def make(self, config: Config, make_optimizer: MakeOptimizer) -> Any:
        # one flat slice per bucket, every layer's variables: no rate per layer (the config refuses layer_decay)
        self.sharded = zero.ShardedOptimizer(self.variables, make_optimizer, config.training.zero,
                                             config.horovod.compression == "fp16", self.host.l2, self.host.clip)
        return self.sharded.local

    def step(self, grads: Optional[list] = None, warmup: bool = False, overlapped: bool = False) -> None:
        assert grads is not None
        self.sharded.apply(grads)  # Horovod: reduced, stepped and gathered by slices

    def save_state(self, state: dict) -> None:
        if self.sharded.in_files:  # each rank wrote its slices
            state[zero.IN_SHARD_FILES] = np.array(self.sharded.size)
            self.sharded.in_files = False
            return
        gathered = self.sharded.gathered  # the unsharded copy lives until it is written
        assert gathered is not None
        self.sharded.gathered = None
        state.update({f"optimizer/{i}": value for i, value in enumerate(gathered)})

    def load_state(self, state: dict, directory: Path) -> None:
        """The checkpoint holds the unsharded optimizer's variables, cut on broadcast, or says
        that each rank's slices are in its shard file beside it."""
        refuse_sharded_parameters(directory / CHECKPOINT_FILE, state)
        if zero.IN_SHARD_FILES in state:
            check_count(directory / CHECKPOINT_FILE, state, "optimizer", 0)
            self.sharded.load_shards_from(directory)
            return
        count = self.sharded.full_length()
        check_count(directory / CHECKPOINT_FILE, state, "optimizer", count)
        self.sharded.load_full([state[f"optimizer/{i}"] for i in range(count)])

    def broadcast_state(self) -> None:
        self.sharded.broadcast_state()  # each rank its slices of rank 0's (loaded) state

    def prepare_checkpoint(self, shard_dir: Optional[Path] = None) -> None:
        if shard_dir is not None:
            self.sharded.write_shard(shard_dir)  # each rank its own slices, beside rank 0's file
        else:
            self.sharded.gather()  # Horovod: the slices gathered, saved unsharded

    def held_grads(self) -> int:
        return self.sharded.held_grad_bytes()
