"""Fine-tuning with the torch backend, in process: the cases of tests/cases/finetune.py, and
how every rank comes to hold optimizer state for the same parameters before the broadcast."""
import numpy as np
import pytest
import torch

from tests.cases.finetune import *  # noqa: F403 (the shared cases, collected here)
from torch_backend import finetune as torch_finetune


class TorchFramework:
    name = "torch"

    @staticmethod
    def train_loss(backend, labels, logits):
        return float(backend.criterion(torch.from_numpy(logits), torch.from_numpy(labels)))

    @staticmethod
    def trainable(backend):
        return [p.detach().numpy().copy() for p in backend.model.parameters()]

    @staticmethod
    def untouched_state(backend, count):
        held = backend.optimizer.state
        return not any(p in held for p in list(backend.model.parameters())[:count])


@pytest.fixture(scope="module")
def framework():
    return TorchFramework()


def model_and_sgd():
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2))
    sgd = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=0.1)
    model(torch.ones(1, 3)).sum().backward()
    sgd.step()  # state for every parameter
    return model, sgd


def test_a_rank_takes_rank_0s_list_of_held_state_without_moving_a_weight(monkeypatch):
    """Rank 0 resumed a checkpoint of the unfrozen epochs (state for all), this rank was built
    frozen (state for the head): the entries it lacks are made, those rank 0 lacks dropped,
    and neither the weights nor the rates change; then Horovod's broadcast lines up."""
    model, sgd = model_and_sgd()
    params = list(model.parameters())
    for p in params[:2]:
        del sgd.state[p]  # the backbone's, as a frozen build holds it
    before = [p.detach().clone() for p in params]
    sent = []
    monkeypatch.setattr(torch_finetune.hvd, "broadcast_object",
                        lambda obj, root_rank, name: sent.append(obj) or [0, 1, 2])  # rank 0: 0..2
    torch_finetune.hold_state_like_root(sgd)
    assert sent == [[2, 3]]  # what this rank held
    assert [p in sgd.state for p in params] == [True, True, True, False]
    assert all(torch.equal(sgd.state[p]["momentum_buffer"], torch.zeros_like(p)) for p in params[:2])
    assert all(map(torch.equal, before, params)) and all(p.grad is not None for p in params)
    assert [(g["lr"], g["weight_decay"]) for g in sgd.param_groups] == [(0.1, 0.1)]


@pytest.mark.parametrize("name", ["adamw", "lamb"])
def test_made_state_has_the_shape_of_a_stepped_ones(name):
    from hvdcls import config
    from torch_backend.backend import make_optimizer

    model = torch.nn.Linear(3, 4)
    optimizer = make_optimizer(model.parameters(), config.load(overrides=[f"optimizer.name={name}"]))
    weights = [p.detach().clone() for p in model.parameters()]
    torch_finetune.make_state(optimizer, list(model.parameters()))
    assert all(map(torch.equal, weights, model.parameters()))
    for p in model.parameters():
        entry = optimizer.state[p]
        assert {"exp_avg", "exp_avg_sq"} <= set(entry) and int(np.asarray(entry["step"])) == 1
