"""`--executor hosts`: each job a `horovodrun` process group on the service's own host list.

The service's scheduler places a job on slots of the inventory; this executor starts it as
`python -m hvdcls.serve.wrapper RUN_DIR -- horovodrun ...` in a session of its own (its own
process group, so cancel signals the group) and independent of the service. The wrapper's
first act is to claim the job's launch with its pid and start time (hvdcls.serve.launches), so a
service restarted after a crash at any instant finds the job running (adopted), ended (the exit
status its wrapper wrote), never started (the launch abandoned: queued again), or gone. An
elastic job's horovodrun takes its hosts from RUN_DIR/discover.sh, which prints
RUN_DIR/allocation: a resize rewrites that file, and a restart takes the job's slots from it.
"""
from __future__ import annotations

import os
import signal
import subprocess
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Optional

from hvdcls.errors import UserError
from hvdcls.launching import launch
from hvdcls.serve import faults, launches, runner
from hvdcls.serve.errors import Refused, TooLarge
from hvdcls.serve.executors.base import NOT_STARTED, Executor, Handle, Launch, Seen
from hvdcls.serve.launches import alive
from hvdcls.serve.store import FAILED, RUNNING, SUCCEEDED

if TYPE_CHECKING:
    from hvdcls.serve.settings import Settings
    from hvdcls.serve.spec import JobSpec
    from hvdcls.serve.store import Job


class HostsExecutor(Executor):
    name = "hosts"

    def __init__(self, settings: "Settings"):
        super().__init__(settings)
        if not settings.inventory:
            raise UserError("give the host inventory with --hosts HOST:SLOTS,... or --hosts-file FILE")
        self.children: dict[int, subprocess.Popen] = {}  # jobs this process started, by job id

    @property
    def inventory(self) -> dict[str, int]:
        return self.settings.inventory

    def describe(self) -> str:
        return f"{sum(self.inventory.values())} slots on {launch.hosts_arg(self.inventory)}"

    def check(self, spec: "JobSpec") -> None:
        if spec.slurm is not None:
            raise Refused("slurm: this service runs jobs on its host list (start it with --executor slurm)")
        total = sum(self.inventory.values())
        if spec.most_slots > total:
            asked = f"max_np={spec.max_np}" if spec.elastic else f"np={spec.np}"
            raise TooLarge(f"{asked}: the inventory has {total} slots in all ({launch.hosts_arg(self.inventory)})")

    def start(self, attempt: Launch) -> Handle:
        run_dir, spec, allocation = attempt.run_dir, attempt.spec, attempt.allocation or {}
        runner.write_hosts(run_dir, allocation, spec.elastic)
        child = start(run_dir, command(run_dir, spec.model_dump(), allocation, self.settings.ssh_port,
                                       self.settings.network_interface, attempt.launch_id))
        self.children[attempt.job_id] = child
        return Handle(pid=child.pid, pid_start=launches.process_start(child.pid))

    def holds(self, job: "Job") -> bool:
        return job.state == RUNNING

    def poll(self, jobs: list["Job"]) -> dict[int, Seen]:
        return {job.id: self.seen(job) for job in jobs if self.holds(job)}

    def seen(self, job: "Job") -> Seen:
        child = self.children.get(job.id)
        if child is not None:
            code = child.poll()
            if code is None:
                return Seen(RUNNING)
            del self.children[job.id]
            written = runner.exit_status(runner.directory(job))  # the wrapper's word: horovodrun's own
            return ended(written if written is not None else code)
        if job.pid is None or alive(job.pid, job.pid_start):
            return Seen(RUNNING)
        code = runner.exit_status(runner.directory(job))
        return ended(code if code is not None else -1)  # adopted, and gone without a word

    def adopt(self, job: "Job") -> Optional[Seen]:
        if job.launch_id is None:  # started by an hvdcls without launch records: its pid alone
            if job.pid is not None and alive(job.pid, job.pid_start):
                return Seen(RUNNING)
            code = runner.exit_status(runner.directory(job)) if job.run_dir else None
            return ended(code) if code is not None else None
        run_dir = runner.directory(job)
        found = launches.decide(run_dir, job.launch_id)
        if found.state == launches.NOT_STARTED:
            return Seen(NOT_STARTED)
        if found.state == launches.GONE:
            return None
        handle = Handle(pid=found.pid, pid_start=found.pid_start)
        if found.state == launches.ENDED:
            return replace(ended(found.returncode if found.returncode is not None else -1), handle=handle)
        return Seen(RUNNING, hosts=runner.read_allocation(run_dir) if job.elastic else None, handle=handle)

    def cancel(self, job: "Job", force: bool = False) -> None:
        """SIGTERM to the job's process group (horovodrun stops its ranks); SIGKILL when forced."""
        if job.pid is not None:
            signal_group(job.pid, signal.SIGKILL if force else signal.SIGTERM)

    def resize(self, job: "Job", hosts: dict[str, int]) -> None:
        runner.write_allocation(runner.directory(job), hosts)  # what its discovery prints from now on


def ended(code: int) -> Seen:
    return Seen(SUCCEEDED if code == 0 else FAILED, code, None if code == 0 else f"exit status {code}")


def command(run_dir: Path, spec: dict, allocation: dict[str, int], ssh_port: Optional[int] = None,
            network_interface: Optional[str] = None, launch_id: Optional[str] = None) -> list[str]:
    """The wrapper (claiming launch `launch_id`) around `horovodrun` (elastic: bounded by
    min_np/max_np, hosts from the discovery script) around `hvdcls train --config RUN_DIR/job.yaml`."""
    train = runner.train_command(run_dir, spec["backend"])
    train = (["-p", str(ssh_port)] if ssh_port else []) + train  # options before the command
    np = sum(allocation.values())
    if spec["elastic"]:
        horovodrun = launch.horovodrun_elastic(np, spec["min_np"], spec["max_np"], str(run_dir / runner.DISCOVERY),
                                               train, network_interface=network_interface)
    else:
        horovodrun = launch.horovodrun(np, train, hosts=allocation)
    return runner.wrapped(run_dir, faults.standin(run_dir) or horovodrun, launch_id)


def start(run_dir: Path, cmd: list[str]) -> subprocess.Popen:
    """Start the job in its own session (process group id = its pid), output into the run dir."""
    with open(run_dir / runner.STDOUT, "ab") as out, open(run_dir / runner.STDERR, "ab") as err:
        return subprocess.Popen(cmd, stdout=out, stderr=err, stdin=subprocess.DEVNULL,
                                env=launch.single_host_env(), cwd=run_dir, start_new_session=True)


def signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass
