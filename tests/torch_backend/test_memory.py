"""torch's tensor bytes for summary.json: the cases of tests/cases/memory.py; and the
activations a step keeps for backward (hvdcls bench's act MB)."""
import types

import pytest
import torch

from tests.cases.memory import *  # noqa: F401,F403 (the shared cases, collected here)
from tests.torch_backend.test_batches import TorchFramework
from torch_backend.backend import TorchBackend


@pytest.fixture(scope="module")
def framework():
    return TorchFramework()


def test_torch_counts_the_saved_activations_once_each_and_not_the_weights():
    host = types.SimpleNamespace(model=torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(),
                                                           torch.nn.Linear(32, 4)))
    x = torch.ones(10, 64)

    def step():
        host.model(x).sum().backward()

    saved = TorchBackend.saved_activation_bytes(host, step)
    # float32: the input (10x64) and ReLU's output (10x32), which ReLU and the second layer
    # both save (counted once); the weights the layers save too are not activations
    assert saved == 4 * (10 * 64 + 10 * 32)
