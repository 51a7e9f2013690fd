"""The one contract between the service loop (hvdcls.serve.service) and what runs its jobs.

The loop owns the job table, the queue, cancel requests, hang detection, the scheduling and
resizing decisions and every state change; an executor owns processes or a scheduler's jobs.
The loop asks each executor the same few things, whatever it is:

    check(spec)            can it run this job at all (Refused, TooLarge: HTTP 400)
    start(launch)          start one attempt; a Handle says how to find it again
    holds(job)             is the job in its hands (started, not yet seen to end)
    poll(jobs)             what it knows of them now: Seen (queued, running, or how it ended)
    adopt(job)             after a restart of the service: still there or ended (Seen), never
                           started (Seen(NOT_STARTED): the service starts it again), or gone (None)
    cancel(job, force)     stop it: politely first, then (force) for good
    resize(job, hosts)     an elastic job's new hosts (only where the service places jobs)
    describe()             one line for the start-up message

`inventory` says who places jobs: the slots the service's scheduler places them on (the host
list), or None where the executor queues and places them itself (Slurm), in which case each
job is started as it is submitted and `Seen.hosts` says where it runs.

A crash of the service may come at any instant of a start. So `start` is given the launch's id,
committed in the job's row before it is called, and the job's wrapper claims that launch
before anything else (hvdcls.serve.launches); after a restart `adopt` decides from what the job
itself left (the claim, its pid; a Slurm job named after the launch), not only from what the
service managed to record, and gives back the Handle the table may lack.
"""
from __future__ import annotations

import abc
from dataclasses import dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar, Optional

from hvdcls import config as cfg

if TYPE_CHECKING:
    from hvdcls.serve.settings import Settings
    from hvdcls.serve.spec import JobSpec
    from hvdcls.serve.store import Job


NOT_STARTED = "not started"  # Seen.state from adopt: the launch never began; start the job again


@dataclass(frozen=True)
class Handle:
    """How an executor finds a job it started, kept in the job's row (these columns, by name)."""

    pid: Optional[int] = None  # the host list: the job's process group leader (the wrapper)
    pid_start: Optional[int] = None  # its start time, so a recycled pid is not taken for it
    external_id: Optional[str] = None  # Slurm: the batch job's id

    def columns(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass(frozen=True)
class Launch:
    """One attempt to run a job, as the service prepared it."""

    job_id: int
    run_dir: Path
    spec: "JobSpec"
    config: cfg.Config  # validated, with the run directory, resume and metrics settings
    allocation: Optional[dict[str, int]] = None  # where the service placed it (None: the executor places it)
    launch_id: Optional[str] = None  # the launch record's id, in the job's row before start (hvdcls.serve.launches)


@dataclass(frozen=True)
class Seen:
    """What the executor knows of a job now.

    state:       QUEUED (it holds the job, waiting), RUNNING, or how it ended (SUCCEEDED,
                 FAILED, CANCELLED)
    exit_status: once ended, horovodrun's exit status (the wrapper's record), else the
                 executor's
    message:     queued: why it waits; ended: why, on one line ("exit status 1", "Slurm
                 TIMEOUT, exit status 143", "cancelled in Slurm while running")
    hosts:       where the executor placed it (Slurm's allocation); where the service placed
                 it, only from adopt: the slots the job was last told of (a resize the crash
                 cut short); else None
    handle:      from adopt: how to find the job, found from what the job left (the table may
                 lack it when the crash came right after the start)
    """

    state: str
    exit_status: Optional[int] = None
    message: Optional[str] = None
    hosts: Optional[dict[str, int]] = None
    handle: Optional[Handle] = None


class Executor(abc.ABC):
    name: ClassVar[str]
    poll_seconds: ClassVar[float] = 0.25  # its natural pace: how often asking is cheap enough

    def __init__(self, settings: "Settings"):
        self.settings = settings

    @property
    @abc.abstractmethod
    def inventory(self) -> Optional[dict[str, int]]:
        """The slots the service schedules jobs on; None: the executor places jobs itself."""

    @abc.abstractmethod
    def check(self, spec: "JobSpec") -> None:
        """Refused (or TooLarge) when this executor can never run the job; nothing else."""

    @abc.abstractmethod
    def start(self, launch: Launch) -> Handle:
        """Start one attempt (its run directory holds spec.json and job.yaml); UserError or
        OSError when it cannot (Rejected: the executor's scheduler refused it)."""

    @abc.abstractmethod
    def holds(self, job: "Job") -> bool:
        """Has it started the job, which has not yet been seen to end?"""

    @abc.abstractmethod
    def poll(self, jobs: list["Job"]) -> dict[int, Seen]:
        """What it knows now of those of `jobs` it holds, by job id (asking once for all)."""

    @abc.abstractmethod
    def adopt(self, job: "Job") -> Optional[Seen]:
        """After a restart of the service, for each job it holds or has a launch of: the job as it
        is now, Seen(NOT_STARTED) when that launch never started and never will (decided here,
        for good), or None when it is gone."""

    @abc.abstractmethod
    def cancel(self, job: "Job", force: bool = False) -> None:
        """Stop the job: ask it to end; `force`, once the grace period is over: end it."""

    @abc.abstractmethod
    def resize(self, job: "Job", hosts: dict[str, int]) -> None:
        """An elastic job runs on `hosts` from now on (Unsupported where it cannot)."""

    @abc.abstractmethod
    def describe(self) -> str:
        """One line: where this executor runs jobs."""
