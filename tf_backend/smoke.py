"""Horovod smoke checks for the TensorFlow backend; torch_backend/smoke.py is its mirror.

Keras 3 note: Horovod's TensorFlow helpers expect `tf.Variable`s, but Keras 3 hands out its
own `KerasVariable`s (`broadcast_variables` then fails with "'SymbolicTensor' object has no
attribute 'assign'", `DistributedGradientTape` with "no attribute 'ref'"). Passing the
underlying `tf.Variable`s, `[v.value for v in ...]`, works for both.
"""
from __future__ import annotations

import hashlib
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import horovod.tensorflow as hvd
import keras
import tensorflow as tf

from hvdcls.checks.smoke import CLASSES, FEATURES, HIDDEN, describe_world, smoke_batch

loss_of = keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def make_model(seed: int) -> keras.Model:
    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(HIDDEN, activation="relu"),
                             keras.layers.Dense(CLASSES)])


def batch_of(rank: int) -> tuple[tf.Tensor, tf.Tensor]:
    inputs, labels = smoke_batch(rank)
    return tf.constant(inputs), tf.constant(labels)


def tf_variables(variables) -> list[tf.Variable]:
    """Keras 3 variables -> the tf.Variables Horovod can broadcast and differentiate."""
    return [v.value for v in variables]


def flat_weights(model: keras.Model) -> tf.Tensor:
    return tf.concat([tf.reshape(v, [-1]) for v in tf_variables(model.trainable_variables)], 0)


def spread_over_ranks(vector: tf.Tensor) -> float:
    """Largest difference of any element between any two ranks (0.0 when identical)."""
    gathered = hvd.allgather(tf.expand_dims(vector, 0))  # Horovod: one row per rank
    return float(tf.reduce_max(tf.reduce_max(gathered, 0) - tf.reduce_min(gathered, 0)))


def gradient_on(model: keras.Model, rank: int) -> tf.Tensor:
    inputs, labels = batch_of(rank)
    with tf.GradientTape() as tape:
        loss = loss_of(labels, model(inputs, training=True))
    gradients = tape.gradient(loss, tf_variables(model.trainable_variables))
    return tf.concat([tf.reshape(g, [-1]) for g in gradients], 0)


def collectives(rank: int) -> dict:
    contribution = tf.fill([4], float(rank + 1))
    return {
        "allreduce_sum": hvd.allreduce(contribution, op=hvd.Sum).numpy().tolist(),
        "allreduce_average": hvd.allreduce(contribution, op=hvd.Average).numpy().tolist(),
        "broadcast": hvd.broadcast(tf.fill([3], 100.0 + rank), root_rank=0).numpy().tolist(),
        "allgather": hvd.allgather(tf.constant([rank])).numpy().tolist(),
    }


def optimizer_step(rank: int, size: int, lr: float) -> dict:
    model = make_model(seed=1000 + rank)
    observed: dict[str, object] = {"spread_before_broadcast": spread_over_ranks(flat_weights(model))}
    hvd.broadcast_variables(tf_variables(model.variables), root_rank=0)  # Horovod: same start
    optimizer = keras.optimizers.SGD(learning_rate=lr)
    optimizer.build(model.trainable_variables)
    hvd.broadcast_variables(tf_variables(optimizer.variables), root_rank=0)
    start = tf.identity(flat_weights(model))
    # What one step must give: the average of every rank's gradient, applied by plain SGD.
    mean_gradient = tf.reduce_mean(tf.stack([gradient_on(model, r) for r in range(size)]), 0)
    inputs, labels = batch_of(rank)
    with tf.GradientTape() as tape:
        loss = loss_of(labels, model(inputs, training=True))
    tape = hvd.DistributedGradientTape(tape)  # Horovod: averages gradients over ranks
    gradients = tape.gradient(loss, tf_variables(model.trainable_variables))
    optimizer.apply_gradients(zip(gradients, model.trainable_variables))
    after = flat_weights(model)
    observed.update({
        "spread_after_broadcast": spread_over_ranks(start),
        "spread_after_step": spread_over_ranks(after),
        "step_size": float(tf.reduce_max(tf.abs(after - start))),
        "step_error": float(tf.reduce_max(tf.abs(after - (start - lr * mean_gradient)))),
        "weights_sha256": hashlib.sha256(after.numpy().tobytes()).hexdigest(),
    })
    return observed


def run(lr: float) -> dict:
    hvd.init()
    observed = describe_world(hvd, {"tensorflow": tf.__version__, "keras": keras.__version__})
    observed.update(collectives(observed["rank"]))
    observed.update(optimizer_step(observed["rank"], observed["size"], lr))
    hvd.shutdown()
    return observed
