"""What the API and the console (hvdcls.serve.console) both show of the service: a job as a
dict, a piece of its log, the inventory's slots and who holds them. One reading of the job
table and the status files, so the JSON and the pages never disagree.
"""
from __future__ import annotations

import os
from pathlib import Path

from hvdcls.files import status_file
from hvdcls.serve.service import Service
from hvdcls.serve.store import FINAL, QUEUED, Job

LOG_CHUNK = 1 << 20  # a follower gets a long log in pieces of this size


def view(job: Job, detail: bool = False) -> dict:
    """A job as the API shows it: its row, plus its phase and progress (its status.json: a
    queued job's is a previous attempt's, not shown), latencies and (detail) last metrics."""
    out = job.as_dict()
    status = status_file.read(Path(job.run_dir)) if job.run_dir and job.state != QUEUED else None
    out["phase"] = status.phase if status else None
    out["progress"] = status.progress if status else None
    out["queued_seconds"] = job.started_at - job.submitted_at if job.started_at else None
    out["first_step_seconds"] = job.first_step_at - job.submitted_at if job.first_step_at else None
    if detail:
        out["last_metrics"] = status.metrics if status else None
    return out


def read_log(service: Service, job_id: int, stream: str, position: int,
             limit: int = LOG_CHUNK) -> tuple[bool, bytes]:
    """(has the job ended, what its log holds from `position` on, up to `limit` bytes)."""
    job = service.store.get(job_id)
    done = job is None or job.state in FINAL  # read before the log: its last lines are then in it
    if not job or not job.run_dir or not (Path(job.run_dir) / stream).exists():
        return done, b""
    with open(Path(job.run_dir) / stream, "rb") as handle:
        handle.seek(position)
        return done, handle.read(limit)


def log_size(job: Job, stream: str) -> int:
    """How long the job's log is now (0 before it has one)."""
    try:
        return os.path.getsize(Path(job.run_dir) / stream) if job.run_dir else 0
    except OSError:
        return 0


def host_slots(service: Service) -> list[dict]:
    """Each host of the inventory: its slots, the jobs on it (id -> slots) and what is free."""
    allocations = service.allocations()
    return [{"host": host, "slots": slots,
             "jobs": {str(j): a[host] for j, a in allocations.items() if host in a},
             "free": slots - sum(a.get(host, 0) for a in allocations.values())}
            for host, slots in service.inventory.items()]
