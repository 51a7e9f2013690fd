"""One launch of a job, recorded so that a service restarted after a crash can tell what became
of it, whatever the instant of the crash.

The launch record comes first: the service commits a new launch id in the job's row (with its
claim of a queued job, or before handing a job to Slurm) before anything is spawned. The
launch's own first act, in its wrapper (hvdcls.serve.wrapper) before it runs anything, is to
create

    RUN_DIR/launches/ID.json   {"pid": ..., "pid_start": ..., "at": ...}   the wrapper's claim

A restarted service that finds a launch id in the table but no such file creates the file
itself, marked abandoned ({"abandoned_at": ...}). Whichever comes first wins: the file is
written whole under a temporary name and hard-linked into place, which fails when the name
exists (atomic on local file systems and on NFS alike). A wrapper that comes second exits
without running anything, so an abandoned launch never started and never will: the job goes
back to its queue, its attempt not counted. The decision (`decide`) is one of

    NOT_STARTED  abandoned: no process of it ran or will run
    RUNNING      the wrapper's pid (with its start time, so a recycled pid is not taken for it)
                 is alive: adopted
    ENDED        the wrapper wrote its exit record for this launch (exit_status.json)
    GONE         the wrapper claimed it, and is gone without an exit record (killed with its
                 processes, the machine rebooted): a real loss, the job's own

Only this module and the wrapper read or write the claim files.
"""
from __future__ import annotations

import json
import os
import secrets
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from hvdcls.serve import runner

LAUNCHES = "launches"
NOT_STARTED, RUNNING, ENDED, GONE = "not started", "running", "ended", "gone"


def new_id() -> str:
    """A launch id: 12 hex digits, fit for a file name and a Slurm job name."""
    return secrets.token_hex(6)


def claim_path(run_dir: Path, launch_id: str) -> Path:
    return Path(run_dir) / LAUNCHES / f"{launch_id}.json"


def claim(run_dir: Path, launch_id: str, record: dict) -> dict:
    """Create the launch's claim file with `record` unless it exists; the record that holds
    the name afterwards (`record` when this call made it, else the one found)."""
    path = claim_path(run_dir, launch_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    try:
        with open(temporary, "w") as handle:
            json.dump(record, handle)
            handle.flush()
            os.fsync(handle.fileno())  # a claim must outlive a power cut as the row it answers does
        os.link(temporary, path)
        return record
    except FileExistsError:
        return read_claim(run_dir, launch_id) or {}
    finally:
        temporary.unlink(missing_ok=True)


def read_claim(run_dir: Path, launch_id: str) -> Optional[dict]:
    try:
        found = json.loads(claim_path(run_dir, launch_id).read_text())
    except (OSError, ValueError):
        return None
    return found if isinstance(found, dict) else None


def claim_for_wrapper(run_dir: Path, launch_id: str) -> bool:
    """The wrapper's first act: True when the launch is its own to run, False when a restarted
    service abandoned it first."""
    pid = os.getpid()
    mine = {"pid": pid, "pid_start": process_start(pid), "at": time.time()}
    return claim(run_dir, launch_id, mine) == mine


@dataclass(frozen=True)
class Found:
    """What became of a launch (`decide`); pid and its start time whenever the wrapper ran."""

    state: str
    pid: Optional[int] = None
    pid_start: Optional[int] = None
    returncode: Optional[int] = None


def decide(run_dir: Path, launch_id: str) -> Found:
    """What became of launch `launch_id`, deciding it for good: a launch nothing has claimed
    yet is claimed as abandoned here, so its wrapper, should it come later, will not run it."""
    found = claim(run_dir, launch_id, {"abandoned_at": time.time()})
    if "pid" not in found:
        return Found(NOT_STARTED)
    pid, started = int(found["pid"]), found.get("pid_start")
    # The record is read again after the liveness check: the wrapper may write it and exit
    # between the two looks, and that end must not be taken for a loss.
    for look in range(2):
        code = exit_code(run_dir, launch_id)
        if code is not None:
            return Found(ENDED, pid, started, code)
        if look == 0 and alive(pid, started):
            return Found(RUNNING, pid, started)
    return Found(GONE, pid, started)


def exit_code(run_dir: Path, launch_id: str) -> Optional[int]:
    """The wrapper's exit status of this launch (its exit_status.json names the launch)."""
    record = runner.exit_record(Path(run_dir))
    return record.get("returncode") if record and record.get("launch") == launch_id else None


def process_start(pid: int) -> Optional[int]:
    """The process's start time in clock ticks since boot (/proc), None when it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[19])  # field 22, counted after the command name


def alive(pid: int, started: Optional[int]) -> bool:
    """Is the process we started still there (and not another one that got its pid)?"""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    after_name = stat.rsplit(")", 1)[1].split()
    return after_name[0] != "Z" and (started is None or int(after_name[19]) == started)
