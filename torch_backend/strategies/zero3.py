"""training.zero=3: the parameters sharded too (torch_backend/zero3.py). Each block's gradient
reduce-scatter onto this rank's slice starts in backward, as soon as backward leaves the block
(Gathered's backward), so the step waits for the last ones, clips (the global norm over every
rank's slices) and steps a plain local optimizer over the slices (SGD, Adam and AdamW act
element by element; padding stays 0). Checkpoints: every rank writes its parameter and optimizer slices to its
shard file in the checkpoint directory, rank 0's torch.pt the blocks' index; ranks that see no
common checkpoint directory are refused.

Mirror: tf_backend/strategies/zero3.py.
"""
from __future__ import annotations

import copy
import dataclasses
import time
from pathlib import Path
from typing import Any, Mapping, Optional

import horovod.torch as hvd
import torch

from hvdcls.config import Config
from hvdcls.errors import UserError
from hvdcls.maths import powersgd
from torch_backend import zero, zero3
from torch_backend.strategies.plain import MakeOptimizer, Plain
from torch_backend.weights import CHECKPOINT_FILE


class Zero3(Plain):
    name = "zero3"

    def __init__(self, host: Any, config: Config, parameters: list[tuple[str, torch.nn.Parameter]],
                 groups: list, make_optimizer: MakeOptimizer, replicas: Any = None):
        """`parameters` are the model's, still whole: rank 0's are broadcast, then each rank keeps
        its slices and the model loses them (the layer groups are one: layer_decay is refused;
        `replicas` is None: the config refuses parallel.tensor with training.zero)."""
        self.host, self.replicas = host, None
        self.counter = powersgd.ByteCounter(powersgd.dense_bytes([tuple(p.shape) for _, p in parameters]))
        hvd.broadcast_parameters(parameters, root_rank=0)  # Horovod: rank 0's weights, before the cut
        parameters.clear()  # the caller's list: the whole parameters go with the model's references
        groups.clear()  # and its optimizer groups': else the whole model outlives the cut through
        # build's first step (ViT-g/14: 4 GB a rank beside the slices and AdamW's state, past the cap)
        self.sharded = zero3.ShardedParameters(host.model)
        self.parameters = []
        self.optimizer = make_optimizer(self.sharded.shards)
        self.loaded: Optional[str] = None  # rank 0: a checkpoint directory whose shard files to read

    def begin(self, passes: int) -> None:
        self.optimizer.zero_grad(set_to_none=True)
        self.sharded.drop_pending()
        self.sharded.sent = 0

    def step(self, grads: Optional[list] = None) -> Optional[float]:
        self.host.waiting_for_allreduce()
        started = time.perf_counter()
        self.sharded.finish_scatters()  # Horovod: the last blocks' gradient reduce-scatters
        waited = time.perf_counter() - started
        self.sharded.drop_pending()  # a gather started ahead reads the slices the step changes
        self.host.unscale_and_clip()
        self.host.scaler.step(self.optimizer)
        self.counter.add(self.sharded.sent)  # the blocks' gathers and reduce-scatters this step
        return waited  # what backward did not hide of the reduce-scatters

    def clip_grad_norm_(self, max_norm: float) -> torch.Tensor:
        return zero.clip_slices_(self.sharded.shards, max_norm)  # the global norm, over every rank's slices

    def held_params(self) -> list[torch.Tensor]:
        return list(self.sharded.shards)

    def held_grads(self) -> list[torch.Tensor]:
        return [s.grad for s in self.sharded.shards if s.grad is not None]

    def memory_extra(self) -> dict[str, int]:
        # the most gathered blocks the hooks held at once (padded; without activation
        # checkpointing autograd keeps each block's gathered copy until backward, beside these)
        return {"gathered_peak_bytes": self.sharded.peak_bytes}

    def full_state(self, model: torch.nn.Module) -> Mapping[str, torch.Tensor]:
        return self.sharded.full_state(model)

    def prepare_checkpoint(self, shard_dir: Optional[Path] = None) -> None:
        if shard_dir is None:
            raise ValueError("training.zero=3 never gathers: each rank writes its slices into the directory "
                             "the Trainer gives it (rank 0's, or its own host's copy)")
        zero.write_shard(shard_dir, {"numels": [b.bucket.numel for b in self.sharded.blocks],
                                     "params": [s.detach() for s in self.sharded.shards],
                                     "optimizer": self.optimizer.state_dict()})

    def save_state(self, state: dict) -> None:
        state["optimizer"] = {zero.IN_SHARD_FILES: hvd.size()}
        state[zero3.INDEX] = self.sharded.index()

    def load_state(self, state: dict, directory: Path) -> None:
        if zero3.INDEX not in state:
            raise UserError(f"cannot load {directory / CHECKPOINT_FILE}: it holds whole parameters; "
                            "training.zero=3 resumes only its own checkpoints yet")
        self.sharded.check_index(state[zero3.INDEX], lambda: str(directory / CHECKPOINT_FILE))
        self.loaded = str(directory)

    def broadcast_state(self) -> None:
        """Horovod: after rank 0 loaded a checkpoint, every rank reads its slices of it (re-cut at
        another world size); at the start, the zero-gradient step zero=0's broadcast takes."""
        directory = hvd.broadcast_object(self.loaded, root_rank=0, name="zero3.checkpoint")
        self.loaded = None
        if directory is not None:
            self._read(Path(directory))
        elif not self.optimizer.state:
            self._initial_step()

    def _read(self, directory: Path) -> None:
        """Every rank reads its slices; one that cannot stops every rank, with its reason."""
        try:
            stored, error = zero.read_shards(directory, [b.bucket for b in self.sharded.blocks], hvd.rank()), None
        except UserError as err:
            stored, error = None, f"rank {hvd.rank()}: {err}"
        errors = [e for e in hvd.allgather_object(error, name="zero3.shards_read") if e]
        if errors or stored is None:
            raise UserError(errors[0] if errors else f"rank {hvd.rank()}: no shard state read")
        self.sharded.drop_pending()
        with torch.no_grad():
            for shard, value in zip(self.sharded.shards, stored["params"]):
                shard.copy_(value)
        zero.load_mapped_state(self.optimizer, stored["optimizer"])  # off the file's mapping

    @torch.no_grad()
    def _initial_step(self) -> None:
        """What hvd.broadcast_optimizer_state does to an optimizer without state (zero=0): one
        step on zero gradients at the built rate, here by slices."""
        for shard in self.sharded.shards:
            shard.grad = torch.zeros_like(shard)
        self.optimizer.step()
        for shard in self.sharded.shards:
            shard.grad = None

    def snapshot(self) -> dict:
        return {"shards": [s.detach().clone() for s in self.sharded.shards],
                "optimizer": copy.deepcopy(self.optimizer.state_dict()), "counter": dataclasses.replace(self.counter)}

    def restore(self, snapshot: dict) -> None:
        self.sharded.drop_pending()
        with torch.no_grad():
            for shard, value in zip(self.sharded.shards, snapshot["shards"]):
                shard.copy_(value)
        self.optimizer.load_state_dict(copy.deepcopy(snapshot["optimizer"]))
        vars(self.counter).update(vars(snapshot["counter"]))
