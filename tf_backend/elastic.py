"""Horovod elastic state for the TensorFlow backend (the retry loop is HorovodBackend.elastic_run).

Mirror: torch_backend/elastic.py. Horovod's Keras state helpers are written for Keras 2
(they broadcast Keras variables, which Keras 3 cannot assign through, see backend.py), so the
state here is an ObjectState that also snapshots the underlying tf.Variables of model and
optimizer. A failed collective surfaces as a TensorFlow error, which collective_failures()
translates for the retry loop (horovod.tensorflow.elastic.run, which would do it, returns
None silently on a TensorFlow error that is not Horovod's, so the loop is the shared one).
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import horovod.tensorflow as hvd
import tensorflow as tf
from horovod.common.elastic import ObjectState
from horovod.common.exceptions import HorovodInternalError


class VariablesState(ObjectState):
    """Progress attributes + the values of `variables` (tf.Variables), saved on commit()."""

    def __init__(self, variables: list[tf.Variable], progress: dict):
        self._variables = variables
        self._values: list = []
        super().__init__(bcast_object=hvd.broadcast_object, get_rank=hvd.rank, **progress)
        self.save()  # Horovod: a failure before the first commit rolls back to the start

    def save(self) -> None:
        self._values = [v.numpy() for v in self._variables]
        super().save()

    def restore(self) -> None:
        for variable, value in zip(self._variables, self._values):
            variable.assign(value)
        super().restore()

    def sync(self) -> None:
        hvd.broadcast_variables(self._variables, root_rank=0)  # Horovod: rank 0's weights
        self._values = [v.numpy() for v in self._variables]  # a later restore returns here
        super().sync()


def make_state(variables: list[tf.Variable], progress: dict) -> VariablesState:
    return VariablesState(variables, progress)


@contextmanager
def collective_failures() -> Iterator[None]:
    """A failed collective surfaces from TensorFlow as an OpError naming a Horovod op; it
    becomes HorovodInternalError, what the elastic loop recovers from. Other errors pass."""
    try:
        yield
    except tf.errors.OpError as err:
        if "Horovod" in str(err):
            raise HorovodInternalError(err) from err
        raise
