"""PowerSGD's torch tensor operations: the cases of tests/cases/powersgd.py, and ResNet-50's
shapes as hvdcls.powersgd lists them."""
import io

import numpy as np
import pytest
import torch
import torchvision

from hvdcls import powersgd
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
