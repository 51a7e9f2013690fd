"""Batches for the TensorFlow backend: the core's EpochBatches behind tf.data.

Mirror: torch_backend/data.py. Which samples form which batch, and every pixel in them, is
decided by the core; tf.data adds parallel workers (threads) and prefetching.
"""
from __future__ import annotations

import tensorflow as tf

from hvdcls.data.batches import EpochBatches


def loader(batches: EpochBatches, workers: int):
    if workers == 0:  # like DataLoader(num_workers=0): read in this thread, nothing in flight
        return ((tf.constant(images), tf.constant(labels))
                for images, labels in (batches[k] for k in range(len(batches))))
    size, soft = batches.preprocess.config.image_size, batches.soft_classes
    label_type, label_shape = (tf.float32, [None, soft]) if soft else (tf.int64, [None])

    def read(k):
        images, labels = tf.numpy_function(lambda i: batches[int(i)], [k], (tf.float32, label_type))
        return tf.ensure_shape(images, [None, size, size, 3]), tf.ensure_shape(labels, label_shape)

    return (tf.data.Dataset.range(len(batches))
            .map(read, num_parallel_calls=workers, deterministic=True)
            .prefetch(2))
