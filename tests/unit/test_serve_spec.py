"""hvdcls.serve: a spec is checked like `hvdcls train` (the bad key named), can only describe a
train run inside the data roots; the job table survives a restart, which reconciles what it
left running."""
import json
import os
import subprocess
import sys

import pytest
from pydantic import ValidationError
from sqlalchemy.exc import IntegrityError

from hvdcls import config as cfg
from hvdcls.errors import UserError
from hvdcls.files import status_file
from hvdcls.serve import runner
from hvdcls.serve.errors import TooLarge
from hvdcls.serve.launches import alive
from hvdcls.serve.launches import process_start as start_time
from hvdcls.serve.service import Service, Settings
from hvdcls.serve.spec import JobSpec, job_config, resolve
from hvdcls.serve.store import CANCELLED, FAILED, QUEUED, RUNNING, SUCCEEDED


def test_a_spec_is_validated_by_the_train_config_code(tmp_path):
    spec = JobSpec(np=2, settings={"training": {"epochs": 3}}, overrides=["optimizer.lr=0.2"])
    config = resolve(spec, [])
    assert (config.training.epochs, config.optimizer.lr) == (3, 0.2)
    assert config == cfg.load(overrides=["training.epochs=3", "optimizer.lr=0.2"])
    for settings, overrides, words in (
            ({"training": {"epohcs": 3}}, [], "training.epohcs"),
            ({}, ["training.batch_size=0"], "training.batch_size=0: must be > 0"),
            ({"optimizer": {"name": "rmsprop"}}, [], "optimizer.name='rmsprop': choose one of sgd"),
            ({"training": 3}, [], "training: is a section")):
        with pytest.raises(UserError, match=words.replace("(", r"\(")):
            resolve(JobSpec(np=1, settings=settings, overrides=overrides), [])


def test_a_spec_is_a_train_run_and_nothing_else():
    with pytest.raises(ValidationError, match="command"):
        JobSpec(np=1, command="rm -rf /")
    with pytest.raises(ValidationError, match="unknown backend 'mxnet'"):
        JobSpec(np=1, backend="mxnet")
    with pytest.raises(ValidationError, match="greater than or equal to 1"):
        JobSpec(np=0)
    for override, words in (("output.dir=/etc", "output.dir: cannot be set"),
                            ("horovod.timeline=/tmp/t.json", "horovod.timeline: cannot be set"),
                            ("training.elastic=true", "say it in the spec instead .elastic: true")):
        with pytest.raises(UserError, match=words):
            resolve(JobSpec(np=1, overrides=[override]), [])


def test_an_elastic_spec_is_bounded_and_runs_elastic():
    spec = JobSpec(np=2, elastic=True, max_np=4)
    assert (spec.min_np, spec.max_np, spec.most_slots) == (1, 4, 4)
    assert resolve(spec, []).training.elastic is True
    for fields, words in (({"np": 2, "min_np": 1}, "min_np and max_np are for elastic jobs"),
                          ({"np": 3, "elastic": True, "max_np": 2}, r"min_np <= np <= max_np \(got 1, 3, 2\)")):
        with pytest.raises(ValidationError, match=words):
            JobSpec(**fields)
    with pytest.raises(UserError, match="horovod.compression=powersgd with training.elastic=true"):
        resolve(JobSpec(np=1, elastic=True, overrides=["horovod.compression=powersgd"]), [])


def test_data_paths_must_lie_under_a_data_root(tmp_path):
    root, outside = tmp_path / "data", tmp_path / "elsewhere"
    (root / "pets").mkdir(parents=True)
    outside.mkdir()
    (root / "escape").symlink_to(outside)
    assert resolve(JobSpec(np=1, overrides=[f"data.path={root / 'pets'}"]), [root]).data.path == str(root / "pets")
    for path in (outside, root / "pets" / ".." / ".." / "elsewhere", root / "escape", "relative/pets"):
        with pytest.raises(UserError, match="not under the service's data roots"):
            resolve(JobSpec(np=1, overrides=[f"data.path={path}"]), [root])
    with pytest.raises(UserError, match=r"training.resume=.*none: start the service with --data-root"):
        resolve(JobSpec(np=1, overrides=[f"training.resume={root}"]), [])


def test_the_job_runs_in_its_run_directory_with_progress_lines(tmp_path):
    config = job_config(resolve(JobSpec(np=1), []), tmp_path, resume=tmp_path)
    assert (config.output.dir, config.output.progress, config.training.resume) == \
        (str(tmp_path), "lines", str(tmp_path))
    cfg.validate(config)
    assert config.output.metrics_port is None
    # serve --job-metrics: rank 0 serves /metrics on a free port, unless the spec chose one
    assert job_config(config, tmp_path, metrics=True).output.metrics_port == 0
    chosen = resolve(JobSpec(np=1, overrides=["output.metrics_port=9400"]), [])
    assert job_config(chosen, tmp_path, metrics=True).output.metrics_port == 9400


@pytest.fixture
def service(tmp_path):
    return Service(Settings(state_dir=tmp_path / "state", inventory={"localhost": 2}))


def test_submit_queues_in_order_and_refuses_what_can_never_run(service):
    ids = [service.submit(JobSpec(np=n)).id for n in (2, 1, 2)]
    assert [j.id for j in service.store.list((QUEUED,))] == ids == sorted(ids)
    assert service.store.get(ids[0]).epochs == 12  # the digits' default, from the validated config
    with pytest.raises(TooLarge, match="np=3: the inventory has 2 slots"):
        service.submit(JobSpec(np=3))
    with pytest.raises(TooLarge, match="max_np=3: the inventory has 2 slots"):
        service.submit(JobSpec(np=1, elastic=True, max_np=3))
    assert service.cancel(ids[1]).state == CANCELLED
    assert service.store.counts() == {QUEUED: 2, RUNNING: 0, SUCCEEDED: 0, FAILED: 0, CANCELLED: 1}


def test_an_idempotency_key_makes_one_job_however_often_it_is_sent(service, monkeypatch):
    first, again = (service.submit_once(JobSpec(np=1), "alice", "key-1") for _ in range(2))
    assert (first[1], again[1], again[0].id) == (False, True, first[0].id)
    assert service.store.count() == 1 and service.store.get(first[0].id).idempotency_key == "key-1"
    with pytest.raises(UserError, match=f"job {first[0].id} was submitted with it, with another spec"):
        service.submit_once(JobSpec(np=2), "alice", "key-1")
    bobs, replayed = service.submit_once(JobSpec(np=1), "bob", "key-1")  # keys are each user's own
    assert not replayed and bobs.id != first[0].id
    # Two requests with one key at once: the later insert meets the earlier's row, and answers with it.
    looked_up = service.store.by_key
    monkeypatch.setattr(service.store, "by_key", lambda owner, key: None)
    with pytest.raises(IntegrityError):  # the table itself holds one job per user and key
        service.store.add(JobSpec(np=1).model_dump(), 2, "alice", idempotency_key="key-1")
    monkeypatch.setattr(service.store, "by_key", lambda owner, key, calls=[]: calls.append(1) or (
        None if len(calls) == 1 else looked_up(owner, key)))
    raced, replayed = service.submit_once(JobSpec(np=1), "alice", "key-1")
    assert (raced.id, replayed, service.store.count()) == (first[0].id, True, 2)


def dead_process() -> tuple[int, int]:
    """A pid and start time of a process that has ended (and been reaped)."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    started = start_time(child.pid)
    child.wait()
    return child.pid, started


def left_running(service, run_dir, requeue=False, exit_code=None):
    """A job the previous service left running, whose process is gone."""
    job = service.submit(JobSpec(np=1, requeue=requeue))
    pid, started = dead_process()
    run_dir.mkdir(parents=True)
    (run_dir / runner.STDERR).write_text("Traceback ...\nRuntimeError: out of memory\n")
    if exit_code is not None:
        (run_dir / runner.EXIT).write_text(json.dumps({"returncode": exit_code}))
    service.store.update(job.id, state=RUNNING, pid=pid, pid_start=started, run_dir=str(run_dir),
                         hosts=json.dumps({"localhost": 1}), started_at=1.0)
    return job.id


def test_a_restart_reconciles_the_jobs_left_running(tmp_path):
    before = Service(Settings(state_dir=tmp_path / "state", inventory={"localhost": 4}))
    gone = left_running(before, tmp_path / "gone")
    again = left_running(before, tmp_path / "again", requeue=True)
    ended = left_running(before, tmp_path / "ended", exit_code=0)
    alive = before.submit(JobSpec(np=1)).id
    before.store.update(alive, state=RUNNING, pid=os.getpid(), pid_start=start_time(os.getpid()),
                        run_dir=str(tmp_path), hosts=json.dumps({"localhost": 1}))
    after = Service(Settings(state_dir=tmp_path / "state", inventory={"localhost": 4}))  # same table
    after.reconcile()
    states = {j: after.store.get(j) for j in (gone, again, ended, alive)}
    assert states[gone].state == FAILED
    assert states[gone].message.splitlines() == ["its processes were gone when the service restarted",
                                                 "Traceback ...", "RuntimeError: out of memory"]
    assert (states[again].state, states[again].hosts) == (QUEUED, None)
    assert (states[ended].state, states[ended].exit_status) == (SUCCEEDED, 0)
    assert states[alive].state == RUNNING  # adopted


def test_a_recycled_pid_is_not_taken_for_the_job():
    assert alive(os.getpid(), start_time(os.getpid()))
    assert not alive(os.getpid(), start_time(os.getpid()) - 1)
    assert not alive(*dead_process())


def test_a_silent_job_is_ended_as_hung_and_a_cancelled_one_as_cancelled(tmp_path):
    """Silence is read from the job's status.json: its last step (or change of phase) long
    ago; a job without a status counts from its start, one stepping now is left alone."""
    service = Service(Settings(state_dir=tmp_path / "state", inventory={"localhost": 3}, grace_seconds=0))
    jobs = {}
    now = __import__("time").time()
    for name, hang, last_step, started in (("silent", 5, 100.0, 100.0), ("cancelled", None, now, now),
                                           ("no status", 5, None, 100.0), ("stepping", 5, now, 100.0)):
        job_id = service.submit(JobSpec(np=1, hang_seconds=hang)).id
        process = subprocess.Popen(["sleep", "60"], start_new_session=True)
        run_dir = tmp_path / name
        run_dir.mkdir()
        (run_dir / runner.STDOUT).write_text("epoch 1/2 step 3/10 loss 2.1\n")
        if last_step is not None:
            status = status_file.RunStatus(phase="training", phase_since=last_step - 1, last_step_at=last_step)
            (run_dir / status_file.STATUS_FILE).write_text(json.dumps(status.as_dict()))
        service.store.update(job_id, state=RUNNING, pid=process.pid, pid_start=start_time(process.pid),
                             run_dir=str(run_dir), hosts=json.dumps({"localhost": 1}), started_at=started)
        jobs[name] = (job_id, process)
    service.cancel(jobs["cancelled"][0])
    service.tick()  # SIGTERM to three groups
    for name in ("silent", "cancelled", "no status"):
        assert jobs[name][1].wait(timeout=10) == -15
    assert jobs["stepping"][1].poll() is None
    service.tick()  # gone: recorded
    silent, cancelled, unknown, stepping = (service.store.get(job_id) for job_id, _ in jobs.values())
    assert silent.state == FAILED and silent.message.startswith("hung: no step for "), silent.message
    assert silent.message.splitlines()[-1] == "epoch 1/2 step 3/10 loss 2.1"
    assert unknown.state == FAILED and unknown.message.startswith("hung: no step for ")
    assert cancelled.state == CANCELLED and cancelled.message == "cancelled while running"
    assert stepping.state == RUNNING and stepping.stop_requested_at is None
    jobs["stepping"][1].kill()
    jobs["stepping"][1].wait()


@pytest.mark.parametrize("fields, words", [
    ({"name": "a b"}, "name"), ({"name": "x;y"}, "name"), ({"name": "\x07"}, "name"),
    ({"overrides": ["model.name=a|b"]}, "'|' is not allowed"),
    ({"overrides": ["model.name=a\tb"]}, "'\\\\t' is not allowed"),
    ({"overrides": ["data.path=${oc.env:HOME}"]}, "interpolations are not allowed"),
    ({"overrides": ["+model.name=x"]}, "not key=value with a dotted key"),
    ({"overrides": ["a=1"] * 1001}, "at most 1000 items"),
    ({"settings": {"model": {"name": "${oc.env:HOME}"}}}, "settings.model.name: .* interpolations"),
    ({"settings": {"optimizer": {"lr": float("nan")}}}, "settings.optimizer.lr: nan is not a finite number"),
    ({"settings": {"training": {"epochs": 2**64}}}, "does not fit in 64 bits"),
    ({"settings": {"data": {"a.b": 1}}}, "key 'a.b' is not a name"),
    ({"settings": {"data": {"mean": [0.5, "x`id`"]}}}, r"settings.data.mean\[1\]: '`'"),
    ({"settings": {"a": {"a": {"a": {"a": {"a": {"a": {"a": {"a": 1}}}}}}}}}, "8 levels at most"),
    ({"settings": {"data": {f"k{i}": i for i in range(6000)}}}, "5000 values"),
    ({"hang_seconds": float("inf")}, "finite number"),
])
def test_a_spec_is_plain_data(fields, words):
    """Nothing in a spec reaches a shell, but it is network input: plain text, finite numbers."""
    with pytest.raises(ValidationError, match=words):
        JobSpec(np=1, **fields)


def test_numbers_out_of_range_are_refused_whichever_layer_set_them():
    for override, words in (("training.epochs=100000000000000000000", "training.epochs: 1e"),
                            ("optimizer.lr=1e999", "optimizer.lr: inf is not a finite number")):
        with pytest.raises(UserError, match=words.replace("1e", "100000")):
            resolve(JobSpec(np=1, overrides=[override]), [])
    spec = JobSpec(np=1, name="resnet-50_v2.1@alice", overrides=["data.mean=[0.5,0.5,0.5]", "model.name='x y'"])
    assert spec.name == "resnet-50_v2.1@alice" and len(spec.overrides) == 2  # what people write still goes
