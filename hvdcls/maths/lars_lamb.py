"""LARS and LAMB, the layer-wise adaptive optimizers (optimizer.name=lars|lamb): the rules both
backends follow, and a NumPy reference of one step that their unit tests compare against.

Both scale each layer's step by a trust ratio, ||w|| / ||update||, so that every layer moves by
about the same fraction of its weights whatever its gradient's size: what lets the learning
rate grow with very large global batches (You et al. 2017, 2019).

LARS (You, Gitman, Ginsburg 2017, "Large Batch Training of Convolutional Networks", Alg. 1),
with momentum m, weight decay b, trust coefficient eta and the schedule's rate lr:
    u = g + b w;  ratio = eta ||w|| / ||u||;  v = m v + lr ratio u;  w = w - v
(nesterov: w = w - (m v + lr ratio u)). The paper writes the denominator ||g|| + b ||w||, an
upper bound of ||g + b w||; we take the norm of the update itself, as TensorFlow's reference
LARS (tensorflow/models, used by SimCLR) and NVIDIA's do, so the ratio is ||w|| / ||update||.

LAMB (You et al. 2019, "Large Batch Optimization for Deep Learning: Training BERT in 76
minutes", Alg. 2), Adam's moments with bias correction at step t (1-based):
    m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2
    r = (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps)
    u = r + b w;  ratio = phi(||w||) / ||u||, phi the identity;  w = w - lr ratio u

Both papers exclude biases and normalisation weights (the 1-D parameters) from the trust ratio
and from weight decay: for those u = g (LARS: plain momentum SGD) or u = r (LAMB: Adam) and the
ratio is 1. A ratio whose either norm is 0 (a zero-initialised layer, a zero gradient) is 1.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import numpy as np

# LAMB's moments: Adam's betas (as optimizer.name=adam uses them) and the LAMB paper's epsilon.
LAMB_BETA1, LAMB_BETA2, LAMB_EPS = 0.9, 0.999, 1e-6


def adapted(ndim: int) -> bool:
    """Does a parameter of this rank get the trust ratio and weight decay? Not biases and
    normalisation scales and shifts (1-D, or a scalar): the papers' exclusion."""
    return ndim > 1


def trust_ratio(weight_norm: float, update_norm: float, coefficient: float = 1.0) -> float:
    """coefficient x ||w|| / ||u||, or 1 where either norm is 0."""
    if weight_norm > 0 and update_norm > 0:
        return coefficient * weight_norm / update_norm
    return 1.0


@dataclass
class ReferenceState:
    """One parameter's optimizer state in the reference: LARS's velocity, LAMB's moments."""
    velocity: Optional[np.ndarray] = None
    m: Optional[np.ndarray] = None
    v: Optional[np.ndarray] = None
    step: int = 0
    ratios: list = field(default_factory=list)  # the trust ratio of each step (1 when excluded)


def lars_step(w: np.ndarray, g: np.ndarray, state: ReferenceState, lr: float, momentum: float,
              weight_decay: float, coefficient: float, nesterov: bool = False) -> np.ndarray:
    """The weights after one LARS step (float64); `state` is updated in place."""
    w, g = np.asarray(w, np.float64), np.asarray(g, np.float64)
    ratio = 1.0
    update = g
    if adapted(w.ndim):
        update = g + weight_decay * w
        ratio = trust_ratio(float(np.linalg.norm(w)), float(np.linalg.norm(update)), coefficient)
    step = lr * ratio * update
    state.velocity = step if state.velocity is None else momentum * state.velocity + step
    state.ratios.append(ratio)
    return w - (momentum * state.velocity + step if nesterov else state.velocity)


def lamb_step(w: np.ndarray, g: np.ndarray, state: ReferenceState, lr: float,
              weight_decay: float) -> np.ndarray:
    """The weights after one LAMB step (float64); `state` is updated in place."""
    w, g = np.asarray(w, np.float64), np.asarray(g, np.float64)
    state.step += 1
    m = np.zeros_like(w) if state.m is None else state.m
    v = np.zeros_like(w) if state.v is None else state.v
    state.m = LAMB_BETA1 * m + (1 - LAMB_BETA1) * g
    state.v = LAMB_BETA2 * v + (1 - LAMB_BETA2) * g * g
    m_hat = state.m / (1 - LAMB_BETA1 ** state.step)
    v_hat = state.v / (1 - LAMB_BETA2 ** state.step)
    update = m_hat / (np.sqrt(v_hat) + LAMB_EPS)
    ratio = 1.0
    if adapted(w.ndim):
        update = update + weight_decay * w
        ratio = trust_ratio(float(np.linalg.norm(w)), float(np.linalg.norm(update)))
    state.ratios.append(ratio)
    return w - lr * ratio * update
