"""training.zero on torch in one process: the cases of tests/cases/zero.py."""
import pytest

from tests.cases.zero import *  # noqa: F403 (the shared cases, collected here)
from tests.torch_backend.test_batches import TorchFramework


@pytest.fixture(scope="module")
def framework():
    return TorchFramework()
