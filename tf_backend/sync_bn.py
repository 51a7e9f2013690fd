"""Synchronised batch normalisation for the TensorFlow backend (Keras 3).

Mirror: torch_backend/sync_bn.py. Horovod's `hvd.SyncBatchNormalization` passes `fused=` to
Keras 3's BatchNormalization, which rejects it; this layer keeps Keras' own layer and only
replaces how it measures the batch: per-channel sum, sum of squares and count, summed over
ranks with Horovod's all-reduce (which has a gradient, so backprop sees the global batch).
"""
from __future__ import annotations

import horovod.tensorflow as hvd
import keras
import tensorflow as tf


def global_moments(x: tf.Tensor, axis: int) -> tuple[tf.Tensor, tf.Tensor]:
    """Mean and biased variance over every axis but `axis`, of the batch of every rank."""
    rank = len(x.shape)
    axes = [i for i in range(rank) if i != axis % rank]
    count = tf.cast(tf.reduce_prod(tf.gather(tf.shape(x), axes)), x.dtype)
    local = tf.concat([tf.reduce_sum(x, axes), tf.reduce_sum(tf.square(x), axes), [count]], 0)
    total = hvd.allreduce(local, op=hvd.Sum)  # Horovod: differentiable, sums over ranks
    channels = x.shape[axis]
    n = total[-1]
    mean = total[:channels] / n
    variance = tf.maximum(total[channels:2 * channels] / n - tf.square(mean), 0.0)
    return mean, variance


class SyncBatchNormalization(keras.layers.BatchNormalization):
    """Keras' BatchNormalization with moments over the global batch while training."""

    def _moments(self, inputs, mask):
        if mask is not None or hvd.size() == 1:
            return super()._moments(inputs, mask)
        return global_moments(inputs, self.axis)


def convert_sync_batchnorm(model: keras.Model) -> keras.Model:
    """The same model with every BatchNormalization synchronised, weights kept."""
    def clone(layer):
        if type(layer) is keras.layers.BatchNormalization:
            return SyncBatchNormalization.from_config(layer.get_config())
        return layer.__class__.from_config(layer.get_config())

    synced = keras.models.clone_model(model, clone_function=clone)
    synced.set_weights(model.get_weights())
    return synced
