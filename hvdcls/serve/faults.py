"""Test-only hooks of the service (the training's are hvdcls.training.faults): a crash placed
exactly at a chosen instant, and a stand-in for horovodrun so that a test can start hundreds of
jobs. Each is inert unless its environment variable is set; nobody sets them outside tests.

    HVDCLS_TEST_SERVE_CRASH=POINT[:N]   the service SIGKILLs its own process group the Nth time
                                        (default the first) it reaches POINT, as a crash there
                                        would end it: one of CRASH_POINTS
    HVDCLS_TEST_SERVE_STANDIN=SCRIPT    the host-list executor runs `python SCRIPT RUN_DIR` in
                                        the job's wrapper instead of horovodrun and `hvdcls
                                        train` (the wrapper, its launch claim and its exit record
                                        stay real)

The environment is read once, at import: a restarted service is a new process, given its
own hooks.
"""
from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import Optional

CRASH = "HVDCLS_TEST_SERVE_CRASH"
STANDIN = "HVDCLS_TEST_SERVE_STANDIN"
CRASH_POINTS = (
    "submit",  # the job is in the table, its submitter not yet answered
    "launch",  # a queued job claimed (running, a launch id), nothing spawned yet
    "hand_over.prepared",  # its run directory written, nothing spawned yet
    "hand_over.started",  # the executor started it, its handle (pid, Slurm id) not yet recorded
    "resize",  # an elastic job told of its new slots, the table not yet changed
    "record_end",  # a job seen to end, its end not yet recorded
    "restart.abandoned",  # a restarted service abandoned a launch, the job not yet queued again
)


def _crash_plan() -> tuple[Optional[str], int]:
    value = os.environ.get(CRASH)
    if not value:
        return None, 0
    point, _, count = value.partition(":")
    assert point in CRASH_POINTS, f"{CRASH}={value}: POINT is one of {', '.join(CRASH_POINTS)}"
    return point, int(count or 1)


_POINT, _LEFT = _crash_plan()


def crash_point(point: str) -> None:
    """Where a test may crash the service (HVDCLS_TEST_SERVE_CRASH names the point)."""
    global _LEFT
    if point != _POINT:
        return
    _LEFT -= 1
    if _LEFT == 0:
        print(f"hvdcls: test hook: crashing at {point}", file=sys.stderr, flush=True)
        os.killpg(os.getpgid(0), signal.SIGKILL)


def standin(run_dir: Path) -> Optional[list[str]]:
    """The stand-in's command line for a job in `run_dir`, None when no test asked for one."""
    script = os.environ.get(STANDIN)
    return [sys.executable, script, str(run_dir)] if script else None
