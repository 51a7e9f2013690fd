"""A training.zero=3 checkpoint read whole, a parameter at a time, for the PyTorch backend.

Mirror: tf_backend/consolidate.py. Rank 0's torch.pt holds the buffers under "model" and the
blocks' index under "zero3" (torch_backend/strategies/zero3.py); each rank's shard file
(zero-shard-RRRRR-of-WWWWW.pt) holds "params", its slice of every block. The shard files are
opened memory-mapped (torch.load's mmap), so reading a parameter reads only the pages of the
slices that hold it (hvdcls.maths.zero_consolidate.pieces): no process holds the whole model,
whatever world size wrote it. Horovod is not needed (evaluation, export and predict run without it).
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import numpy as np
import torch

from hvdcls.errors import UserError
from hvdcls.files import safetensors_file
from hvdcls.maths.zero import find_shards
from hvdcls.maths.zero_consolidate import ShardedIndex, assemble, read_index

INDEX_KEY = "zero3"  # torch.pt's key for the blocks' index (torch_backend/strategies/zero3.py)
SHARD_SUFFIX = ".pt"  # torch_backend/zero.py's, which imports Horovod


class ShardedModel:
    """The model state of a zero=3 checkpoint: `shapes` by name (the parameters', then the
    buffers'), `read(name)` one tensor (the parameters assembled from the ranks' slices)."""

    def __init__(self, directory: Path, state: dict, origin: str):
        self.index: ShardedIndex = read_index(state[INDEX_KEY], origin)
        files = find_shards(directory, SHARD_SUFFIX)
        if files is None or len(files) != self.index.world:
            raise UserError(f"{origin}: training.zero=3 checkpoint without its {self.index.world} ranks' shard "
                            f"files ({SHARD_SUFFIX}) in {directory}")
        self.files = files
        self.opened: dict[int, list[torch.Tensor]] = {}
        self.params = {p.name: p for p in self.index.params}
        self.buffers: dict[str, torch.Tensor] = dict(state.get("model", {}))
        self.shapes = {**{p.name: p.shape for p in self.index.params},
                       **{k: tuple(v.shape) for k, v in self.buffers.items()}}

    def read(self, name: str) -> torch.Tensor:
        param = self.params.get(name)
        if param is None:
            return self.buffers[name]
        flat = torch.empty(param.size, dtype=torch.float32)  # zero=3's slices are float32
        return assemble(param, flat, self._slice).view(param.shape)

    def write(self, output: Path) -> int:
        """The whole state as one .safetensors file (torchvision's state-dict names, which
        model.weights= and safetensors' loaders read), a tensor at a time; returns its tensor count."""
        entries = [safetensors_file.Entry(name, self._dtype(name), shape) for name, shape in self.shapes.items()]
        safetensors_file.write(output, entries, lambda entry: [_bytes(self.read(entry.name))], {"format": "pt"})
        return len(entries)

    def _dtype(self, name: str) -> str:
        return "float32" if name in self.params else str(self.buffers[name].dtype).removeprefix("torch.")

    def _slice(self, rank: int, block: int, start: int, end: int) -> torch.Tensor:
        return self._shard(rank)[block][start:end]

    def _shard(self, rank: int) -> list[torch.Tensor]:
        """Rank `rank`'s slices, its file mapped once and checked against the index."""
        if rank not in self.opened:
            path = self.files[rank]
            try:
                stored = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
                slices = list(stored["params"])
            except (OSError, RuntimeError, KeyError, ValueError, EOFError, TypeError) as err:
                raise UserError(f"cannot read {path}: {first_line(err)}") from None
            if [s.numel() for s in slices] != [b.shard for b in self.index.buckets]:
                raise UserError(f"cannot read {path}: its slices are not those of its checkpoint's "
                                "training.zero=3 index")
            self.opened[rank] = slices
        return self.opened[rank]


def sharded_model(directory: Path, state: dict, origin: str) -> Optional[ShardedModel]:
    """The zero=3 checkpoint `state` (rank 0's torch.pt, loaded) read whole; None when it holds
    its model itself."""
    return ShardedModel(directory, state, origin) if INDEX_KEY in state else None


def _bytes(tensor: torch.Tensor) -> np.ndarray:
    """A tensor's bytes as they lie in memory (little-endian here), whatever its dtype (bfloat16 too)."""
    return tensor.detach().reshape(-1).contiguous().view(torch.uint8).numpy()


def first_line(err: BaseException) -> str:
    return str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
