"""LARS and LAMB as torch optimizers: the cases of tests/cases/optimizers.py, and Horovod's
DistributedOptimizer around them (one process)."""
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.cases.optimizers import *  # noqa: F401,F403 (the shared cases, collected here)
from tests.cases.optimizers import gradients, settings, weights
from torch_backend.backend import make_optimizer

REPO = Path(__file__).resolve().parents[2]


def parameters(values: dict) -> dict[str, torch.nn.Parameter]:
    return {k: torch.nn.Parameter(torch.tensor(w)) for k, w in values.items()}


def step(optimizer, params: dict, grads: dict) -> None:
    for key, p in params.items():
        p.grad = torch.tensor(grads[key])
    optimizer.step()


class TorchOptimizerOps:
    @staticmethod
    def steps(config, values, grads):
        params = parameters(values)
        optimizer = make_optimizer(list(params.values()), config)
        for g in grads:
            step(optimizer, params, g)
        return {k: p.detach().numpy() for k, p in params.items()}


@pytest.fixture(scope="module")
def optimizer_ops():
    return TorchOptimizerOps()


def distributed_steps_match_plain(name: str) -> None:
    """DistributedOptimizer re-creates the class from the param groups alone, and
    broadcast_optimizer_state sends the groups' settings and the state: the steps after it
    are the plain optimizer's. Needs hvd.init(): run in a process of its own."""
    import horovod.torch as hvd

    hvd.init()
    config = settings(name)
    plain, wrapped = parameters(weights()), parameters(weights())
    reference = make_optimizer(list(plain.values()), config)
    distributed = hvd.DistributedOptimizer(make_optimizer(list(wrapped.values()), config),
                                           named_parameters=list(wrapped.items()))
    hvd.broadcast_optimizer_state(distributed, root_rank=0)  # a zero-gradient step on each
    for p in plain.values():  # the same zero-gradient step for the plain one
        p.grad = torch.zeros_like(p)
    reference.step()
    for g in gradients():
        step(reference, plain, g)
        step(distributed, wrapped, g)
    for key in plain:
        np.testing.assert_allclose(wrapped[key].detach().numpy(), plain[key].detach().numpy(),
                                   rtol=1e-6, atol=1e-7, err_msg=key)
    assert distributed.state_dict()["param_groups"][0]["lr"] == config.optimizer.lr


def test_horovods_distributed_optimizer_rebuilds_and_broadcasts_them():
    """One plain process (no launcher), apart from pytest's: hvd.init() stays out of it."""
    code = ("from tests.torch_backend.test_optimizers import distributed_steps_match_plain as check\n"
            "check('lars'); check('lamb')")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
