"""horovod.sync_bn under horovodrun -np 2: each rank normalises half a batch, and must get
exactly what plain batch norm gives on the whole batch (outputs, gradients, running stats)."""
import json

import pytest

from tests.parallel.test_train import NP

pytestmark = pytest.mark.parallel
TOLERANCE = 1e-5  # float32, summed in another order


@pytest.mark.parametrize("backend", ["torch", "tensorflow"])
def test_sync_bn_over_two_halves_equals_batch_norm_over_the_whole(backend, probes):
    """sync_bn_probe.py's reports, from the launch it shares with test_balance's probe."""
    reports = [json.loads(p.read_text()) for p in sorted((probes(backend) / "sync_bn").glob("rank-*.json"))]
    assert [r["rank"] for r in reports] == list(range(NP))
    for report in reports:
        for key in ("output", "input_grad", "gamma_grad", "running_mean"):
            assert report[key] < TOLERANCE, (report["rank"], key, report[key])
        assert report["running_var"] < TOLERANCE, (report["rank"], report["running_var"])
