"""training.compile for the TensorFlow backend: XLA (jit_compile) for the gradient step.

Mirror: torch_backend/compiled.py. XLA cannot compile Horovod's all-reduce (a custom op with no
XLA kernel on the CPU), so what is compiled is the forward and backward pass that yields the
local gradients, a function the step's plain tf.function calls; the all-reduce and the update
follow it in that graph. The cost: the all-reduce no longer overlaps backward, it starts when
every gradient exists.
"""
from __future__ import annotations

import tensorflow as tf

from hvdcls.config import Config
from hvdcls.errors import UserError


def refuse_what_breaks(config: Config) -> None:
    """The settings XLA cannot compile, refused before anything is built; one line."""
    if config.training.compile and config.horovod.sync_bn:
        # tf_backend.sync_bn all-reduces the batch moments inside the model's forward pass
        raise UserError("config training.compile=true with horovod.sync_bn=true: the tensorflow "
                        "backend's synchronised batch norm all-reduces inside the model, and XLA "
                        "cannot compile Horovod's all-reduce; use one or the other")


def gradient_step(function, jit: bool):
    """`function` as the backend's traced step; XLA-compiled when training.compile is set (each
    new batch shape compiles once more: a short last batch of an epoch costs one compile)."""
    return tf.function(function, reduce_retracing=True, jit_compile=True if jit else None)
