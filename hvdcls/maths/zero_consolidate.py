"""training.zero=3's checkpoint read whole, framework-free: `hvdcls checkpoint consolidate`, and
evaluation, export, predict and model.weights given a sharded run, read each parameter from it
this way, one at a time.

Rank 0's checkpoint holds the blocks' index (hvdcls.maths.zero.Block.index: each block's
parameter names, shapes and offsets in its flat bucket) and the world size that wrote it; each
rank r's shard file holds, per block, its slice [r x shard, (r + 1) x shard) of the bucket
padded to a multiple of that world size. A parameter's elements [offset, offset + size) of its
bucket therefore lie in the slices of a run of consecutive ranks: `pieces` says which part of
each, and `assemble` copies them into one flat array, reading only those parts. The backends
read the files (torch_backend/consolidate.py, tf_backend/consolidate.py).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

from hvdcls.errors import UserError
from hvdcls.maths.zero import Bucket


@dataclass(frozen=True)
class Piece:
    """Elements [start, end) of rank `rank`'s slice of the block go to `at` in the parameter."""

    rank: int
    start: int
    end: int
    at: int


@dataclass(frozen=True)
class Param:
    """One parameter of a sharded checkpoint: where it lies in its block's bucket."""

    name: str
    shape: tuple[int, ...]
    block: int  # the block's number (its slice's place in each shard file)
    offset: int  # in the block's flat bucket
    bucket: Bucket  # at the world size that wrote the shards

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    def pieces(self) -> list[Piece]:
        """The ranks' slices that hold this parameter's elements, in order (none for an empty one)."""
        shard, end = self.bucket.shard, self.offset + self.size
        out = []
        for rank in range(self.offset // shard, -(-end // shard) if self.size else 0):
            lo, hi = max(self.offset, rank * shard), min(end, (rank + 1) * shard)
            out.append(Piece(rank, lo - rank * shard, hi - rank * shard, lo - self.offset))
        return out


@dataclass(frozen=True)
class ShardedIndex:
    world: int
    buckets: tuple[Bucket, ...]  # one per block, at `world`
    params: tuple[Param, ...]  # every block's, in the index's order


def read_index(index: Any, origin: str) -> ShardedIndex:
    """The index rank 0's checkpoint holds ({"world", "blocks": [{"names", "shapes", "offsets"}]}),
    checked: a block's offsets must lay its parameters end to end. A UserError names `origin`."""
    try:
        world, blocks = int(index["world"]), list(index["blocks"])
        if world < 1:
            raise ValueError(f"world size {world}")
        buckets: list[Bucket] = []
        params: list[Param] = []
        for b, block in enumerate(blocks):
            shapes = [tuple(int(d) for d in s) for s in block["shapes"]]
            sizes = [math.prod(s) for s in shapes]
            offsets = [int(o) for o in block["offsets"]]
            names = [str(n) for n in block["names"]]
            ends = [o + s for o, s in zip(offsets, sizes)]
            if len({len(names), len(shapes), len(offsets)}) != 1 or offsets[:1] != [0] \
                    or offsets[1:] != ends[:-1]:
                raise ValueError(f"block {b} is not laid out end to end")
            bucket = Bucket(tuple(range(len(params), len(params) + len(names))), tuple(offsets), tuple(sizes), world)
            buckets.append(bucket)
            params += [Param(n, s, b, o, bucket) for n, s, o in zip(names, shapes, offsets)]
    except (KeyError, TypeError, ValueError, IndexError) as err:
        raise UserError(f"{origin}: its training.zero=3 index is unreadable ({err})") from None
    return ShardedIndex(world, tuple(buckets), tuple(params))


def assemble(param: Param, out: Any, read: Callable[[int, int, int, int], Any]) -> Any:
    """`param`'s elements, flat, into `out` (a numpy array or torch tensor of param.size):
    read(rank, block, start, end) gives elements [start, end) of that rank's slice of the block."""
    for piece in param.pieces():
        out[piece.at:piece.at + piece.end - piece.start] = read(piece.rank, param.block, piece.start, piece.end)
    return out
