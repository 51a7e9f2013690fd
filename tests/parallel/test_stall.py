"""Stalls under a real launcher: one rank stops submitting tensors (the HVDCLS_TEST_STALL hook)
and the job must end, non-zero, within horovod.stall_shutdown_seconds, naming the rank.

Run under mpirun: with Horovod 0.28.1 the stall inspector reports and shuts down under the MPI
controller, while under Gloo it was seen to stay silent (docs/elastic-and-reliability.md, "Stalls").
"""
import subprocess
import time
from pathlib import Path

import pytest

from hvdcls import launch
from hvdcls.training import faults

pytestmark = pytest.mark.parallel
REPO = Path(__file__).resolve().parents[2]
DIGITS = str(REPO / "configs" / "digits.yaml")
CHECK, SHUTDOWN = 2, 6
# Start-up (imports, hvd.init, the first steps) on a busy 2-core machine, plus the shutdown
# time: a bound on a hang, not a measurement.
BOUND = 240


@pytest.mark.parametrize("backend", ["torch", "tensorflow"])
def test_a_rank_that_stops_submitting_ends_the_job_naming_it(backend, tmp_path):
    command = launch.hvdcls_command("train", "--backend", backend, "--config", DIGITS, "--epochs", "1",
                                    "schedule.warmup_epochs=0", "--output-dir", str(tmp_path / "run"),
                                    f"horovod.stall_check_seconds={CHECK}",
                                    f"horovod.stall_shutdown_seconds={SHUTDOWN}")
    env = {**launch.single_host_env(), faults.STALL: "1:3"}
    cmd = launch.mpirun(2, command, env=env, extra_env=(faults.STALL,))
    started = time.monotonic()
    result = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=BOUND, cwd=tmp_path)
    output = result.stdout + result.stderr
    assert result.returncode != 0, output[-3000:]
    assert "rank 1 stops submitting tensors before step 3" in output  # the hook did fire
    assert "Missing ranks:\n1!:" in output, output[-3000:]  # Horovod's report names rank 1
    stopped = [line for line in output.splitlines() if "hvdcls: error: rank 0: Horovod shut the job down" in line]
    assert len(stopped) == 1, output[-3000:]
    assert f"horovod.stall_shutdown_seconds={SHUTDOWN}" in stopped[0]
    assert "Traceback" not in output, output[-3000:]
    print(f"{backend}: stalled job ended after {time.monotonic() - started:.1f} s")
