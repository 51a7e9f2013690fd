"""training.zero in one process (world size 1: the rank's slice is everything, the collectives
are Horovod's own): the sharded step equals zero=0's, its checkpoint is zero=0's format both
ways, and snapshot/restore puts the slices back. The 2-rank equalities and memory are
tests/parallel/test_zero.py's.

tests/torch_backend/test_zero.py and tests/tf_backend/test_zero.py run these cases, each
defining the module-scoped `framework` fixture (tests/cases/batches.py describes it).
"""
import numpy as np
import pytest

from hvdcls import config, registry

CLASSES = 4


def built(framework, zero: int, *overrides):
    cfg = config.load(overrides=["training.threads=1", "data.image_size=16", f"training.zero={zero}",
                                 "optimizer.name=adamw", "optimizer.weight_decay=0.05", *overrides])
    backend = registry.create_backend(framework.name)
    backend.hvd.init()  # not backend.init(): other tests in this process set the threads already
    backend.threads, backend.device = 1, framework.cpu
    backend.seed(0)
    backend.build(cfg, CLASSES)
    return backend


def step(framework, backend, seed: int) -> None:
    rng = np.random.default_rng(seed)
    batch = framework.batch(rng.normal(size=(8, 16, 16, 3)).astype(np.float32), rng.integers(0, CLASSES, 8))
    backend.train_step([batch], 1e-3)


def differences(a, b) -> float:
    """By position: TensorFlow names a second model's variables apart from the first's."""
    wa, wb = list(a.weights().values()), list(b.weights().values())
    assert len(wa) == len(wb)
    return max(float(np.abs(x - y).max()) for x, y in zip(wa, wb))


@pytest.mark.parametrize("zero", [1, 2])
def test_one_rank_steps_as_zero_0_and_checkpoints_in_its_format(framework, zero, tmp_path):
    plain, sharded = built(framework, 0), built(framework, zero)
    for backend in (plain, sharded):
        step(framework, backend, 1)
        step(framework, backend, 2)
    assert differences(plain, sharded) == 0.0
    for backend, name in ((plain, "plain"), (sharded, "sharded")):
        backend.prepare_checkpoint()
        (tmp_path / name).mkdir()
        backend.save(tmp_path / name)
    # each loads the other's checkpoint
    crossed_plain, crossed_sharded = built(framework, 0), built(framework, zero)
    crossed_plain.load(tmp_path / "sharded")
    crossed_sharded.load(tmp_path / "plain")
    for backend in (crossed_plain, crossed_sharded):
        backend.broadcast_state()
        step(framework, backend, 3)
    step(framework, plain, 3)
    assert differences(plain, crossed_plain) == 0.0
    assert differences(plain, crossed_sharded) == 0.0


def test_snapshot_and_restore_put_the_slices_back(framework):
    backend = built(framework, 2)
    step(framework, backend, 1)
    saved, before = backend.snapshot(), backend.weights().copied()
    step(framework, backend, 2)
    backend.restore(saved)
    assert all(np.array_equal(x, y) for x, y in zip(before.values(), backend.weights().values()))
    again = built(framework, 2)
    step(framework, again, 1)
    step(framework, again, 2)
    step(framework, backend, 2)
    assert differences(backend, again) == 0.0


def test_shard_files_resume_as_the_run_went_on_and_a_lost_one_is_one_line(framework, tmp_path):
    """A checkpoint whose optimizer state is in the ranks' shard files (one here): a resume from
    it steps as the run itself did; at zero=0, or without its shard file, it stops with one line."""
    from hvdcls.errors import UserError

    saved = built(framework, 2)
    step(framework, saved, 1)
    saved.prepare_checkpoint(tmp_path)  # every rank its own file: the Trainer passes rank 0's directory
    saved.save(tmp_path)
    shards = sorted(tmp_path.glob("zero-shard-*"))
    assert [p.stem for p in shards] == ["zero-shard-00000-of-00001"]  # .pt or .npz
    resumed = built(framework, 2)
    resumed.load(tmp_path)
    resumed.broadcast_state()
    for backend in (saved, resumed):
        step(framework, backend, 2)
    assert differences(saved, resumed) == 0.0
    with pytest.raises(UserError, match="per-rank shard files; resume it with training.zero=1 or 2"):
        built(framework, 0).load(tmp_path)  # zero=0 has no slices to read them into
    shards[0].unlink()
    lost = built(framework, 2)
    lost.load(tmp_path)
    with pytest.raises(UserError, match="training.zero shard files expected, none found"):
        lost.broadcast_state()



def test_zero_3_resumes_its_shards_restores_its_slices_and_is_refused_elsewhere_in_one_line(framework, tmp_path):
    """training.zero=3 in one process (its steps against zero=0's: tests/parallel/test_zero.py):
    its checkpoint (the parameters in the shard file) resumes as the run went on, snapshot/restore
    puts the slices back, and zero=0 or 2 refuse it in one line, as zero=3 refuses zero=0's whole
    parameters, each before loading anything."""
    from hvdcls.errors import UserError

    sharded, plain = built(framework, 3), built(framework, 0)
    step(framework, sharded, 1)
    sharded.prepare_checkpoint(tmp_path)
    sharded.save(tmp_path)
    (tmp_path / "plain").mkdir()
    plain.prepare_checkpoint()
    plain.save(tmp_path / "plain")
    resumed = built(framework, 3)
    resumed.load(tmp_path)
    resumed.broadcast_state()
    saved, before = sharded.snapshot(), sharded.weights().copied()
    for backend in (sharded, resumed):
        step(framework, backend, 2)
    assert differences(sharded, resumed) == 0.0
    sharded.restore(saved)
    assert all(np.array_equal(x, y) for x, y in zip(before.values(), sharded.weights().values()))
    for backend, directory in ((plain, tmp_path), (built(framework, 2), tmp_path), (resumed, tmp_path / "plain")):
        with pytest.raises(UserError) as refused:
            backend.load(directory)
        assert "\n" not in str(refused.value), str(refused.value)
