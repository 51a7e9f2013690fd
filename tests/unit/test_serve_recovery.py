"""What a restarted service decides for a job of its own queue (the host-list executor) that a
crash left at each instant of its launch, of a resize and of the recording of its end: never
started (queued again, its attempt not counted, whatever requeue says), running (adopted from
what its wrapper wrote first), ended (its exit record), or gone. The crash is raised at the
service's own crash points (hvdcls.serve.faults); the jobs are real wrappers around the test
stand-in for horovodrun (tests/serve_standin.py), which logs each start."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hvdcls.serve import faults, launches, runner
from hvdcls.serve.executors import hosts
from hvdcls.serve.service import Service
from hvdcls.serve.settings import Settings
from hvdcls.serve.spec import JobSpec
from hvdcls.serve.store import CANCELLED, FAILED, QUEUED, RUNNING, SUCCEEDED

STANDIN = Path(__file__).resolve().parents[1] / "serve_standin.py"


class Crash(BaseException):
    """The service's process ending at a crash point (BaseException: nothing of it catches it)."""


@pytest.fixture(autouse=True)
def standin(monkeypatch, tmp_path):
    monkeypatch.setenv(faults.STANDIN, str(STANDIN))
    monkeypatch.setenv("PYTHONPATH", str(Path(__file__).resolve().parents[2]))
    yield
    for claim in tmp_path.glob(f"state/jobs/*/{launches.LAUNCHES}/*.json"):  # no wrapper outlives its test
        pid = json.loads(claim.read_text()).get("pid")
        if pid:
            hosts.signal_group(pid, signal.SIGKILL)


def service(tmp_path: Path, slots: int = 2) -> Service:
    return Service(Settings(state_dir=tmp_path / "state", inventory={"localhost": slots},
                            resize_cooldown_seconds=0))


def crash_at(monkeypatch, point: str):
    def hook(name: str) -> None:
        if name == point:
            raise Crash(point)
    monkeypatch.setattr(faults, "crash_point", hook)


def restart(tmp_path: Path, monkeypatch, crash: str = "") -> Service:
    crash_at(monkeypatch, crash)
    again = service(tmp_path)
    again.reconcile()
    return again


def crashed_launch(tmp_path, monkeypatch, point: str, spec: JobSpec) -> tuple[Service, int]:
    """A job the service crashed at `point` of its first launch."""
    before = service(tmp_path)
    job_id = before.submit(spec).id
    crash_at(monkeypatch, point)
    with pytest.raises(Crash):
        before.tick()
    return before, job_id


def wait_for(condition, timeout: float = 30):
    deadline = time.time() + timeout
    while not (found := condition()):
        assert time.time() < deadline, "timed out"
        time.sleep(0.05)
    return found


def starts(job) -> list[str]:
    """The stand-in's own log of this job: a line per start and per end."""
    log = Path(job.run_dir) / "standin.log"
    return [line.split()[0] + (f" {line.split()[1]}" if line.startswith("end") else "")
            for line in (log.read_text().splitlines() if log.exists() else [])]


def run_to_end(svc: Service, job_id: int, timeout: float = 30):
    return wait_for(lambda: svc.tick() or (j := svc.store.get(job_id)).state in (SUCCEEDED, FAILED, CANCELLED)
                    and j, timeout)


@pytest.mark.parametrize("point", ["launch", "hand_over.prepared"])
def test_a_launch_cut_before_anything_was_spawned_is_queued_again_and_runs_once(tmp_path, monkeypatch, point):
    before, job_id = crashed_launch(tmp_path, monkeypatch, point, JobSpec(np=1))
    cut = before.store.get(job_id)
    assert (cut.state, cut.attempts, cut.pid) == (RUNNING, 1, None) and cut.launch_id
    again = restart(tmp_path, monkeypatch)
    queued = again.store.get(job_id)
    assert (queued.state, queued.attempts, queued.hosts, queued.started_at, queued.launch_id, queued.message) == (
        QUEUED, 0, None, None, None, None)  # not failed, not counted: it never ran (requeue is False)
    # The wrapper of the cut launch, should it start now, runs nothing: the launch was abandoned.
    marker = tmp_path / "ran"
    late = subprocess.run(runner.wrapped(Path(cut.run_dir), ["touch", str(marker)], cut.launch_id),
                          capture_output=True, text=True, timeout=30)
    assert (late.returncode, marker.exists()) == (0, False), late.stderr
    assert "abandoned by a restarted service" in late.stderr
    done = run_to_end(again, job_id)
    assert (done.state, done.attempts, starts(done)) == (SUCCEEDED, 1, ["start", "end 0"])


def test_a_wrapper_that_claimed_its_launch_before_the_restart_is_adopted(tmp_path, monkeypatch):
    before, job_id = crashed_launch(tmp_path, monkeypatch, "hand_over.started", JobSpec(np=1))
    cut = before.store.get(job_id)
    assert cut.pid is None  # spawned, not recorded
    claim = wait_for(lambda: launches.read_claim(Path(cut.run_dir), cut.launch_id))
    again = restart(tmp_path, monkeypatch)
    adopted = again.store.get(job_id)
    assert (adopted.state, adopted.pid, adopted.pid_start) == (RUNNING, claim["pid"], claim["pid_start"])
    wait_for(lambda: starts(adopted) == ["start"])
    again.cancel(job_id)
    done = run_to_end(again, job_id)
    assert (done.state, done.attempts, starts(done)) == (CANCELLED, 1, ["start", "end 143"])


@pytest.mark.parametrize("name, state, code", [(None, SUCCEEDED, 0), ("fail", FAILED, 3)])
def test_an_end_the_crash_kept_from_the_table_is_recorded_from_the_exit_record(tmp_path, monkeypatch,
                                                                                name, state, code):
    before = service(tmp_path)
    job_id = before.submit(JobSpec(np=1, name=name)).id
    crash_at(monkeypatch, "record_end")
    with pytest.raises(Crash):
        wait_for(lambda: before.tick() or False)
    assert before.store.get(job_id).state == RUNNING
    again = restart(tmp_path, monkeypatch)
    ended = again.store.get(job_id)
    assert (ended.state, ended.exit_status, starts(ended)) == (state, code, ["start", f"end {code}"])


def test_a_job_that_ended_before_the_restart_found_its_pid_is_recorded_too(tmp_path, monkeypatch):
    before, job_id = crashed_launch(tmp_path, monkeypatch, "hand_over.started",
                                    JobSpec(np=1))
    run_dir = Path(before.store.get(job_id).run_dir)
    wait_for(lambda: runner.exit_record(run_dir))
    ended = restart(tmp_path, monkeypatch).store.get(job_id)
    assert (ended.state, ended.exit_status, ended.pid) == (SUCCEEDED, 0, None)


@pytest.mark.parametrize("requeue", [False, True])
def test_a_claimed_launch_gone_without_a_word_is_a_real_loss(tmp_path, monkeypatch, requeue):
    before, job_id = crashed_launch(tmp_path, monkeypatch, "hand_over.started", JobSpec(np=1, requeue=requeue))
    cut = before.store.get(job_id)
    claim = wait_for(lambda: launches.read_claim(Path(cut.run_dir), cut.launch_id))
    hosts.signal_group(claim["pid"], signal.SIGKILL)  # the wrapper and its job, killed with no record
    wait_for(lambda: not launches.alive(claim["pid"], claim["pid_start"]))
    after = restart(tmp_path, monkeypatch).store.get(job_id)
    if requeue:
        assert (after.state, after.attempts, after.launch_id) == (QUEUED, 1, None)  # it ran: counted
    else:
        assert after.state == FAILED and after.message.startswith("its processes were gone")


def test_a_cancel_of_a_launch_that_never_started_ends_it_cancelled(tmp_path, monkeypatch):
    before, job_id = crashed_launch(tmp_path, monkeypatch, "launch", JobSpec(np=1))
    before.cancel(job_id)  # the API's thread, before the crash
    after = restart(tmp_path, monkeypatch).store.get(job_id)
    assert (after.state, after.message, starts(after)) == (CANCELLED, "cancelled before it started", [])


def test_a_restart_cut_short_after_abandoning_decides_the_same_next_time(tmp_path, monkeypatch):
    crashed_launch(tmp_path, monkeypatch, "launch", JobSpec(np=1))
    with pytest.raises(Crash):
        restart(tmp_path, monkeypatch, crash="restart.abandoned")
    jobs = restart(tmp_path, monkeypatch).store.list()
    assert [(j.state, j.attempts, j.launch_id) for j in jobs] == [(QUEUED, 0, None)]


def test_a_resize_cut_short_is_completed_from_the_slots_the_job_was_told_of(tmp_path, monkeypatch):
    before = service(tmp_path)
    elastic = before.submit(JobSpec(np=2, elastic=True, min_np=1, overrides=["training.epochs=1000"])).id
    before.tick()
    started = before.store.get(elastic)
    wait_for(lambda: launches.read_claim(Path(started.run_dir), started.launch_id))
    head = before.submit(JobSpec(np=1)).id
    crash_at(monkeypatch, "resize")
    with pytest.raises(Crash):
        before.tick()  # the job's allocation file says 1 slot; the table still 2
    assert json.loads(before.store.get(elastic).hosts) == {"localhost": 2}
    again = restart(tmp_path, monkeypatch)
    resized = again.store.get(elastic)
    assert (resized.state, json.loads(resized.hosts), resized.resizes) == (RUNNING, {"localhost": 1}, 1)
    again.tick()  # the freed slot goes to the head of the queue, not twice
    assert (again.store.get(head).state, json.loads(again.store.get(head).hosts)) == (RUNNING, {"localhost": 1})


def test_launch_claims_the_first_comer_wins_whole(tmp_path):
    run_dir = tmp_path / "run"
    mine = {"pid": os.getpid(), "pid_start": launches.process_start(os.getpid()), "at": 1.0}
    assert launches.claim(run_dir, "a", mine) == mine
    assert launches.claim(run_dir, "a", {"abandoned_at": 2.0}) == mine  # the second comer reads the first's
    assert launches.decide(run_dir, "a") == launches.Found(launches.RUNNING, os.getpid(), mine["pid_start"])
    assert launches.decide(run_dir, "b").state == launches.NOT_STARTED
    assert launches.claim(run_dir, "b", mine) == {"abandoned_at": launches.read_claim(run_dir, "b")["abandoned_at"]}
    assert [p.name for p in (run_dir / launches.LAUNCHES).iterdir()] in (["a.json", "b.json"], ["b.json", "a.json"])


def test_only_this_launchs_exit_record_ends_it(tmp_path):
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    dead = {"pid": child.pid, "pid_start": launches.process_start(child.pid)}
    child.wait()
    launches.claim(tmp_path, "new", dead)
    (tmp_path / runner.EXIT).write_text(json.dumps({"returncode": 0, "launch": "old"}))
    assert launches.decide(tmp_path, "new").state == launches.GONE  # an earlier launch's end is not this one's
    (tmp_path / runner.EXIT).write_text(json.dumps({"returncode": 2, "launch": "new"}))
    assert launches.decide(tmp_path, "new") == launches.Found(launches.ENDED, dead["pid"], dead["pid_start"], 2)


def test_the_wrapper_runs_a_launch_once_however_often_it_is_started(tmp_path):
    command = runner.wrapped(tmp_path, [sys.executable, "-c", "import sys; print('ran'); sys.exit(4)"], "x1")
    first = subprocess.run(command, capture_output=True, text=True, timeout=30)
    second = subprocess.run(command, capture_output=True, text=True, timeout=30)
    assert (first.returncode, first.stdout, second.returncode, second.stdout) == (4, "ran\n", 0, "")
    assert json.loads((tmp_path / runner.EXIT).read_text())["launch"] == "x1"
    assert launches.read_claim(tmp_path, "x1")["pid"] != os.getpid()
