"""Stalls under a real launcher, ended by every rank's watchdog (hvdcls.training.watchdog).

Under `horovodrun --gloo` Horovod 0.28.1's stall inspector does nothing: without the watchdog
these jobs hang for ever. Two faults, each made by a test hook (hvdcls.training.faults):

- rank 1's data read never returns (HVDCLS_TEST_STALL), inside one of its two loader workers
  (torch: a worker process, TensorFlow: a tf.data thread): it is alive and submits no tensor,
  like a deadlocked loader or a dead network mount. Its watchdog names it "reading data" and
  the worker holding the batch, and ends it with EXIT_STALLED; rank 0, told over the heartbeat
  channel, says it was waiting in the all-reduce and writes a summary.json naming rank 1; the
  job ends.
- rank 1 stops whole (HVDCLS_TEST_FREEZE: SIGSTOP, like a host that vanished): it cannot
  speak, so rank 0 names it from its missing heartbeats, and the message no longer blames a
  stall shutdown that did not happen.
"""
import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from hvdcls.launching import launch
from hvdcls.training import faults, watchdog

pytestmark = pytest.mark.parallel
REPO = Path(__file__).resolve().parents[2]
DIGITS = str(REPO / "configs" / "digits.yaml")
TIMEOUT = 8  # training.stall_timeout_seconds: tight, the digits' steps take milliseconds
# Start-up (imports, hvd.init, the first steps) on a busy 2-core machine, plus the timeout
# and its grace: a bound on a hang, not a measurement.
BOUND = 240


def launch_stalled(tmp_path: Path, backend: str, hook: dict,
                   *args: str) -> tuple[subprocess.CompletedProcess, str]:
    command = launch.hvdcls_command("train", "--backend", backend, "--config", DIGITS, "--epochs", "1",
                                    "schedule.warmup_epochs=0", "--output-dir", str(tmp_path / "run"),
                                    f"training.stall_timeout_seconds={TIMEOUT}", *args)
    env = {**launch.single_host_env(), **hook}
    started = time.monotonic()
    result = subprocess.run(launch.horovodrun(2, command), env=env, capture_output=True, text=True,
                            timeout=BOUND, cwd=tmp_path)
    print(f"{backend}: the stalled job ended after {time.monotonic() - started:.1f} s")
    return result, result.stdout + result.stderr


def watchdog_lines(output: str) -> list[str]:
    return [line for line in output.splitlines() if "hvdcls: watchdog:" in line]


def ranks_output(output: str) -> str:
    """What the ranks printed (horovodrun prefixes it "[1]<stderr>:"), not horovodrun's own
    traceback about a failed process."""
    return "\n".join(line for line in output.splitlines() if line.startswith("["))


@pytest.mark.parametrize("backend", ["torch", "tensorflow"])
def test_a_rank_stuck_reading_data_is_named_and_ends_the_job(backend, tmp_path):
    result, output = launch_stalled(tmp_path, backend, {faults.STALL: "1:3"}, "data.workers=2")
    assert result.returncode != 0, output[-3000:]
    assert "rank 1 stops submitting tensors: reading the data of step 3" in output  # the hook fired
    lines = watchdog_lines(output)
    stuck = [line for line in lines if "rank 1 (" in line and "no step for" in line]
    # Batch 3 of the epoch: DataLoader deals batches round robin, so worker 1 holds it.
    worker = r"loader worker 1, pid \d+" if backend == "torch" else r"loader worker thread \d+"
    assert stuck and re.search(rf"stuck reading data \(step 3, {worker}\)", stuck[0]), output[-3000:]
    # Rank 0 waits in step 3's all-reduce: torch marks it before synchronize(), TensorFlow's
    # compiled step once backward is done (TensorFlowBackend._backward_done).
    told = [line for line in lines if "stopped by its watchdog" in line]
    assert told and "rank 0 (" in told[0] and f"{watchdog.ALLREDUCE} (step 3)" in told[0], output[-3000:]
    assert f"Exit code: {watchdog.EXIT_STALLED}" in output, output[-3000:]
    # hvdcls-horovodrun hands the rank's status on, in one line without the launcher's traceback
    assert result.returncode == watchdog.EXIT_STALLED and "horovod/runner/gloo_run.py" not in output
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["stopped"]["by"] == "watchdog" and summary["stopped"]["rank"] == 1, summary
    assert summary["stopped"]["phase"] == watchdog.READING and summary["epochs_done"] == 0
    assert re.fullmatch(worker, summary["stopped"]["detail"]), summary["stopped"]
    print("\n".join(lines))
    assert "Traceback" not in ranks_output(output), output[-3000:]


def test_a_frozen_rank_is_named_from_its_missing_heartbeats(tmp_path):
    """SIGSTOP: rank 1 cannot speak. A watchdog timeout above Gloo's receive timeout (cut to
    12 s) makes Gloo's timeout end the job: rank 0's message names rank 1 all the same."""
    pid_file = tmp_path / "frozen.pid"
    hook = {faults.FREEZE: f"1:5:{pid_file}", "HOROVOD_GLOO_TIMEOUT_SECONDS": "12"}
    try:
        result, output = launch_stalled(tmp_path, "torch", hook, "training.stall_timeout_seconds=60")
    finally:
        if pid_file.exists():  # horovodrun kills it; make sure, a stopped process lingers
            try:
                os.kill(int(pid_file.read_text()), signal.SIGKILL)
            except ProcessLookupError:
                pass
    assert pid_file.exists(), output[-3000:]  # the hook fired
    assert result.returncode != 0, output[-3000:]
    stopped = [line for line in output.splitlines()
               if "hvdcls: error: rank 0: Horovod shut the job down" in line]
    assert len(stopped) == 1, output[-3000:]
    assert "rank 1 (" in stopped[0] and "no heartbeat for" in stopped[0], stopped[0]
    assert "(last: " in stopped[0], stopped[0]
    assert "stall_shutdown_seconds" not in output and "stall inspector" not in stopped[0]
    assert any("rank 1 (" in line and "no heartbeat for" in line for line in watchdog_lines(output))
    print("\n".join(watchdog_lines(output) + stopped))
    assert "Traceback" not in ranks_output(output), output[-3000:]
