"""PowerSGD's tensor operations in one backend, against hvdcls.maths.powersgd's numpy reference.

Written once; tests/torch_backend/test_powersgd.py and tests/tf_backend/test_powersgd.py run
them, each defining the module-scoped `ops` fixture (an adapter with `channels_last`,
`orthogonalise(p)`, `reducer(shapes, settings)`, `reduce(reducer, grads)`, `errors(reducer)`
and `roundtrip(reducer, fresh)`). One process, no Horovod: the reducers get an exchange
that averages over one rank. Multi-rank behaviour: tests/parallel/test_powersgd.py.
"""
import numpy as np
import pytest

from hvdcls.config import PowerSGDConfig
from hvdcls.maths import powersgd

CONV = (16, 8, 3, 3)  # torch layout; the adapters give the same gradient in their own layout


def settings(**kwargs) -> PowerSGDConfig:
    return PowerSGDConfig(**{"rank": 2, "start_iter": 0, **kwargs})


def rank_r(n: int, m: int, rank: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((n, rank)) @ rng.standard_normal((rank, m))).astype(np.float32)


def layer_shapes(ops) -> list[tuple]:
    """A convolution, its bias, a dense layer and its bias, in the backend's layout."""
    conv = (3, 3, 8, 16) if ops.channels_last else CONV
    dense = (64, 10) if ops.channels_last else (10, 64)
    return [conv, (16,), dense, (10,)]


def gradients(ops, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(shape).astype(np.float32) for shape in layer_shapes(ops)]


def test_orthogonalise_matches_the_reference(ops):
    p = np.random.default_rng(0).standard_normal((40, 4)).astype(np.float32)
    got = ops.orthogonalise(p)
    assert np.allclose(got, powersgd.orthogonalise(p.astype(np.float64)), atol=1e-5)
    assert np.allclose(got.T @ got, np.eye(4), atol=1e-5)


@pytest.mark.parametrize("rank", [1, 2, 4])
def test_a_rank_r_gradient_is_reproduced_by_rank_r_powersgd(ops, rank):
    grad = rank_r(40, 30, rank, seed=rank)
    reducer = ops.reducer([(40, 30)], settings(rank=rank))
    [sent] = ops.reduce(reducer, [grad])
    assert np.abs(sent - grad).max() < 1e-4 * np.abs(grad).max()


def test_steps_match_the_numpy_reference_with_warm_start_and_error_feedback(ops):
    shapes = layer_shapes(ops)
    plans = powersgd.plan(shapes, 2, 2.0, ops.channels_last)
    reducer = ops.reducer(shapes, settings())
    qs = {i: powersgd.initial_q(p.matrix[1], p.rank, i).astype(np.float64)
          for i, p in enumerate(plans) if p.compressed}
    errors = {i: np.zeros(plans[i].matrix) for i in qs}
    assert sorted(qs) == [0, 2]  # the convolution and the dense layer, not the biases
    for step in range(3):
        grads = gradients(ops, seed=step)
        sent = ops.reduce(reducer, grads)
        for i, grad in enumerate(grads):
            if i not in qs:
                assert np.array_equal(sent[i], grad)  # uncompressed: the average of one rank
                continue
            expected, qs[i], errors[i] = powersgd.reference_step(
                grad.reshape(plans[i].matrix).astype(np.float64), qs[i], errors[i])
            assert np.allclose(sent[i], expected.reshape(grad.shape), atol=1e-4), (step, i)
            assert np.allclose(ops.errors(reducer)[i], errors[i], atol=1e-4), (step, i)


def test_error_feedback_carries_the_residual(ops):
    """sum over steps of what was sent + the error left = the sum of the gradients."""
    reducer = ops.reducer([(30, 20)], settings(rank=1))
    total_sent, total_grad = np.zeros((30, 20)), np.zeros((30, 20))
    for step in range(6):
        grad = np.random.default_rng(step).standard_normal((30, 20)).astype(np.float32)
        [sent] = ops.reduce(reducer, [grad])
        total_sent += sent
        total_grad += grad
    error = ops.errors(reducer)[0]
    assert np.abs(error).max() > 0.1  # rank 1 of 20 leaves a real residual
    assert np.allclose(total_sent + error, total_grad, atol=1e-4)


def test_warm_up_steps_send_everything_then_the_factors(ops):
    shapes = layer_shapes(ops)
    reducer = ops.reducer(shapes, settings(start_iter=2))
    grads = gradients(ops, seed=5)
    for _ in range(2):
        assert all(np.array_equal(a, b) for a, b in zip(ops.reduce(reducer, grads), grads))
        assert reducer.counter.last_step == powersgd.dense_bytes(shapes)
    assert not np.array_equal(ops.reduce(reducer, grads)[0], grads[0])
    plans = powersgd.plan(shapes, 2, 2.0, ops.channels_last)
    assert reducer.counter.last_step == powersgd.compressed_bytes(plans)
    assert reducer.counter.steps == 3 and reducer.step == 3


def test_fp16_factors_halve_their_bytes(ops):
    shapes = layer_shapes(ops)
    reducer = ops.reducer(shapes, settings(fp16=True))
    sent = ops.reduce(reducer, gradients(ops, seed=1))
    plans = powersgd.plan(shapes, 2, 2.0, ops.channels_last)
    assert reducer.counter.last_step == powersgd.compressed_bytes(plans, pq_bytes=2)
    assert all(s.dtype == np.float32 for s in sent)


def test_an_overflowed_step_keeps_the_error_and_the_warm_start(ops):
    """A gradient with an inf (a mixed-precision step the loss scaler will skip) leaves its
    error and its Q as they were, so the next step is finite again; the other gradients' move on."""
    shapes = layer_shapes(ops)
    reducer = ops.reducer(shapes, settings())
    ops.reduce(reducer, gradients(ops, seed=0))
    kept = {i: e.copy() for i, e in ops.errors(reducer).items()}
    overflowed = gradients(ops, seed=1)
    overflowed[0].flat[0] = np.inf  # one element of the convolution's gradient
    assert not np.isfinite(ops.reduce(reducer, overflowed)[0]).all()
    errors = ops.errors(reducer)
    assert np.array_equal(errors[0], kept[0]) and not np.array_equal(errors[2], kept[2])
    assert all(np.isfinite(sent).all() for sent in ops.reduce(reducer, gradients(ops, seed=2)))


def test_state_round_trips_through_a_checkpoint(ops):
    """A reducer restored from another's saved state makes the same next step."""
    shapes = layer_shapes(ops)
    original = ops.reducer(shapes, settings())
    for step in range(2):
        ops.reduce(original, gradients(ops, seed=step))
    restored = ops.reducer(shapes, settings())
    ops.roundtrip(original, restored)
    assert restored.step == 2
    grads = gradients(ops, seed=9)
    fresh = ops.reduce(ops.reducer(shapes, settings()), grads)
    for a, b, c in zip(ops.reduce(original, grads), ops.reduce(restored, grads), fresh):
        assert np.array_equal(a, b)
    assert not np.allclose(fresh[0], ops.reduce(restored, grads)[0], atol=1e-3)  # state mattered
