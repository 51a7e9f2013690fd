"""LARS and LAMB as torch optimizers: the update rules of hvdcls.maths.lars_lamb (the formulas and
the NumPy reference the tests compare with), computed per parameter tensor (one layer's weight).

Mirror: tf_backend/optimizers.py. Horovod's DistributedOptimizer re-creates the optimizer's
class around it and calls its __init__ with the param groups alone, so every hyperparameter
has a default and lives in the groups; and each is a plain float or bool, which Horovod's
broadcast_optimizer_state knows how to send.
"""
from __future__ import annotations

import torch

from hvdcls.maths.lars_lamb import LAMB_BETA1, LAMB_BETA2, LAMB_EPS, adapted


def trust_ratio(weight: torch.Tensor, update: torch.Tensor, coefficient: float = 1.0) -> torch.Tensor:
    """coefficient x ||w|| / ||u||, or 1 where either norm is 0 (on the device: no sync)."""
    w_norm, u_norm = torch.linalg.vector_norm(weight), torch.linalg.vector_norm(update)
    ratio = coefficient * w_norm / u_norm
    return torch.where((w_norm > 0) & (u_norm > 0), ratio, torch.ones_like(ratio))


class LayerWise(torch.optim.Optimizer):
    """One update per parameter tensor: the trust ratio is a layer's, never a group's."""

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    self._update(p, p.grad.float(), group)
        return loss

    def _update(self, p: torch.Tensor, grad: torch.Tensor, group: dict) -> None:
        raise NotImplementedError


class LARS(LayerWise):
    def __init__(self, params, lr: float = 0.1, momentum: float = 0.9, weight_decay: float = 0.0,
                 trust_coefficient: float = 0.001, nesterov: bool = False):
        defaults = {"lr": lr, "momentum": momentum, "weight_decay": weight_decay,
                    "trust_coefficient": trust_coefficient, "nesterov": nesterov}
        super().__init__(params, defaults)

    def _update(self, p: torch.Tensor, grad: torch.Tensor, group: dict) -> None:
        weight = p.float()
        if adapted(p.ndim):
            update = grad.add(weight, alpha=group["weight_decay"])
            step = update.mul_(trust_ratio(weight, update, group["trust_coefficient"]) * group["lr"])
        else:  # biases and normalisation weights: momentum SGD, no decay
            step = grad.mul(group["lr"])
        state = self.state[p]
        if "momentum_buffer" not in state:
            state["momentum_buffer"] = torch.zeros_like(weight)
        velocity = state["momentum_buffer"]
        velocity.mul_(group["momentum"]).add_(step)
        moved = velocity.mul(group["momentum"]).add_(step) if group["nesterov"] else velocity
        p.sub_(moved.to(p.dtype))


class LAMB(LayerWise):
    def __init__(self, params, lr: float = 1e-3, weight_decay: float = 0.0,
                 beta1: float = LAMB_BETA1, beta2: float = LAMB_BETA2, eps: float = LAMB_EPS):
        defaults = {"lr": lr, "weight_decay": weight_decay, "beta1": beta1, "beta2": beta2, "eps": eps}
        super().__init__(params, defaults)

    def _update(self, p: torch.Tensor, grad: torch.Tensor, group: dict) -> None:
        weight = p.float()
        beta1, beta2 = group["beta1"], group["beta2"]
        state = self.state[p]
        if "step" not in state:
            state["step"] = 0
            state["exp_avg"] = torch.zeros_like(weight)
            state["exp_avg_sq"] = torch.zeros_like(weight)
        state["step"] += 1
        t = state["step"]
        m, v = state["exp_avg"], state["exp_avg_sq"]
        m.mul_(beta1).add_(grad, alpha=1 - beta1)
        v.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
        denominator = (v / (1 - beta2 ** t)).sqrt_().add_(group["eps"])
        update = (m / (1 - beta1 ** t)).div_(denominator)
        if adapted(p.ndim):
            update.add_(weight, alpha=group["weight_decay"])
            update.mul_(trust_ratio(weight, update))
        p.sub_(update.mul_(group["lr"]).to(p.dtype))
