"""`hvdcls serve --executor slurm` restarted while its job runs, against a real one-node Slurm
(2 CPUs, private munged, slurmctld and slurmd; tests/slurm_cluster.py) on this host.

Everything else the Slurm executor must do (both backends across two nodes, Slurm's queue
order, cancel, a failure's Slurm state, refusals at submit) runs on the compose Slurm cluster:
tests/docker/test_slurm.py. What only this module covers: the service stops while its job runs
and, restarted on the same state directory, follows the job by its Slurm id to the end; and
the crash in the one instant that id exists only in Slurm: the job neither lost nor doubled.

    A  torch  np 2  2 epochs  the service restarts while it runs
    B  torch  np 1  1 epoch   the service crashes between sbatch and recording the Slurm id
                              (faults' hand_over.started); restarted, it finds B by its name

Everything (the job, the daemons, the private directory) is gone when the module ends.
"""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import httpx
import pytest

from hvdcls.launching import launch
from hvdcls.serve import faults, launches
from tests.parallel.test_serve import Server, epochs
from tests.run_files import read_json
from tests.slurm_cluster import SlurmCluster

pytestmark = pytest.mark.parallel
FINAL = ("succeeded", "failed", "cancelled")


@pytest.fixture(scope="module")
def workload(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("slurm")
    (tmp / "data").mkdir()
    out: dict = {}
    with SlurmCluster(cpus=2) as cluster:
        options = ("--executor", "slurm", "--partition", "debug")
        server = Server(tmp / "state", tmp / "data", tmp / "serve.log", None, *options,
                        extra_env={"SLURM_CONF": str(cluster.conf)})
        server.start()
        try:
            a = server.submit(2, settings=epochs(2), name="A")
            out["A running"] = server.wait(a, lambda j: j["state"] == "running")
            server.stop()  # the job stays with Slurm; the restarted service follows it by its id
            server.start()
            out["A"] = server.wait(a, lambda j: j["state"] in FINAL)
            out["A status"] = subprocess.run(
                launch.hvdcls_command("job", "status", str(a), "--state-dir", str(server.state_dir)),
                env=server.env(), capture_output=True, text=True, timeout=120)
            server.stop()
            out.update(crash_after_sbatch(server, cluster, tmp, options))
        finally:
            if server.process.poll() is None:
                server.stop()
    out["daemons left"] = [p.args[0] for p in cluster.processes if p.poll() is None]
    return out


def crash_after_sbatch(server: Server, cluster: SlurmCluster, tmp: Path, options: tuple) -> dict:
    """B: a service that SIGKILLs its own process group the moment sbatch has answered (the
    Slurm id in no table yet), then `server` restarted on its state directory. The crash may
    cut the submission's own request: it is sent again with its idempotency key, as
    `hvdcls job submit` does, and must answer with the job the first one made."""
    crashing = Server(server.state_dir, tmp / "data", tmp / "serve-crash.log", None, *options, own_group=True,
                      extra_env={"SLURM_CONF": str(cluster.conf), faults.CRASH: "hand_over.started"})
    crashing.start()
    spec, key = {"np": 1, "backend": "torch", "settings": epochs(1), "name": "B"}, {"Idempotency-Key": "B-1"}
    try:
        crashing.http.post("/jobs", json=spec, headers=key)
    except httpx.TransportError:
        pass  # cut by the crash
    crashing.process.wait(timeout=120)
    server.start()
    again = server.http.post("/jobs", json=spec, headers=key)
    assert again.status_code == 200, again.text  # the first request's job, not a second one
    b = again.json()["id"]
    job = server.wait(b, lambda j: j["state"] in FINAL)
    claims = [json.loads(p.read_text()) for p in (Path(job["run_dir"]) / launches.LAUNCHES).glob("*.json")]
    return {"B": job, "B claims": claims, "B crash log": crashing.log.read_text()}


def test_a_job_runs_through_slurm_across_a_restart_of_the_service(workload):
    a = workload["A"]
    assert a["state"] == "succeeded" and a["exit_status"] == 0, a
    assert a["external_id"] == workload["A running"]["external_id"] and a["external_id"].isdigit()
    assert sum(a["hosts"].values()) == 2, a["hosts"]
    summary = read_json(Path(a["run_dir"]) / "summary.json")
    assert (summary["backend"], summary["world_size"], summary["controller"]) == ("torch", 2, "gloo")
    digests = summary["rank_weight_digests"]
    assert len(digests) == 2 and len(set(digests)) == 1, digests
    status = read_json(Path(a["run_dir"]) / "status.json")  # rank 0's: what the service recorded
    assert (status["phase"], status["world_size"], status["hosts"]) == ("done", 2, a["hosts"]), status
    assert workload["A status"].returncode == 0, workload["A status"].stderr
    assert f"slurm job: {a['external_id']}" in workload["A status"].stdout, workload["A status"].stdout


def test_a_crash_between_sbatch_and_the_record_neither_loses_nor_doubles_the_job(workload):
    b, claims = workload["B"], workload["B claims"]
    assert "test hook: crashing at hand_over.started" in workload["B crash log"]
    assert b["state"] == "succeeded" and b["exit_status"] == 0, b
    assert b["external_id"] is not None and b["external_id"].isdigit(), b  # found by its name
    assert len(claims) == 1 and "pid" in claims[0], claims  # one launch, whose wrapper ran once
    summary = read_json(Path(b["run_dir"]) / "summary.json")
    assert (summary["world_size"], summary["epochs"]) == (1, 1), summary


def test_nothing_is_left_running(workload):
    assert workload["daemons left"] == []
