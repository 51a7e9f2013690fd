"""Fine-tuning for the TensorFlow backend: the frozen part (training.freeze_epochs), the
per-variable rates (optimizer.layer_decay) and the class-weighted loss (training.class_weights),
on hvdcls.finetune's rules.

Mirror: torch_backend/finetune.py. The head is what tf_backend/weights.py's head_variables finds.
Frozen means left out of the tape's sources: the step differentiates, all-reduces and applies
the head's variables alone (a new trace at the switch), so the optimizer neither decays nor
moves the rest, nor their slots. Keras' `layer.trainable = False` is not used: it would put
batch norm into inference mode, where torch (and timm, torchvision) keep it training. One
difference stays: Keras' Adam-type optimizers count steps per optimizer, not per variable as
torch's do, so an unfrozen variable's first bias correction is the optimizer's step count's.
A Keras optimizer has one rate; the layer-decay multipliers are each variable's, applied where
the rate is used (update_step, and AdamW's decoupled decay), as torch's param groups do.
"""
from __future__ import annotations

from typing import Optional, Sequence

import keras
import tensorflow as tf
from keras import ops

from hvdcls import finetune
from tf_backend.weights import head_variables


def head_flags(model: keras.Model) -> list[bool]:
    """For each of model.trainable_variables: whether it is the classifier head's."""
    heads = head_variables(model)
    return [v.path in heads for v in model.trainable_variables]


def trained_variables(model: keras.Model, frozen: bool) -> list:
    """What the step differentiates: every trainable variable, or (frozen) the head's."""
    if not frozen:
        return list(model.trainable_variables)
    return [v for v, head in zip(model.trainable_variables, head_flags(model)) if head]


def variable_scales(model: keras.Model, model_name: str, decay: Optional[float]) -> Optional[list[float]]:
    """Each trainable variable's rate multiplier; None without layer decay."""
    if not finetune.decay_in_force(decay):
        return None
    names = [v.path for v in model.trainable_variables]
    return finetune.layer_scales(names, head_flags(model), model_name, decay)


class LayerRates(keras.optimizers.Optimizer):
    """Mixed in before a Keras optimizer class (with_layer_rates): variable i trains at the
    rate x lr_scales[i]."""

    lr_scales: tuple[float, ...] = ()

    def _scaled(self, learning_rate, variable):
        scale = self.lr_scales[self._get_variable_index(variable)]
        return learning_rate if scale == 1.0 else learning_rate * scale

    def update_step(self, gradient, variable, learning_rate):
        return super().update_step(gradient, variable, self._scaled(learning_rate, variable))

    def _apply_weight_decay(self, variables):
        """AdamW's decoupled decay, each variable at its own rate (torch: its group's lr)."""
        if self.weight_decay is None:
            return
        for variable in variables:
            if self._use_weight_decay(variable):
                lr = self._scaled(ops.cast(self.learning_rate, variable.dtype), variable)
                variable.assign_sub(variable * ops.cast(self.weight_decay, variable.dtype) * lr)


def with_layer_rates(optimizer_class: type, scales: Sequence[float]) -> type:
    """`optimizer_class` whose update of variable i (in the order it is built on) is at
    rate x scales[i]."""
    return type(f"LayerRate{optimizer_class.__name__}", (LayerRates, optimizer_class),
                {"lr_scales": tuple(float(s) for s in scales)})


def weighted_cross_entropy(labels, logits, weights: Sequence[float], smoothing: float):
    """torch's CrossEntropyLoss(weight=w, label_smoothing=s) on class indices, mean reduction:
    [(1 - s) sum_i w[y_i] nll_i + s / C sum_i sum_c w[c] (-log p_ic)] / sum_i w[y_i]."""
    log_p = tf.nn.log_softmax(tf.cast(logits, tf.float32))
    w = tf.constant(list(weights), tf.float32)
    w_y = tf.gather(w, labels)
    total = tf.reduce_sum(w_y)
    nll = -tf.gather(log_p, tf.cast(labels, tf.int32), batch_dims=1)
    loss = (1.0 - smoothing) * tf.reduce_sum(w_y * nll) / total
    if smoothing:
        loss += smoothing / len(weights) * tf.reduce_sum(-log_p * w) / total
    return loss
