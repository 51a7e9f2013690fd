"""The service's loop: after a restart adopt, then follow, cancel, watch for hangs, resize and
schedule, the same over every executor (hvdcls.serve.executors).

One thread runs the loop; the API's threads only insert jobs and mark cancel requests, then wake
it (a job handed to an executor that keeps its own queue is started in the API's thread, at
submit, so that a refusal is the request's answer). Every job state change is a conditional
update (`expect=`), so a cancel racing a start or an end never leaves a job in two states.

What the loop knows of a job comes from three places only: the job table, what its executor
says (Seen: queued, running, or how it ended) and the job's own status.json (progress, the time
of its last step, the world it runs in; hvdcls.files.status_file). It parses no job output.
"""
from __future__ import annotations

import json
import logging
import threading
import time
from pathlib import Path
from typing import Optional

from sqlalchemy.exc import IntegrityError

from hvdcls import config as cfg
from hvdcls.errors import UserError
from hvdcls.files import status_file
from hvdcls.files.status_file import RunStatus
from hvdcls.serve import elasticity, executors, faults, launches, runner, scheduler
from hvdcls.serve import spec as job_spec
from hvdcls.serve.executors.base import NOT_STARTED, Executor, Handle, Launch, Seen
from hvdcls.serve.settings import Settings
from hvdcls.serve.store import CANCELLED, FAILED, FINAL, QUEUED, RUNNING, SUCCEEDED, Job, Store

log = logging.getLogger("hvdcls.serve")
NO_LAUNCH = dict(launch_id=None, **Handle().columns())  # a job no executor holds


class Service:
    def __init__(self, settings: Settings, executor: Optional[Executor] = None):
        self.settings = settings
        settings.state_dir.mkdir(parents=True, exist_ok=True)
        self.executor = executor or executors.create(settings)
        self.store = Store(settings.state_dir / "jobs.db")
        self.signalled: set[int] = set()  # jobs with a stop request already passed to the executor
        self.wake, self.stopping = threading.Event(), threading.Event()
        self.thread: Optional[threading.Thread] = None

    @property
    def inventory(self) -> dict[str, int]:
        """The slots the service places jobs on ({} where the executor places them)."""
        return self.executor.inventory or {}

    @property
    def total_slots(self) -> int:
        return sum(self.inventory.values())

    def run_dir(self, job_id: int) -> Path:
        return self.settings.state_dir / "jobs" / f"{job_id:06d}"

    # --- what the API calls -----------------------------------------------------------------

    def submit(self, spec: job_spec.JobSpec, owner: Optional[str] = None) -> Job:
        """Queue a job; UserError (naming the key) for a bad spec, Refused (TooLarge, Rejected)
        for one this service cannot run. An executor that keeps its own queue gets it now."""
        return self.submit_once(spec, owner)[0]

    def submit_once(self, spec: job_spec.JobSpec, owner: Optional[str] = None,
                    key: Optional[str] = None) -> tuple[Job, bool]:
        """submit, with the submitter's idempotency key: (the job, False) when it is new, (the
        job the key made before, True) when it is a retry; UserError when the key made a job
        of another spec."""
        if key is not None and (before := self.store.by_key(owner, key)) is not None:
            return self.same_submission(before, spec, key), True
        config = job_spec.resolve(spec, self.settings.data_roots)
        self.executor.check(spec)
        self.check_sweep(spec, owner)
        try:
            job = self.store.add(spec.model_dump(), config.training.epochs, owner, idempotency_key=key)
        except IntegrityError:  # the same key in a request running beside this one: that one's job
            return self.same_submission(self.store.by_key(owner, key or ""), spec, key or ""), True
        faults.crash_point("submit")
        begun = self.begin_launch(job) if self.executor.inventory is None else None
        if begun is not None:
            try:
                job = self.hand_over(begun, spec, config, allocation=None, resume=False)
            except Exception:  # refused (a crash instead leaves the row, for the restart to decide)
                self.store.delete(job.id)  # never reached the executor: as if never submitted
                raise
        self.wake.set()
        return job, False

    @staticmethod
    def same_submission(before: Optional[Job], spec: job_spec.JobSpec, key: str) -> Job:
        """The job an idempotency key made, when the retry asks for the same job."""
        if before is None:  # made and deleted again (refused by its executor) meanwhile
            raise UserError(f"Idempotency-Key {key!r}: its submission was refused; retry with a new key")
        if before.spec != json.dumps(spec.model_dump(), sort_keys=True):
            raise UserError(f"Idempotency-Key {key!r}: job {before.id} was submitted with it, with another "
                            "spec; give a new key for a new job")
        return before

    def check_sweep(self, spec: job_spec.JobSpec, owner: Optional[str]) -> None:
        """A sweep's trials are one user's: a job may not join another user's sweep."""
        if spec.sweep is None:
            return
        holder = self.store.sweep_owner(spec.sweep.id)
        if holder is not None and holder != owner:
            raise UserError(f"sweep.id {spec.sweep.id!r}: that sweep is {holder}'s; give another id")

    def cancel(self, job_id: int, reason: Optional[str] = None) -> Optional[Job]:
        """In the service's queue: cancelled now. In the executor's hands: the loop asks it to
        stop the job (the host list: SIGTERM, SIGKILL after the grace; Slurm: scancel). `reason`
        (store.PRUNED: its sweep stopped it) is kept with the first request to stop it."""
        now = time.time()
        job = self.store.get(job_id)
        if job is None:
            return None
        if not self.executor.holds(job):
            job = self.store.update(job_id, expect=(QUEUED,), state=CANCELLED, ended_at=now,
                                    message="cancelled before it started", cancel_reason=reason
                                    ) or self.store.get(job_id)
        if job is not None and job.state in (QUEUED, RUNNING) and job.stop_requested_at is None:
            self.store.update(job_id, expect=(QUEUED, RUNNING), stop_requested_at=now, cancel_reason=reason)
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
        pause = self.settings.poll_seconds or self.executor.poll_seconds
        while not self.stopping.is_set():
            try:
                self.tick()
            except Exception:  # a bad moment (disk full, a race, Slurm away) must not end the service
                log.exception("service loop")
            self.wake.wait(pause)
            self.wake.clear()

    def tick(self) -> None:
        active = self.store.list((QUEUED, RUNNING))
        seen = self.executor.poll(active) if active else {}
        for job in active:
            if job.id in seen:
                self.follow(job, seen[job.id])
        if self.executor.inventory is not None:  # the service places jobs: resize, then start
            self.resize_elastic()
            self.schedule()

    def reconcile(self) -> None:
        """Jobs a previous service left in an executor's hands or was starting when it ended,
        whatever the instant: adopted if still there, recorded if they ended meanwhile, started
        again if they never started (executors.base: adopt), else failed (or queued again when
        their spec says requeue). Nothing is started twice: a launch the executor cannot find is
        abandoned for good before its job is started again."""
        for job in self.store.list((QUEUED, RUNNING)):
            if self.executor.holds(job) or job.launch_id is not None:
                self.recover(job, self.executor.adopt(job))
            elif self.executor.inventory is None:  # its submission ended before its handover began
                self.relaunch(job)

    def recover(self, job: Job, seen: Optional[Seen]) -> None:
        if seen is None:
            self.lost(job)
        elif seen.state == NOT_STARTED:
            self.not_started(job)
        elif seen.state in FINAL:
            self.record_end(job, seen)
        else:
            self.adopted(job, seen)

    def adopted(self, job: Job, seen: Seen) -> None:
        """Still there: the table gains what the job left and the crash kept from it (its
        handle, the slots a resize cut short had already told it of)."""
        fields = {k: v for k, v in seen.handle.columns().items() if v is not None} if seen.handle else {}
        if self.executor.inventory is not None and seen.hosts:
            fields.update(self.hosts_change(job, seen.hosts, time.time()))
        if fields:
            self.store.update(job.id, expect=(job.state,), **fields)
        log.info("job %d: still %s (%s), adopted", job.id, seen.state, self.executor.name)

    def not_started(self, job: Job) -> None:
        """A launch the crash cut short before anything of it ran: the job goes on as if it had
        never been claimed (its attempt not counted, whatever requeue says); a cancel asked
        meanwhile ends it."""
        faults.crash_point("restart.abandoned")
        reset = dict(NO_LAUNCH, hosts=None, started_at=None, resized_at=None, first_step_at=None)
        if job.state == RUNNING:  # the service's own queue counted the attempt as it claimed the job
            reset["attempts"] = max(job.attempts - 1, 0)
        if job.stop_requested_at is not None:
            self.store.update(job.id, expect=(QUEUED, RUNNING), state=CANCELLED, ended_at=time.time(),
                              message="cancelled before it started", **reset)
        elif self.executor.inventory is not None:
            self.store.update(job.id, expect=(RUNNING,), state=QUEUED, message=None, **reset)
        else:
            self.store.update(job.id, expect=(QUEUED,), **reset)
            self.relaunch(job)
        log.info("job %d: its launch never started; %s", job.id,
                 "cancelled" if job.stop_requested_at is not None else "queued again")

    def lost(self, job: Job) -> None:
        if job.requeue and job.stop_requested_at is None:
            self.store.update(job.id, expect=(RUNNING,), state=QUEUED, hosts=None,
                              message="requeued: its processes were gone at restart", **NO_LAUNCH)
        else:
            self.store.update(job.id, expect=(QUEUED, RUNNING), state=FAILED, ended_at=time.time(),
                              message=runner.failure_message(
                                  runner.directory(job), "its processes were gone when the service restarted"))

    def follow(self, job: Job, seen: Seen) -> None:
        if seen.state == QUEUED:  # the executor holds it, waiting
            if job.message != seen.message:
                self.store.update(job.id, expect=(QUEUED,), message=seen.message)
            self.signal_if_stopping(job)
        elif seen.state == RUNNING:
            status = status_file.read(runner.directory(job))
            job = self.note_running(job, seen, status) or job
            self.stop_if_hung(job, status)
            self.signal_if_stopping(job)
        else:
            self.record_end(job, seen)

    def note_running(self, job: Job, seen: Seen, status: Optional[RunStatus]) -> Optional[Job]:
        """The table follows the job: running (once its executor runs it), where (when the
        executor placed it: the world its status names), its first step."""
        now = time.time()
        fields: dict[str, object] = {}
        if job.state == QUEUED:
            fields.update(state=RUNNING, started_at=now, resized_at=now, message=None)
        fields.update(self.hosts_change(job, self.placed(status, seen), now))
        if job.first_step_at is None and status is not None and status.last_step_at is not None:
            fields["first_step_at"] = now
        return self.store.update(job.id, expect=(job.state,), **fields) if fields else job

    def placed(self, status: Optional[RunStatus], seen: Optional[Seen] = None) -> Optional[dict[str, int]]:
        """Where a job placed by its executor runs: the world its own status.json names (after
        an elastic reset too), else what the executor says; None where the service placed it."""
        if self.executor.inventory is not None:
            return None
        if status is not None and status.hosts:
            return dict(status.hosts)
        return seen.hosts if seen is not None and seen.hosts else None

    def hosts_change(self, job: Job, hosts: Optional[dict[str, int]], now: float) -> dict:
        """The fields recording `hosts` when they differ from the job's; a running elastic
        job's change of hosts is a resize."""
        if not hosts or (job.hosts and json.loads(job.hosts) == hosts):
            return {}
        change: dict = {"hosts": json.dumps(hosts)}
        if job.elastic and job.hosts and job.state == RUNNING:
            change.update(resized_at=now, resizes=job.resizes + 1)
            log.info("job %d: now on %s (was %s)", job.id, hosts, json.loads(job.hosts))
        return change

    def record_end(self, job: Job, seen: Seen) -> None:
        """How the job ended: a stop the service asked for (hung: failed; cancelled), else as
        the executor saw it. Its status.json is read a last time here, so what the table says
        of its world is what the job said last, however soon after its last change it ended."""
        run_dir, now = runner.directory(job), time.time()
        status = status_file.read(run_dir)
        fields = self.hosts_change(job, self.placed(status, seen), now)
        # A stopped job's exit status says little (horovodrun may exit 0 after a SIGTERM): it
        # finished only if it said so itself, in its status file, before it ended.
        finished = seen.state == SUCCEEDED and status is not None and status.phase == status_file.DONE
        message: Optional[str]
        if job.stop_reason is not None:
            state, message = FAILED, runner.failure_message(run_dir, job.stop_reason)
        elif job.stop_requested_at is not None and not finished:
            state, message = CANCELLED, seen.message if seen.state == CANCELLED else "cancelled while running"
        elif seen.state in (SUCCEEDED, CANCELLED):
            state, message = seen.state, seen.message
        else:
            state, message = FAILED, runner.failure_message(run_dir, seen.message or f"exit status {seen.exit_status}")
        faults.crash_point("record_end")
        self.store.update(job.id, expect=(QUEUED, RUNNING), state=state, ended_at=now,
                          exit_status=seen.exit_status, message=message, **fields)
        self.signalled.discard(job.id)
        log.info("job %d: %s (exit status %s; %s)", job.id, state, seen.exit_status, seen.message or "-")

    def stop_if_hung(self, job: Job, status: Optional[RunStatus]) -> None:
        """No step and no change of phase (status.json) for the job's hang_seconds (else the
        service's): end it, as failed. Silence counts from the job's start until it has a status."""
        limit = json.loads(job.spec).get("hang_seconds") or self.settings.hang_seconds
        if not limit or job.stop_requested_at is not None or job.state != RUNNING:
            return
        heard = [t for t in (status.last_sign_of_life if status else None, job.started_at) if t is not None]
        silent = time.time() - max(heard, default=time.time())
        if silent > limit:
            log.warning("job %d: no step for %.0f s, ending it", job.id, silent)
            self.store.update(job.id, expect=(RUNNING,), stop_requested_at=time.time(),
                              stop_reason=f"hung: no step for {silent:.0f} s (limit {limit:g} s)")

    def signal_if_stopping(self, job: Job) -> None:
        """Ask the executor to stop the job once; force it after the grace period."""
        now = self.store.get(job.id)  # stop_if_hung or a cancel may just have asked
        if now is None or now.stop_requested_at is None or not self.executor.holds(now):
            return
        if now.id not in self.signalled:
            self.executor.cancel(now)
            self.signalled.add(now.id)
        elif time.time() - now.stop_requested_at > self.settings.grace_seconds:
            self.executor.cancel(now, force=True)

    def schedule(self) -> None:
        queued = self.store.list((QUEUED,))
        if not queued:
            return
        waiting = [scheduler.Waiting(job.id, job.np) for job in queued]
        by_id = {job.id: job for job in queued}
        for job_id, allocation in scheduler.plan(waiting, self.inventory, list(self.allocations().values())):
            self.launch(by_id[job_id], allocation)

    def resize_elastic(self) -> None:
        """Shrink elastic jobs to admit the head of the queue; grow them when nothing waits."""
        queued = self.store.list((QUEUED,))
        running = [job for job in self.store.list((RUNNING,)) if job.hosts]
        allocations = {job.id: json.loads(job.hosts or "{}") for job in running}
        free = scheduler.free_slots(self.inventory, list(allocations.values()))
        resizable = [elasticity.Resizable(job.id, sum(allocations[job.id].values()), job.min_np or 1,
                                          job.max_np or job.np, job.resized_at or 0.0)
                     for job in running if job.elastic and job.stop_requested_at is None and self.executor.holds(job)]
        sizes = elasticity.resize(queued[0].np if queued else None, sum(free.values()), resizable,
                                  time.time(), self.settings.resize_cooldown_seconds)
        for job in running:
            if job.id not in sizes:
                continue
            before = allocations[job.id]
            after = (elasticity.shrunk(before, sizes[job.id]) if sizes[job.id] < sum(before.values())
                     else elasticity.grown(before, sizes[job.id], free))
            free = {host: n + before.get(host, 0) - after.get(host, 0) for host, n in free.items()}
            self.executor.resize(job, after)
            faults.crash_point("resize")  # a restart takes the slots from what the job was told
            self.store.update(job.id, expect=(RUNNING,), hosts=json.dumps(after), resized_at=time.time(),
                              resizes=job.resizes + 1)
            log.info("job %d: resized %s -> %s (%d waiting)", job.id, before, after, len(queued))

    def launch(self, job: Job, allocation: dict[str, int]) -> None:
        """Start a job of the service's queue on the slots the scheduler gave it. The claim
        commits the launch record (a new launch id) before anything is spawned."""
        now = time.time()
        claimed = self.store.update(job.id, expect=(QUEUED,), state=RUNNING, started_at=now, resized_at=now,
                                    hosts=json.dumps(allocation), run_dir=str(self.run_dir(job.id)),
                                    attempts=job.attempts + 1, first_step_at=None, launch_id=launches.new_id())
        if claimed is None:  # cancelled meanwhile
            return
        faults.crash_point("launch")
        self.start_attempt(claimed, allocation, resume=job.attempts > 0)

    def begin_launch(self, job: Job) -> Optional[Job]:
        """The launch record of a job handed to an executor that keeps its own queue; None when
        it left the queue meanwhile (cancelled)."""
        return self.store.update(job.id, expect=(QUEUED,), run_dir=str(self.run_dir(job.id)),
                                 launch_id=launches.new_id(), **Handle().columns())

    def relaunch(self, job: Job) -> None:
        """After a restart: hand again to its executor a job whose handover never began or
        never reached it (the executor keeps the queue)."""
        begun = self.begin_launch(job)
        if begun is not None:
            self.start_attempt(begun, allocation=None, resume=False)

    def start_attempt(self, job: Job, allocation: Optional[dict[str, int]], resume: bool) -> None:
        try:
            spec = job_spec.JobSpec(**json.loads(job.spec))
            config = job_spec.resolve(spec, self.settings.data_roots)
            self.hand_over(job, spec, config, allocation, resume=resume)
        except (UserError, OSError) as err:  # the data roots changed, the disk filled up, ...
            self.store.update(job.id, expect=(QUEUED, RUNNING), state=FAILED, ended_at=time.time(),
                              message=f"could not start: {err}")

    def hand_over(self, job: Job, spec: job_spec.JobSpec, config: cfg.Config,
                  allocation: Optional[dict[str, int]], resume: bool) -> Job:
        """Write the run directory every executor starts from and start the attempt there
        (resuming from its latest checkpoint when an earlier attempt left one), under the
        launch record already in the job's row."""
        run_dir = self.run_dir(job.id)
        resume_from = run_dir if resume and runner.has_checkpoint(run_dir) else None
        config = job_spec.job_config(config, run_dir, resume_from, self.settings.job_metrics)
        runner.prepare(run_dir, spec.model_dump(), config)
        faults.crash_point("hand_over.prepared")
        handle = self.executor.start(Launch(job.id, run_dir, spec, config, allocation, job.launch_id))
        faults.crash_point("hand_over.started")
        log.info("job %d: started by %s on %s (%s)", job.id, self.executor.name, allocation or "its own nodes",
                 ", ".join(f"{k} {v}" for k, v in handle.columns().items() if v is not None))
        # launch() counted the attempt as it claimed the job; a job handed over at submit is at its first
        started = self.store.update(job.id, expect=(QUEUED, RUNNING), run_dir=str(run_dir),
                                    attempts=max(job.attempts, 1), **handle.columns())
        if started is None:  # cancelled while it was being handed over: the executor has it now
            for column, value in handle.columns().items():
                setattr(job, column, value)
            self.executor.cancel(job)
        return started or job
