"""training.activation_checkpointing for the TensorFlow backend: tf.recompute_grad per encoder
block of the ViTs (tf_backend/vit.py), each block's activations recomputed in the backward
pass, only its input kept. keras.applications' ResNets are functional graphs with no block
boundary to wrap short of rebuilding them, so they, like every other model, are refused.

Mirror: torch_backend/recompute.py.
"""
from __future__ import annotations

import keras

from hvdcls.errors import UserError
from tf_backend.vit import EncoderBlock


def enable(model: keras.Model, name: str) -> keras.Model:
    """Recompute `model`'s encoder blocks (before the training step is traced; returns it); a
    model without them is a one-line UserError."""
    blocks = [layer for layer in model.layers if isinstance(layer, EncoderBlock)]
    if not blocks:
        raise UserError(f"training.activation_checkpointing=true: the tensorflow backend recomputes "
                        f"the ViTs' encoder blocks only, not model {name!r} (torch also does ResNets)")
    for block in blocks:
        block.recompute = True
    return model
