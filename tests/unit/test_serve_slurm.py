"""hvdcls.serve under Slurm, without Slurm: the batch script, SLURM_TASKS_PER_NODE, what
squeue's states mean, and the executor's bookkeeping (submit, refusal, states, a
restart) with Slurm's commands replaced by canned answers."""
import json
import os
import re
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from hvdcls.errors import UserError
from hvdcls.files import status_file
from hvdcls.serve import faults, launches, runner
from hvdcls.serve.errors import Refused
from hvdcls.serve.executors import slurm_batch as slurm
from hvdcls.serve.executors import slurm_elastic
from hvdcls.serve.service import Service
from hvdcls.serve.settings import Settings
from hvdcls.serve.slurm_options import SlurmOptions
from hvdcls.serve.spec import JobSpec
from hvdcls.serve.store import CANCELLED, FAILED, QUEUED, RUNNING, SUCCEEDED, Store

SQUEUE = "{id}|{state}|{reason}|{status}|"  # squeue -O JobID:|,State:|,Reason:|,exit_code:|


def test_tasks_per_node_expands_slurms_compression():
    assert slurm.tasks_per_node("2(x3),1") == [2, 2, 2, 1]
    assert slurm.tasks_per_node("4") == [4]
    assert slurm.allocation(["a", "b", "c"], "2(x2),1") == {"a": 2, "b": 2, "c": 1}
    with pytest.raises(UserError, match=r"cannot read '2\(x'"):
        slurm.tasks_per_node("2(x")
    with pytest.raises(UserError, match="2 nodes but SLURM_TASKS_PER_NODE '2' counts 1"):
        slurm.allocation(["a", "b"], "2")


def test_the_batch_script_asks_for_the_tasks_and_launches_horovodrun_on_the_allocation(tmp_path):
    options = SlurmOptions(partition="gpu", time_limit="1:00:00", account="vision").merged(
        {"tasks_per_node": 2, "account": None})
    script = slurm.batch_script("hvdcls-7", 3, "tensorflow", tmp_path, options)
    lines = script.splitlines()
    assert lines[0] == "#!/bin/bash"
    assert [line for line in lines if line.startswith("#SBATCH")] == [
        "#SBATCH --job-name=hvdcls-7", "#SBATCH --ntasks=3", "#SBATCH --cpus-per-task=1",
        f"#SBATCH --output={tmp_path}/stdout.log", f"#SBATCH --error={tmp_path}/stderr.log",
        f"#SBATCH --chdir={tmp_path}", "#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=2",
        "#SBATCH --partition=gpu", "#SBATCH --time=1:00:00", "#SBATCH --account=vision"]
    assert lines[-2] == f"hosts=$({sys.executable} -m hvdcls.serve.executors.slurm_batch hosts {tmp_path})"
    assert lines[-1].startswith(f"exec {sys.executable} -m hvdcls.serve.wrapper {tmp_path} -- ")
    assert ' -np 3 -H "$hosts" --gloo ' in lines[-1]
    assert lines[-1].endswith(f"-m hvdcls train --backend tensorflow --config {tmp_path}/job.yaml")
    assert subprocess.run(["bash", "-n"], input=script, text=True).returncode == 0
    plain = slurm.batch_script("j", 2, "torch", tmp_path, SlurmOptions())
    assert "--nodes" not in plain and "--partition" not in plain and "--time" not in plain


def test_the_script_finds_its_hosts_inside_the_allocation(tmp_path, monkeypatch, capsys):
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "scontrol").write_text('#!/bin/sh\n[ "$*" = "show hostnames node[1-2]" ] && printf "node1\\nnode2\\n"\n')
    (fake / "scontrol").chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("SLURM_JOB_NODELIST", "node[1-2]")
    monkeypatch.setenv("SLURM_TASKS_PER_NODE", "2,1")
    assert slurm.main(["hosts", str(tmp_path)]) == 0
    assert capsys.readouterr().out == "node1:2,node2:1\n"
    assert (tmp_path / runner.ALLOCATION).read_text() == "node1:2\nnode2:1\n"


@pytest.mark.parametrize("state, status, expected", [
    ("PENDING", 0, (QUEUED, None, 0)), ("CONFIGURING", 0, (QUEUED, None, 0)),
    ("RUNNING", 0, (RUNNING, None, 0)), ("COMPLETING", 0, (RUNNING, None, 0)),
    ("COMPLETED", 0, (SUCCEEDED, 0, 0)), ("CANCELLED", 15, (CANCELLED, 0, 15)),
    ("FAILED", 2 << 8, (FAILED, 2, 0)), ("TIMEOUT", 0, (FAILED, 0, 0)),
    ("NODE_FAIL", 0, (FAILED, 0, 0)), ("OUT_OF_MEMORY", 125, (FAILED, 0, 125))])
def test_slurm_states_map_to_the_services(state, status, expected):
    found = slurm.parse_squeue(SQUEUE.format(id=7, state=state, reason="None", status=status))["7"]
    assert (found.state, found.exit_code, found.signal) == expected
    assert found.slurm_state == state and found.reason is None


def test_one_squeue_answer_gives_every_job_and_the_pending_reasons():
    text = "\n".join([SQUEUE.format(id=7, state="PENDING", reason="Resources", status=0),
                      SQUEUE.format(id=8, state="PENDING", reason="ReqNodeNotAvail, UnavailableNodes:node1", status=0),
                      SQUEUE.format(id=9, state="FAILED", reason="NonZeroExitCode", status=256), ""])
    found = slurm.parse_squeue(text)
    assert sorted(found) == ["7", "8", "9"]
    assert (found["7"].reason, found["8"].reason) == ("Resources", "ReqNodeNotAvail, UnavailableNodes:node1")
    assert (found["9"].state, found["9"].exit_code) == (FAILED, 1)


def test_sbatchs_refusal_is_one_line():
    said = "sbatch: error: invalid partition specified: nope\nsbatch: error: Batch job submission failed: x\n"
    assert slurm.one_line(said) == "invalid partition specified: nope; Batch job submission failed: x"


class FakeSlurm:
    """sbatch, squeue and scancel as canned answers (every job in one state); records the calls."""

    def __init__(self):
        self.calls, self.state, self.status, self.refuse, self.known = [], "PENDING", 0, None, True
        self.submitted, self.names = 41, {}  # job name -> Slurm id, as sbatch's scripts name them

    def __call__(self, args, env=None):
        self.calls.append(args)
        if args[0] == "sbatch":
            if self.refuse:
                return subprocess.CompletedProcess(args, 1, "", f"sbatch: error: {self.refuse}\n")
            self.submitted += 1
            self.names[re.search(r"--job-name=(\S+)", Path(args[-1]).read_text()).group(1)] = str(self.submitted)
            return subprocess.CompletedProcess(args, 0, f"{self.submitted}\n", "")
        if args[0] == "squeue" and any(a.startswith("--name=") for a in args):
            name = next(a for a in args if a.startswith("--name=")).split("=", 1)[1]
            found = [SQUEUE.format(id=self.names[name], state=self.state, reason="None", status=self.status)
                     ] if name in self.names and self.known else []
            return subprocess.CompletedProcess(args, 0, "".join(f"{line}\n" for line in found), "")
        if args[0] == "squeue":
            if not self.known:
                return subprocess.CompletedProcess(args, 1, "", "slurm_load_jobs error: Invalid job id specified\n")
            ids = next(a for a in args if a.startswith("--jobs=")).split("=")[1].split(",")
            reason = "Priority" if self.state == "PENDING" else "None"
            lines = [SQUEUE.format(id=i, state=self.state, reason=reason, status=self.status) for i in ids]
            return subprocess.CompletedProcess(args, 0, "\n".join(lines) + "\n", "")
        return subprocess.CompletedProcess(args, 0, "", "")


@pytest.fixture
def fake(monkeypatch):
    fake = FakeSlurm()
    monkeypatch.setattr(slurm, "call", fake)
    return fake


def service(tmp_path: Path) -> Service:
    return Service(Settings(state_dir=tmp_path, executor="slurm", slurm=SlurmOptions(partition="debug")))


def test_a_job_follows_its_slurm_job_across_a_restart(tmp_path, fake):
    first = service(tmp_path)
    job = first.submit(JobSpec(np=2, slurm={"time_limit": "10"}))
    assert (job.state, job.external_id) == (QUEUED, "42")
    script = (Path(job.run_dir) / slurm.BATCH_SCRIPT).read_text()
    assert "#SBATCH --partition=debug\n" in script and "#SBATCH --time=10\n" in script
    assert fake.calls[0] == ["sbatch", "--parsable", str(Path(job.run_dir) / slurm.BATCH_SCRIPT)]
    first.tick()
    assert first.store.get(job.id).message == "pending in Slurm (Priority)"
    again = service(tmp_path)  # a restart: the Slurm job id is in the table
    again.reconcile()
    fake.state = "RUNNING"
    (Path(job.run_dir) / runner.ALLOCATION).write_text("vm:2\n")
    again.tick()
    running = again.store.get(job.id)
    assert (running.state, json.loads(running.hosts), running.message) == (RUNNING, {"vm": 2}, None)
    fake.state, fake.status = "FAILED", 3 << 8
    again.tick()
    failed = again.store.get(job.id)
    assert (failed.state, failed.exit_status) == (FAILED, 3)
    assert failed.message.startswith("Slurm FAILED, exit status 3")


def test_one_turn_of_the_loop_asks_slurm_once_for_all_its_jobs(tmp_path, fake):
    svc = service(tmp_path)
    jobs = [svc.submit(JobSpec(np=1)) for _ in range(3)]
    fake.calls.clear()
    svc.tick()
    assert fake.calls == [["squeue", "--noheader", "--states=all", "--jobs=42,43,44",
                           f"--Format={slurm.SQUEUE_FORMAT}"]]
    assert [svc.store.get(job.id).message for job in jobs] == ["pending in Slurm (Priority)"] * 3
    fake.state = "COMPLETED"
    svc.tick()
    fake.calls.clear()
    svc.tick()  # nothing left to follow: no call at all
    assert fake.calls == [] and {svc.store.get(job.id).state for job in jobs} == {SUCCEEDED}


def test_a_job_slurm_has_forgotten_ends_as_its_wrapper_recorded(tmp_path, fake):
    svc = service(tmp_path)
    job = svc.submit(JobSpec(np=1))
    (Path(job.run_dir) / runner.EXIT).write_text('{"returncode": 0}')
    fake.known = False
    svc.tick()
    assert (svc.store.get(job.id).state, svc.store.get(job.id).exit_status) == (SUCCEEDED, 0)


def test_cancel_is_scancel_and_the_state_comes_from_slurm(tmp_path, fake):
    svc = service(tmp_path)
    job = svc.submit(JobSpec(np=1))
    assert svc.cancel(job.id).state == QUEUED
    svc.tick()  # the loop passes the request on, as a pending job's
    assert fake.calls[-1] == ["scancel", "42"]
    svc.tick()
    assert fake.calls.count(["scancel", "42"]) == 1  # once
    fake.state, fake.status = "CANCELLED", 15
    svc.tick()
    done = svc.store.get(job.id)
    assert (done.state, done.message) == (CANCELLED, "cancelled in Slurm before it started")


def test_what_slurm_refuses_leaves_no_job(tmp_path, fake):
    svc = service(tmp_path)
    fake.refuse = "invalid partition specified: nope"
    with pytest.raises(Refused, match="^Slurm refused the job: invalid partition specified: nope$"):
        svc.submit(JobSpec(np=1, slurm={"partition": "nope"}))
    assert svc.store.list() == []


def test_an_older_job_table_gains_the_new_columns(tmp_path):
    with sqlite3.connect(tmp_path / "jobs.db") as db:
        db.execute("CREATE TABLE jobs (id INTEGER PRIMARY KEY, state VARCHAR(16))")
        db.execute("INSERT INTO jobs (id, state) VALUES (1, 'succeeded')")
    Store(tmp_path / "jobs.db")
    with sqlite3.connect(tmp_path / "jobs.db") as db:
        columns = {row[1] for row in db.execute("PRAGMA table_info(jobs)")}
        indexes = {row[1]: row[2] for row in db.execute("PRAGMA index_list(jobs)")}
    assert {"external_id", "spec", "hosts", "launch_id", "idempotency_key"} <= columns
    assert indexes["ix_jobs_owner_idempotency_key"] == 1  # unique


def test_slurm_script_prints_the_script_and_writes_the_validated_config(tmp_path, capsys):
    from hvdcls import config as cfg
    from hvdcls.cli import main

    run_dir = tmp_path / "run"
    assert main(["slurm-script", "--np", "2", "--output-dir", str(run_dir), "--partition", "debug",
                 "--name", "pets", "training.epochs=2"]) == 0
    script = capsys.readouterr().out
    assert script == slurm.batch_script("pets", 2, "torch", run_dir, SlurmOptions(partition="debug"))
    config = cfg.load(run_dir / runner.JOB_CONFIG)
    assert (config.training.epochs, config.output.dir) == (2, str(run_dir))
    assert main(["slurm-script", "--np", "2", "--output-dir", str(run_dir), "training.epohcs=2"]) == 2
    assert "training.epohcs" in capsys.readouterr().err
    assert main(["slurm-script", "--np", "4", "--elastic", "--min-np", "2", "--output-dir", str(run_dir)]) == 0
    assert capsys.readouterr().out == slurm.batch_script("hvdcls", 4, "torch", run_dir, SlurmOptions(),
                                                         slurm.Elastic(2, 4))
    assert cfg.load(run_dir / runner.JOB_CONFIG).training.elastic is True
    for bad, said in ((["--min-np", "5"], "elastic: needs min_np <= np <= max_np (got 5, 4, 4)"),
                      (["--launcher", "mpirun"], "--elastic needs horovodrun")):
        assert main(["slurm-script", "--np", "4", "--elastic", *bad, "--output-dir", str(run_dir)]) == 2
        assert said in capsys.readouterr().err


def test_an_elastic_job_asks_for_max_np_tasks_that_survive_a_lost_node(tmp_path):
    elastic = slurm.Elastic(min_np=2, max_np=4, network_interface="eth0")
    script = slurm.batch_script("e", 3, "torch", tmp_path, SlurmOptions(), elastic)
    lines = script.splitlines()
    assert "#SBATCH --ntasks=4" in lines and "#SBATCH --no-kill" in lines
    assert lines[-2] == f"{sys.executable} -m hvdcls.serve.executors.slurm_batch hosts {tmp_path} --elastic >/dev/null"
    assert (f" -np 3 --min-np 2 --max-np 4 --host-discovery-script {tmp_path}/discover.sh --elastic-timeout 60 "
            "--gloo --blacklist-cooldown-range 2 5 --network-interface eth0 ") in lines[-1]
    assert " -H " not in lines[-1] and subprocess.run(["bash", "-n"], input=script, text=True).returncode == 0
    assert "--no-kill" not in slurm.batch_script("j", 2, "torch", tmp_path, SlurmOptions())


def test_discovery_lists_the_allocations_nodes_that_slurm_and_their_sshd_say_are_usable(tmp_path, monkeypatch):
    """The real script with sinfo and ssh -G faked: 127.0.0.1 listens, 127.0.0.2 refuses,
    node3 is down in Slurm (and would not resolve anyway)."""
    import socket

    listening = socket.socket()
    listening.bind(("127.0.0.1", 0))
    listening.listen()
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "sinfo").write_text('#!/bin/sh\n[ "$*" = "--noheader --Node --states=down,drain,fail,no_respond '
                                '--format=%N" ] && echo node3\n')
    (fake / "ssh").write_text(f'#!/bin/sh\n[ "$1" = -G ] && echo "port {listening.getsockname()[1]}"\n')
    for tool in ("sinfo", "ssh"):
        (fake / tool).chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("SLURM_JOB_NODELIST", "x")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    slurm_elastic.write_discovery(run_dir, {"127.0.0.1": 2, "127.0.0.2": 1, "node3": 2})
    (run_dir / runner.ALLOCATION).write_text("127.0.0.1:2\n127.0.0.2:1\nnode3:2\n")
    try:
        found = subprocess.run([str(run_dir / runner.DISCOVERY)], capture_output=True, text=True, timeout=60)
    finally:
        listening.close()
    assert (found.returncode, found.stdout) == (0, "127.0.0.1:2\n"), found.stderr
    assert slurm_elastic.current_hosts(run_dir) == {"127.0.0.1": 2}
    (run_dir / slurm_elastic.NODES).write_text("127.0.0.2:1\n")  # nothing usable: still exit 0
    found = subprocess.run([str(run_dir / runner.DISCOVERY)], capture_output=True, text=True, timeout=60)
    assert (found.returncode, found.stdout, slurm_elastic.current_hosts(run_dir)) == (0, "", {})


def test_an_elastic_job_records_each_change_of_its_nodes_and_why_it_failed(tmp_path, fake):
    svc = service(tmp_path)
    job = svc.submit(JobSpec(np=4, elastic=True, min_np=2))
    script = (Path(job.run_dir) / slurm.BATCH_SCRIPT).read_text()
    assert "#SBATCH --no-kill" in script and "--min-np 2 --max-np 4" in script
    fake.state = "RUNNING"
    (Path(job.run_dir) / runner.ALLOCATION).write_text("node1:2\nnode2:2\n")
    svc.tick()
    svc.tick()
    assert (svc.store.get(job.id).resizes, json.loads(svc.store.get(job.id).hosts)) == (0, {"node1": 2, "node2": 2})
    (Path(job.run_dir) / runner.ALLOCATION).write_text("node1:2\n")  # node2 lost
    svc.tick()
    shrunk = svc.store.get(job.id)
    assert (shrunk.state, shrunk.resizes, json.loads(shrunk.hosts)) == (RUNNING, 1, {"node1": 2})
    # Slurm still cleans up the lost node, the script ended on its own: succeeded, not "running".
    fake.state = "COMPLETING"
    (Path(job.run_dir) / runner.EXIT).write_text('{"returncode": 0, "terminated": false}')
    svc.tick()
    assert (svc.store.get(job.id).state, svc.store.get(job.id).exit_status) == (SUCCEEDED, 0)

    below = svc.submit(JobSpec(np=4, elastic=True, min_np=3))
    fake.state = "RUNNING"
    (Path(below.run_dir) / runner.ALLOCATION).write_text("node1:2\nnode2:2\n")
    svc.tick()
    (Path(below.run_dir) / runner.ALLOCATION).write_text("node1:2\n")
    (Path(below.run_dir) / runner.EXIT).write_text('{"returncode": 1, "terminated": false}')
    fake.state = "COMPLETING"
    svc.tick()
    failed = svc.store.get(below.id)
    assert failed.state == FAILED and failed.message.splitlines()[0] == (
        "Slurm FAILED, exit status 1: 2 slot(s) left (node1:2), fewer than min_np=3"), failed.message
    # Signalled (scancel, the time limit): only Slurm can tell which, so its end state is awaited.
    stopped = svc.submit(JobSpec(np=1))
    fake.state = "COMPLETING"
    (Path(stopped.run_dir) / runner.EXIT).write_text('{"returncode": -15, "terminated": true}')
    svc.tick()
    assert svc.store.get(stopped.id).state == RUNNING
    fake.state, fake.status = "TIMEOUT", 15
    svc.tick()
    assert svc.store.get(stopped.id).message.startswith("Slurm TIMEOUT, exit status -15")


def test_the_batch_script_may_launch_with_mpirun_but_not_an_elastic_job(tmp_path, fake):
    script = slurm.batch_script("m", 4, "torch", tmp_path, SlurmOptions(launcher="mpirun"))
    last = script.splitlines()[-1]
    assert re.search(r' -- \S*mpirun -mca plm rsh -np 4 -H "\$hosts" -bind-to none -map-by slot .* -x OMP_NUM_THREADS ',
                     last), last
    assert subprocess.run(["bash", "-n"], input=script, text=True).returncode == 0
    svc = service(tmp_path)
    with pytest.raises(Refused, match="elastic: needs horovodrun"):
        svc.submit(JobSpec(np=2, elastic=True, slurm={"launcher": "mpirun"}))
    assert svc.store.list() == []


def write_status(run_dir: Path, hosts: dict, **fields) -> None:
    status = status_file.RunStatus(phase=fields.pop("phase", "training"), hosts=hosts,
                                   world_size=sum(hosts.values()), **fields)
    (run_dir / status_file.STATUS_FILE).write_text(json.dumps(status.as_dict()))


def test_the_world_recorded_is_the_one_the_job_wrote_last_even_when_it_ends_at_once(tmp_path, fake):
    """The docker test's flake, without docker: node2 is lost, the job resets on node1 and
    finishes before a turn of the loop sees it running there; the discovery's record still
    lists both nodes. The end is recorded with the job's own last word (status.json)."""
    svc = service(tmp_path)
    job = svc.submit(JobSpec(np=4, elastic=True, min_np=2))
    run_dir = Path(job.run_dir)
    fake.state = "RUNNING"
    (run_dir / runner.ALLOCATION).write_text("node1:2\nnode2:2\n")
    svc.tick()
    write_status(run_dir, {"node1": 2, "node2": 2})
    svc.tick()
    assert (json.loads(svc.store.get(job.id).hosts), svc.store.get(job.id).resizes) == ({"node1": 2, "node2": 2}, 0)
    # Between two turns: the reset on node1 and the end. The allocation file lags behind.
    write_status(run_dir, {"node1": 2}, phase="done")
    (run_dir / runner.EXIT).write_text('{"returncode": 0, "terminated": false}')
    fake.state = "COMPLETING"
    svc.tick()
    done = svc.store.get(job.id)
    assert (done.state, json.loads(done.hosts), done.resizes) == (SUCCEEDED, {"node1": 2}, 1)
    # While it runs, the job's word wins over the allocation's too.
    other = svc.submit(JobSpec(np=4, elastic=True, min_np=2))
    fake.state = "RUNNING"
    (Path(other.run_dir) / runner.ALLOCATION).write_text("node1:2\nnode2:2\n")
    write_status(Path(other.run_dir), {"node1": 2, "node2": 2})
    svc.tick()
    write_status(Path(other.run_dir), {"node1": 2})
    svc.tick()
    svc.tick()
    shrunk = svc.store.get(other.id)
    assert (shrunk.state, json.loads(shrunk.hosts), shrunk.resizes) == (RUNNING, {"node1": 2}, 1)
    assert shrunk.first_step_at is None  # no step in its status yet


def test_a_hung_job_under_slurm_is_scancelled_and_recorded_as_hung(tmp_path, fake):
    """Hang detection under Slurm: the job's status.json says it last stepped long ago."""
    svc = Service(Settings(state_dir=tmp_path, executor="slurm", hang_seconds=30))
    job = svc.submit(JobSpec(np=2))
    fake.state = "RUNNING"
    svc.tick()
    svc.store.update(job.id, started_at=1000.0)  # running since long ago ...
    write_status(Path(job.run_dir), {"node1": 2}, last_step_at=1000.0, phase_since=990.0)  # ... silent as long
    svc.tick()
    assert fake.calls[-1] == ["scancel", "42"]
    fake.state, fake.status = "CANCELLED", 15
    svc.tick()
    hung = svc.store.get(job.id)
    assert hung.state == FAILED and hung.message.startswith("hung: no step for "), hung.message


class Crash(BaseException):
    """The service ending at one of its crash points (hvdcls.serve.faults)."""


def crash_at(monkeypatch, point):
    def hook(name):
        if name == point:
            raise Crash(point)
    monkeypatch.setattr(faults, "crash_point", hook)


def test_a_job_sbatched_before_the_crash_recorded_its_id_is_found_by_its_name(tmp_path, fake, monkeypatch):
    crash_at(monkeypatch, "hand_over.started")
    with pytest.raises(Crash):
        service(tmp_path).submit(JobSpec(np=1))
    (cut,) = Store(tmp_path / "jobs.db").list()
    assert (cut.state, cut.external_id) == (QUEUED, None) and list(fake.names) == [f"hvdcls-{cut.id}-{cut.launch_id}"]
    crash_at(monkeypatch, "")
    again = service(tmp_path)
    again.reconcile()
    found = again.store.get(cut.id)
    assert (found.external_id, found.launch_id, fake.submitted) == ("42", cut.launch_id, 42)  # not sbatched again
    fake.state = "COMPLETED"
    again.tick()
    assert again.store.get(cut.id).state == SUCCEEDED


@pytest.mark.parametrize("point", ["submit", "hand_over.prepared"])
def test_a_job_the_crash_kept_from_slurm_is_handed_over_at_the_restart_once(tmp_path, fake, monkeypatch, point):
    crash_at(monkeypatch, point)
    with pytest.raises(Crash):
        service(tmp_path).submit(JobSpec(np=1))
    (cut,) = Store(tmp_path / "jobs.db").list()
    crash_at(monkeypatch, "")
    again = service(tmp_path)
    again.reconcile()
    again.reconcile()  # a second restart finds it held: nothing more
    handed = again.store.get(cut.id)
    assert (handed.state, handed.external_id, handed.attempts, fake.submitted) == (QUEUED, "42", 1, 42)
    assert handed.launch_id != cut.launch_id and list(fake.names) == [f"hvdcls-{cut.id}-{handed.launch_id}"]
    if cut.launch_id:  # its first launch is abandoned: had sbatch landed it after all, its wrapper runs nothing
        assert launches.read_claim(Path(handed.run_dir), cut.launch_id).keys() == {"abandoned_at"}


def test_a_job_slurm_ran_and_forgot_before_the_restart_ends_as_its_wrapper_recorded(tmp_path, fake, monkeypatch):
    crash_at(monkeypatch, "hand_over.started")
    with pytest.raises(Crash):
        service(tmp_path).submit(JobSpec(np=1))
    (cut,) = Store(tmp_path / "jobs.db").list()
    run_dir = Path(cut.run_dir)
    launches.claim(run_dir, cut.launch_id, {"pid": 1, "pid_start": 1})  # its wrapper ran ...
    (run_dir / runner.EXIT).write_text(json.dumps({"returncode": 0, "launch": cut.launch_id}))
    fake.known = False  # ... and Slurm has forgotten the job since
    crash_at(monkeypatch, "")
    again = service(tmp_path)
    again.reconcile()
    assert (again.store.get(cut.id).state, fake.submitted) == (SUCCEEDED, 42)
