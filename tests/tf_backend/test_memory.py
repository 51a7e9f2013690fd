"""TensorFlow's tensor bytes for summary.json: the cases of tests/cases/memory.py; and the
activations a step keeps for backward (hvdcls bench's act MB), read from its traced graph."""
import keras
import numpy as np
import pytest
import tensorflow as tf

from tests.cases.memory import *  # noqa: F401,F403 (the shared cases, collected here)
from tests.cases.memory import CLASSES, trained_one_step
from tests.tf_backend.test_batches import TensorFlowFramework
from tf_backend import activations
from tf_backend.vit import gelu


@pytest.fixture(scope="module")
def framework():
    return TensorFlowFramework()


def traced_step(recompute: bool = False) -> tf.Graph:
    """Dense(32, relu), Dense(64) (recomputed in backward, or not), Dense(4) on a (10, 64)
    input, its gradients and an AdamW update (which reads the weights, not the forward), traced."""
    inner = keras.Sequential([keras.layers.Dense(32, activation="relu"), keras.layers.Dense(64)])
    head = keras.layers.Dense(4)
    inner.build((None, 64))
    head.build((None, 64))
    variables = inner.trainable_variables + head.trainable_variables
    optimizer = keras.optimizers.AdamW(0.01, weight_decay=0.1)

    @tf.function
    def step(x):
        with tf.GradientTape() as tape:
            hidden = tf.recompute_grad(lambda t: inner(t, training=True))(x) if recompute else inner(x, training=True)
            loss = tf.reduce_sum(head(hidden))
        optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables))
        return loss

    x = tf.ones((10, 64))
    step(x)
    return step.get_concrete_function(x).graph


def test_tensorflow_counts_what_the_backward_reads_from_the_forward_once_and_not_the_weights():
    # float32: the input (10x64), ReLU's output (10x32: read by ReLU's gradient and the second
    # layer's), the head's input (10x64); not the kernels the gradients read, nor AdamW's reads
    assert activations.saved_bytes(traced_step()) == 4 * (10 * 64 + 10 * 32 + 10 * 64)


def test_the_vits_gelu_keeps_its_input_and_output_only():
    """(10, 64) into Dense(32, the ViT's GELU), Dense(4): the input, GELU's input (its own
    backward's) and output (the second layer's), as torch keeps them."""
    model = keras.Sequential([keras.layers.Dense(32, activation=gelu), keras.layers.Dense(4)])
    model.build((None, 64))

    @tf.function
    def step(x):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(model(x, training=True))
        return tape.gradient(loss, model.trainable_variables)

    x = tf.ones((10, 64))
    assert activations.saved_bytes(step.get_concrete_function(x).graph) == 4 * (10 * 64 + 2 * 10 * 32)


def test_a_recomputed_block_keeps_only_its_input():
    assert activations.saved_bytes(traced_step(recompute=True)) == 4 * (10 * 64 + 10 * 64)


def test_the_backend_counts_the_graph_its_step_ran(framework):
    backend = trained_one_step(framework)
    rng = np.random.default_rng(1)
    batch = framework.batch(rng.normal(size=(8, 16, 16, 3)).astype(np.float32), rng.integers(0, CLASSES, 8))
    saved = backend.saved_activation_bytes(lambda: backend.train_step([batch], 0.05))
    # compact_cnn keeps its input batch and more, and the step ran (the optimizer's second)
    assert saved > 8 * 16 * 16 * 3 * 4 and int(backend.optimizer.iterations) == 2
