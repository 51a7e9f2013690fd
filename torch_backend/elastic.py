"""Horovod elastic state for the PyTorch backend (the retry loop is HorovodBackend.elastic_run).

Mirror: tf_backend/elastic.py. horovod.torch ships what is needed: TorchState snapshots the
model and optimizer on commit() and broadcasts them from rank 0 on sync(); the other
attributes (the core's progress) travel as pickled Python objects. A failed collective
raises HorovodInternalError itself, so the backend translates no errors for the retry loop.
"""
from __future__ import annotations

import horovod.torch as hvd


class TorchState(hvd.elastic.TorchState):
    def sync(self) -> None:
        # Horovod's optimizer broadcast takes a zero-gradient step on a worker whose optimizer
        # has no state yet (one that just joined); with weight decay that step moves its
        # weights, and TorchState broadcasts the weights *before* the optimizer, so the new
        # worker would train on weights no other rank has. Optimizer first, weights after.
        hvd.broadcast_optimizer_state(self.optimizer, root_rank=0)
        super().sync()


def make_state(model, optimizer, progress: dict) -> TorchState:
    state = TorchState(model=model, optimizer=optimizer, **progress)
    state.save()  # Horovod: a failure before the first commit rolls back to the start
    return state
