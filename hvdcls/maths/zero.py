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

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from hvdcls.errors import UserError

LEVELS = (0, 1, 2, 3)
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
        raise UserError(f"config training.zero={zero}: must be 0 (off), 1 (optimizer state sharded), "
                        "2 (gradients sharded too) or 3 (parameters sharded too)")


# Checkpoints of sharded state: every rank writes its own slices (its local optimizer's state)
# to one file in the checkpoint directory, so no rank ever holds the whole state (AdamW's for
# ViT-H/14 is 5 GB). The buckets do not depend on the world size (only their padding does), so
# a resume at another world size rebuilds each new slice from the old slices it overlaps.
# Hosts that share no filesystem each keep their own ranks' files (the Trainer's host copies):
# enough to resume at the same world size; the re-cut and consolidation need every file.

SHARD_PREFIX = "zero-shard-"


def shard_file_name(rank: int, world: int, suffix: str) -> str:
    return f"{SHARD_PREFIX}{rank:05d}-of-{world:05d}{suffix}"


def shard_glob(world: int) -> str:
    """Every rank's shard file at world size `world`, whichever backend's suffix."""
    return f"{SHARD_PREFIX}*-of-{world:05d}.*"


def own_shard(directory: Path, suffix: str, rank: int, world: int) -> Optional[Path]:
    """`rank`'s own file at world size `world`, where the checkpoint holds it: all that rank
    reads to resume at the same world size (bit-identical), and on a host that shares no
    filesystem with rank 0 the one file there may be."""
    path = directory / shard_file_name(rank, world, suffix)
    return path if path.is_file() else None


def find_shards(directory: Path, suffix: str) -> Optional[list[Path]]:
    """The shard files of a checkpoint, in rank order; None when it holds none (it was saved
    gathered, unsharded); a UserError when some rank's file is missing."""
    pattern = re.compile(re.escape(SHARD_PREFIX) + r"(\d{5})-of-(\d{5})" + re.escape(suffix) + "$")
    matched = [m for m in (pattern.match(p.name) for p in directory.iterdir()) if m]
    if not matched:
        return None
    worlds = {int(m.group(2)) for m in matched}
    world = max(worlds)
    expected = [directory / shard_file_name(r, world, suffix) for r in range(world)]
    missing = sorted({p.name for p in expected} - {m.group(0) for m in matched})
    if len(worlds) > 1 or missing:
        raise UserError(f"checkpoint {directory}: its training.zero shard files do not make one set "
                        f"(missing: {', '.join(missing) or 'none'}; world sizes: "
                        f"{', '.join(map(str, sorted(worlds)))}; where the saving hosts shared no "
                        "filesystem, copy every host's zero-shard files of it into this directory)")
    return expected


@dataclass(frozen=True)
class Copy:
    """`length` elements from old rank `source`'s slice at `source_offset` to `offset` in the
    new slice (of one bucket)."""

    source: int
    source_offset: int
    offset: int
    length: int


def sources(bucket: Bucket, old_world: int, rank: int) -> list[Copy]:
    """Where rank `rank`'s slice of `bucket` (at the bucket's world size) lies in the slices the
    `old_world` ranks held: the bucket's real elements only (padding is zero in both)."""
    old = Bucket(bucket.params, bucket.offsets, bucket.sizes, old_world)
    lo, hi = bucket.slice(rank)
    hi = min(hi, bucket.numel)
    copies = []
    for q in range(old_world):
        old_lo, old_hi = old.slice(q)
        start, end = max(lo, old_lo), min(hi, old_hi, bucket.numel)
        if start < end:
            copies.append(Copy(q, start - old_lo, start - lo, end - start))
    return copies


def fill_from(target, old_slice, bucket: Bucket, old_world: int, rank: int, source: int) -> None:
    """Into `target`, rank `rank`'s new slice of `bucket`, the parts of it that old rank
    `source`'s slice `old_slice` held (numpy arrays or torch tensors: both take slice assignment)."""
    for copy in sources(bucket, old_world, rank):
        if copy.source == source:
            target[copy.offset:copy.offset + copy.length] = \
                old_slice[copy.source_offset:copy.source_offset + copy.length]


# training.zero=3: the parameters themselves sharded, block by block. A block is what one
# forward gathers at once: a segment the backend names (a ViT encoder block, a ResNet stage,
# a top-level child), or, for a parameter no segment covers (a ViT's class token on the model,
# its position embedding on the encoder), the module that holds it directly. Each block is one
# flat bucket (Bucket's slicing: rank r owns [r x shard, (r + 1) x shard)), whatever its size.


@dataclass(frozen=True)
class Block:
    module: str  # the module whose forward gathers it ("": the model itself)
    direct: bool  # only the parameters `module` holds itself (not a segment: its children apart)
    names: tuple[str, ...]  # the parameters' full names, in the model's order
    shapes: tuple[tuple[int, ...], ...]
    bucket: Bucket  # its params index the model's parameter list

    def index(self) -> dict:
        """What a sharded checkpoint's index says of it (plain data)."""
        return {"module": self.module, "names": list(self.names), "shapes": [list(s) for s in self.shapes],
                "offsets": list(self.bucket.offsets)}


def owner(name: str, segments: list[str]) -> tuple[str, bool]:
    """(module, direct) of the block parameter `name` belongs to: the longest segment holding
    it, else the module holding it directly."""
    holding = [s for s in segments if name.startswith(s + ".")]
    if holding:
        return max(holding, key=len), False
    return name.rpartition(".")[0], True


def blocks(names: list[str], shapes: list[tuple[int, ...]], world: int, segments: list[str]) -> list[Block]:
    """The model's parameters (`names`, `shapes`, in order) cut into blocks, in the order their
    first parameters come; every parameter in exactly one."""
    grouped: dict[tuple[str, bool], list[int]] = {}
    for i, name in enumerate(names):
        grouped.setdefault(owner(name, segments), []).append(i)
    sizes = [_numel(s) for s in shapes]
    return [Block(module, direct, tuple(names[i] for i in indices), tuple(tuple(shapes[i]) for i in indices),
                  _bucket(indices, sizes, world))
            for (module, direct), indices in grouped.items()]


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n
