"""TensorFlow's tensor bytes for summary.json: the cases of tests/cases/memory.py."""
import pytest

from tests.cases.memory import *  # noqa: F401,F403 (the shared cases, collected here)
from tests.tf_backend.test_batches import TensorFlowFramework


@pytest.fixture(scope="module")
def framework():
    return TensorFlowFramework()
