import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# The tools/ scripts are not a package: make them importable for their unit tests.
sys.path.insert(0, str(REPO / "tools"))


def pytest_collection_finish(session):
    """No test module may load a Horovod binding when it is imported: horovod.tensorflow loaded
    before torch makes a later import of torchvision crash the whole run (a segfault in
    collection, no test run). Import backends inside the tests (tests/tf_backend/test_batches.py)."""
    loaded = sorted(name for name in ("horovod.tensorflow", "horovod.torch") if name in sys.modules)
    if loaded:
        raise RuntimeError(f"collecting the tests imported {', '.join(loaded)}: import it inside the test")
