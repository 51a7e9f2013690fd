"""The sweep's trials as jobs of a running `hvdcls serve`, through its REST API (hvdcls.serve.client:
the same address and token as `hvdcls job submit`). The driver sees only this small interface, so
its logic runs against a stand-in in the unit tests.
"""
from __future__ import annotations

import uuid
from pathlib import Path
from typing import Optional, Protocol

from hvdcls.errors import UserError
from hvdcls.files import fileio
from hvdcls.sweep.trials import JobView, view

METRICS_FILE = "metrics.jsonl"  # hvdcls train's epoch records (hvdcls.training.outputs)


class Jobs(Protocol):
    def submit(self, spec: dict) -> int:
        """Queue a job; its id. UserError when the service refuses it (its reason)."""

    def poll(self, job_id: int) -> JobView:
        """The job now: state, epochs seen, message."""

    def cancel(self, job_id: int) -> None:
        """Stop the job, pruned (its slots go to the next one)."""


class ServiceJobs:
    """Jobs of the service at `client`'s address, submitted as its token's user."""

    def __init__(self, client):
        self.client = client

    def slots(self) -> Optional[int]:
        """The inventory's slots; None where the executor places jobs (Slurm: no inventory)."""
        hosts = self.client.call("GET", "/hosts")
        return sum(h["slots"] for h in hosts) if hosts else None

    def submit(self, spec: dict) -> int:
        """With an idempotency key of its own, as `hvdcls job submit` sends one: a request cut
        on its way (the service restarting) is sent again and makes the trial's job once."""
        job, _ = self.client.submit(spec, f"{spec.get('name', 'sweep')}-{uuid.uuid4().hex}")
        return int(job["id"])

    def poll(self, job_id: int) -> JobView:
        job = self.client.call("GET", f"/jobs/{job_id}")
        return view(job, read_history(job.get("run_dir")))

    def cancel(self, job_id: int) -> None:
        try:
            self.client.call("POST", f"/jobs/{job_id}/cancel", params={"reason": "pruned"})
        except UserError:  # it ended meanwhile, or was removed: nothing left to stop
            pass


def read_history(run_dir: Optional[str]) -> list[dict]:
    """The run's metrics.jsonl when this machine sees the run directory (the service's own, or a
    shared file system); else [] and the API's last epoch alone."""
    if not run_dir:
        return []
    try:
        return fileio.read_jsonl(Path(run_dir) / METRICS_FILE)
    except (OSError, ValueError):
        return []
