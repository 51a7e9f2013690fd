"""A training.zero=3 checkpoint read whole, a variable at a time, for the TensorFlow backend.

Mirror: torch_backend/consolidate.py. Rank 0's tensorflow.npz holds `model/<i>` for every
variable of the model (by the position of model.variables), an empty placeholder for each
sharded (trainable) one, and the blocks' index under "zero3" (tf_backend/strategies/zero3.py);
the blocks list the trainable variables in the model's order, so the placeholders, in order,
are the index's parameters. Each rank's shard file (zero-shard-RRRRR-of-WWWWW.npz) holds
`param/B`, its slice of block B. An .npz member is read whole, so a variable is assembled from
the slices of its block (hvdcls.maths.zero_consolidate), one block's slices held at a time,
never the model. Horovod is not needed (evaluation, export and predict run without it).
"""
from __future__ import annotations

import json
import os
import zipfile
from functools import partial
from pathlib import Path
from typing import Any, Optional

import numpy as np

from hvdcls.errors import UserError
from hvdcls.files import fileio
from hvdcls.maths.zero import find_shards
from hvdcls.maths.zero_consolidate import ShardedIndex, assemble, read_index
from tf_backend.strategies import SHARDED_PARAMETERS

SHARD_SUFFIX = ".npz"  # tf_backend/zero.py's, which imports Horovod
READ_ERRORS = (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile)


class ShardedModel:
    """The model variables of a zero=3 checkpoint: `shapes` by position, `read(i)` one array
    (a sharded one assembled from the ranks' slices)."""

    def __init__(self, directory: Path, stored: Any, origin: str):
        self.stored, self.origin = stored, origin
        self.index: ShardedIndex = read_index(json.loads(str(stored[SHARDED_PARAMETERS])), origin)
        files = find_shards(directory, SHARD_SUFFIX)
        if files is None or len(files) != self.index.world:
            raise UserError(f"{origin}: training.zero=3 checkpoint without its {self.index.world} ranks' shard "
                            f"files ({SHARD_SUFFIX}) in {directory}")
        self.files = files
        self.shapes = model_shapes(stored)
        placeholders = [i for i, shape in enumerate(self.shapes) if shape == (0,)]
        if len(placeholders) != len(self.index.params):
            raise UserError(f"{origin}: {len(placeholders)} sharded variables, its training.zero=3 index lists "
                            f"{len(self.index.params)}")
        self.sharded = dict(zip(placeholders, self.index.params))
        for i, param in self.sharded.items():
            self.shapes[i] = param.shape
        self.opened: dict[int, Any] = {}
        self.held: dict[int, tuple[int, np.ndarray]] = {}  # rank -> (block, its slice): the last read

    def read(self, i: int) -> np.ndarray:
        param = self.sharded.get(i)
        if param is None:
            return self.stored[f"model/{i}"]
        return assemble(param, np.empty(param.size, np.float32), self._slice).reshape(param.shape)

    def write(self, output: Path) -> int:
        """tensorflow.npz's layout, whole (`model/<i>`, which model.weights=FILE.npz reads), an
        array at a time; returns the array count."""
        tmp = output.with_name(f".{output.name}.tmp-{os.getpid()}")
        try:
            with fileio.large_output(tmp) as handle:
                arrays = {f"model/{i}": partial(self.read, i) for i in range(len(self.shapes))}
                fileio.savez_one_at_a_time(handle, arrays)
            os.replace(tmp, output)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        return len(self.shapes)

    def _slice(self, rank: int, block: int, start: int, end: int) -> np.ndarray:
        held = self.held.get(rank)
        if held is None or held[0] != block:
            self.held.clear()  # one block's slices at a time (a parameter spans ranks, not blocks)
            held = self.held[rank] = (block, self._read(rank, f"param/{block}"))
        return held[1][start:end]

    def _read(self, rank: int, key: str) -> np.ndarray:
        path = self.files[rank]
        try:
            if rank not in self.opened:
                stored = self.opened[rank] = np.load(path)
                if stored["numels"].tolist() != [b.numel for b in self.index.buckets]:
                    raise ValueError("its blocks are not those of the checkpoint's training.zero=3 index")
            value = self.opened[rank][key]
        except READ_ERRORS as err:
            raise UserError(f"cannot read {path}: {first_line(err)}") from None
        if value.size != self.index.buckets[int(key.split("/")[1])].shard:
            raise UserError(f"cannot read {path}: its {key} is not a slice of the checkpoint's training.zero=3 index")
        return value


def model_shapes(stored: Any) -> list[tuple[int, ...]]:
    """The shapes of an .npz's model/0, model/1, ... (tensorflow.npz's layout), none read."""
    return [npy_shape(stored, f"model/{i}") for i in range(sum(k.startswith("model/") for k in stored.files))]


def npy_shape(stored: Any, key: str) -> tuple[int, ...]:
    """An .npz member's shape from its header, the array left unread."""
    with stored.zip.open(f"{key}.npy") as member:
        version = np.lib.format.read_magic(member)
        read_header = getattr(np.lib.format, f"read_array_header_{version[0]}_{version[1]}")
        return tuple(read_header(member)[0])


def sharded_model(directory: Path, path: Path, origin: str) -> Optional[ShardedModel]:
    """The zero=3 checkpoint `path` (rank 0's tensorflow.npz) read whole; None when it holds its
    model itself."""
    try:
        stored = np.load(path)
        if SHARDED_PARAMETERS not in stored.files:
            stored.close()
            return None
        return ShardedModel(directory, stored, origin)
    except READ_ERRORS as err:
        raise UserError(f"cannot read {path}: {first_line(err)}") from None


def first_line(err: BaseException) -> str:
    return str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
