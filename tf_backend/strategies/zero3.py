"""training.zero=3 on TensorFlow: a refusal, one line, before anything is built (tf_backend/zero3.py).

Mirror: torch_backend/strategies/zero3.py.
"""
from __future__ import annotations

from typing import Any

from tf_backend import zero3


class Zero3:
    name = "zero3"

    def __init__(self, *args: Any, **kwargs: Any):
        zero3.refuse()
