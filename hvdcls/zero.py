"""training.zero's partitioning, framework-free (both backends' zero.py use it): the parameters
laid end to end in flat buckets, each bucket padded to a multiple of the world size and cut
into one equal contiguous slice per rank (rank r owns [r x shard, (r + 1) x shard) of every
bucket), so that every element is owned by exactly one rank. The backends' zero.py step,
reduce-scatter and all-gather by this plan.

Equal slices (padding, not Horovod's uneven split) keep every collective the same shape on
every rank: reducescatter hands rank r exactly its slice and allgather puts the slices back in
rank order with nothing to strip but the pad at the bucket's end.
"""
from __future__ import annotations

from dataclasses import dataclass

from hvdcls.errors import UserError

LEVELS = (0, 1, 2)
# A bucket closes once it holds this many elements (64 MiB of float32): one collective per
# bucket, and the flat copies a step makes stay this small. A larger tensor has a bucket alone.
BUCKET_ELEMENTS = 1 << 24


@dataclass(frozen=True)
class Piece:
    """The part of one parameter inside a rank's slice: its elements [start, end) (flattened)
    sit at `offset` in the rank's shard."""

    param: int
    start: int
    end: int
    offset: int


@dataclass(frozen=True)
class Bucket:
    params: tuple[int, ...]  # indices into the parameter list, in order
    offsets: tuple[int, ...]  # where each starts in the flat bucket
    sizes: tuple[int, ...]
    world: int

    @property
    def numel(self) -> int:
        return sum(self.sizes)

    @property
    def shard(self) -> int:
        """Elements per rank: the bucket padded up to a multiple of the world size, split."""
        return -(-self.numel // self.world)

    @property
    def padded(self) -> int:
        return self.shard * self.world

    def slice(self, rank: int) -> tuple[int, int]:
        """This rank's [start, end) in the flat (padded) bucket."""
        return rank * self.shard, (rank + 1) * self.shard

    def pieces(self, rank: int) -> list[Piece]:
        """The parameters' parts this rank owns; the rest of its slice, if any, is padding."""
        lo, hi = self.slice(rank)
        out = []
        for param, offset, size in zip(self.params, self.offsets, self.sizes):
            start, end = max(lo, offset), min(hi, offset + size)
            if start < end:
                out.append(Piece(param, start - offset, end - offset, start - lo))
        return out


def plan(sizes: list[int], world: int, bucket_elements: int = BUCKET_ELEMENTS) -> list[Bucket]:
    """Buckets over parameters of `sizes` elements, in order, for `world` ranks."""
    if world < 1:
        raise ValueError(f"world size {world}: must be >= 1")
    buckets: list[Bucket] = []
    current: list[int] = []
    offset = 0
    for index, size in enumerate(sizes):
        if current and offset + size > bucket_elements:
            buckets.append(_bucket(current, sizes, world))
            current, offset = [], 0
        current.append(index)
        offset += size
    if current:
        buckets.append(_bucket(current, sizes, world))
    return buckets


def _bucket(indices: list[int], sizes: list[int], world: int) -> Bucket:
    offsets, at = [], 0
    for i in indices:
        offsets.append(at)
        at += sizes[i]
    return Bucket(tuple(indices), tuple(offsets), tuple(sizes[i] for i in indices), world)


def check_level(zero: int) -> None:
    if zero not in LEVELS:
        raise UserError(f"config training.zero={zero}: must be 0 (off), 1 (optimizer state sharded) "
                        "or 2 (gradients sharded too)")
