import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# The tools/ scripts are not a package: make them importable for their unit tests.
sys.path.insert(0, str(REPO / "tools"))


def pytest_collection_finish(session):
    """No test module may load horovod.tensorflow when it is imported: loaded before torch, it
    makes a later import of torchvision crash the whole run (a segfault in collection, no test
    run). Import the TensorFlow backend inside the tests (tests/tf_backend/test_batches.py).
    (horovod.torch first is harmless: the torch tests import their backend at module level.)"""
    if "horovod.tensorflow" in sys.modules:
        raise RuntimeError("collecting the tests imported horovod.tensorflow: import it inside the test")
