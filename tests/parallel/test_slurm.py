"""`hvdcls serve --executor slurm` against a real one-node Slurm (2 CPUs, private munged,
slurmctld and slurmd; tests/slurm_cluster.py), with tiny torch jobs (digits, compact_cnn).

One workload, run once by the module fixture, and read by the tests:

    bad partition        refused at submit with sbatch's reason (HTTP 400; `hvdcls submit` exit 2)
    2 nodes              refused too: the cluster has one
    X  torch  np 2  long      cancelled once Slurm runs it (`hvdcls cancel`): gone from squeue
    A  torch  np 2  3 epochs  runs on both CPUs; the service restarts while it runs
    F  torch  np 1  no data   submitted after A: pending in Slurm (Resources) until A ends; fails

Everything (jobs, daemons, the private directory) is gone when the module ends.
"""
from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from hvdcls import launch
from tests.parallel.test_serve import QUICK, epochs
from tests.parallel.test_serve import env as serve_env
from tests.run_files import read_json
from tests.slurm_cluster import SlurmCluster

pytestmark = pytest.mark.parallel
FINAL = ("succeeded", "failed", "cancelled")


class SlurmServer:
    def __init__(self, cluster: SlurmCluster, state_dir: Path, data_root: Path, log: Path):
        self.cluster, self.state_dir, self.data_root, self.log = cluster, state_dir, data_root, log

    def env(self) -> dict:
        return {**serve_env(), "SLURM_CONF": str(self.cluster.conf)}

    def start(self) -> None:
        (self.state_dir / "server.json").unlink(missing_ok=True)
        command = launch.hvdcls_command("serve", "--executor", "slurm", "--partition", "debug",
                                        "--state-dir", str(self.state_dir), "--port", "0",
                                        "--data-root", str(self.data_root))
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=self.env())
        deadline = time.time() + 60
        while not (self.state_dir / "server.json").exists():
            assert self.process.poll() is None and time.time() < deadline, self.log.read_text()[-3000:]
            time.sleep(0.1)
        url = json.loads((self.state_dir / "server.json").read_text())["url"]
        token = (self.state_dir / "token").read_text().strip()
        self.http = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=60)

    def stop(self) -> None:
        self.process.send_signal(signal.SIGTERM)
        self.process.wait(timeout=30)

    def submit(self, np: int, settings: dict, **extra) -> int:
        reply = self.http.post("/jobs", json={"np": np, "backend": "torch", "settings": settings, **extra})
        assert reply.status_code == 201, reply.text
        return reply.json()["id"]

    def job(self, job_id: int) -> dict:
        return self.http.get(f"/jobs/{job_id}").json()

    def wait(self, job_id: int, until, timeout: float = 240) -> dict:
        deadline = time.time() + timeout
        while not until(job := self.job(job_id)):
            assert time.time() < deadline, (job, self.log.read_text()[-3000:])
            time.sleep(0.2)
        return job

    def cli(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run(launch.hvdcls_command(*args, "--state-dir", str(self.state_dir)), env=self.env(),
                              capture_output=True, text=True, timeout=120)

    def squeue(self) -> list[str]:
        return subprocess.run(["squeue", "-h", "-o", "%i"], env=self.env(), capture_output=True,
                              text=True, check=True).stdout.split()


@pytest.fixture(scope="module")
def workload(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("slurm")
    data_root = tmp / "data"
    (data_root / "empty").mkdir(parents=True)
    out: dict = {}
    with SlurmCluster(cpus=2) as cluster:
        server = SlurmServer(cluster, tmp / "state", data_root, tmp / "serve.log")
        server.start()
        try:
            out["bad partition"] = server.http.post("/jobs", json={"np": 1, "slurm": {"partition": "nope"}})
            out["too many nodes"] = server.http.post("/jobs", json={"np": 2, "slurm": {"tasks_per_node": 1}})
            out["bad partition cli"] = server.cli("submit", "--np", "1", "--partition", "nope")
            out["jobs after refusals"] = server.http.get("/jobs").json()

            x = server.submit(2, epochs(50), name="X")
            out["X running"] = server.wait(x, lambda j: j["state"] == "running")
            out["X cancel"] = server.cli("cancel", str(x))
            asked = time.time()
            out["X"] = server.wait(x, lambda j: j["state"] in FINAL, timeout=60)
            out["cancel seconds"] = time.time() - asked
            out["squeue after X"] = server.squeue()

            a = server.submit(2, epochs(3), name="A")
            f = server.submit(1, {**QUICK, "data": {"path": str(data_root / "empty")}}, name="F")
            out["A running"] = server.wait(a, lambda j: j["state"] == "running")
            out["F while A runs"] = server.wait(f, lambda j: (j["message"] or "").startswith("pending in Slurm ("))
            server.stop()  # the jobs stay with Slurm; the restarted service follows them by their ids
            server.start()
            out["A"] = server.wait(a, lambda j: j["state"] in FINAL)
            out["F"] = server.wait(f, lambda j: j["state"] in FINAL)
            out["A log"] = server.http.get(f"/jobs/{a}/logs").text
            out["jobs"] = server.cli("jobs")
            out["A status"] = server.cli("status", str(a))
        finally:
            server.stop()
    out["daemons left"] = [p.args[0] for p in cluster.processes if p.poll() is None]
    return out


def test_a_spec_slurm_refuses_gets_one_line_and_leaves_no_job(workload):
    reply = workload["bad partition"]
    assert reply.status_code == 400, reply.text
    assert reply.json()["detail"] == ("Slurm refused the job: invalid partition specified: nope; "
                                      "Batch job submission failed: Invalid partition name specified")
    nodes = workload["too many nodes"]  # 2 nodes of 1 task; the cluster has one (EnforcePartLimits=ALL)
    assert nodes.status_code == 400 and nodes.json()["detail"].startswith("Slurm refused the job: "), nodes.text
    assert "\n" not in nodes.json()["detail"] and "node" in nodes.json()["detail"].lower(), nodes.text
    print("more nodes than exist:", nodes.json()["detail"])
    cli = workload["bad partition cli"]
    assert cli.returncode == 2 and cli.stderr.strip().count("\n") == 0, cli
    assert "400: Slurm refused the job: invalid partition specified: nope" in cli.stderr
    assert workload["jobs after refusals"] == []


def test_cancel_ends_the_slurm_job(workload):
    running, x = workload["X running"], workload["X"]
    assert running["external_id"].isdigit(), running
    assert workload["X cancel"].returncode == 0, workload["X cancel"].stderr
    assert x["state"] == "cancelled" and x["message"] == "cancelled in Slurm while running", x
    assert x["external_id"] not in workload["squeue after X"]


def test_a_torch_job_runs_through_slurm_across_a_restart(workload):
    a = workload["A"]
    assert a["state"] == "succeeded" and a["exit_status"] == 0, a
    assert a["external_id"] == workload["A running"]["external_id"]
    assert sum(a["hosts"].values()) == 2, a["hosts"]
    run_dir = Path(a["run_dir"])
    assert (run_dir / "job.sbatch").read_text().count("#SBATCH --ntasks=2\n") == 1
    summary = read_json(run_dir / "summary.json")
    assert (summary["backend"], summary["world_size"], summary["controller"]) == ("torch", 2, "gloo")
    digests = summary["rank_weight_digests"]
    assert len(digests) == 2 and len(set(digests)) == 1, digests
    assert 0.7 <= summary["val_accuracy"] <= 1.0, summary["val_accuracy"]
    assert "epoch 3/3 step" in workload["A log"]
    assert workload["jobs"].returncode == 0 and "succeeded" in workload["jobs"].stdout
    assert f"slurm job: {a['external_id']}" in workload["A status"].stdout, workload["A status"]


def test_slurm_orders_the_queue_and_reports_a_failure(workload):
    waiting = workload["F while A runs"]
    assert waiting["state"] == "queued" and waiting["message"] == "pending in Slurm (Resources)", waiting
    f = workload["F"]
    assert f["state"] == "failed" and f["exit_status"] != 0, f
    assert f["started_at"] >= workload["A running"]["started_at"]
    first = f["message"].splitlines()[0]
    assert first.startswith(f"Slurm FAILED, exit status {f['exit_status']}: no class directories in "), first


def test_nothing_is_left_running(workload):
    assert workload["daemons left"] == []


def test_latencies_through_slurm(workload):
    """Reported, not bounded: Slurm's part and the job's start."""
    a = workload["A"]
    print(f"A (torch, np 2): submit to running {a['queued_seconds']:.1f} s, to first step "
          f"{a['first_step_seconds']:.1f} s; cancel (scancel) to 'cancelled' {workload['cancel seconds']:.1f} s")
    assert a["first_step_seconds"] > a["queued_seconds"] >= 0
