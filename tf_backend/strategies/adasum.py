"""horovod.op=adasum: the plain strategy's exchange with Horovod's Adasum in place of the average.

Mirror: torch_backend/strategies/adasum.py.
"""
from __future__ import annotations

import horovod.tensorflow as hvd

from tf_backend.strategies.plain import Plain


class Adasum(Plain):
    name = "adasum"
    op = hvd.Adasum
