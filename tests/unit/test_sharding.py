"""hvdcls.data.sharding: equal, full batches on every rank; exact validation partition."""
from collections import Counter

import numpy as np
import pytest

from hvdcls.data.sharding import ElasticShards, TrainShards, epoch_permutation, eval_batches, eval_indices
from hvdcls.errors import UserError

# (num_samples, world_size, batch_size, backward_passes)
CASES = [
    (1797, 1, 32, 1),
    (1797, 2, 32, 1),
    (1797, 3, 32, 1),
    (1797, 3, 16, 2),
    (1000, 4, 10, 1),
    (1000, 3, 7, 3),
    (10, 3, 2, 1),
    (5, 4, 1, 1),
    (2, 3, 1, 1),
]


def all_ranks(n, world, batch, passes, seed=0):
    return [TrainShards(n, world, rank, batch, passes, seed) for rank in range(world)]


@pytest.mark.parametrize("n, world, batch, passes", CASES)
def test_every_rank_runs_the_same_full_batches(n, world, batch, passes):
    shards = all_ranks(n, world, batch, passes)
    steps = -(-n // world) // (batch * passes)
    assert steps >= 1
    for shard in shards:
        assert shard.samples_per_rank == -(-n // world)
        assert shard.steps_per_epoch == steps
        for epoch in (0, 1):
            batches = shard.batches(epoch)
            assert len(batches) == steps * passes
            assert [len(b) for b in batches] == [batch] * (steps * passes)
            assert np.array_equal(np.concatenate(batches), shard.indices(epoch))
            assert all(0 <= i < n for i in shard.indices(epoch))


def test_known_step_counts():
    assert TrainShards(1797, 2, 0, 32).steps_per_epoch == 28  # ceil(1797/2)=899 -> 28 x 32
    assert TrainShards(1797, 3, 2, 32).steps_per_epoch == 18  # 599 -> 18 x 32
    assert TrainShards(1797, 3, 0, 16, 2).steps_per_epoch == 18  # 599 -> 18 x 32
    assert TrainShards(1000, 3, 1, 7, 3).steps_per_epoch == 15  # 334 -> 15 x 21


@pytest.mark.parametrize("n, world, batch, passes", [
    (1797, 1, 1797, 1), (1797, 3, 1, 1), (1797, 2, 29, 31), (1797, 3, 599, 1),
    (1000, 4, 25, 2), (10, 3, 2, 2), (2, 3, 1, 1)])
def test_all_samples_covered_when_nothing_is_dropped(n, world, batch, passes):
    shards = all_ranks(n, world, batch, passes, seed=5)
    assert shards[0].samples_per_rank % (batch * passes) == 0  # no incomplete batch to drop
    for epoch in (0, 3):
        seen = np.concatenate([s.indices(epoch) for s in shards])
        assert len(seen) == shards[0].samples_per_rank * world
        assert set(seen.tolist()) == set(range(n))


@pytest.mark.parametrize("n, world, batch, passes", CASES)
def test_ranks_overlap_only_in_the_wrap_around_padding(n, world, batch, passes):
    shards = all_ranks(n, world, batch, passes, seed=11)
    padding = shards[0].samples_per_rank * world - n
    for epoch in (0, 1):
        order = epoch_permutation(n, 11, epoch)
        wrapped = set(np.resize(order, padding).tolist())  # the samples read a second time
        counts = Counter(np.concatenate([s.indices(epoch) for s in shards]).tolist())
        repeated = {i for i, c in counts.items() if c > 1}
        assert repeated <= wrapped
        assert sum(c - 1 for c in counts.values()) <= padding
        for shard in shards:  # within one rank no sample repeats unless the set is tiny
            if n >= world:
                assert len(set(shard.indices(epoch).tolist())) == len(shard.indices(epoch))


def test_exact_padding_for_1797_on_2_ranks():
    order = epoch_permutation(1797, 0, 0)
    rank0, rank1 = (TrainShards(1797, 2, r, 1).indices(0) for r in (0, 1))
    assert len(rank0) == len(rank1) == 899
    assert rank0[-1] == order[1796]
    assert rank1[-1] == order[0]  # the one padded sample wraps to the start of the permutation
    assert np.array_equal(np.sort(np.concatenate([rank0, rank1[:-1]])), np.arange(1797))


def test_permutation_depends_on_epoch_and_seed_only():
    a = epoch_permutation(1797, 0, 0)
    assert np.array_equal(np.sort(a), np.arange(1797))
    assert np.array_equal(a, epoch_permutation(1797, 0, 0))
    assert not np.array_equal(a, epoch_permutation(1797, 0, 1))
    assert not np.array_equal(a, epoch_permutation(1797, 1, 0))


def test_shards_are_reproducible_and_reshuffled_per_epoch():
    first = TrainShards(1797, 3, 1, 32, 1, seed=7)
    second = TrainShards(1797, 3, 1, 32, 1, seed=7)
    for epoch in range(3):
        assert np.array_equal(first.indices(epoch), second.indices(epoch))
    assert not np.array_equal(first.indices(0), first.indices(1))
    assert not np.array_equal(first.indices(0), TrainShards(1797, 3, 1, 32, 1, seed=8).indices(0))
    assert not np.array_equal(first.indices(0), TrainShards(1797, 3, 0, 32, 1, seed=7).indices(0))


@pytest.mark.parametrize("n, world, batch, passes", [
    (10, 1, 11, 1), (1797, 2, 900, 1), (1797, 3, 300, 2), (5, 4, 3, 1), (0, 1, 1, 1)])
def test_batch_too_large_for_one_step(n, world, batch, passes):
    with pytest.raises(UserError) as info:
        TrainShards(n, world, 0, batch, passes)
    message = str(info.value)
    assert "\n" not in message
    assert f"training.batch_size={batch}" in message
    assert f"horovod.backward_passes_per_step={passes}" in message
    assert f"{n} training samples" in message and f"{world} ranks" in message


def test_just_large_enough_batch_is_accepted():
    assert TrainShards(1797, 2, 1, 899).steps_per_epoch == 1
    assert TrainShards(10, 1, 0, 10).steps_per_epoch == 1


@pytest.mark.parametrize("n", [0, 1, 2, 7, 10, 180, 1797])
@pytest.mark.parametrize("world", [1, 2, 3, 4, 8])
def test_eval_indices_partition(n, world):
    parts = [eval_indices(n, world, rank) for rank in range(world)]
    merged = np.concatenate(parts)
    assert len(merged) == n
    assert np.array_equal(np.sort(merged), np.arange(n))
    sizes = [len(p) for p in parts]
    assert max(sizes) - min(sizes) <= (1 if n else 0)
    assert all(np.all(np.diff(p) == world) for p in parts if len(p) > 1)


def test_eval_indices_exact():
    assert eval_indices(7, 3, 0).tolist() == [0, 3, 6]
    assert eval_indices(7, 3, 1).tolist() == [1, 4]
    assert eval_indices(7, 3, 2).tolist() == [2, 5]


def test_eval_batches_keep_the_remainder():
    batches = eval_batches(180, 3, 1, 16)
    assert [len(b) for b in batches] == [16, 16, 16, 12]
    assert np.array_equal(np.concatenate(batches), eval_indices(180, 3, 1))
    assert eval_batches(0, 2, 0, 4) == []


@pytest.mark.parametrize("num_samples,world,batch", [(129, 2, 32), (64, 2, 32), (10, 3, 3), (180, 3, 16), (7, 4, 2)])
def test_every_rank_takes_as_many_eval_batches_and_every_sample_once(num_samples, world, batch):
    """training.zero=3's forwards are collectives: no rank may run fewer (129 at np=2, batch 32: 65 and 64)."""
    per_rank = [eval_batches(num_samples, world, r, batch) for r in range(world)]
    assert len({len(b) for b in per_rank}) == 1, [[len(x) for x in b] for b in per_rank]
    taken = np.concatenate([x for b in per_rank for x in b])
    assert sorted(taken.tolist()) == list(range(num_samples))
    assert all(0 < len(x) <= batch for b in per_rank for x in b)


# Elastic: (num_samples, batch_size, backward_passes, world sizes one after the other, steps
# each world trains before the next one takes over)
ELASTIC_CASES = [
    (1437, 32, 1, [2, 1], [7]),
    (1437, 32, 1, [1, 3, 2], [5, 4]),
    (1000, 7, 3, [4, 2, 3], [3, 2]),
    (101, 5, 1, [3, 4], [1]),
]


@pytest.mark.parametrize("n, batch, passes, worlds, steps", ELASTIC_CASES)
def test_elastic_epoch_reads_no_sample_twice_across_world_changes(n, batch, passes, worlds, steps):
    """Each world trains some steps, then the rest of the epoch is re-dealt to the next one:
    no sample is read twice, and only less than one final step's worth goes unread."""
    consumed, seen = 0, Counter()
    for world, count in zip(worlds, [*steps, None]):
        shards = [ElasticShards(n, world, rank, batch, passes, seed=3) for rank in range(world)]
        per_rank = [s.batches(epoch=5, consumed=consumed) for s in shards]
        assert len({len(b) for b in per_rank}) == 1  # every rank runs the same steps
        taken = per_rank[0] and len(per_rank[0]) // passes
        count = taken if count is None else count
        for batches in per_rank:
            assert all(len(b) == batch for b in batches)
            seen.update(int(i) for b in batches[:count * passes] for i in b)
        consumed += count * shards[0].per_step
    assert max(seen.values()) == 1
    assert set(seen) <= set(range(n)) and n - len(seen) < batch * passes * worlds[-1]
    assert len(seen) == consumed


def test_elastic_consumed_samples_are_the_permutations_prefix():
    order = epoch_permutation(100, 0, 2)
    before = [ElasticShards(100, 2, r, 5).batches(2, 0)[:3] for r in range(2)]
    read = sorted(int(i) for batches in before for b in batches for i in b)
    assert read == sorted(order[:30].tolist())
    after = ElasticShards(100, 3, 0, 5).batches(2, 30)
    assert int(after[0][0]) == int(order[30]) and len(after) == 70 // 15


def test_elastic_steps_per_epoch_drop_no_padding():
    assert ElasticShards(1437, 2, 0, 32).steps_per_epoch == 22  # 1437 // 64, no wrap-around
    assert ElasticShards(1437, 2, 0, 32).remaining_steps(64 * 20) == 2


def test_an_elastic_world_that_cannot_fill_one_step_is_one_line():
    assert TrainShards(63, 2, 0, 32).steps_per_epoch == 1  # padded to 64
    with pytest.raises(UserError, match="63 training samples are too few for one step of 64"):
        ElasticShards(63, 2, 0, 32)  # 63 // 64: no step, and no schedule to follow


def random_plan(rng: np.random.Generator, world: int, batch: int) -> tuple:
    """Per-rank sizes >= 1 summing to batch x world (training.balance's plans)."""
    cuts = np.sort(rng.choice(np.arange(1, batch * world), size=world - 1, replace=False))
    return tuple(int(b) for b in np.diff([0, *cuts, batch * world]))


@pytest.mark.parametrize("n, batch, passes, worlds, steps", ELASTIC_CASES)
@pytest.mark.parametrize("plan_seed", [0, 1, 2])
def test_balanced_elastic_epoch_reads_each_sample_once_for_any_plan_and_world(
        n, batch, passes, worlds, steps, plan_seed):
    """training.balance under elastic: each world trains its steps under random plans that
    change at random step boundaries, then the next world cuts the rest anew. Every rank runs
    the same steps, each step's global batch is the permutation's next slice, cut at the
    plan's offsets: what the worlds consumed is exactly the permutation's prefix, once each."""
    rng, consumed, seen = np.random.default_rng(plan_seed), 0, Counter()
    order = epoch_permutation(n, 3, 5)
    for world, count in zip(worlds, [*steps, None]):
        shards = [ElasticShards(n, world, rank, batch, passes, seed=3) for rank in range(world)]
        left = shards[0].remaining_steps(consumed) if count is None else count
        while left:
            plan = random_plan(rng, world, batch) if world > 1 else (batch,)
            per_rank = [s.balanced_batches(5, consumed, plan) for s in shards]
            assert {len(b) for b in per_rank} == {shards[0].remaining_steps(consumed) * passes}
            run = int(rng.integers(1, left + 1))  # steps until the next re-plan (or reset)
            for rank, batches in enumerate(per_rank):
                assert all(len(b) == plan[rank] for b in batches)
                seen.update(int(i) for b in batches[:run * passes] for i in b)
            consumed += run * shards[0].per_step
            left -= run
    assert max(seen.values()) == 1
    assert sorted(seen) == sorted(order[:consumed].tolist())  # a prefix, nothing skipped
    assert n - consumed < batch * passes * worlds[-1]


def test_balanced_elastic_batches_refuse_a_plan_of_another_world():
    with pytest.raises(ValueError):
        ElasticShards(100, 2, 0, 8).balanced_batches(0, 0, (6, 5, 5))


def test_the_balanced_sampler_draws_every_class_alike_and_keeps_the_steps():
    """data.sampler=balanced: 90 % of the samples in class 0, yet over epochs each class is
    drawn about as often; every rank runs the same steps as with shuffling, and the ranks'
    draws are one epoch's draw dealt out (the same on every rank, no talking)."""
    from hvdcls.data.sharding import class_balanced_weights

    labels = np.array([0] * 900 + [1] * 60 + [2] * 40)
    weights = class_balanced_weights(labels)
    assert weights.sum() == pytest.approx(1.0)
    ranks = [TrainShards(1000, 3, r, 16, 1, 5, weights) for r in range(3)]
    plain = TrainShards(1000, 3, 0, 16, 1, 5)
    assert all(s.steps_per_epoch == plain.steps_per_epoch for s in ranks)
    drawn = np.concatenate([np.concatenate([s.indices(e) for s in ranks]) for e in range(10)])
    shares = np.bincount(labels[drawn], minlength=3) / len(drawn)
    assert np.allclose(shares, 1 / 3, atol=0.03), shares
    whole = ranks[0].padded_order(4)
    assert np.array_equal(np.sort(np.concatenate([s.padded_order(4)[s.rank::3] for s in ranks])), np.sort(whole))
    assert not np.array_equal(ranks[0].indices(0), ranks[0].indices(1))  # a new draw each epoch


def test_balanced_sampling_with_elastic_is_refused_in_one_line():
    from hvdcls import config as cfg
    from hvdcls.errors import UserError

    with pytest.raises(UserError, match="data.sampler=balanced with training.elastic"):
        cfg.load(overrides=["data.sampler=balanced", "training.elastic=true"])
