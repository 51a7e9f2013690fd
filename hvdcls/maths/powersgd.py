"""PowerSGD gradient compression (Vogels et al., 2019): the framework-free half.

Each backend's `compression.py` runs the tensor operations; this module decides, once for
both, which gradients are compressed and as which matrix, draws the initial Q, counts the
bytes a step all-reduces, and holds a numpy reference of one step that the backends' tests
compare against.

One step for a gradient G viewed as an n x m matrix, with error feedback E and warm-start Q:

    M = G + E;  P = M Q;  P <- mean over ranks;  P <- orthonormal columns (Gram-Schmidt)
    Q = Mᵀ P;  Q <- mean over ranks;  G <- P Qᵀ;  E <- M - P Qᵀ

Only P (n x r) and Q (m x r) travel instead of G (n x m). Because both all-reduces are means,
the result depends on the ranks' mean of M only, so replacing every rank's E by the ranks'
mean E (done before a checkpoint) leaves training unchanged.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np

FLOAT32_BYTES = 4
FLOAT16_BYTES = 2
GRAM_SCHMIDT_EPS = 1e-8  # a zero column stays zero instead of dividing by zero


@dataclass(frozen=True)
class TensorPlan:
    """How one gradient travels: as P and Q (`matrix` set) or as itself."""

    shape: tuple
    matrix: Optional[tuple]  # (n, m) when compressed
    rank: int  # effective rank: min(rank, n, m); 0 when not compressed

    @property
    def compressed(self) -> bool:
        return self.matrix is not None

    @property
    def dims(self) -> tuple[int, int]:
        """(n, m) of a compressed gradient's matrix view."""
        if self.matrix is None:
            raise ValueError(f"a gradient of shape {self.shape} is not compressed")
        return self.matrix


def matrix_shape(shape: Sequence[int], channels_last: bool) -> tuple[int, int]:
    """The 2-D view of a weight: torch puts output channels first (out, in, kh, kw),
    Keras last (kh, kw, in, out); either way the output channels stay one axis."""
    if channels_last:
        return math.prod(shape[:-1]), shape[-1]
    return shape[0], math.prod(shape[1:])


def plan(shapes: Sequence[Sequence[int]], rank: int, min_compression_rate: float,
         channels_last: bool) -> list[TensorPlan]:
    """Compress a matrix or convolution gradient when n*m / (r*(n+m)) >= min_compression_rate;
    vectors (biases, norms) and small tensors go uncompressed."""
    plans = []
    for shape in shapes:
        shape = tuple(int(d) for d in shape)
        if len(shape) < 2:
            plans.append(TensorPlan(shape, None, 0))
            continue
        n, m = matrix_shape(shape, channels_last)
        r = min(rank, n, m)
        if n * m >= min_compression_rate * r * (n + m):
            plans.append(TensorPlan(shape, (n, m), r))
        else:
            plans.append(TensorPlan(shape, None, 0))
    return plans


def dense_bytes(shapes: Sequence[Sequence[int]], element_bytes: int = FLOAT32_BYTES) -> int:
    """What an uncompressed all-reduce of these gradients sends per step."""
    return sum(math.prod(shape) for shape in shapes) * element_bytes


def compressed_bytes(plans: Sequence[TensorPlan], pq_bytes: int = FLOAT32_BYTES,
                     element_bytes: int = FLOAT32_BYTES) -> int:
    """What a PowerSGD step sends once past start_iter: P and Q, plus the uncompressed rest."""
    total = 0
    for p in plans:
        if p.compressed:
            n, m = p.dims
            total += p.rank * (n + m) * pq_bytes
        else:
            total += math.prod(p.shape) * element_bytes
    return total


def communication(shapes: Sequence[Sequence[int]], compression: str, rank: int = 4,
                  min_compression_rate: float = 2.0, channels_last: bool = False,
                  pq_fp16: bool = False) -> dict:
    """Bytes one step all-reduces for a model's gradient shapes under `compression` (none,
    fp16, powersgd), against the uncompressed float32 baseline: what `hvdcls bench` reports."""
    dense = dense_bytes(shapes)
    if compression == "none":
        sent = dense
    elif compression == "fp16":
        sent = dense_bytes(shapes, FLOAT16_BYTES)
    else:
        plans = plan(shapes, rank, min_compression_rate, channels_last)
        sent = compressed_bytes(plans, FLOAT16_BYTES if pq_fp16 else FLOAT32_BYTES)
    return {"dense_bytes_per_step": dense, "bytes_per_step": sent,
            "compression_ratio": dense / sent if sent else None}


def initial_q(m: int, rank: int, index: int, seed: int = 0) -> np.ndarray:
    """The first Q of gradient `index` (m x rank, float32): the same on every rank and in
    both backends, so no broadcast is needed and the backends agree."""
    generator = np.random.default_rng([seed, index])
    return generator.standard_normal((m, rank)).astype(np.float32)


def orthogonalise(p: np.ndarray) -> np.ndarray:
    """Modified Gram-Schmidt over the columns (the backends do exactly this)."""
    p = p.copy()
    for i in range(p.shape[1]):
        column = p[:, i]
        column /= np.linalg.norm(column) + GRAM_SCHMIDT_EPS
        if i + 1 < p.shape[1]:
            rest = p[:, i + 1:]
            rest -= np.outer(column, column @ rest)
    return p


def reference_step(grad: np.ndarray, q: np.ndarray, error: np.ndarray):
    """One process's step in numpy: returns (sent approximation, new Q, new error)."""
    m = grad + error
    p = orthogonalise(m @ q)
    q = m.T @ p
    approx = p @ q.T
    return approx, q, m - approx


@dataclass
class ByteCounter:
    """Gradient bytes handed to Horovod, counted by a backend from the tensors it sends."""

    dense_per_step: int  # the uncompressed float32 baseline
    sent: int = 0
    steps: int = 0
    last_step: int = 0

    def add(self, step_bytes: int) -> None:
        self.sent += step_bytes
        self.steps += 1
        self.last_step = step_bytes

    def summary(self) -> dict:
        """bytes_per_step: the latest step (past start_iter: the steady state);
        mean_bytes_per_step: over every step counted; ratios against dense."""
        mean = self.sent / self.steps if self.steps else None
        return {"dense_bytes_per_step": self.dense_per_step, "bytes_per_step": self.last_step,
                "mean_bytes_per_step": mean, "sent_bytes": self.sent, "steps": self.steps,
                "compression_ratio": self.dense_per_step / self.last_step if self.last_step else None,
                "mean_compression_ratio": self.dense_per_step / mean if mean else None}


def resnet50_shapes(num_classes: int = 1000) -> list[tuple]:
    """ResNet-50's trainable parameter shapes (torchvision order and layout), to size its
    communication without building it."""
    shapes: list[tuple] = [(64, 3, 7, 7), (64,), (64,)]
    channels = 64
    for width, blocks in ((64, 3), (128, 4), (256, 6), (512, 3)):
        for block in range(blocks):
            inputs = channels
            for conv in ((width, inputs, 1, 1), (width, width, 3, 3), (width * 4, width, 1, 1)):
                shapes += [conv, (conv[0],), (conv[0],)]
            if block == 0:  # the projection shortcut
                shapes += [(width * 4, inputs, 1, 1), (width * 4,), (width * 4,)]
            channels = width * 4
    return shapes + [(num_classes, 2048), (num_classes,)]
