"""training.zero=3: the parameters sharded too (tf_backend/zero3.py). The compiled step
differentiates this rank's slices: each block is gathered in its call and its gradient
reduce-scattered onto the slice as backward leaves the block, so the step only adds L2, clips
(the global norm over every rank's slices) and steps the local optimizer over the slices, as
zero=1 and 2 do. Checkpoints: every rank writes its parameter and optimizer slices to its shard
file in the checkpoint directory, rank 0's tensorflow.npz the blocks' index and placeholders for
the sharded variables; ranks that see no common checkpoint directory are refused.

Mirror: torch_backend/strategies/zero3.py.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping, Optional

import numpy as np

from hvdcls.config import Config
from hvdcls.errors import UserError
from tf_backend import zero3
from tf_backend.strategies import SHARDED_PARAMETERS, check_count
from tf_backend.strategies.plain import MakeOptimizer
from tf_backend.strategies.zero import Zero
from tf_backend.weights import CHECKPOINT_FILE

PLACEHOLDER = np.zeros(0, np.float32)  # a sharded variable's entry in rank 0's file (it has no storage)


class Zero3(Zero):
    name = "zero3"
    sharded: zero3.ShardedParameters

    def make(self, config: Config, make_optimizer: MakeOptimizer) -> Any:
        """The model's variables, still whole: rank 0's are broadcast, then each rank keeps its
        slices and the variables lose their storage (one rate: layer_decay is refused)."""
        self.sharded = zero3.ShardedParameters(self.host.model, self.variables, make_optimizer,
                                               self.host.l2, self.host.clip)
        sharded = {id(v) for v in self.variables}
        self.placeholders = [m for m, v in enumerate(self.host.model.variables) if id(v) in sharded]
        passes = config.horovod.backward_passes_per_step
        self.step_bytes = passes * self.sharded.sent_per_pass(config.training.activation_checkpointing)
        return self.sharded.local

    def sources(self, trained: list) -> list:
        return self.sharded.sources()  # the slices (the config refuses freezing under zero)

    def step(self, grads: Optional[list] = None, warmup: bool = False, overlapped: bool = False) -> None:
        assert grads is not None
        self.sharded.step_slices(grads)  # reduce-scattered in backward already

    def held_params(self) -> int:
        return self.sharded.held_param_bytes()

    def memory_extra(self) -> dict[str, int]:
        return {"gathered_peak_bytes": self.sharded.gathered_peak_bytes()}

    def full_state(self, model) -> Mapping:
        return self.sharded.full_state(model)

    def snapshot(self) -> dict:
        return {**super().snapshot(), "shards": [np.array(s.numpy(), copy=True) for s in self.sharded.shards]}

    def restore(self, snapshot: dict) -> None:
        super().restore(snapshot)
        for shard, value in zip(self.sharded.shards, snapshot["shards"]):
            shard.assign(value)

    def prepare_checkpoint(self, shard_dir: Optional[Path] = None) -> None:
        if shard_dir is None:
            raise ValueError("training.zero=3 never gathers: each rank writes its slices into the directory "
                             "the Trainer gives it (rank 0's, or its own host's copy)")
        self.sharded.write_shard(shard_dir)  # the parameters' slices and the optimizer's

    def save_state(self, state: dict) -> None:
        for m in self.placeholders:
            state[f"model/{m}"] = PLACEHOLDER
        state[SHARDED_PARAMETERS] = np.array(json.dumps(self.sharded.index()))
        super().save_state(state)  # says the optimizer's state is in the shard files

    def load_state(self, state: dict, directory: Path) -> None:
        path = directory / CHECKPOINT_FILE
        if SHARDED_PARAMETERS not in state:
            raise UserError(f"cannot load {path}: it holds whole parameters; training.zero=3 resumes only "
                            "its own checkpoints yet")
        self.sharded.check_index(json.loads(str(state[SHARDED_PARAMETERS])), str(path))
        check_count(path, state, "optimizer", 0)
        self.sharded.load_shards_from(directory)  # each rank reads its slices on broadcast
        for m in self.placeholders:
            del state[f"model/{m}"]  # not the backend's to assign
