"""Horovod elastic state and retry for the TensorFlow backend, on horovod.common.elastic.

Mirror: torch_backend/elastic.py. Horovod's Keras state helpers are written for Keras 2
(they broadcast Keras variables, which Keras 3 cannot assign through, see backend.py), so the
state here is an ObjectState that also snapshots the underlying tf.Variables of model and
optimizer. horovod.tensorflow.elastic.run would return None silently on a TensorFlow error
that is not Horovod's, so the retry wrapper is ours too.
"""
from __future__ import annotations

from typing import Any, Callable

import horovod.tensorflow as hvd
import tensorflow as tf
from horovod.common.elastic import ObjectState, run_fn
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


def _reset() -> None:
    hvd.shutdown()
    hvd.init()


def run(state, attempt: Callable[[Any], Any]) -> Any:
    """attempt(state) under Horovod's elastic loop: reset + restore/sync + call again after a
    failure or a host change. A failed collective surfaces from TensorFlow as an OpError
    naming a Horovod op; it becomes HorovodInternalError, what the loop recovers from."""
    def guarded(state):
        try:
            return attempt(state)
        except tf.errors.OpError as err:
            if "Horovod" in str(err):
                raise HorovodInternalError(err) from err
            raise

    return run_fn(guarded, _reset)(state)
