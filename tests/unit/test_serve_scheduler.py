"""hvdcls.serve.scheduler: gang FIFO, backfill only when it cannot delay the head, placement."""
import itertools

import pytest

from hvdcls.errors import UserError
from hvdcls.serve.scheduler import Waiting, cannot_delay_head, parse_hosts, place, plan

FOUR = {"a": 2, "b": 2}


def queue(*sizes: int) -> list[Waiting]:
    return [Waiting(job_id, np) for job_id, np in enumerate(sizes, start=1)]


def started(starts) -> list[int]:
    return [job_id for job_id, _ in starts]


def test_jobs_start_in_submission_order_while_they_fit():
    starts = plan(queue(2, 1, 1, 2), FOUR, running=[])
    assert started(starts) == [1, 2, 3]  # the fourth needs 2 of the 0 left
    assert sum(sum(a.values()) for _, a in starts) == 4


def test_a_job_waits_behind_a_head_that_does_not_fit_unless_backfill_is_safe():
    # 3 slots busy in one job, the head wants 2: a 1-slot job would take the only free slot,
    # and when the 3-slot job ends the head still fits (4 - 1 >= 2): safe.
    assert started(plan(queue(2, 1), FOUR, running=[{"a": 2, "b": 1}])) == [2]
    # Two jobs running (2 + 1), one slot free, head wants 2: without the 1-slot job the head
    # starts when the 1-slot job ends (1 + 1 = 2); with it, it waits for the 2-slot one. Unsafe.
    assert started(plan(queue(2, 1), FOUR, running=[{"a": 2}, {"b": 1}])) == []


def test_no_backfill_when_nothing_is_free_and_never_past_the_inventory():
    assert plan(queue(1), FOUR, running=[{"a": 2, "b": 2}]) == []
    assert plan(queue(5, 1), FOUR, running=[]) == [(2, {"a": 1})]  # 5 can never start; 1 is safe


def test_the_head_starts_as_soon_as_it_fits_even_with_backfilled_jobs_before_it():
    running = [{"a": 2, "b": 1}]  # 3 busy
    first = plan(queue(2, 1), FOUR, running)
    assert started(first) == [2]
    # The 3-slot job ends: 3 free (the backfilled job holds one): the head starts.
    assert started(plan(queue(2), FOUR, [first[0][1]])) == [1]


def test_gang_placement_uses_as_few_hosts_as_possible():
    assert place(2, {"a": 1, "b": 2}) == {"b": 2}
    assert place(3, {"a": 1, "b": 2}) == {"b": 2, "a": 1}
    assert place(4, {"a": 1, "b": 2}) is None


@pytest.mark.parametrize("running", [[1, 1, 1], [2, 1], [3], [1, 2, 3], []])
def test_backfill_rule_equals_brute_force_over_ending_orders(running):
    """For every free count, head and candidate: the rule admits the candidate exactly when no
    order of the running jobs' endings lets the head start later with it than without it."""
    for free, head, candidate in itertools.product(range(4), range(1, 7), range(1, 4)):
        def first_start(extra_held: int):
            for order in itertools.permutations(range(len(running))):
                freed = 0
                for moment, index in enumerate([None, *order]):
                    freed += running[index] if index is not None else 0
                    if free + freed - extra_held >= head:
                        yield moment
                        break
                else:
                    yield None  # never

        safe = candidate <= free and all(
            without is None or (with_ is not None and with_ <= without)
            for without, with_ in zip(first_start(0), first_start(candidate)))
        assert cannot_delay_head(head, free, running, candidate) == safe, (free, head, candidate)


def test_parse_hosts_names_a_bad_entry():
    assert parse_hosts("a:2,b:2") == FOUR
    assert parse_hosts("# inventory\na:2\nb:2  # second\n") == FOUR
    for bad, words in (("a", "expected HOST:SLOTS"), ("a:0", "SLOTS >= 1"), ("a:2,a:1", "twice"), ("", "empty")):
        with pytest.raises(UserError, match=words):
            parse_hosts(bad)
