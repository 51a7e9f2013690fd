"""What several parallel test modules share: the demo's own 2-rank run, trained once per backend
per session (test_train checks it; test_powersgd compares PowerSGD against it; test_monitor's
report compares the TensorFlow one with its torch run), and the probes' launch per backend
(test_balance and test_sync_bn read it)."""
import subprocess
import sys

import pytest

from hvdcls.launching import launch
from tests.parallel.test_train import NP, REPO, train

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


@pytest.fixture(scope="session")
def probes(tmp_path_factory):
    """probes(backend) -> the folder where one horovodrun -np NP launch of tests/parallel/probes.py
    left balance/rank-N.json and sync_bn/rank-N.json, launched on first use."""
    outs = {}

    def get(backend: str):
        if backend not in outs:
            out = tmp_path_factory.mktemp(f"probes-{backend}")
            cmd, env = launch.local_job("horovodrun", NP, [sys.executable, "-m", "tests.parallel.probes",
                                                           backend, str(out)])
            result = subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True, timeout=300)
            assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
            outs[backend] = out
        return outs[backend]

    return get
