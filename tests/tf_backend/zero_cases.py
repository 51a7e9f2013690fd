"""training.zero on TensorFlow in one process: the cases of tests/cases/zero.py and
tests/cases/consolidate.py (training.zero=3's checkpoint consolidated). Not collected
with the suite: tests/tf_backend/test_zero.py runs this file in a process of its own."""
import pytest

from tests.cases.consolidate import *  # noqa: F403
from tests.cases.zero import *  # noqa: F403 (the shared cases, collected here)
from tests.tf_backend.test_batches import TensorFlowFramework


@pytest.fixture(scope="module")
def framework():
    return TensorFlowFramework()
