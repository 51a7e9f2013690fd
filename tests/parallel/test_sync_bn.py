"""horovod.sync_bn under horovodrun -np 2: each rank normalises half a batch, and must get
exactly what plain batch norm gives on the whole batch (outputs, gradients, running stats)."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from hvdcls import launch
from tests.parallel.test_train import NP, REPO

pytestmark = pytest.mark.parallel
TOLERANCE = 1e-5  # float32, summed in another order


def run_probe(module: str, backend: str, out: Path) -> None:
    """`python -m module BACKEND OUT` on NP ranks under horovodrun; it must succeed."""
    cmd, env = launch.local_job("horovodrun", NP, [sys.executable, "-m", module, backend, str(out)])
    result = subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]


@pytest.mark.parametrize("backend", ["torch", "tensorflow"])
def test_sync_bn_over_two_halves_equals_batch_norm_over_the_whole(backend, tmp_path):
    run_probe("tests.parallel.sync_bn_probe", backend, tmp_path)
    reports = [json.loads(p.read_text()) for p in sorted(tmp_path.glob("rank-*.json"))]
    assert [r["rank"] for r in reports] == list(range(NP))
    for report in reports:
        for key in ("output", "input_grad", "gamma_grad", "running_mean"):
            assert report[key] < TOLERANCE, (report["rank"], key, report[key])
        # torch keeps the unbiased running variance and so does ours; Keras keeps the biased one
        assert report["running_var"] < TOLERANCE, (report["rank"], report["running_var"])
