"""PowerSGD's torch tensor operations: the cases of tests/cases/powersgd.py, and ResNet-50's
shapes as hvdcls.maths.powersgd lists them."""
import io

import numpy as np
import pytest
import torch
import torchvision

from hvdcls.config import PowerSGDConfig
from hvdcls.maths import powersgd
from tests.cases.powersgd import *  # noqa: F401,F403 (the shared cases, collected here)
from torch_backend import compression


class TorchOps:
    channels_last = False

    @staticmethod
    def orthogonalise(p):
        tensor = torch.from_numpy(p.copy())
        compression.orthogonalise_(tensor)
        return tensor.numpy()

    @staticmethod
    def reducer(shapes, settings):
        return compression.PowerSGDReducer(shapes, settings, torch.device("cpu"), compression.local_exchange())

    @staticmethod
    def reduce(reducer, grads):
        tensors = [torch.from_numpy(g.copy()) for g in grads]
        reducer.reduce_(tensors)
        return [t.numpy() for t in tensors]

    @staticmethod
    def errors(reducer):
        return {i: e.numpy() for i, e in reducer.errors.items()}

    @staticmethod
    def roundtrip(reducer, fresh):
        buffer = io.BytesIO()
        torch.save(reducer.state_dict(), buffer)
        buffer.seek(0)
        fresh.load_state_dict(torch.load(buffer, weights_only=True))


@pytest.fixture(scope="module")
def ops():
    return TorchOps()


def test_resnet50_shapes_are_torchvisions():
    model = torchvision.models.resnet50()
    assert powersgd.resnet50_shapes() == [tuple(p.shape) for p in model.parameters()]


def reducer_and_grads(seed_count: int = 3):
    shapes = [(16, 8, 3, 3), (16,), (10, 64)]
    settings = PowerSGDConfig(rank=2, start_iter=0)
    grads = [[torch.from_numpy(np.random.default_rng(seed).standard_normal(s).astype(np.float32))
              for s in shapes] for seed in range(seed_count)]
    return (lambda: compression.PowerSGDReducer(shapes, settings, torch.device("cpu"),
                                                compression.local_exchange())), grads


def test_a_loss_scale_scales_the_result_and_leaves_the_error_unscaled():
    """Mixed precision: gradients that carry a loss scale of 8 give 8x the unscaled step's
    result, and the error feedback the unscaled step's."""
    make, steps = reducer_and_grads()
    plain, scaled = make(), make()
    for grads in steps:
        one = [g.clone() for g in grads]
        eight = [g * 8 for g in grads]
        plain.reduce_(one)
        scaled.reduce_(eight, scale=8.0)
        for a, b in zip(one, eight):
            assert torch.allclose(b, a * 8, rtol=1e-5, atol=1e-5)
        for i in plain.compressed:
            assert torch.allclose(scaled.errors[i], plain.errors[i], rtol=1e-5, atol=1e-6)

