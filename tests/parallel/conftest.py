"""What several parallel test modules share: the demo's own 2-rank run, trained once per backend
per session (test_train checks it; test_powersgd compares PowerSGD against it)."""
import pytest

from tests.parallel.test_train import NP, train


@pytest.fixture(scope="session")
def demo_run(tmp_path_factory):
    """demo_run(backend) -> the run directory of the demo's job (digits, 12 epochs, horovodrun
    -np 2, checkpoints 4, 8, 12 kept), trained on first use."""
    runs = {}

    def get(backend: str):
        if backend not in runs:
            out = tmp_path_factory.mktemp(f"digits-{backend}") / "run"
            train("horovodrun", NP, backend, out, "output.keep_checkpoints=3")
            runs[backend] = out
        return runs[backend]

    return get
