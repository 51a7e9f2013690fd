"""training.zero on torch in one process (world size 1: each rank's slice is everything, the
collectives are Horovod's own): the sharded step equals zero=0's, its checkpoint is zero=0's
format both ways, and snapshot/restore puts the slices back. The 2-rank equalities and memory
are tests/parallel/test_zero.py's."""
import numpy as np
import pytest

from hvdcls import config, registry
from tests.torch_backend.test_batches import TorchFramework

CLASSES = 4


def built(zero: int, *overrides):
    cfg = config.load(overrides=["training.threads=1", "data.image_size=16", f"training.zero={zero}",
                                 "optimizer.name=adamw", "optimizer.weight_decay=0.05", *overrides])
    backend = registry.create_backend("torch")
    backend.hvd.init()  # not backend.init(): other tests in this process set the threads already
    backend.threads, backend.device = 1, TorchFramework.cpu
    backend.seed(0)
    backend.build(cfg, CLASSES)
    return backend


def step(backend, seed: int) -> None:
    rng = np.random.default_rng(seed)
    batch = TorchFramework.batch(rng.normal(size=(8, 16, 16, 3)).astype(np.float32),
                                 rng.integers(0, CLASSES, 8))
    backend.train_step([batch], 1e-3)


def differences(a, b) -> float:
    wa, wb = a.weights(), b.weights()
    return max(float(np.abs(wa[k] - wb[k]).max()) for k in wa)


@pytest.mark.parametrize("zero", [1, 2])
def test_one_rank_steps_as_zero_0_and_checkpoints_in_its_format(zero, tmp_path):
    plain, sharded = built(0), built(zero)
    for backend in (plain, sharded):
        step(backend, 1)
        step(backend, 2)
    assert differences(plain, sharded) == 0.0
    for backend, name in ((plain, "plain"), (sharded, "sharded")):
        backend.prepare_checkpoint()
        (tmp_path / name).mkdir()
        backend.save(tmp_path / name)
    crossed_plain, crossed_sharded = built(0), built(zero)  # each loads the other's checkpoint
    crossed_plain.load(tmp_path / "sharded")
    crossed_sharded.load(tmp_path / "plain")
    for backend in (crossed_plain, crossed_sharded):
        backend.broadcast_state()
        step(backend, 3)
    step(plain, 3)
    assert differences(plain, crossed_plain) == 0.0
    assert differences(plain, crossed_sharded) == 0.0


def test_snapshot_and_restore_put_the_slices_back():
    backend = built(2)
    step(backend, 1)
    saved, before = backend.snapshot(), backend.weights()
    step(backend, 2)
    backend.restore(saved)
    assert all(np.array_equal(before[k], v) for k, v in backend.weights().items())
    again = built(2)
    step(again, 1)
    step(again, 2)
    step(backend, 2)
    assert differences(backend, again) == 0.0
