"""`hvdcls train --backend torch` end to end, one plain process: the cases of tests/cases/train.py."""
import pytest

from tests.cases.train import *  # noqa: F401,F403 (the shared cases, collected here)


@pytest.fixture(scope="module")
def backend() -> str:
    return "torch"
