"""What the console's pages and their polls show, read from the job table (through
hvdcls.serve.views, as the API reads it) and each job's run directory: a page of the job list,
one job's epochs (metrics.jsonl), the end of its log and its resizes.

Polls ask for what they lack only: the list sends the fingerprints of the rows it shows and gets
back the rows that differ; a job's page sends how many epochs and how many log bytes it has and
gets the rest.
"""
from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Optional

from hvdcls.files import fileio
from hvdcls.serve import views
from hvdcls.serve.service import Service
from hvdcls.serve.store import QUEUED, RUNNING, STATES, Job

PAGE = 50  # jobs per page of the list
LOG_TAIL = 32 << 10  # bytes of log a job's page opens with
LOG_POLL = 256 << 10  # at most this much more per poll (a faster log is skipped to its end)
CURVES = ("epoch", "train_loss", "val_loss", "train_accuracy", "val_accuracy", "steps_per_second")


ACTIVE = "active"  # the list's filter for queued and running together


def known_filter(state: Optional[str]) -> Optional[str]:
    """The list's ?state= when it names one (a state, or ACTIVE); else None: every job."""
    return state if state in (*STATES, ACTIVE) else None


def states_for(state: Optional[str]) -> tuple[str, ...]:
    if state == ACTIVE:
        return (QUEUED, RUNNING)
    return (state,) if state in STATES else STATES


def page_of_jobs(service: Service, page: int, state: Optional[str]) -> tuple[list[dict], int]:
    """One page of the list, newest first, and how many jobs match in all."""
    states = states_for(state)
    total = service.store.count(states)
    jobs = service.store.list(states, PAGE, (page - 1) * PAGE, newest_first=True)
    return [views.view(job) for job in jobs], total


def pages(total: int, per_page: int = PAGE) -> int:
    """How many pages a list of `total` rows takes (at least one, empty)."""
    return max(1, -(-total // per_page))


def fingerprint(html: str) -> str:
    return hashlib.sha256(html.encode()).hexdigest()[:16]


def epochs(job: Job, after: int = 0) -> list[dict]:
    """The job's epoch records from `after` on (metrics.jsonl, a line per finished epoch), each
    cut to the numbers the curves draw."""
    if not job.run_dir:
        return []
    try:
        records = fileio.read_jsonl(Path(job.run_dir) / "metrics.jsonl")
    except (OSError, ValueError):  # none yet (or a damaged file): no curve rather than a 500
        return []
    return [curve_point(record) for record in records[after:]]


def curve_point(record: dict) -> dict:
    steps, seconds = record.get("steps"), record.get("train_seconds")
    point = {key: record.get(key) for key in CURVES[:-1]}
    point["steps_per_second"] = steps / seconds if steps and seconds else None
    point["world_size"] = record.get("world_size")
    return point


def log_piece(service: Service, job: Job, stream: str, offset: Optional[int]) -> dict:
    """Log bytes from `offset` (None: the last LOG_TAIL bytes), as text, and where the next
    read starts. A reader more than LOG_POLL behind jumps to the end (`skipped`)."""
    size = views.log_size(job, stream)
    behind = offset is None or offset > size or size - offset > LOG_POLL
    start = max(0, size - (LOG_TAIL if offset is None else LOG_POLL)) if behind or offset is None else offset
    _, chunk = views.read_log(service, job.id, stream, start, size - start)
    text = chunk
    if behind and start > 0 and b"\n" in chunk:
        text = chunk[chunk.find(b"\n") + 1:]  # begin at a whole line
    return {"text": text.decode(errors="replace"), "offset": start + len(chunk),
            "skipped": behind and offset is not None}


def resizes(points: list[dict]) -> list[dict]:
    """Where an elastic job's world changed, by epoch (its size at each epoch's end)."""
    changes, size = [], None
    for point in points:
        if point.get("world_size") != size:
            if size is not None:
                changes.append({"epoch": point["epoch"], "from": size, "to": point["world_size"]})
            size = point.get("world_size")
    return changes


def job_state(job: Job) -> dict:
    """The parts of a job that change while it runs, for its page's poll."""
    shown = views.view(job, detail=True)
    return {key: shown[key] for key in ("state", "phase", "progress", "hosts", "message", "started_at", "ended_at",
                                        "stop_requested_at", "resizes", "resized_at", "exit_status")}
