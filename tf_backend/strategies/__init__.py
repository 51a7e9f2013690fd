"""The reduction strategies of the TensorFlow backend (hvdcls.strategy's interface and registry).

Mirror: torch_backend/strategies/. One module per mode, the same names: plain (adasum beside it),
powersgd, zero. A strategy is built with its host, the backend, and asks of it only: `model`,
`trained` (the variables the step differentiates), `loss_scaled`, `l2`, `clip`, `optimizer` (its
loss scale) and `apply_update(grads)` (once the gradients are exchanged). Horovod sees Keras
3's variables as the tf.Variables under them (`tf_variables`).
"""
from __future__ import annotations

import numpy as np
import tensorflow as tf


def tf_variables(variables) -> list[tf.Variable]:
    """Keras 3 variables -> the tf.Variables Horovod can broadcast and differentiate."""
    return [v.value for v in variables]


def variable_bytes(variables) -> int:
    return sum(int(np.prod(v.shape)) * tf.as_dtype(v.dtype).size for v in variables)


def check_count(path, stored: dict, prefix: str, count: int) -> None:
    """A checkpoint's `prefix/i` arrays are as many as the configured model's (or optimizer's)."""
    from hvdcls.errors import UserError

    names = [k for k in stored if k.startswith(prefix + "/")]
    if len(names) != count:
        raise UserError(f"cannot load {path}: it holds {len(names)} {prefix} variables, "
                        f"the configured {prefix} has {count}")


SHARDED_PARAMETERS = "zero3"  # a checkpoint's key where training.zero=3 left its parameters in shard files


def refuse_sharded_parameters(path, stored: dict) -> None:
    """A checkpoint whose parameters are in training.zero=3's per-rank shard files: one line."""
    from hvdcls.errors import UserError

    if SHARDED_PARAMETERS in stored:
        raise UserError(f"cannot load {path}: its parameters are in training.zero=3's per-rank shard files; "
                        "resume it with training.zero=3")
