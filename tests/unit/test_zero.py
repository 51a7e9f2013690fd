"""training.zero's partitioning (hvdcls/maths/zero.py): every element of every
parameter owned by exactly one rank, slices equal, padding below one element per rank."""
import random

import pytest

from hvdcls import config
from hvdcls.errors import UserError
from hvdcls.maths import zero as zero_partition


def owners(sizes, world, bucket_elements):
    """{(param, element): [(rank, bucket, position in the rank's shard)]}."""
    seen: dict = {}
    for b, bucket in enumerate(zero_partition.plan(sizes, world, bucket_elements)):
        for rank in range(world):
            for piece in bucket.pieces(rank):
                assert piece.offset >= 0 and piece.offset + piece.end - piece.start <= bucket.shard
                for k in range(piece.start, piece.end):
                    seen.setdefault((piece.param, k), []).append((rank, b, piece.offset + k - piece.start))
    return seen


@pytest.mark.parametrize("world", range(1, 9))
def test_every_element_owned_exactly_once(world):
    rng = random.Random(world)
    for bucket_elements in (1, 7, 50, 10**9):
        sizes = [rng.randint(1, 40) for _ in range(rng.randint(1, 12))]
        seen = owners(sizes, world, bucket_elements)
        assert set(seen) == {(p, k) for p, n in enumerate(sizes) for k in range(n)}
        assert all(len(where) == 1 for where in seen.values())
        positions = [where[0] for where in seen.values()]
        assert len(set(positions)) == len(positions)  # no two elements in one shard position


@pytest.mark.parametrize("world", range(1, 9))
def test_slices_are_equal_and_padding_is_short(world):
    for bucket in zero_partition.plan([5, 3, 11, 1, 29], world, bucket_elements=16):
        assert bucket.padded % world == 0 and 0 <= bucket.padded - bucket.numel < world
        assert [bucket.slice(r) for r in range(world)] == [(r * bucket.shard, (r + 1) * bucket.shard)
                                                           for r in range(world)]


def test_buckets_keep_order_and_a_large_tensor_alone():
    buckets = zero_partition.plan([4, 4, 100, 4], 2, bucket_elements=10)
    assert [b.params for b in buckets] == [(0, 1), (2,), (3,)]
    assert buckets[0].offsets == (0, 4)


@pytest.mark.parametrize("old_world", range(1, 6))
def test_resharding_rebuilds_every_slice_from_the_old_ones(old_world):
    """A checkpoint's slices at old_world, re-cut for every new world: each new slice holds
    exactly its bucket's elements, copied from where the old ranks kept them."""
    rng = random.Random(old_world)
    sizes = [rng.randint(1, 30) for _ in range(9)]
    for new_world in range(1, 6):
        old_buckets = zero_partition.plan(sizes, old_world, bucket_elements=40)
        new_buckets = zero_partition.plan(sizes, new_world, bucket_elements=40)
        assert [b.params for b in old_buckets] == [b.params for b in new_buckets]  # world-free
        for old, new in zip(old_buckets, new_buckets):
            # the old slices, element k of the bucket holding the value k (padding: None)
            held = [[k if k < old.numel else None for k in range(*old.slice(q))] for q in range(old_world)]
            for rank in range(new_world):
                rebuilt = [None] * new.shard
                for copy in zero_partition.sources(new, old_world, rank):
                    part = held[copy.source][copy.source_offset:copy.source_offset + copy.length]
                    assert None not in part
                    rebuilt[copy.offset:copy.offset + copy.length] = part
                lo, hi = new.slice(rank)
                assert rebuilt == [k if k < new.numel else None for k in range(lo, hi)]


def test_shard_files_make_one_set_or_a_one_line_error(tmp_path):
    name = zero_partition.shard_file_name
    assert zero_partition.find_shards(tmp_path, ".pt") is None  # a checkpoint saved gathered
    for rank in range(3):
        (tmp_path / name(rank, 3, ".pt")).touch()
    (tmp_path / ".zero-shard-00000-of-00003.pt.tmp").touch()  # a writer's temporary: not a shard
    assert zero_partition.find_shards(tmp_path, ".pt") == [tmp_path / name(r, 3, ".pt") for r in range(3)]
    (tmp_path / name(1, 3, ".pt")).unlink()
    with pytest.raises(UserError, match="missing: zero-shard-00001-of-00003.pt"):
        zero_partition.find_shards(tmp_path, ".pt")
    (tmp_path / name(1, 3, ".pt")).touch()
    (tmp_path / name(0, 2, ".pt")).touch()
    with pytest.raises(UserError, match="world sizes: 2, 3"):
        zero_partition.find_shards(tmp_path, ".pt")


def test_level_outside_0_to_2_is_one_line():
    for good in (0, 1, 2):
        zero_partition.check_level(good)
    with pytest.raises(UserError, match="training.zero=3"):
        zero_partition.check_level(3)


@pytest.mark.parametrize("overrides, says", [
    (["training.zero=3"], "training.zero=3: must be 0"),
    (["training.zero=-1"], "training.zero=-1: must be 0"),
    (["training.zero=1", "training.elastic=true"], "elastic reset would have to re-shard"),
    (["training.zero=2", "horovod.compression=powersgd"], "PowerSGD"),
    (["training.zero=1", "horovod.compression=powersgd"], "PowerSGD"),
    (["training.zero=1", "horovod.op=adasum"], "Adasum"),
    (["training.zero=2", "optimizer.name=lamb"], "trust ratio"),
    (["training.zero=1", "optimizer.name=lars"], "trust ratio"),
    (["training.zero=1", "training.amp=true", "training.amp_dtype=float16"], "loss scaler"),
])
def test_what_zero_cannot_serve_is_refused_in_one_line(overrides, says):
    with pytest.raises(UserError) as info:
        config.load(overrides=overrides)
    assert says in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize("overrides", [
    ["training.zero=1", "optimizer.name=sgd"], ["training.zero=2", "optimizer.name=adam"],
    ["training.zero=2", "horovod.compression=fp16", "training.grad_clip_norm=1.0",
     "horovod.backward_passes_per_step=2", "training.ema_decay=0.99", "training.balance=dynamic"],
])
def test_what_zero_serves_is_accepted(overrides):
    assert config.load(overrides=overrides).training.zero in (1, 2)
