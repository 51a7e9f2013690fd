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


def test_a_rank_at_the_same_world_size_reads_its_own_file_alone(tmp_path):
    """A host that shares no filesystem with rank 0 keeps only its own ranks' files: enough at
    the same world size; anything else needs the whole set, and says how to bring it together."""
    name = zero_partition.shard_file_name
    (tmp_path / name(1, 2, ".pt")).touch()
    assert zero_partition.own_shard(tmp_path, ".pt", 1, 2) == tmp_path / name(1, 2, ".pt")
    assert zero_partition.own_shard(tmp_path, ".pt", 0, 2) is None
    assert zero_partition.own_shard(tmp_path, ".pt", 1, 3) is None  # another world size: re-cut from all
    with pytest.raises(UserError, match="missing: zero-shard-00000-of-00002.pt.*copy every host's"):
        zero_partition.find_shards(tmp_path, ".pt")


def test_level_outside_0_to_3_is_one_line():
    for good in (0, 1, 2, 3):
        zero_partition.check_level(good)
    with pytest.raises(UserError, match="training.zero=4"):
        zero_partition.check_level(4)


@pytest.mark.parametrize("overrides, says", [
    (["training.zero=4"], "training.zero=4: must be 0"),
    (["training.zero=-1"], "training.zero=-1: must be 0"),
    (["training.zero=1", "training.elastic=true"], "elastic reset would have to re-shard"),
    (["training.zero=2", "horovod.compression=powersgd"], "PowerSGD"),
    (["training.zero=1", "horovod.compression=powersgd"], "PowerSGD"),
    (["training.zero=1", "horovod.op=adasum"], "Adasum"),
    (["training.zero=2", "optimizer.name=lamb"], "trust ratio"),
    (["training.zero=1", "optimizer.name=lars"], "trust ratio"),
    (["training.zero=1", "training.amp=true", "training.amp_dtype=float16"], "loss scaler"),
    (["training.zero=3", "training.elastic=true"], "elastic reset would have to re-shard"),
    (["training.zero=3", "horovod.compression=powersgd"], "PowerSGD"),
    (["training.zero=3", "training.ema_decay=0.99"], "training.ema_decay with training.zero=3"),
    (["training.zero=3", "training.compile=true"], "training.compile=true with training.zero=3"),
    (["training.zero=3", "horovod.compression=fp16"], "horovod.compression=fp16 with training.zero=3"),
    (["training.zero=3", "optimizer.layer_decay=0.65"], "training.zero=3"),
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


# training.zero=3's blocks (hvdcls.maths.zero.blocks)

VIT_NAMES = ["class_token", "conv_proj.weight", "conv_proj.bias", "encoder.pos_embedding",
             *[f"encoder.layers.encoder_layer_{i}.{p}" for i in range(2) for p in ("ln_1.weight", "mlp.0.weight")],
             "encoder.ln.weight", "encoder.ln.bias", "heads.head.weight", "heads.head.bias"]


def test_a_vits_blocks_are_its_encoder_blocks_and_each_leftover_parameters_module():
    segments = ["encoder.layers.encoder_layer_0", "encoder.layers.encoder_layer_1", "conv_proj", "heads"]
    shapes = [(3, i + 1) for i in range(len(VIT_NAMES))]
    found = zero_partition.blocks(VIT_NAMES, shapes, 2, segments)
    assert [(b.module, b.direct, len(b.names)) for b in found] == [
        ("", True, 1), ("conv_proj", False, 2), ("encoder", True, 1),
        ("encoder.layers.encoder_layer_0", False, 2), ("encoder.layers.encoder_layer_1", False, 2),
        ("encoder.ln", True, 2), ("heads", False, 2)]
    assert found[3].index() == {"module": "encoder.layers.encoder_layer_0",
                                "names": VIT_NAMES[4:6], "shapes": [[3, 5], [3, 6]], "offsets": [0, 15]}


@pytest.mark.parametrize("world", [1, 2, 3, 5, 8])
def test_blocks_cover_every_element_once_for_any_world_size(world):
    rng = random.Random(world)
    names = [f"m{rng.randrange(4)}.s{i % 3}.p{i}" for i in range(30)]
    shapes = [(rng.randrange(1, 9), rng.randrange(1, 5)) for _ in names]  # uneven, some below the world size
    found = zero_partition.blocks(names, shapes, world, ["m0", "m1.s2", "m1"])
    params = sorted(i for b in found for i in b.bucket.params)
    assert params == list(range(len(names)))  # every parameter in exactly one block
    for block in found:
        bucket = block.bucket
        assert [names[i] for i in bucket.params] == list(block.names)
        assert list(bucket.sizes) == [h * w for h, w in block.shapes]
        assert bucket.padded % world == 0 and bucket.padded - bucket.numel < world
        owned = sorted((p.param, k) for r in range(world) for p in bucket.pieces(r) for k in range(p.start, p.end))
        assert owned == [(i, k) for i, size in zip(bucket.params, bucket.sizes) for k in range(size)]
        holder = {zero_partition.owner(n, ["m0", "m1.s2", "m1"]) for n in block.names}
        assert holder == {(block.module, block.direct)}
    assert {zero_partition.owner("m1.s2.p5", ["m0", "m1.s2", "m1"])} == {("m1.s2", False)}  # the longest
