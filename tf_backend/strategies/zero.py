"""training.zero=1 or 2: tf_backend.zero.ShardedOptimizer in place of the all-reduced update. In
the compiled step it reduces the gradients by slices, steps them and gathers them back (L2 and
clipping as the backend's update does them); checkpoints hold the optimizer's state in per-rank
shard files (tf_backend/zero.py).

Under parallel.tensor it shards and averages over the ranks holding the same slices (the
replicas' data set) and saves in the tensor split's whole layout, like the plain strategy: each
data set gathers its slices' state to its replica-0 rank, replica 0's group gathers the split,
rank 0 writes the TF ViT's `model/i` and `optimizer/i`; a resume (at any split and world) cuts
rank 0's whole arrays.

Mirror: torch_backend/strategies/zero.py.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import horovod.tensorflow as hvd
import numpy as np

from hvdcls.config import Config
from hvdcls.errors import UserError
from hvdcls.maths import tensor_parallel as plan
from tf_backend import tensor_parallel, zero
from tf_backend.strategies import check_count, refuse_sharded_parameters
from tf_backend.strategies.plain import MakeOptimizer, Plain
from tf_backend.weights import CHECKPOINT_FILE


class Zero(Plain):
    name = "zero"
    reduces_in_tape = False  # reduced, stepped and gathered by slices
    whole_optimizer: Optional[list] = None  # parallel.tensor, rank 0: a checkpoint's arrays, until dealt

    def make(self, config: Config, make_optimizer: MakeOptimizer) -> Any:
        # one flat slice per bucket, every layer's variables: no rate per layer (the config refuses layer_decay)
        replicas = self.replicas
        self.sharded = zero.ShardedOptimizer(self.variables, make_optimizer, config.training.zero,
                                             config.horovod.compression == "fp16", self.host.l2, self.host.clip,
                                             process_set=replicas.data_set if replicas else None,
                                             norm_shares=replicas.norm_shares(self.variables) if replicas else None)
        return self.sharded.local

    def optimizer_paths(self) -> list:
        """parallel.tensor: per entry of the unsharded optimizer's layout (the 0-d variables,
        then each variable's slots), the model path that cuts it (None: whole everywhere)."""
        sharded = self.sharded
        return [None] * sharded.scalars + [v.path for v in self.variables for _ in sharded.kinds]

    def step(self, grads: Optional[list] = None, warmup: bool = False, overlapped: bool = False) -> None:
        assert grads is not None
        self.sharded.apply(grads)  # Horovod: reduced, stepped and gathered by slices

    def save_state(self, state: dict) -> None:
        if self.replicas:  # the gathered whole arrays (rank 0 alone saves)
            assert self.whole is not None
            state.update(self.whole)
            self.whole = None
            return
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
        if zero.IN_SHARD_FILES in state and self.replicas:
            raise UserError(f"cannot load {directory / CHECKPOINT_FILE} at parallel.tensor="
                            f"{self.replicas.layout.tensor}: its optimizer state is in training.zero's "
                            "per-rank shard files; resume it at parallel.tensor=1")
        if zero.IN_SHARD_FILES in state:
            check_count(directory / CHECKPOINT_FILE, state, "optimizer", 0)
            self.sharded.load_shards_from(directory)
            return
        count = self.sharded.full_length()
        check_count(directory / CHECKPOINT_FILE, state, "optimizer", count)
        arrays = [state[f"optimizer/{i}"] for i in range(count)]
        if self.replicas:  # rank 0: whole; its model slices cut now, the rest dealt on broadcast
            self.replicas.take_whole(state, tensor_parallel.model_entries(self.host.model))
            self.whole_optimizer = arrays
            return
        self.sharded.load_full(arrays)

    def broadcast_state(self) -> None:
        if self.replicas and self.replicas.dealing():
            self._deal_over_replicas()
            return
        self.sharded.broadcast_state()  # each rank its slices of rank 0's (loaded) state

    def _deal_over_replicas(self) -> None:
        """parallel.tensor, after rank 0 read a checkpoint: every rank's slices of the model (the
        tensor split's) and of the optimizer's state (the split's, then the data set's slice)."""
        replicas = self.replicas
        assert replicas is not None
        replicas.deal(tensor_parallel.model_entries(self.host.model))
        full = hvd.broadcast_object(self.whole_optimizer if hvd.rank() == 0 else None, root_rank=0,
                                    name="zero.tp.optimizer")  # Horovod
        tensor, t = replicas.layout.tensor, replicas.t
        self.sharded.cut([plan.split_entry(path or "", value, tensor, t)
                           for path, value in zip(self.optimizer_paths(), full)])
        self.whole_optimizer = None

    def prepare_checkpoint(self, shard_dir: Optional[Path] = None) -> None:
        if not self.replicas and shard_dir is not None:
            self.sharded.write_shard(shard_dir)  # each rank its own slices, beside rank 0's file
            return
        self.sharded.gather()  # Horovod: the slices gathered, saved unsharded (to the data set's first rank)
        if self.replicas:  # its gathered split, gathered whole by replica 0's group for rank 0
            self._gather_split()

    def _gather_split(self) -> None:
        replicas = self.replicas
        assert replicas is not None
        if replicas.layout.replica(hvd.rank()) == 0:
            arrays = self.sharded.gathered
            assert arrays is not None
            entries = tensor_parallel.model_entries(self.host.model) + [
                (f"optimizer/{i}", path, value) for i, (path, value) in enumerate(zip(self.optimizer_paths(), arrays))]
            whole = replicas.gather(entries)
            self.whole = whole if hvd.rank() == 0 else None  # the others only helped gather
        self.sharded.gathered = None

    def held_grads(self) -> int:
        return self.sharded.held_grad_bytes()
