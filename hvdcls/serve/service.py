"""The service's loop: after a restart reconcile, then reap, signal, watch and schedule.

One thread runs the loop; the API's threads only insert jobs and mark cancel requests, then wake
it. Every job state change is a conditional update (`expect=`), so a cancel racing a start or an
end never leaves a job in two states.
"""
from __future__ import annotations

import json
import logging
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Optional

from hvdcls import launch
from hvdcls.errors import UserError
from hvdcls.serve import elasticity, runner, scheduler
from hvdcls.serve import spec as job_spec
from hvdcls.serve.store import CANCELLED, FAILED, QUEUED, RUNNING, SUCCEEDED, Job, Store

if TYPE_CHECKING:
    from hvdcls.serve import slurm

log = logging.getLogger("hvdcls.serve")


class Refused(UserError):
    """A valid spec this service cannot run (HTTP 400)."""


class TooLarge(Refused):
    """The job asks for more slots than the whole inventory has."""


@dataclass
class Settings:
    state_dir: Path
    inventory: dict[str, int]
    data_roots: list[Path] = field(default_factory=list)
    ssh_port: Optional[int] = None
    grace_seconds: float = 10.0  # SIGTERM, then SIGKILL after this long
    hang_seconds: float = 0.0  # a running job silent this long is ended as hung (0: never)
    resize_cooldown_seconds: float = 60.0  # an elastic job is resized at most this often
    network_interface: Optional[str] = None  # elastic jobs' horovodrun --network-interface
    job_metrics: bool = False  # every job's rank 0 serves /metrics (listed by GET /targets)
    poll_seconds: float = 0.25
    executor: str = "hosts"  # or "slurm": hvdcls.serve.slurm_service
    slurm: Optional["slurm.Options"] = None  # --executor slurm: partition, time limit, account


class Service:
    def __init__(self, settings: Settings):
        self.settings = settings
        settings.state_dir.mkdir(parents=True, exist_ok=True)
        self.store = Store(settings.state_dir / "jobs.db")
        self.children: dict[int, subprocess.Popen] = {}  # jobs this process started
        self.signalled: set[int] = set()  # cancelled jobs already sent SIGTERM
        self.wake, self.stopping = threading.Event(), threading.Event()
        self.thread: Optional[threading.Thread] = None

    @property
    def total_slots(self) -> int:
        return sum(self.settings.inventory.values())

    def run_dir(self, job_id: int) -> Path:
        return self.settings.state_dir / "jobs" / f"{job_id:06d}"

    # --- what the API calls -----------------------------------------------------------------

    def submit(self, spec: job_spec.JobSpec, owner: Optional[str] = None) -> Job:
        """Queue a job; UserError (naming the key) for a bad spec, TooLarge for an impossible one."""
        config = job_spec.resolve(spec, self.settings.data_roots)
        if spec.slurm is not None:
            raise Refused("slurm: this service runs jobs on its host list (start it with --executor slurm)")
        if spec.most_slots > self.total_slots:
            asked = f"max_np={spec.max_np}" if spec.elastic else f"np={spec.np}"
            raise TooLarge(f"{asked}: the inventory has {self.total_slots} slots in all "
                           f"({launch.hosts_arg(self.settings.inventory)})")
        job = self.store.add(spec.model_dump(), config.training.epochs, owner)
        self.wake.set()
        return job

    def cancel(self, job_id: int) -> Optional[Job]:
        """Queued: cancelled now. Running: the loop sends SIGTERM, SIGKILL after the grace."""
        now = time.time()
        cancelled = self.store.update(job_id, expect=(QUEUED,), state=CANCELLED, ended_at=now,
                                      message="cancelled before it started")
        if cancelled is None:
            job = self.store.get(job_id)
            if job is not None and job.state == RUNNING and job.stop_requested_at is None:
                self.store.update(job_id, expect=(RUNNING,), stop_requested_at=now)
        self.wake.set()
        return self.store.get(job_id)

    def allocations(self) -> dict[int, dict[str, int]]:
        return {job.id: json.loads(job.hosts) for job in self.store.list((RUNNING,)) if job.hosts}

    # --- the loop -----------------------------------------------------------------------------

    def start(self) -> None:
        self.reconcile()
        self.thread = threading.Thread(target=self.loop, name="hvdcls-serve-loop", daemon=True)
        self.thread.start()

    def stop(self) -> None:
        """Stop the loop; running jobs go on (a restart adopts them)."""
        self.stopping.set()
        self.wake.set()
        if self.thread is not None:
            self.thread.join(timeout=10)

    def loop(self) -> None:
        while not self.stopping.is_set():
            try:
                self.tick()
            except Exception:  # a bad moment (disk full, a race) must not end the service
                log.exception("service loop")
            self.wake.wait(self.settings.poll_seconds)
            self.wake.clear()

    def tick(self) -> None:
        for job in self.store.list((RUNNING,)):
            code = self.ended(job)
            if code is not None:
                self.finish(job, code)
            else:
                self.stop_if_hung(job)
                self.signal_if_stopping(job)
                self.note_first_step(job)
        self.resize_elastic()
        self.schedule()

    def reconcile(self) -> None:
        """Jobs left running by a previous service: adopted if alive, finished if their exit
        status was written, else failed (or queued again when their spec says requeue)."""
        for job in self.store.list((RUNNING,)):
            if job.pid is not None and runner.alive(job.pid, job.pid_start):
                log.info("job %d: still running (pid %d), adopted", job.id, job.pid)
                continue
            code = runner.exit_status(Path(job.run_dir)) if job.run_dir else None
            if code is not None:
                self.finish(job, code)
            elif job.requeue and job.stop_requested_at is None:
                self.store.update(job.id, expect=(RUNNING,), state=QUEUED, pid=None, pid_start=None,
                                  hosts=None, message="requeued: its processes were gone at restart")
            else:
                self.store.update(job.id, expect=(RUNNING,), state=FAILED, ended_at=time.time(),
                                  message=runner.failure_message(
                                      Path(job.run_dir), "its processes were gone when the service restarted"))

    def ended(self, job: Job) -> Optional[int]:
        """The job's exit status once it has ended, else None."""
        child = self.children.get(job.id)
        if child is not None:
            code = child.poll()
            if code is None:
                return None
            del self.children[job.id]
            written = runner.exit_status(Path(job.run_dir))  # the wrapper's word: horovodrun's own
            return written if written is not None else code
        if job.pid is None or runner.alive(job.pid, job.pid_start):
            return None
        code = runner.exit_status(Path(job.run_dir))
        return code if code is not None else -1  # adopted, and gone without a word

    def finish(self, job: Job, code: int) -> None:
        run_dir = Path(job.run_dir)
        if job.stop_requested_at is not None and job.stop_reason is None:
            state, message = CANCELLED, "cancelled while running"
        elif job.stop_reason is not None:
            state, message = FAILED, runner.failure_message(run_dir, job.stop_reason)
        elif code == 0:
            state, message = SUCCEEDED, None
        else:
            state, message = FAILED, runner.failure_message(run_dir, f"exit status {code}")
        self.store.update(job.id, expect=(RUNNING,), state=state, ended_at=time.time(),
                          exit_status=code, message=message)
        self.signalled.discard(job.id)
        log.info("job %d: %s (exit status %s)", job.id, state, code)

    def stop_if_hung(self, job: Job) -> None:
        """No output for the job's hang_seconds (else the service's): end it, as failed. Output
        is what a training run gives every training.log_every steps (docs/serve.md)."""
        limit = json.loads(job.spec).get("hang_seconds") or self.settings.hang_seconds
        if not limit or job.stop_requested_at is not None or job.pid is None:
            return
        silent = time.time() - max(runner.last_output(Path(job.run_dir)), job.started_at or 0)
        if silent > limit:
            log.warning("job %d: no output for %.0f s, ending it", job.id, silent)
            self.store.update(job.id, expect=(RUNNING,), stop_requested_at=time.time(),
                              stop_reason=f"hung: no output for {silent:.0f} s (limit {limit:g} s)")

    def signal_if_stopping(self, job: Job) -> None:
        """SIGTERM to the job's process group once, SIGKILL after the grace period."""
        job = self.store.get(job.id)  # stop_if_hung may just have asked
        if job.stop_requested_at is None or job.pid is None:
            return
        if job.id not in self.signalled:
            runner.signal_group(job.pid, signal.SIGTERM)
            self.signalled.add(job.id)
        elif time.time() - job.stop_requested_at > self.settings.grace_seconds:
            runner.signal_group(job.pid, signal.SIGKILL)

    def note_first_step(self, job: Job) -> None:
        if job.first_step_at is None and runner.progress(Path(job.run_dir)) is not None:
            self.store.update(job.id, expect=(RUNNING,), first_step_at=time.time())

    def schedule(self) -> None:
        queued = self.store.list((QUEUED,))
        if not queued:
            return
        waiting = [scheduler.Waiting(job.id, job.np) for job in queued]
        by_id = {job.id: job for job in queued}
        for job_id, allocation in scheduler.plan(waiting, self.settings.inventory,
                                                 list(self.allocations().values())):
            self.launch(by_id[job_id], allocation)

    def resize_elastic(self) -> None:
        """Shrink elastic jobs to admit the head of the queue; grow them when nothing waits."""
        queued = self.store.list((QUEUED,))
        running = [job for job in self.store.list((RUNNING,)) if job.hosts]
        allocations = {job.id: json.loads(job.hosts) for job in running}
        free = scheduler.free_slots(self.settings.inventory, list(allocations.values()))
        resizable = [elasticity.Resizable(job.id, sum(allocations[job.id].values()), job.min_np, job.max_np,
                                          job.resized_at or 0.0)
                     for job in running if job.elastic and job.stop_requested_at is None and job.pid]
        sizes = elasticity.resize(queued[0].np if queued else None, sum(free.values()), resizable,
                                  time.time(), self.settings.resize_cooldown_seconds)
        for job in running:
            if job.id not in sizes:
                continue
            before = allocations[job.id]
            after = (elasticity.shrunk(before, sizes[job.id]) if sizes[job.id] < sum(before.values())
                     else elasticity.grown(before, sizes[job.id], free))
            free = {host: n + before.get(host, 0) - after.get(host, 0) for host, n in free.items()}
            runner.write_allocation(Path(job.run_dir), after)
            self.store.update(job.id, expect=(RUNNING,), hosts=json.dumps(after), resized_at=time.time(),
                              resizes=job.resizes + 1)
            log.info("job %d: resized %s -> %s (%d waiting)", job.id, before, after, len(queued))

    def launch(self, job: Job, allocation: dict[str, int]) -> None:
        run_dir = self.run_dir(job.id)
        claimed = self.store.update(job.id, expect=(QUEUED,), state=RUNNING, started_at=time.time(),
                                    resized_at=time.time(),
                                    hosts=json.dumps(allocation), run_dir=str(run_dir),
                                    attempts=job.attempts + 1, first_step_at=None)
        if claimed is None:  # cancelled meanwhile
            return
        try:
            spec = job_spec.JobSpec(**json.loads(job.spec))
            resume = run_dir if job.attempts > 0 and runner.has_checkpoint(run_dir) else None
            config = job_spec.job_config(job_spec.resolve(spec, self.settings.data_roots), run_dir, resume,
                                         self.settings.job_metrics)
            runner.prepare(run_dir, spec.model_dump(), config, allocation)
            child = runner.start(run_dir, runner.command(run_dir, spec.model_dump(), allocation,
                                                         self.settings.ssh_port, self.settings.network_interface))
        except (UserError, OSError) as err:  # the data roots changed, the disk filled up, ...
            self.store.update(job.id, expect=(RUNNING,), state=FAILED, ended_at=time.time(),
                              message=f"could not start: {err}")
            return
        self.children[job.id] = child
        self.store.update(job.id, pid=child.pid, pid_start=runner.start_time(child.pid))
        log.info("job %d: started on %s (pid %d)", job.id, allocation, child.pid)
