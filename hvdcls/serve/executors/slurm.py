"""`--executor slurm`: every job is handed to Slurm at submit; Slurm's queue, not the service's,
decides the order and the nodes.

The job table keeps each job's Slurm job id (its Handle's `external_id`), so a restarted service
simply goes on asking Slurm: there is nothing to adopt, except a job whose id a crash kept from
the table (between sbatch and its record): Slurm knows it by its name, `hvdcls-ID-LAUNCH`. A
job is `queued` while Slurm holds it pending, `running` while its batch job runs, and ends as
Slurm says (slurm_batch.status), or as the wrapper recorded once Slurm has forgotten it. Logs,
progress and metrics come from the run directory exactly as under the host-list executor,
because the batch script runs the same wrapper and `hvdcls train` there. Slurm places the job,
so `Seen.hosts` is its allocation as the batch script found it (RUN_DIR/allocation); the
service records, once the job says so in its status.json, the world it runs in (an elastic job
shrinks when a node is lost: slurm_elastic). The service never resizes a job here: Slurm adds
no node to an allocation.
"""
from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING, Optional

from hvdcls.errors import UserError
from hvdcls.files.fileio import write_atomic
from hvdcls.launching import launch
from hvdcls.serve import launches, runner
from hvdcls.serve.errors import Refused, Unsupported
from hvdcls.serve.executors import slurm_batch, slurm_elastic
from hvdcls.serve.executors.base import NOT_STARTED, Executor, Handle, Launch, Seen
from hvdcls.serve.slurm_options import SlurmOptions
from hvdcls.serve.store import CANCELLED, FAILED, FINAL, QUEUED, RUNNING, SUCCEEDED

if TYPE_CHECKING:
    from hvdcls.serve.settings import Settings
    from hvdcls.serve.spec import JobSpec
    from hvdcls.serve.store import Job

log = logging.getLogger("hvdcls.serve")


class SlurmExecutor(Executor):
    name = "slurm"
    poll_seconds = 1.0  # one squeue per turn: Slurm's controller answers everyone

    def __init__(self, settings: "Settings"):
        super().__init__(settings)
        if settings.inventory:
            raise UserError("--executor slurm: Slurm owns the nodes; drop --hosts/--hosts-file")

    @property
    def inventory(self) -> None:
        return None

    def describe(self) -> str:
        return "jobs handed to Slurm"

    def options(self, spec: "JobSpec") -> SlurmOptions:
        """The service's defaults with the spec's own `slurm` options in their place."""
        return self.settings.slurm.merged(spec.slurm.model_dump() if spec.slurm else None)

    def check(self, spec: "JobSpec") -> None:
        if spec.elastic and self.options(spec).launcher == "mpirun":
            raise Refused("elastic: needs horovodrun (Horovod's elastic driver), not launcher mpirun")

    def start(self, attempt: Launch) -> Handle:
        """Write the batch script and sbatch it; Rejected (HTTP 400) with sbatch's reason."""
        spec, run_dir = attempt.spec, attempt.run_dir
        elastic = slurm_batch.Elastic(*spec.bounds, self.settings.network_interface) if spec.elastic else None
        script = run_dir / slurm_batch.BATCH_SCRIPT
        write_atomic(script, slurm_batch.batch_script(job_name(attempt.job_id, attempt.launch_id), spec.np,
                                                      spec.backend, run_dir, self.options(spec), elastic,
                                                      attempt.launch_id).encode())
        slurm_id = slurm_batch.submit(script, env=launch.single_host_env())
        log.info("job %d: Slurm job %s", attempt.job_id, slurm_id)
        return Handle(external_id=slurm_id)

    def holds(self, job: "Job") -> bool:
        return job.external_id is not None and job.state not in FINAL

    def poll(self, jobs: list["Job"]) -> dict[int, Seen]:
        """One squeue for every job it holds, however many there are."""
        held = {job.external_id: job for job in jobs if job.external_id is not None and self.holds(job)}
        answers = slurm_batch.query(list(held))
        return {job.id: self.seen(job, answers.get(slurm_id)) for slurm_id, job in held.items()}

    def seen(self, job: "Job", found: Optional[slurm_batch.Status]) -> Seen:
        run_dir = runner.directory(job)
        if found is None:  # Slurm forgot it (MinJobAge): the wrapper's record, if any
            code = runner.exit_status(run_dir)
            found = slurm_batch.Status(SUCCEEDED if code == 0 else FAILED, "GONE", code if code is not None else -1)
        code = ended_by_itself(run_dir) if found.slurm_state == "COMPLETING" else None
        if code is not None:
            # Its script ended on its own; Slurm still cleans up its nodes (a lost one until
            # SlurmdTimeout marks it DOWN, 300 s by default): nothing will change how it ended,
            # so it is recorded now, in the state Slurm gives a batch script ending so (whether
            # this turn saw it COMPLETING or the next sees it done must not change the record).
            found = (slurm_batch.Status(SUCCEEDED, "COMPLETED", code) if code == 0
                     else slurm_batch.Status(FAILED, "FAILED", code))
        if found.state == QUEUED:
            return Seen(QUEUED, message=f"pending in Slurm ({found.reason})" if found.reason else "pending in Slurm")
        if found.state == RUNNING:
            return Seen(RUNNING, hosts=allocation(run_dir))
        return self.ended(job, found)

    def ended(self, job: "Job", found: slurm_batch.Status) -> Seen:
        run_dir = runner.directory(job)
        written = runner.exit_status(run_dir)  # horovodrun's own status, when the wrapper got to write it
        code = written if written is not None else found.exit_code
        hosts = allocation(run_dir)
        if found.state == SUCCEEDED:
            return Seen(SUCCEEDED, code, hosts=hosts)
        if found.state == CANCELLED:
            when = " while running" if job.state == RUNNING else " before it started"
            return Seen(CANCELLED, code, "cancelled in Slurm" + when, hosts)
        reason = f"Slurm {found.slurm_state}, exit status {code}"
        too_few = slurm_elastic.below_min_np(hosts, job.min_np) if job.elastic else None
        return Seen(FAILED, code, f"{reason}: {too_few}" if too_few else reason, hosts)

    def adopt(self, job: "Job") -> Optional[Seen]:
        """Slurm kept the job: the next poll says where it is. A job whose Slurm id the crash
        kept from the table is found by its name, which carries its id and launch; one Slurm
        does not know is abandoned (its wrapper, should sbatch still land it, will not run it)
        unless its wrapper claimed it first: then it ran, and Slurm has forgotten it since."""
        if job.external_id is not None or job.launch_id is None:
            return Seen(job.state)
        found = slurm_batch.find(job_name(job.id, job.launch_id))
        if found:
            slurm_id = max(found, key=int)  # one, unless sbatch was run by hand with its name
            return Seen(job.state, handle=Handle(external_id=slurm_id))
        claim = launches.claim(runner.directory(job), job.launch_id, {"abandoned_at": time.time()})
        if "pid" not in claim:
            return Seen(NOT_STARTED)
        return self.seen(job, None)  # its wrapper's record, if any

    def cancel(self, job: "Job", force: bool = False) -> None:
        """scancel; Slurm itself goes from SIGTERM to SIGKILL (its KillWait), so forcing adds nothing."""
        if not force and job.external_id is not None:
            slurm_batch.cancel(job.external_id)

    def resize(self, job: "Job", hosts: dict[str, int]) -> None:
        raise Unsupported("Slurm adds no node to a running allocation: an elastic job only shrinks when one is lost")


def job_name(job_id: int, launch_id: Optional[str]) -> str:
    """The Slurm job's name: hvdcls's job id and the launch, so that a restart finds it by name."""
    return f"hvdcls-{job_id}-{launch_id}" if launch_id else f"hvdcls-{job_id}"


def allocation(run_dir: Path) -> Optional[dict[str, int]]:
    """The hosts the batch script found in its allocation (RUN_DIR/allocation), once written;
    an elastic job's discovery rewrites it with the nodes still usable ({} when none is)."""
    return slurm_elastic.current_hosts(run_dir)


def ended_by_itself(run_dir: Path) -> Optional[int]:
    """horovodrun's exit status when the wrapper saw it end without being signalled (not
    cancelled, not past its time limit: those states only Slurm can tell); else None."""
    record = runner.exit_record(run_dir)
    return None if not record or record.get("terminated") else record.get("returncode")
