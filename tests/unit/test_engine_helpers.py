"""hvdcls.training.loop's pure helpers: micro-batch grouping, per-rank seeds, exact metric reduction."""
import pytest

from hvdcls.training.loop import EpochTimes, Reduced, epoch_seed, grouped


@pytest.mark.parametrize("size", [1, 2, 3, 6])
def test_grouped_even(size):
    groups = list(grouped(range(6), size))
    assert groups == [list(range(i, i + size)) for i in range(0, 6, size)]
    assert all(type(g) is list for g in groups)


def test_grouped_exact_groups():
    assert list(grouped("abcdef", 2)) == [["a", "b"], ["c", "d"], ["e", "f"]]
    assert list(grouped(iter([10, 20, 30, 40]), 4)) == [[10, 20, 30, 40]]
    assert list(grouped([], 3)) == []


def test_grouped_drops_an_incomplete_tail():
    # sharding makes the count a multiple; a stray tail must never become a short optimizer step
    assert list(grouped(range(7), 3)) == [[0, 1, 2], [3, 4, 5]]
    assert list(grouped(range(2), 3)) == []


def test_grouped_is_lazy():
    def source():
        yield 1
        yield 2
        raise AssertionError("read past the first group")

    assert next(grouped(source(), 2)) == [1, 2]


def test_epoch_seed_is_stable():
    assert epoch_seed(0, 0, 0) == epoch_seed(0, 0, 0)
    assert epoch_seed(7, 3, 1) == epoch_seed(7, 3, 1)
    value = epoch_seed(1, 2, 3)
    assert isinstance(value, int) and 0 <= value < 2 ** 32


def test_epoch_seed_differs_by_seed_epoch_and_rank():
    seeds = {epoch_seed(seed, epoch, rank)
             for seed in range(3) for epoch in range(5) for rank in range(4)}
    assert len(seeds) == 3 * 5 * 4
    assert epoch_seed(0, 1, 0) != epoch_seed(0, 0, 1)  # (epoch, rank) is not symmetric


def test_reduced_from_sums():
    reduced = Reduced.from_sums([6.0, 3.0, 4.0])
    assert reduced == Reduced(loss=1.5, accuracy=0.75, count=4)
    assert type(reduced.count) is int


def test_reduced_is_exact_over_ranks():
    # rank 0: 3 of 4 right, loss sum 2; rank 1: 1 of 1 right, loss sum 0.5 -> 4 of 5, 2.5 / 5
    ranks = [(2.0, 3.0, 4.0), (0.5, 1.0, 1.0)]
    summed = [sum(column) for column in zip(*ranks)]
    assert Reduced.from_sums(summed) == Reduced(loss=0.5, accuracy=0.8, count=5)


def test_reduced_rounds_float_counts():
    assert Reduced.from_sums([3.0, 2.0, 3.9999999]).count == 4


def test_reduced_of_nothing_does_not_divide_by_zero():
    assert Reduced.from_sums([0.0, 0.0, 0.0]) == Reduced(loss=0.0, accuracy=0.0, count=0)


def test_epoch_bytes_per_step_from_the_backends_counter():
    times = EpochTimes(sent_before=(1000, 4))
    times.close((1000 + 3 * 250, 7))
    assert times.bytes_per_step == 250
    uncounted = EpochTimes(sent_before=None)
    uncounted.close(None)
    assert uncounted.bytes_per_step is None
