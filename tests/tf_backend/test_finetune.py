"""Fine-tuning with the tensorflow backend, in process: the cases of tests/cases/finetune.py,
and AdamW's decoupled decay at each variable's own rate."""
import numpy as np
import pytest

from tests.cases.finetune import *  # noqa: F403 (the shared cases, collected here)


class TensorFlowFramework:
    name = "tensorflow"

    @staticmethod
    def train_loss(backend, labels, logits):
        import tensorflow as tf

        return float(backend.train_loss(tf.constant(labels), tf.constant(logits)))

    @staticmethod
    def trainable(backend):
        return [np.array(v.numpy(), copy=True) for v in backend.model.trainable_variables]

    @staticmethod
    def untouched_state(backend, count):
        """Keras names a slot after its variable's path ('/' as '_')."""
        frozen = [v.path.replace("/", "_") for v in backend.model.trainable_variables[:count]]
        slots = [s for s in backend.optimizer.variables if len(s.shape) and any(f in s.path for f in frozen)]
        assert slots  # the optimizer has slots for them (momentum, moments)
        return not any(np.any(s.numpy()) for s in slots)


@pytest.fixture(scope="module")
def framework():
    return TensorFlowFramework()


def test_adamws_decoupled_decay_takes_each_variables_rate():
    """Zero gradients: Adam's step is 0, so each variable moves by its decay alone:
    w x (1 - lr x scale x weight_decay), as torch's AdamW does per param group."""
    import keras

    from tf_backend import finetune

    variables = [keras.Variable(np.full((2, 2), 2.0, np.float32)), keras.Variable(np.full((3,), 4.0, np.float32))]
    optimizer = finetune.with_layer_rates(keras.optimizers.AdamW, [0.25, 1.0])(0.1, weight_decay=0.5)
    optimizer.build(variables)
    optimizer.apply_gradients([(np.zeros((2, 2), np.float32), variables[0]), (np.zeros(3, np.float32), variables[1])])
    np.testing.assert_allclose(variables[0].numpy(), 2.0 * (1 - 0.1 * 0.25 * 0.5), rtol=1e-6)
    np.testing.assert_allclose(variables[1].numpy(), 4.0 * (1 - 0.1 * 1.0 * 0.5), rtol=1e-6)
