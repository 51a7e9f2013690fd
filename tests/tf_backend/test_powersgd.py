"""PowerSGD's TensorFlow tensor operations: the cases of tests/cases/powersgd.py."""
import io

import numpy as np
import pytest
import tensorflow as tf

from tests.cases.powersgd import *  # noqa: F401,F403 (the shared cases, collected here)
from tf_backend import compression


class TensorFlowOps:
    channels_last = True

    @staticmethod
    def orthogonalise(p):
        return compression.orthogonalise(tf.constant(p)).numpy()

    @staticmethod
    def reducer(shapes, settings):
        return compression.PowerSGDReducer(shapes, settings, compression.local_exchange())

    @staticmethod
    def reduce(reducer, grads):
        warmup = reducer.warmup  # as the backend does: decided in Python, per step
        sent = reducer.reduce([tf.constant(g) for g in grads], 1.0, warmup)
        reducer.count(warmup)
        return [t.numpy() for t in sent]

    @staticmethod
    def errors(reducer):
        return {i: e.numpy() for i, e in reducer.errors.items()}

    @staticmethod
    def roundtrip(reducer, fresh):
        buffer = io.BytesIO()
        np.savez(buffer, **reducer.state_arrays())
        buffer.seek(0)
        with np.load(buffer) as arrays:
            fresh.load_arrays({key: arrays[key] for key in arrays.files})


@pytest.fixture(scope="module")
def ops():
    return TensorFlowOps()
