"""`hvdcls serve --executor slurm`: every job is handed to Slurm at submit; Slurm's queue, not
the service's, decides the order and the nodes.

The job table keeps each job's Slurm job id (`external_id`), so a restarted service simply goes
on asking Slurm. A job is `queued` while Slurm holds it pending, `running` while its batch job
runs, and ends as Slurm says (hvdcls.serve.slurm.status). Logs, progress and metrics come from
the run directory exactly as under the host-list executor, because the batch script runs the
same wrapper and `hvdcls train` there. An elastic job is sized within its allocation and shrinks
when a node is lost (hvdcls.serve.slurm_elastic): the service follows its discovery's record of
the nodes in use and counts each change as a resize; it never resizes the job itself.
"""
from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Optional

from hvdcls import launch
from hvdcls.fileio import write_atomic
from hvdcls.serve import runner, slurm, slurm_elastic
from hvdcls.serve import spec as job_spec
from hvdcls.serve.service import Refused, Service
from hvdcls.serve.store import CANCELLED, FAILED, FINAL, QUEUED, RUNNING, SUCCEEDED, Job

log = logging.getLogger("hvdcls.serve")


class SlurmService(Service):
    @property
    def options(self) -> slurm.Options:
        return self.settings.slurm or slurm.Options()

    def submit(self, spec: job_spec.JobSpec) -> Job:
        """Write the run directory and sbatch it; Rejected (HTTP 400) with sbatch's reason."""
        config = job_spec.resolve(spec, self.settings.data_roots)
        if spec.elastic and self.job_options(spec).launcher == "mpirun":
            raise Refused("elastic: needs horovodrun (Horovod's elastic driver), not launcher mpirun")
        job = self.store.add(spec.model_dump(), config.training.epochs)
        run_dir = self.run_dir(job.id)
        try:
            script = self.write_run_dir(job, spec, config, run_dir)
            slurm_id = slurm.submit(script, env=launch.single_host_env())
        except BaseException:
            self.store.delete(job.id)  # never reached Slurm: as if it had not been submitted
            raise
        log.info("job %d: Slurm job %s", job.id, slurm_id)
        return self.store.update(job.id, external_id=slurm_id, run_dir=str(run_dir), attempts=1)

    def job_options(self, spec: job_spec.JobSpec) -> slurm.Options:
        return self.options.merged(spec.slurm.model_dump() if spec.slurm else None)

    def write_run_dir(self, job: Job, spec: job_spec.JobSpec, config, run_dir: Path) -> Path:
        config = job_spec.job_config(config, run_dir, metrics=self.settings.job_metrics)
        runner.prepare(run_dir, spec.model_dump(), config, {})
        options = self.job_options(spec)
        script = run_dir / slurm.BATCH_SCRIPT
        elastic = (slurm.Elastic(spec.min_np, spec.max_np, self.settings.network_interface)
                   if spec.elastic else None)
        write_atomic(script, slurm.batch_script(f"hvdcls-{job.id}", spec.np, spec.backend, run_dir, options,
                                                elastic).encode())
        return script

    def cancel(self, job_id: int) -> Optional[Job]:
        """scancel; the job's state follows Slurm's on the next turn of the loop."""
        job = self.store.get(job_id)
        if job is not None and job.state not in FINAL and job.external_id:
            slurm.cancel(job.external_id)
            if job.stop_requested_at is None:
                self.store.update(job_id, expect=(QUEUED, RUNNING), stop_requested_at=time.time())
        self.wake.set()
        return self.store.get(job_id)

    def reconcile(self) -> None:
        """Nothing to adopt: Slurm kept the jobs; the loop asks it about them all."""

    def tick(self) -> None:
        """One squeue for every job the service follows, however many there are."""
        jobs = [job for job in self.store.list((QUEUED, RUNNING)) if job.external_id]
        answers = slurm.query([job.external_id for job in jobs])
        for job in jobs:
            self.follow(job, answers.get(job.external_id))

    def follow(self, job: Job, found: Optional[slurm.Status]) -> None:
        if found is None:  # Slurm forgot it (MinJobAge): the wrapper's record, if any
            code = runner.exit_status(Path(job.run_dir))
            found = slurm.Status(SUCCEEDED if code == 0 else FAILED, "GONE", code if code is not None else -1)
        code = ended_by_itself(Path(job.run_dir)) if found.slurm_state == "COMPLETING" else None
        if code is not None:
            # Its script ended on its own; Slurm still cleans up its nodes (a lost one until
            # SlurmdTimeout marks it DOWN, 300 s by default): nothing will change how it ended.
            found = slurm.Status(SUCCEEDED if code == 0 else FAILED, "COMPLETING", code)
        if found.state == QUEUED:
            waiting = f"pending in Slurm ({found.reason})" if found.reason else "pending in Slurm"
            if job.message != waiting:
                self.store.update(job.id, expect=(QUEUED,), message=waiting)
        elif found.state == RUNNING:
            self.note_running(job)
        else:
            self.record_end(job, found)

    def note_running(self, job: Job) -> None:
        hosts = allocation(Path(job.run_dir))
        if job.state == QUEUED:
            self.store.update(job.id, expect=(QUEUED,), state=RUNNING, started_at=time.time(), message=None,
                              hosts=json.dumps(hosts) if hosts else None, resized_at=time.time())
        elif hosts and not job.hosts:
            self.store.update(job.id, expect=(RUNNING,), hosts=json.dumps(hosts))
        elif job.elastic and job.hosts and hosts is not None and hosts != json.loads(job.hosts):
            self.store.update(job.id, expect=(RUNNING,), hosts=json.dumps(hosts), resized_at=time.time(),
                              resizes=job.resizes + 1)
            log.info("job %d: its nodes changed %s -> %s (Slurm job %s)", job.id, json.loads(job.hosts), hosts,
                     job.external_id)
        else:
            self.note_first_step(job)

    def record_end(self, job: Job, found: slurm.Status) -> None:
        run_dir = Path(job.run_dir)
        written = runner.exit_status(run_dir)  # horovodrun's own status, when the wrapper got to write it
        code = written if written is not None else found.exit_code
        if found.state == SUCCEEDED:
            message = None
        elif found.state == CANCELLED:
            message = "cancelled in Slurm" + (" while running" if job.state == RUNNING else " before it started")
        else:
            reason = f"Slurm {found.slurm_state}, exit status {code}"
            too_few = slurm_elastic.below_min_np(allocation(run_dir), job.min_np) if job.elastic else None
            message = runner.failure_message(run_dir, f"{reason}: {too_few}" if too_few else reason)
        self.store.update(job.id, expect=(QUEUED, RUNNING), state=found.state, ended_at=time.time(),
                          exit_status=code, message=message)
        log.info("job %d: %s (Slurm job %s %s)", job.id, found.state, job.external_id, found.slurm_state)


def allocation(run_dir: Path) -> Optional[dict[str, int]]:
    """The hosts the batch script found in its allocation (RUN_DIR/allocation), once written;
    an elastic job's discovery rewrites it with the nodes still usable ({} when none is)."""
    return slurm_elastic.current_hosts(run_dir)


def ended_by_itself(run_dir: Path) -> Optional[int]:
    """horovodrun's exit status when the wrapper saw it end without being signalled (not
    cancelled, not past its time limit: those states only Slurm can tell); else None."""
    record = runner.exit_record(run_dir)
    return None if not record or record.get("terminated") else record.get("returncode")
