"""PowerSGD for TensorFlow gradients: the tensor operations of hvdcls/maths/powersgd.py.

Mirror: torch_backend/compression.py. `reduce(grads, scale, warmup)` runs inside the backend's
compiled step and returns the ranks' (compressed) average of the gradient list. Three grouped
Horovod all-reduces (the uncompressed gradients, all Ps, all Qs); the first has no data
dependency on P and Q, so TensorFlow's graph runs it while they are computed.
"""
from __future__ import annotations

from typing import Callable, Optional

import numpy as np
import tensorflow as tf

from hvdcls.config import PowerSGDConfig
from hvdcls.maths import powersgd

# (tensors, name) -> the ranks' averages, in order.
Exchange = Callable[[list, str], list]


def horovod_exchange() -> Exchange:
    import horovod.tensorflow as hvd

    def exchange(tensors: list, name: str) -> list:
        return hvd.grouped_allreduce(tensors, op=hvd.Average, name=name)  # Horovod

    return exchange


def local_exchange() -> Exchange:
    """One process, no Horovod: the average of one rank is itself."""
    return lambda tensors, name: list(tensors)


def orthogonalise(p: tf.Tensor) -> tf.Tensor:
    """Modified Gram-Schmidt over the columns (as powersgd.orthogonalise)."""
    columns: list = []
    for j in range(p.shape[1]):
        v = p[:, j:j + 1]
        for q in columns:
            v = v - q * tf.reduce_sum(q * v)
        columns.append(v / (tf.norm(v) + powersgd.GRAM_SCHMIDT_EPS))
    return tf.concat(columns, axis=1)


def nbytes(tensors: list) -> int:
    return sum(int(np.prod(t.shape)) * t.dtype.size for t in tensors)


def placed(grads: list, indices: list[int], values: list) -> list:
    """`grads` with grads[i] replaced by each value, in order."""
    out = list(grads)
    for i, value in zip(indices, values):
        out[i] = value
    return out


class PowerSGDReducer:
    """Error feedback and warm-start Q per compressed gradient (tf.Variables); `step` counts
    reductions, in Python: warm-up and compressed steps are two traces of the step."""

    def __init__(self, shapes: list[tuple], settings: PowerSGDConfig,
                 exchange: Optional[Exchange] = None):
        self.plans = powersgd.plan(shapes, settings.rank, settings.min_compression_rate,
                                   channels_last=True)
        self.start_iter, self.fp16 = settings.start_iter, settings.fp16
        self.exchange = exchange or horovod_exchange()
        self.compressed = [i for i, p in enumerate(self.plans) if p.compressed]
        self.dense = [i for i, p in enumerate(self.plans) if not p.compressed]
        self.qs = {i: tf.Variable(powersgd.initial_q(self.plans[i].dims[1], self.plans[i].rank, i),
                                  trainable=False, name=f"powersgd_q_{i}") for i in self.compressed}
        self.errors = {i: tf.Variable(tf.zeros(self.plans[i].dims), trainable=False,
                                      name=f"powersgd_error_{i}") for i in self.compressed}
        self.step = 0
        self.counter = powersgd.ByteCounter(powersgd.dense_bytes(shapes))
        self.traced_bytes: dict[bool, int] = {}  # warmup? -> bytes one step sends, from the trace

    @property
    def warmup(self) -> bool:
        """Whether the next step all-reduces plainly (the first start_iter steps)."""
        return self.step < self.start_iter

    def reduce(self, grads: list, scale=1.0, warmup: bool = False) -> list:
        """The ranks' average of `grads`. `scale` is the loss scale they carry (mixed
        precision): the error feedback is kept unscaled, so a new scale does not skew it. A
        None (a frozen variable's, training.freeze_epochs) takes no part and comes back None;
        the bytes counted are the last trace's (a switch traces the step anew)."""
        grads = [None if g is None else tf.convert_to_tensor(g) for g in grads]
        if warmup:  # the plain average of every live gradient
            live = [i for i, g in enumerate(grads) if g is not None]
            self.traced_bytes[True] = nbytes([grads[i] for i in live])
            return placed(grads, live, self.exchange([grads[i] for i in live], "powersgd.warmup"))
        dense = [i for i in self.dense if grads[i] is not None]
        averaged = self.exchange([grads[i] for i in dense], "powersgd.dense") if dense else []
        compressed = [i for i in self.compressed if grads[i] is not None]
        approximations, sent = self._compress(grads, compressed, scale)
        self.traced_bytes[False] = nbytes([grads[i] for i in dense]) + sent
        return placed(grads, dense + compressed, averaged + approximations)

    def _compress(self, grads: list, indices: list[int], scale) -> tuple[list, int]:
        """The ranks' rank-r approximation of each compressed gradient i in `indices`."""
        if not indices:
            return [], 0
        ms = [tf.reshape(grads[i], self.plans[i].dims) + self.errors[i] * scale for i in indices]
        ps, sent_p = self._allreduce([m @ self.qs[i] for m, i in zip(ms, indices)], "powersgd.p")
        ps = [orthogonalise(p) for p in ps]
        qs, sent_q = self._allreduce([tf.transpose(m) @ p for m, p in zip(ms, ps)], "powersgd.q")
        out = []
        for i, m, p, q in zip(indices, ms, ps, qs):
            approx = p @ tf.transpose(q)
            # An overflowed fp16 step keeps the error and the warm start (a NaN Q would make
            # every later step NaN too)
            finite = tf.reduce_all(tf.math.is_finite(approx))
            self.qs[i].assign(tf.where(finite, q, self.qs[i]))
            self.errors[i].assign(tf.where(finite, (m - approx) / scale, self.errors[i]))
            out.append(tf.reshape(approx, self.plans[i].shape))
        return out, sent_p + sent_q

    def _allreduce(self, tensors: list, name: str) -> tuple[list, int]:
        """The ranks' averages (float32), sent in float16 when so configured; and bytes sent."""
        sent = [tf.cast(t, tf.float16) for t in tensors] if self.fp16 else tensors
        return [tf.cast(t, tf.float32) for t in self.exchange(sent, name)], nbytes(sent)

    def count(self, warmup: bool) -> None:
        """After a compiled step ran: count its bytes, advance the step."""
        self.counter.add(self.traced_bytes[warmup])
        self.step += 1

    def average_errors(self) -> None:
        """Every rank's error <- the ranks' mean error: what a checkpoint keeps. Training does
        not change (only the mean error enters the averaged M)."""
        if self.compressed:
            errors = [self.errors[i] for i in self.compressed]
            for variable, value in zip(errors, self.exchange([e.value() for e in errors], "powersgd.errors")):
                variable.assign(value)

    def state_arrays(self) -> dict[str, np.ndarray]:
        arrays = {"powersgd/step": np.array(self.step)}
        for k, i in enumerate(self.compressed):
            arrays[f"powersgd/q/{k}"] = self.qs[i].numpy()
            arrays[f"powersgd/error/{k}"] = self.errors[i].numpy()
        return arrays

    def load_arrays(self, arrays: dict) -> None:
        stored = len([key for key in arrays if key.startswith("powersgd/q/")])
        if stored != len(self.compressed):
            raise ValueError(f"PowerSGD state for {stored} compressed tensors, "
                             f"the model has {len(self.compressed)}")
        self.step = int(arrays["powersgd/step"])
        for k, i in enumerate(self.compressed):
            self.qs[i].assign(arrays[f"powersgd/q/{k}"])
            self.errors[i].assign(arrays[f"powersgd/error/{k}"])

    def state_variables(self) -> list[tf.Variable]:
        """Q and error variables, for Horovod's broadcast."""
        return [self.qs[i] for i in self.compressed] + [self.errors[i] for i in self.compressed]
