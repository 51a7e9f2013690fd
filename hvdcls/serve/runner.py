"""One job's run directory, the same under every executor.

    RUN_DIR/spec.json         the spec as submitted
    RUN_DIR/job.yaml          the validated config it runs with (`hvdcls train --config`)
    RUN_DIR/hostfile          the host list: its allocation, one `host slots=N` line per host
    RUN_DIR/discover.sh       elastic jobs: Horovod's discovery script, printing ...
    RUN_DIR/allocation        ... the job's current slots (HOST:SLOTS lines): the service
                              rewrites it to shrink or grow a job on the host list; under
                              Slurm the batch script writes what it found in its allocation
    RUN_DIR/stdout.log        horovodrun's output: every rank's lines
    RUN_DIR/stderr.log
    RUN_DIR/exit_status.json  written by the wrapper when horovodrun ends (naming its launch)
    RUN_DIR/launches/ID.json  each launch's claim: the wrapper's pid, or abandoned by a
                              restarted service (hvdcls.serve.launches)
    RUN_DIR/status.json       rank 0's own account of the run (hvdcls.files.status_file): phase,
                              progress, last epoch's metrics, world, metrics endpoint
    RUN_DIR/metrics.jsonl, summary.json, checkpoints/, ...   what `hvdcls train` writes

Every executor runs `python -m hvdcls.serve.wrapper RUN_DIR -- horovodrun ... hvdcls train
--config RUN_DIR/job.yaml`; the wrapper's exit_status.json tells how it ended, status.json how
far it got. The service reads a job's state from those two files only; its output is shown to
people (logs, the last lines of a failure), never parsed for state.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Optional

from hvdcls.errors import UserError
from hvdcls.files import status_file
from hvdcls.files.fileio import write_atomic, write_json_atomic
from hvdcls.launching import launch
from hvdcls.serve.scheduler import parse_hosts

if TYPE_CHECKING:
    from hvdcls import config as cfg
    from hvdcls.serve.store import Job

SPEC, JOB_CONFIG, HOSTFILE = "spec.json", "job.yaml", "hostfile"
DISCOVERY, ALLOCATION = "discover.sh", "allocation"
STDOUT, STDERR, EXIT = "stdout.log", "stderr.log", "exit_status.json"
# A checkpoint as hvdcls.training.checkpoint writes it (the service does not import training).
CHECKPOINTS = "checkpoints/epoch-*/state.json"


def directory(job: "Job") -> Path:
    """The job's run directory: every job an executor was given has one."""
    assert job.run_dir is not None, f"job {job.id} has no run directory"
    return Path(job.run_dir)


def prepare(run_dir: Path, spec: dict, config: "cfg.Config") -> None:
    """The files every executor's job starts from; a previous attempt's end and status go, so
    that neither is taken for this attempt's."""
    from hvdcls import config as cfg  # here: the wrapper imports this module, and must start fast

    run_dir.mkdir(parents=True, exist_ok=True)
    write_json_atomic(run_dir / SPEC, spec)
    write_atomic(run_dir / JOB_CONFIG, cfg.to_yaml(config).encode())
    (run_dir / EXIT).unlink(missing_ok=True)
    (run_dir / status_file.STATUS_FILE).unlink(missing_ok=True)


def write_hosts(run_dir: Path, allocation: dict[str, int], elastic: bool) -> None:
    """The host list's files: the hostfile and, for an elastic job, the discovery of its slots."""
    write_atomic(run_dir / HOSTFILE, "".join(f"{h} slots={n}\n" for h, n in allocation.items()).encode())
    if elastic:
        write_allocation(run_dir, allocation)
        write_atomic(run_dir / DISCOVERY, f"#!/bin/sh\nexec cat {run_dir / ALLOCATION}\n".encode())
        (run_dir / DISCOVERY).chmod(0o755)


def write_allocation(run_dir: Path, allocation: dict[str, int]) -> None:
    """What an elastic job's discovery script prints from now on."""
    write_atomic(run_dir / ALLOCATION, "".join(f"{h}:{n}\n" for h, n in allocation.items()).encode())


def read_allocation(run_dir: Path) -> Optional[dict[str, int]]:
    """The slots the job was last told of (RUN_DIR/allocation: a resize's, or what Slurm's
    discovery printed last; {} when none was usable); None before any was written."""
    try:
        text = (run_dir / ALLOCATION).read_text()
        return parse_hosts(text) if text.strip() else {}  # HOST:SLOTS lines, as an inventory's
    except (OSError, UserError):  # not written yet
        return None


def wrapped(run_dir: Path, launcher: list[str], launch_id: Optional[str] = None) -> list[str]:
    """The wrapper (hvdcls.serve.wrapper) around the launcher's command line; with the launch's
    id, the wrapper claims it before anything else (hvdcls.serve.launches)."""
    claim = ["--launch", launch_id] if launch_id else []
    return [sys.executable, "-m", "hvdcls.serve.wrapper", str(run_dir), *claim, "--", *launcher]


def train_command(run_dir: Path, backend: str) -> list[str]:
    """`hvdcls train` on the job's config, as every rank runs it."""
    return launch.hvdcls_command("train", "--backend", backend, "--config", str(run_dir / JOB_CONFIG))


def exit_status(run_dir: Path) -> Optional[int]:
    record = exit_record(run_dir)
    return record.get("returncode") if record else None


def exit_record(run_dir: Path) -> Optional[dict]:
    """The wrapper's exit_status.json (returncode, terminated, seconds), None before it ends."""
    try:
        record = json.loads((run_dir / EXIT).read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def tail(path: Path, lines: int = 20, max_bytes: int = 16384) -> list[str]:
    try:
        with open(path, "rb") as handle:
            handle.seek(max(0, handle.seek(0, os.SEEK_END) - max_bytes))
            return handle.read().decode(errors="replace").splitlines()[-lines:]
    except OSError:
        return []


def has_checkpoint(run_dir: Path) -> bool:
    return any(run_dir.glob(CHECKPOINTS))


def failure_message(run_dir: Path, reason: str, lines: int = 20) -> str:
    """For people: the reason, with the job's own one-line error (a rank's `hvdcls: error:`
    line, else rank 0's status.json `error`), then the last lines of its output (stderr, else
    stdout). Nothing here decides a state."""
    last = tail(run_dir / STDERR, lines=200) or tail(run_dir / STDOUT, lines=200)
    said = [line.split("hvdcls: error: ", 1)[1] for line in last if "hvdcls: error: " in line]
    if not said:
        status = status_file.read(run_dir)
        said = [status.error] if status is not None and status.error else []
    return "\n".join([f"{reason}: {said[0]}" if said else reason, *last[-lines:]])
