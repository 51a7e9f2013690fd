"""The service loop over the Executor contract, with an in-memory executor: what the loop asks
(start, poll once per turn, cancel then force, resize, adopt) and what it records from the
answers and from the jobs' status.json, whether the service places jobs (an inventory) or the
executor does (none: each job handed over at submit). No process, no Slurm."""
import json
import time
from pathlib import Path

import pytest

from hvdcls.files import status_file
from hvdcls.serve import executors
from hvdcls.serve.errors import Refused
from hvdcls.serve.executors.base import Executor, Handle, Seen
from hvdcls.serve.service import Service
from hvdcls.serve.settings import Settings
from hvdcls.serve.spec import JobSpec
from hvdcls.serve.store import CANCELLED, FAILED, QUEUED, RUNNING, SUCCEEDED


class FakeExecutor(Executor):
    """Jobs as entries of `seen` that the test moves along; every call recorded."""

    name = "fake"

    def __init__(self, settings, inventory=None):
        super().__init__(settings)
        self.slots, self.seen, self.calls = inventory, {}, []
        self.refuse = None

    @property
    def inventory(self):
        return self.slots

    def describe(self):
        return "in memory"

    def check(self, spec):
        if spec.name == "impossible":
            raise Refused("impossible: never")

    def start(self, attempt):
        self.calls.append(("start", attempt.job_id, attempt.allocation))
        if self.refuse:
            raise Refused(self.refuse)
        assert (attempt.run_dir / "job.yaml").exists() and not (attempt.run_dir / status_file.STATUS_FILE).exists()
        self.seen[attempt.job_id] = Seen(QUEUED if self.slots is None else RUNNING, message="waiting")
        return Handle(external_id=f"x{attempt.job_id}")

    def holds(self, job):
        return job.external_id is not None and job.id in self.seen

    def poll(self, jobs):
        self.calls.append(("poll", sorted(j.id for j in jobs if self.holds(j))))
        return {job.id: self.seen[job.id] for job in jobs if self.holds(job)}

    def adopt(self, job):
        self.calls.append(("adopt", job.id))
        return self.seen.get(job.id)

    def cancel(self, job, force=False):
        self.calls.append(("cancel", job.id, force))

    def resize(self, job, hosts):
        self.calls.append(("resize", job.id, hosts))

    def end(self, job_id, state, code, message=None, hosts=None):
        self.seen[job_id] = Seen(state, code, message, hosts)


def make(tmp_path, inventory=None, **settings) -> tuple[Service, FakeExecutor]:
    settings = Settings(state_dir=tmp_path / "state", **settings)
    fake = FakeExecutor(settings, inventory)
    return Service(settings, fake), fake


def status(job, **fields) -> None:
    fields.setdefault("phase", "training")
    (Path(job.run_dir) / status_file.STATUS_FILE).write_text(json.dumps(status_file.RunStatus(**fields).as_dict()))


def test_the_registry_names_the_executors_and_refuses_others(tmp_path):
    assert executors.names() == ["hosts", "slurm"]
    with pytest.raises(Exception, match="unknown executor 'pbs': choose one of hosts, slurm"):
        executors.create(Settings(state_dir=tmp_path, executor="pbs"))
    with pytest.raises(Exception, match="give the host inventory"):
        executors.create(Settings(state_dir=tmp_path, executor="hosts"))
    with pytest.raises(Exception, match="Slurm owns the nodes"):
        executors.create(Settings(state_dir=tmp_path, executor="slurm", inventory={"a": 1}))


def test_an_executor_with_its_own_queue_gets_each_job_at_submit(tmp_path):
    service, fake = make(tmp_path)
    with pytest.raises(Refused, match="impossible"):
        service.submit(JobSpec(np=1, name="impossible"))
    fake.refuse = "no such partition"
    with pytest.raises(Refused, match="no such partition"):
        service.submit(JobSpec(np=1))
    assert service.store.list() == []  # neither refusal left a job
    fake.refuse = None
    job = service.submit(JobSpec(np=2))
    assert (job.state, job.external_id, job.attempts) == (QUEUED, f"x{job.id}", 1)
    assert fake.calls[-1] == ("start", job.id, None)  # placed by the executor
    service.tick()
    assert service.store.get(job.id).message == "waiting"
    fake.seen[job.id] = Seen(RUNNING, hosts={"a": 2})
    service.tick()
    running = service.store.get(job.id)
    assert (running.state, json.loads(running.hosts), running.first_step_at) == (RUNNING, {"a": 2}, None)
    status(running, last_step_at=time.time(), hosts={"a": 1, "b": 1})  # its world, as it says
    service.tick()
    stepped = service.store.get(job.id)
    assert stepped.first_step_at is not None and json.loads(stepped.hosts) == {"a": 1, "b": 1}
    assert stepped.resizes == 0  # not elastic: the record follows, no resize counted
    fake.end(job.id, FAILED, 3, "exit status 3")
    service.tick()
    failed = service.store.get(job.id)
    assert (failed.state, failed.exit_status, failed.message.splitlines()[0]) == (FAILED, 3, "exit status 3")
    assert [c for c in fake.calls if c[0] == "poll"][-1] == ("poll", [job.id])  # one poll a turn, all held jobs


def test_cancel_queued_in_the_service_at_once_held_through_the_executor_then_forced(tmp_path):
    service, fake = make(tmp_path, inventory={"a": 2}, grace_seconds=0)
    big = service.submit(JobSpec(np=2))
    waiting = service.submit(JobSpec(np=2))
    service.tick()  # big starts on the 2 slots, the other waits in the service's queue
    assert fake.calls[-1] == ("start", big.id, {"a": 2})
    assert service.cancel(waiting.id).state == CANCELLED  # never reached the executor
    assert service.cancel(big.id).state == RUNNING
    service.tick()
    service.tick()
    assert [c for c in fake.calls if c[0] == "cancel"] == [("cancel", big.id, False), ("cancel", big.id, True)]
    fake.end(big.id, FAILED, -15, "exit status -15")
    service.tick()
    ended = service.store.get(big.id)
    assert (ended.state, ended.message) == (CANCELLED, "cancelled while running")



def test_a_stopped_job_that_exits_0_succeeded_only_if_its_status_said_done(tmp_path):
    service, fake = make(tmp_path, inventory={"a": 2})
    stopped, finished = service.submit(JobSpec(np=1)), service.submit(JobSpec(np=1))
    service.tick()
    for job_id, phase in ((stopped.id, "training"), (finished.id, "done")):
        status(service.store.get(job_id), phase=phase)
        service.cancel(job_id)
    service.tick()
    for job_id in (stopped.id, finished.id):
        fake.end(job_id, SUCCEEDED, 0)  # horovodrun may exit 0 after a SIGTERM
    service.tick()
    assert service.store.get(stopped.id).state == CANCELLED
    assert service.store.get(finished.id).state == SUCCEEDED  # it ended before the signal told

def test_a_hang_is_the_status_files_silence_under_any_executor(tmp_path):
    service, fake = make(tmp_path, hang_seconds=30)
    job = service.submit(JobSpec(np=1))
    fake.seen[job.id] = Seen(RUNNING)
    service.tick()
    running = service.store.get(job.id)
    status(running, last_step_at=time.time() - 40, phase_since=time.time() - 100)
    service.tick()
    assert service.store.get(job.id).stop_requested_at is None  # an old status: silence counts from the start
    service.store.update(job.id, started_at=time.time() - 100)
    status(running, last_step_at=time.time() - 10, phase_since=time.time() - 100)
    service.tick()
    assert service.store.get(job.id).stop_requested_at is None  # 10 s: within the limit
    status(running, last_step_at=time.time() - 40, phase_since=time.time() - 100)
    service.tick()
    assert ("cancel", job.id, False) in fake.calls
    fake.end(job.id, CANCELLED, 0, "cancelled by the executor")
    service.tick()
    hung = service.store.get(job.id)
    assert hung.state == FAILED and hung.message.startswith("hung: no step for 4"), hung.message


def test_a_restart_adopts_records_or_requeues(tmp_path):
    service, fake = make(tmp_path, inventory={"a": 4})
    jobs = [service.submit(JobSpec(np=1, requeue=n == 2)) for n in range(4)]
    service.tick()  # all four start
    alive, ended, gone_requeued, gone = jobs
    fake.end(ended.id, SUCCEEDED, 0)
    del fake.seen[gone_requeued.id], fake.seen[gone.id]  # a restart finds no trace of them
    again, _ = make(tmp_path, inventory={"a": 4})
    again.executor = fake
    fake.seen[gone_requeued.id] = fake.seen[gone.id] = None  # still "held" by their handle
    again.reconcile()
    states = [again.store.get(j.id) for j in jobs]
    assert [s.state for s in states] == [RUNNING, SUCCEEDED, QUEUED, FAILED]
    assert states[2].external_id is None and states[2].hosts is None  # its handle cleared
    assert states[3].message.startswith("its processes were gone")


def test_the_service_resizes_an_elastic_job_it_placed_to_admit_the_head(tmp_path):
    service, fake = make(tmp_path, inventory={"a": 2, "b": 2}, resize_cooldown_seconds=0)
    elastic = service.submit(JobSpec(np=4, elastic=True, min_np=2))
    service.tick()
    head = service.submit(JobSpec(np=2))
    service.tick()  # a shrink to 2 (whole hosts first), then the head on the freed slots
    resized = [c for c in fake.calls if c[0] == "resize"]
    assert resized == [("resize", elastic.id, {"b": 2})]
    assert fake.calls[-1][0:2] == ("start", head.id)
    assert service.store.get(elastic.id).resizes == 1
