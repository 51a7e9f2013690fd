"""hvdcls checkpoint consolidate on torch in one process: the case of tests/cases/consolidate.py."""
import pytest

from tests.cases.consolidate import *  # noqa: F403 (the shared case, collected here)
from tests.torch_backend.test_batches import TorchFramework


@pytest.fixture(scope="module")
def framework():
    return TorchFramework()
