"""The TensorFlow loader and loss on augmented, mixed batches: the cases of tests/cases/batches.py."""
from types import SimpleNamespace

import pytest
import tensorflow as tf

from tests.cases.batches import *  # noqa: F401,F403 (the shared cases, collected here)
from tf_backend import data


def backend_class():
    """Imported when a test runs, not at collection: horovod.tensorflow loaded before torch's
    modules are collected (tests/torch_backend) makes importing torch._dynamo segfault."""
    from tf_backend.backend import TensorFlowBackend
    return TensorFlowBackend


class TensorFlowFramework:
    name, cpu = "tensorflow", "cpu"
    worker_named = r"loader worker thread \d+"  # tf.data's map threads live in this process
    raw_loader = staticmethod(data.loader)

    @staticmethod
    def loader_worker(loader, batches):
        return object.__new__(backend_class()).loader_worker(loader, batches)

    @staticmethod
    def batch(images, labels):
        return tf.constant(images), tf.constant(labels)

    @staticmethod
    def ema_names(backend):
        return [v.path for v in backend.ema_sources()]

    @staticmethod
    def loader(batches, workers):
        for images, labels in data.loader(batches, workers):
            yield images.numpy(), labels.numpy()

    @staticmethod
    def backend_loader(batches, workers):
        """tf.data normalises inside the loader: what its Python workers handed over is what
        EpochBatches.read returned them (one worker: in order)."""
        handed, read = [], batches.read

        def spy(k, uint8=False):
            images, labels = read(k, uint8)
            handed.append(str(images.dtype))
            return images, labels

        batches.read = spy
        for images, _ in object.__new__(backend_class()).loader(batches, workers):
            yield images.numpy(), handed.pop(0)

    @staticmethod
    def loss_and_correct(targets, logits, smoothing):
        """TensorFlowBackend.loss and .sums themselves, on a stand-in for the built backend."""
        built = SimpleNamespace(smoothing=smoothing, num_classes=targets.shape[1])
        logits, targets = tf.constant(logits), tf.constant(targets)
        backend = backend_class()
        loss = backend.loss(built, targets, logits)
        sums = backend.sums(loss, logits, targets)
        return float(loss), int(sums.correct)


@pytest.fixture(scope="module")
def framework():
    return TensorFlowFramework()
