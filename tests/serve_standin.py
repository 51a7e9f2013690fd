"""A stand-in for `horovodrun ... hvdcls train` in the service's tests: `python serve_standin.py
RUN_DIR`, run inside the job's real wrapper when the service is given HVDCLS_TEST_SERVE_STANDIN
(hvdcls/serve/faults.py), so that a test can start hundreds of jobs in the time of a few.

It writes what a test counts, appended in one write each (O_APPEND) to RUN_DIR/standin.log:

    start PID TIME        first thing, once per start of the job's training
    end 0|143 TIME        when it finishes (status.json says done) or is stopped by SIGTERM

and keeps RUN_DIR/status.json as a run's rank 0 would (a step every STEP_SECONDS). It runs
`training.epochs` x STEPS_PER_EPOCH steps (the spec's override; default 2 epochs); a job named
`fail` exits 3 at the end instead.
"""
import json
import os
import signal
import sys
import time
from pathlib import Path

STEP_SECONDS, STEPS_PER_EPOCH = 0.1, 5
LOG = "standin.log"


def note(run_dir: Path, line: str) -> None:
    fd = os.open(run_dir / LOG, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{line} {time.time():.6f}\n".encode())
    finally:
        os.close(fd)


def write_status(run_dir: Path, **fields) -> None:
    temporary = run_dir / f".status.{os.getpid()}.tmp"
    temporary.write_text(json.dumps({**fields, "updated_at": time.time(), "version": 1}))
    os.replace(temporary, run_dir / "status.json")


def epochs(spec: dict) -> int:
    for override in spec.get("overrides") or []:
        key, _, value = override.partition("=")
        if key == "training.epochs":
            return int(value)
    return 2


def main(run_dir: Path) -> int:
    signal.signal(signal.SIGTERM, lambda *_: (note(run_dir, "end 143"), os._exit(143)))
    note(run_dir, f"start {os.getpid()}")
    spec = json.loads((run_dir / "spec.json").read_text())
    total, began = epochs(spec) * STEPS_PER_EPOCH, time.time()
    for step in range(1, total + 1):
        time.sleep(STEP_SECONDS)
        now = time.time()
        write_status(run_dir, phase="training", phase_since=began, last_step_at=now,
                     epoch=(step - 1) // STEPS_PER_EPOCH + 1, epochs=epochs(spec), step=step,
                     steps_per_epoch=STEPS_PER_EPOCH, fraction=step / total)
    write_status(run_dir, phase="done", phase_since=time.time(), last_step_at=time.time(), fraction=1.0)
    code = 3 if spec.get("name") == "fail" else 0
    note(run_dir, f"end {code}")
    return code


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
