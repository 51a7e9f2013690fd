"""horovod.op=adasum: the plain strategy's optimizer with Horovod's Adasum, which combines the
weight updates inside step() itself (so no wait apart from the update).

Mirror: tf_backend/strategies/adasum.py.
"""
from __future__ import annotations

from typing import Optional

import horovod.torch as hvd

from torch_backend.strategies.plain import Plain


class Adasum(Plain):
    name = "adasum"
    op = hvd.Adasum

    def step(self, grads: Optional[list] = None) -> Optional[float]:
        self.host.unscale_and_clip()
        self.host.waiting_for_allreduce()
        self.host.scaler.step(self.optimizer)
        self.counter.add(self.step_bytes)
        return None  # inside step(), with the update: not separable
