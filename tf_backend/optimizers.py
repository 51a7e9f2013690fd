"""LARS and LAMB as Keras 3 optimizers: the update rules of hvdcls.maths.lars_lamb (the formulas and
the NumPy reference the tests compare with), computed per variable (one layer's weight).

Mirror: torch_backend/optimizers.py. Horovod averages the gradients before apply_gradients
(DistributedGradientTape, or the backend's own all-reduce), so these see the world's gradient
and every rank takes the same step. The weight decay is theirs, not the base class's
`weight_decay` (that one decays every variable, outside the trust ratio): the base is given
none, and the backend adds no L2 to the gradient for them.
"""
from __future__ import annotations

import math

import keras
from keras import ops

from hvdcls.maths.lars_lamb import LAMB_BETA1, LAMB_BETA2, LAMB_EPS, adapted


def bias_correction(beta: float, t):
    """1 - beta^t as -expm1(t log beta): in float32, 1 - 0.999^2 computed as written loses
    four digits to the subtraction (torch's optimizer takes it in Python's float64)."""
    return -ops.expm1(t * math.log(beta))


def norm(x):
    return ops.sqrt(ops.sum(ops.square(x)))


def trust_ratio(weight, update, coefficient: float = 1.0):
    """coefficient x ||w|| / ||u||, or 1 where either norm is 0."""
    w_norm, u_norm = norm(weight), norm(update)
    positive = ops.logical_and(w_norm > 0, u_norm > 0)
    return ops.where(positive, coefficient * w_norm / ops.where(positive, u_norm, 1.0), 1.0)


class LARS(keras.optimizers.Optimizer):
    def __init__(self, learning_rate=0.1, momentum: float = 0.9, weight_decay: float = 0.0,
                 trust_coefficient: float = 0.001, nesterov: bool = False, name: str = "lars", **kwargs):
        super().__init__(learning_rate=learning_rate, name=name, **kwargs)
        self.momentum, self.weight_decay_rate = momentum, weight_decay
        self.trust_coefficient, self.nesterov = trust_coefficient, nesterov

    def build(self, variables):
        if self.built:
            return
        super().build(variables)
        self.velocities = [self.add_variable_from_reference(v, "velocity") for v in variables]

    def update_step(self, gradient, variable, learning_rate):
        lr = ops.cast(learning_rate, variable.dtype)
        grad = ops.cast(gradient, variable.dtype)
        if adapted(len(variable.shape)):
            update = grad + self.weight_decay_rate * variable
            step = lr * trust_ratio(variable, update, self.trust_coefficient) * update
        else:  # biases and normalisation weights: momentum SGD, no decay
            step = lr * grad
        velocity = self.velocities[self._get_variable_index(variable)]
        self.assign(velocity, self.momentum * velocity + step)
        self.assign_sub(variable, self.momentum * velocity + step if self.nesterov else velocity)

    def get_config(self):
        return {**super().get_config(), "momentum": self.momentum, "weight_decay": self.weight_decay_rate,
                "trust_coefficient": self.trust_coefficient, "nesterov": self.nesterov}


class LAMB(keras.optimizers.Optimizer):
    def __init__(self, learning_rate=1e-3, weight_decay: float = 0.0, beta1: float = LAMB_BETA1,
                 beta2: float = LAMB_BETA2, eps: float = LAMB_EPS, name: str = "lamb", **kwargs):
        super().__init__(learning_rate=learning_rate, name=name, **kwargs)
        self.weight_decay_rate, self.beta1, self.beta2, self.eps = weight_decay, beta1, beta2, eps

    def build(self, variables):
        if self.built:
            return
        super().build(variables)
        self.moments = [self.add_variable_from_reference(v, "m") for v in variables]
        self.velocities = [self.add_variable_from_reference(v, "v") for v in variables]

    def update_step(self, gradient, variable, learning_rate):
        lr = ops.cast(learning_rate, variable.dtype)
        grad = ops.cast(gradient, variable.dtype)
        t = ops.cast(self.iterations + 1, variable.dtype)  # 1-based, as the bias correction wants
        index = self._get_variable_index(variable)
        m, v = self.moments[index], self.velocities[index]
        self.assign(m, self.beta1 * m + (1 - self.beta1) * grad)
        self.assign(v, self.beta2 * v + (1 - self.beta2) * ops.square(grad))
        m_hat = m / bias_correction(self.beta1, t)
        v_hat = v / bias_correction(self.beta2, t)
        update = m_hat / (ops.sqrt(v_hat) + self.eps)
        if adapted(len(variable.shape)):
            update = update + self.weight_decay_rate * variable
            update = trust_ratio(variable, update) * update
        self.assign_sub(variable, lr * update)

    def get_config(self):
        return {**super().get_config(), "weight_decay": self.weight_decay_rate, "beta1": self.beta1,
                "beta2": self.beta2, "eps": self.eps}
