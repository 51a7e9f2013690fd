"""optimizer.lr=auto with the tensorflow backend, in process: the cases of tests/cases/lr_find.py."""
import pytest

from tests.cases.lr_find import *  # noqa: F401,F403 (the shared cases, collected here)


@pytest.fixture(scope="module")
def backend() -> str:
    return "tensorflow"
