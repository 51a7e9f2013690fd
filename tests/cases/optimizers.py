"""LARS and LAMB in one backend (optimizer.name=lars|lamb), against the formulas: one step
computed by hand, two against hvdcls.maths.lars_lamb's NumPy reference.

Written once; tests/torch_backend/test_optimizers.py and tests/tf_backend/test_optimizers.py
run them, each defining the module-scoped `optimizer_ops` fixture: an adapter whose
`steps(config, weights, grads)` builds the backend's optimizer from the config (its
make_optimizer), sets the weights (name -> array) and applies each dict of gradients in turn,
returning the weights after them. One process, no Horovod collectives.

The hand-made example: a 2x2 matrix whose update is chosen to have norm 1, a bias (1-D:
excluded from the trust ratio and the decay), and a zero-initialised matrix (||w|| = 0: ratio 1).
"""
import numpy as np
import pytest

from hvdcls import config as cfg
from hvdcls.maths import lars_lamb

LR, MOMENTUM, DECAY, ETA = 0.5, 0.9, 0.1, 0.02


def weights() -> dict[str, np.ndarray]:
    return {"kernel": np.array([[3.0, 0.0], [0.0, 4.0]], np.float32),  # ||w|| = 5
            "bias": np.array([1.0, -2.0], np.float32),
            "zero": np.zeros((2, 3), np.float32)}


def gradients() -> list[dict[str, np.ndarray]]:
    """Two steps' gradients. Step 1's kernel gradient makes g + 0.1 w = [[.6, 0], [0, .8]]."""
    return [{"kernel": np.array([[0.3, 0.0], [0.0, 0.4]], np.float32),
             "bias": np.array([0.5, -0.25], np.float32),
             "zero": np.array([[1.0, -2.0, 0.0], [0.0, 2.0, 4.0]], np.float32)},
            {"kernel": np.array([[-0.1, 0.2], [0.05, 0.3]], np.float32),
             "bias": np.array([0.0, 1.0], np.float32),
             "zero": np.array([[0.5, 0.5, 0.5], [0.0, 0.0, 1.0]], np.float32)}]


def settings(name: str, *extra: str) -> cfg.Config:
    return cfg.load(overrides=[f"optimizer.name={name}", f"optimizer.lr={LR}", "optimizer.scale_lr=none",
                               f"optimizer.momentum={MOMENTUM}", f"optimizer.weight_decay={DECAY}",
                               f"optimizer.trust_coefficient={ETA}", *extra])


def reference(name: str, steps: int, nesterov: bool = False) -> dict[str, np.ndarray]:
    out = {}
    for key, w in weights().items():
        state = lars_lamb.ReferenceState()
        for grads in gradients()[:steps]:
            if name == "lars":
                w = lars_lamb.lars_step(w, grads[key], state, LR, MOMENTUM, DECAY, ETA, nesterov)
            else:
                w = lars_lamb.lamb_step(w, grads[key], state, LR, DECAY)
        out[key] = w
    return out


def close(got: dict, want: dict, atol: float = 1e-6) -> None:
    assert set(got) == set(want)
    for key in want:
        np.testing.assert_allclose(got[key], want[key], rtol=1e-5, atol=atol, err_msg=key)


def test_one_lars_step_by_hand(optimizer_ops):
    got = optimizer_ops.steps(settings("lars"), weights(), gradients()[:1])
    # kernel: ratio = eta ||w|| / ||g + b w|| = 0.02 x 5 / 1 = 0.1; w - lr x 0.1 x (g + b w)
    # bias (excluded): w - lr g;  zero (||w|| = 0: ratio 1, and b w = 0): w - lr g
    close(got, {"kernel": np.array([[2.97, 0.0], [0.0, 3.96]]),
                "bias": np.array([0.75, -1.875]),
                "zero": np.array([[-0.5, 1.0, 0.0], [0.0, -1.0, -2.0]])})


def test_one_lamb_step_by_hand(optimizer_ops):
    got = optimizer_ops.steps(settings("lamb"), weights(), gradients()[:1])
    # Step 1 of Adam with bias correction: r = g / (|g| + eps), about sign(g).
    r = {k: g / (np.abs(g) + lars_lamb.LAMB_EPS) for k, g in gradients()[0].items()}
    kernel = r["kernel"] + DECAY * weights()["kernel"]  # [[1.3, 0], [0, 1.4]]
    ratio = 5.0 / np.sqrt(1.3 ** 2 + 1.4 ** 2)
    close(got, {"kernel": weights()["kernel"] - LR * ratio * kernel,
                "bias": weights()["bias"] - LR * r["bias"],  # excluded: Adam, no decay
                "zero": -LR * r["zero"]})  # ||w|| = 0: ratio 1


@pytest.mark.parametrize("name, nesterov", [("lars", False), ("lars", True), ("lamb", False)])
def test_two_steps_match_the_numpy_reference(optimizer_ops, name, nesterov):
    config = settings(name, f"optimizer.nesterov={str(nesterov).lower()}")
    got = optimizer_ops.steps(config, weights(), gradients())
    close(got, reference(name, 2, nesterov))


def test_a_zero_gradient_and_no_decay_leaves_the_weights(optimizer_ops):
    """||u|| = 0 (no gradient, no decay): ratio 1, nothing moves, nothing divides by zero."""
    zero = [{k: np.zeros_like(w) for k, w in weights().items()}]
    for name in ("lars", "lamb"):
        got = optimizer_ops.steps(settings(name, "optimizer.weight_decay=0"), weights(), zero)
        close(got, weights())
        assert all(np.isfinite(w).all() for w in got.values())
