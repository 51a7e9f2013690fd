"""`hvdcls serve --executor slurm` restarted while its job runs, against a real one-node Slurm
(2 CPUs, private munged, slurmctld and slurmd; tests/slurm_cluster.py) on this host.

Everything else the Slurm executor must do (both backends across two nodes, Slurm's queue
order, cancel, a failure's Slurm state, refusals at submit) runs on the compose Slurm cluster:
tests/docker/test_slurm.py. What only this module covers: the service stops while its job runs
and, restarted on the same state directory, follows the job by its Slurm id to the end.

    A  torch  np 2  2 epochs  the service restarts while it runs

Everything (the job, the daemons, the private directory) is gone when the module ends.
"""
from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from hvdcls import launch
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
        server = Server(tmp / "state", tmp / "data", tmp / "serve.log", None, "--executor", "slurm",
                        "--partition", "debug", extra_env={"SLURM_CONF": str(cluster.conf)})
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
        finally:
            server.stop()
    out["daemons left"] = [p.args[0] for p in cluster.processes if p.poll() is None]
    return out


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


def test_nothing_is_left_running(workload):
    assert workload["daemons left"] == []
