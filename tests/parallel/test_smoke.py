"""Real Horovod under real launchers: 2 ranks, each backend, `horovodrun --gloo` and `mpirun`.

Every rank writes what it observed; the assertions hold on every rank: the collectives'
results, identical weights after a DistributedOptimizer / DistributedGradientTape step that
equals plain SGD on the mean gradient of all ranks' batches, and the controller in use.
"""
import pytest

from hvdcls.checks.smoke import launch_locally

pytestmark = pytest.mark.parallel
NP = 2
CONTROLLER = {"horovodrun": "gloo", "mpirun": "mpi"}


@pytest.mark.parametrize("launcher", ["horovodrun", "mpirun"])
@pytest.mark.parametrize("backend", ["torch", "tensorflow"])
def test_collectives_and_one_step_hold_on_every_rank(backend, launcher, tmp_path):
    run = launch_locally(backend, launcher, NP, tmp_path)
    assert run.returncode == 0, run.output[-4000:]
    assert sorted(r["rank"] for r in run.reports) == list(range(NP))
    for report in run.reports:
        failures = [c for c in report["checks"] if not c["ok"]]
        assert failures == [], f"rank {report['rank']}: {failures}"
        assert report["size"] == NP and report["backend"] == backend
        assert report["controller"] == CONTROLLER[launcher]
        assert report["spread_after_step"] == 0.0 and report["step_size"] > 0
    assert len({r["weights_sha256"] for r in run.reports}) == 1, "weights differ between ranks"
