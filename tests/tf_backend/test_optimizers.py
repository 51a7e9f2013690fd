"""LARS and LAMB as Keras 3 optimizers: the cases of tests/cases/optimizers.py, and their
slots where the backend's checkpoint and Horovod's broadcast look for them (one process)."""
import keras
import numpy as np
import pytest
import tensorflow as tf

from tests.cases.optimizers import *  # noqa: F401,F403 (the shared cases, collected here)
from tests.cases.optimizers import gradients, settings, weights


def make_optimizer(config):
    """Imported when a test runs, not at collection: horovod.tensorflow (which tf_backend.backend
    imports) loaded before torch makes the torch tests' import of torchvision crash."""
    from tf_backend.backend import make_optimizer as make
    return make(config)


def variables(values: dict) -> dict[str, keras.Variable]:
    return {k: keras.Variable(w, name=k) for k, w in values.items()}


def step(optimizer, params: dict, grads: dict) -> None:
    optimizer.apply_gradients([(keras.ops.convert_to_tensor(grads[k]), v) for k, v in params.items()])


class TensorFlowOptimizerOps:
    @staticmethod
    def steps(config, values, grads):
        """Each step in a tf.function, as the backend's compiled training step applies them."""
        params = variables(values)
        optimizer = make_optimizer(config)
        optimizer.build(list(params.values()))
        apply = tf.function(lambda g: optimizer.apply_gradients([(g[k], v) for k, v in params.items()]))
        for g in grads:
            apply({k: tf.constant(x) for k, x in g.items()})
        return {k: np.asarray(v.numpy()) for k, v in params.items()}


@pytest.fixture(scope="module")
def optimizer_ops():
    return TensorFlowOptimizerOps()


@pytest.mark.parametrize("name", ["lars", "lamb"])
def test_their_state_is_in_optimizer_variables_and_a_loss_scaled_one_steps_alike(name):
    """The backend saves, restores and broadcasts `optimizer.variables`: the slots are there
    once built; under LossScaleOptimizer (float16 AMP) the unscaled steps are the same."""
    config = settings(name)
    plain, scaled = variables(weights()), variables(weights())
    reference = make_optimizer(config)
    reference.build(list(plain.values()))
    slots = {"lars": 1, "lamb": 2}[name] * len(plain)
    assert len(reference.variables) == 2 + slots  # iterations and the learning rate, then the slots
    wrapped = keras.optimizers.LossScaleOptimizer(make_optimizer(config), initial_scale=8.0)
    wrapped.build(list(scaled.values()))
    for g in gradients():
        step(reference, plain, g)
        step(wrapped, scaled, {k: 8.0 * v for k, v in g.items()})
    for key in plain:
        np.testing.assert_allclose(scaled[key].numpy(), plain[key].numpy(), rtol=1e-6, atol=1e-7,
                                   err_msg=key)
