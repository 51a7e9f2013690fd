"""hvdcls.maths.powersgd: which tensors are compressed, bytes per step, and the numpy reference step
(rank-r exactness, error feedback); plus the config keys. No framework."""
import math

import numpy as np
import pytest

from hvdcls import config
from hvdcls.errors import UserError
from hvdcls.maths import powersgd


def low_rank(n: int, m: int, rank: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.standard_normal((n, rank)) @ rng.standard_normal((rank, m))


def test_orthogonalise_gives_orthonormal_columns():
    p = powersgd.orthogonalise(np.random.default_rng(1).standard_normal((50, 4)))
    assert np.allclose(p.T @ p, np.eye(4), atol=1e-7)  # eps keeps it off 1 by ~1e-9


@pytest.mark.parametrize("rank", [1, 2, 4])
def test_a_rank_r_matrix_is_reproduced_exactly_by_rank_r_powersgd(rank):
    grad = low_rank(40, 30, rank)
    q = powersgd.initial_q(30, rank, index=0).astype(np.float64)
    sent, _, error = powersgd.reference_step(grad, q, np.zeros_like(grad))
    scale = np.abs(grad).max()
    assert np.abs(sent - grad).max() < 1e-8 * scale  # exact up to float64 round-off
    assert np.abs(error).max() < 1e-8 * scale


def test_a_higher_rank_matrix_is_not_reproduced_and_the_error_keeps_the_rest():
    grad = low_rank(40, 30, 6)
    q = powersgd.initial_q(30, 2, index=0).astype(np.float64)
    sent, _, error = powersgd.reference_step(grad, q, np.zeros_like(grad))
    assert np.linalg.norm(grad - sent) > 1e-3 * np.linalg.norm(grad)
    assert np.allclose(sent + error, grad)
    assert np.linalg.matrix_rank(sent) == 2


def test_error_feedback_carries_the_residual():
    """Over any number of steps: sum of what was sent + the last error = sum of gradients."""
    rng = np.random.default_rng(2)
    q, error = powersgd.initial_q(20, 2, index=3).astype(np.float64), np.zeros((30, 20))
    grads, sent_total = [], np.zeros((30, 20))
    for _ in range(7):
        grads.append(rng.standard_normal((30, 20)))
        sent, q, error = powersgd.reference_step(grads[-1], q, error)
        sent_total += sent
    assert np.allclose(sent_total + error, sum(grads), atol=1e-9)
    assert np.abs(error).max() > 1e-3  # rank 2 of 20: a residual really is carried


def test_initial_q_is_the_same_for_the_same_tensor_and_differs_between_tensors():
    assert np.array_equal(powersgd.initial_q(9, 3, index=5), powersgd.initial_q(9, 3, index=5))
    assert not np.array_equal(powersgd.initial_q(9, 3, index=5), powersgd.initial_q(9, 3, index=6))
    assert powersgd.initial_q(9, 3, index=5).dtype == np.float32


def test_plan_compresses_matrices_and_convolutions_not_vectors_or_small_tensors():
    shapes = [(64, 32, 3, 3), (64,), (10, 64), (4, 4), (3, 3, 32, 64)]
    plans = powersgd.plan(shapes, rank=4, min_compression_rate=2.0, channels_last=False)
    # (3, 3, 32, 64) read output-first (torch's layout) is 3 x 18432: rank 3 would gain < 2x
    assert [p.compressed for p in plans] == [True, False, True, False, False]
    assert plans[0].matrix == (64, 288) and plans[2].matrix == (10, 64)
    keras = powersgd.plan(shapes, rank=4, min_compression_rate=2.0, channels_last=True)
    assert [p.compressed for p in keras] == [False, False, True, False, True]
    assert keras[4].matrix == (3 * 3 * 32, 64)
    assert plans[2].rank == 4


def test_min_compression_rate_decides():
    # 10 x 64 at rank 4: 640 values against 4 * 74 = 296, a rate of 2.16
    assert powersgd.plan([(10, 64)], 4, 2.0, False)[0].compressed
    assert not powersgd.plan([(10, 64)], 4, 2.5, False)[0].compressed


def test_bytes_per_step_counted_by_hand():
    shapes = [(64, 32, 3, 3), (64,), (10, 64), (10,)]
    dense = (64 * 288 + 64 + 640 + 10) * 4
    assert powersgd.dense_bytes(shapes) == dense
    sent = (4 * (64 + 288) + 4 * (10 + 64)) * 4 + (64 + 10) * 4
    result = powersgd.communication(shapes, "powersgd", rank=4)
    assert result == {"dense_bytes_per_step": dense, "bytes_per_step": sent,
                      "compression_ratio": dense / sent}
    half = powersgd.communication(shapes, "powersgd", rank=4, pq_fp16=True)["bytes_per_step"]
    assert half == sent - (4 * (64 + 288) + 4 * (10 + 64)) * 2
    assert powersgd.communication(shapes, "fp16")["bytes_per_step"] == dense // 2
    assert powersgd.communication(shapes, "none")["compression_ratio"] == 1.0


def test_resnet50_bytes_per_step_drop_at_least_eightfold():
    shapes = powersgd.resnet50_shapes()
    assert sum(math.prod(s) for s in shapes) == 25_557_032  # torchvision's resnet50()
    for rank in (1, 2, 4):
        result = powersgd.communication(shapes, "powersgd", rank=rank)
        assert result["compression_ratio"] >= 8, (rank, result)


def test_byte_counter_summary():
    counter = powersgd.ByteCounter(dense_per_step=1000)
    assert counter.summary()["compression_ratio"] is None
    for step_bytes in (1000, 1000, 100, 100):
        counter.add(step_bytes)
    summary = counter.summary()
    assert summary["bytes_per_step"] == 100 and summary["compression_ratio"] == 10
    assert summary["mean_bytes_per_step"] == 550 and summary["sent_bytes"] == 2200
    assert summary["steps"] == 4 and summary["dense_bytes_per_step"] == 1000


def test_config_keys_and_their_errors():
    loaded = config.load(overrides=["horovod.compression=powersgd", "horovod.powersgd.rank=2",
                                    "horovod.powersgd.start_iter=0", "horovod.powersgd.fp16=true"])
    assert loaded.horovod.compression == "powersgd"
    assert (loaded.horovod.powersgd.rank, loaded.horovod.powersgd.start_iter) == (2, 0)
    assert loaded.horovod.powersgd.fp16 is True
    for overrides, key in ((["horovod.powersgd.rank=0"], "horovod.powersgd.rank"),
                           (["horovod.powersgd.start_iter=-1"], "horovod.powersgd.start_iter"),
                           (["horovod.powersgd.min_compression_rate=0.5"],
                            "horovod.powersgd.min_compression_rate"),
                           (["horovod.compression=powersgd", "horovod.op=adasum"], "horovod.op=adasum")):
        with pytest.raises(UserError) as info:
            config.load(overrides=overrides)
        assert key in str(info.value) and "\n" not in str(info.value)
