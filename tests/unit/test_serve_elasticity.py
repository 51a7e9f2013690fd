"""hvdcls.serve.elasticity: elastic jobs shrink only to admit the head, grow back when nothing
waits, never twice within the cool-down; allocations shrink by whole hosts first."""
from hvdcls.serve.elasticity import Resizable, grown, resize, shrunk

NOW, COOLDOWN = 1000.0, 60.0


def job(job_id: int, size: int, min_np: int = 1, max_np: int = 4, resized_at: float = 0.0) -> Resizable:
    return Resizable(job_id, size, min_np, max_np, resized_at)


def test_a_waiting_head_shrinks_elastic_jobs_just_enough_to_start():
    assert resize(2, 0, [job(1, 4)], NOW, COOLDOWN) == {1: 2}
    assert resize(2, 1, [job(1, 4)], NOW, COOLDOWN) == {1: 3}  # one slot is free already
    # The job with most to spare gives first; each keeps at least its min_np.
    assert resize(2, 0, [job(1, 2, min_np=2), job(2, 3)], NOW, COOLDOWN) == {2: 1}
    assert resize(2, 0, [job(1, 2, min_np=1), job(2, 3, min_np=1)], NOW, COOLDOWN) == {2: 1}
    assert resize(3, 0, [job(1, 2, min_np=1), job(2, 3, min_np=1)], NOW, COOLDOWN) == {2: 1, 1: 1}


def test_no_shrink_that_would_not_admit_the_head():
    assert resize(4, 0, [job(1, 3, min_np=1)], NOW, COOLDOWN) == {}  # 2 to spare, 4 needed
    assert resize(2, 2, [job(1, 2)], NOW, COOLDOWN) == {}  # the head fits: nothing to do


def test_growth_only_when_nothing_waits_and_up_to_max_np():
    assert resize(None, 3, [job(1, 1, max_np=2), job(2, 1, max_np=4)], NOW, COOLDOWN) == {1: 2, 2: 3}
    assert resize(None, 0, [job(1, 1)], NOW, COOLDOWN) == {}
    assert resize(None, 2, [job(1, 4)], NOW, COOLDOWN) == {}


def test_no_job_is_resized_within_its_cooldown():
    recent = NOW - COOLDOWN / 2
    assert resize(2, 0, [job(1, 4, resized_at=recent)], NOW, COOLDOWN) == {}
    assert resize(None, 2, [job(1, 1, resized_at=recent)], NOW, COOLDOWN) == {}
    assert resize(2, 0, [job(1, 4, resized_at=NOW - COOLDOWN)], NOW, COOLDOWN) == {1: 2}


def test_allocations_shrink_by_whole_hosts_and_grow_where_the_job_is():
    assert shrunk({"a": 2, "b": 1}, 2) == {"a": 2}
    assert shrunk({"a": 2, "b": 2}, 1) == {"b": 1}
    assert grown({"a": 1}, 2, {"a": 1, "b": 2}) == {"a": 2}
    assert grown({"a": 1}, 3, {"a": 0, "b": 2}) == {"a": 1, "b": 2}
