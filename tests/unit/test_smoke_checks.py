"""The smoke job's verdicts: right observations pass, each kind of wrong one fails."""
import pytest

from hvdcls.checks.smoke import describe_world, evaluate, smoke_batch


def good(size: int = 2) -> dict:
    total = size * (size + 1) / 2
    return {"rank": 0, "size": size, "allreduce_sum": [total] * 4,
            "allreduce_average": [total / size] * 4, "broadcast": [100.0] * 3,
            "allgather": list(range(size)), "spread_before_broadcast": 0.3,
            "spread_after_broadcast": 0.0, "step_size": 0.01, "step_error": 1e-8,
            "spread_after_step": 0.0}


def failed(observed: dict) -> list[str]:
    return [c.name for c in evaluate(observed) if not c.ok]


@pytest.mark.parametrize("size", [1, 2, 8])
def test_correct_observations_pass(size):
    assert failed(good(size)) == []


@pytest.mark.parametrize("field, value, check", [
    ("allreduce_sum", [2.0] * 4, "allreduce sum"),  # e.g. a rank's contribution lost
    ("allreduce_average", [3.0] * 4, "allreduce average"),  # summed, not averaged
    ("broadcast", [101.0] * 3, "broadcast from rank 0"),
    ("allgather", [0, 0], "allgather of ranks"),
    ("spread_before_broadcast", 0.0, "ranks start different"),
    ("spread_after_broadcast", 1e-3, "weights identical after broadcast"),
    ("step_size", 0.0, "optimizer step moved the weights"),
    ("step_error", 0.05, "step applies the mean gradient of all ranks"),  # local gradient only
    ("spread_after_step", 1e-7, "weights identical after the step"),
])
def test_each_wrong_observation_fails_its_check(field, value, check):
    observed = good()
    observed[field] = value
    assert failed(observed) == [check]


def test_ranks_train_on_different_but_reproducible_batches():
    inputs0, labels0 = smoke_batch(0)
    inputs1, _ = smoke_batch(1)
    again, labels_again = smoke_batch(0)
    assert (inputs0 == again).all() and (labels0 == labels_again).all()
    assert not (inputs0 == inputs1).all()


class FakeBinding:
    """Stands in for horovod.torch / horovod.tensorflow: pure bookkeeping under test."""
    def __init__(self, mpi: bool, gloo: bool):
        self._mpi, self._gloo = mpi, gloo

    def rank(self): return 1
    def size(self): return 2
    def local_rank(self): return 1
    def mpi_enabled(self): return self._mpi
    def gloo_enabled(self): return self._gloo


@pytest.mark.parametrize("mpi, gloo, controller", [(True, False, "mpi"), (False, True, "gloo")])
def test_describe_world_names_the_controller_in_use(mpi, gloo, controller):
    world = describe_world(FakeBinding(mpi, gloo), {"torch": "2.14.1"})
    assert world["controller"] == controller
    assert (world["rank"], world["size"]) == (1, 2)
    assert world["versions"]["torch"] == "2.14.1" and "horovod" in world["versions"]
