"""What several parallel test modules share: the demo's own 2-rank run, trained once per backend
per session (test_train checks it; test_powersgd compares PowerSGD against it)."""
import pytest

from tests.parallel.test_train import NP, train

DEMO_STALL_TIMEOUT = 30  # s; the default is 600


@pytest.fixture(scope="session")
def demo_run(tmp_path_factory):
    """demo_run(backend) -> the run directory of the demo's job (digits, 12 epochs, horovodrun
    -np 2, checkpoints 4, 8, 12 kept, a 30 s stall timeout), trained on first use."""
    runs = {}

    def get(backend: str):
        if backend not in runs:
            out = tmp_path_factory.mktemp(f"digits-{backend}") / "run"
            # A tight but sufficient watchdog timeout: a normal run is never stopped by it.
            train("horovodrun", NP, backend, out, "output.keep_checkpoints=3",
                  f"training.stall_timeout_seconds={DEMO_STALL_TIMEOUT}")
            runs[backend] = out
        return runs[backend]

    return get
