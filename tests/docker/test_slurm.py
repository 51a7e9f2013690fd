"""`hvdcls serve --executor slurm` on a real Slurm cluster in compose (docker/slurm.yaml): Debian's
slurmctld on a controller, slurmd on node1 and node2 (2 CPUs each), munge with a key made for
the project, and the service submitting to it. One workload (tests/docker/slurm_workload.py),
run once inside the service container, then read by the tests; the project is torn down after
and must leave nothing behind.
"""
import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.docker import cluster as docker_cluster

pytestmark = pytest.mark.timeout(2400)  # the first test builds the images
# Docker is shared: HVDCLS_COMPOSE_PROJECT names one's own projects (tests/docker/conftest.py).
PROJECT = os.environ.get("HVDCLS_COMPOSE_PROJECT", "hvdcls-test") + "-slurm"
NODES = ["node1", "node2"]


@pytest.fixture(scope="module")
def workload(images):
    docker_cluster.build_slurm_image()
    slurm = docker_cluster.Cluster(PROJECT, docker_cluster.SLURM_COMPOSE_FILE)
    try:
        slurm.up(wait=False)  # the workload waits for the service, which waits for both nodes
        found = run_workload(slurm)
        # The lost node, for real: node2's container killed outright (no shutdown, no FIN on its
        # connections, its name gone from the network) while E trains on both nodes.
        slurm.compose("kill", "-s", "SIGKILL", "node2")
        found.update(run_workload(slurm, "elastic", str(found["E id"])))
        # A container of the image with no volume: /etc/munge as the image has it.
        found["key in image"] = subprocess.run(["docker", "run", "--rm", "--entrypoint", "ls",
                                                docker_cluster.SLURM_IMAGE, "-A", "/etc/munge"],
                                               capture_output=True, text=True, timeout=300).stdout
    finally:
        slurm.down()
    found["left in docker"] = slurm.resources()
    e = found["E"]
    print(f"Slurm workload: {found['seconds']:.0f} s, then E {e['ended_at'] - e['submitted_at']:.0f} s from "
          f"submit to end, {found['E seconds after the kill']:.0f} s of it from node2's kill")
    return found


def run_workload(slurm, *args: str) -> dict:
    done = slurm.python("service", Path(__file__).with_name("slurm_workload.py"), 1800, *args)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:] + slurm.compose(
        "logs", "--tail", "30", check=False).stdout[-4000:]
    return json.loads(done.stdout.splitlines()[-1])


def test_a_spec_slurm_refuses_gets_one_line_at_submit(workload):
    status, detail = workload["bad partition"]
    assert status == 400 and detail.startswith("Slurm refused the job: invalid partition specified: nope"), detail
    status, detail = workload["too many nodes"]  # 3 nodes of 1 task; the cluster has 2 (EnforcePartLimits=ALL)
    assert status == 400 and detail.startswith("Slurm refused the job: ") and "node" in detail.lower(), detail
    assert all("\n" not in workload[k][1] for k in ("bad partition", "too many nodes"))
    assert workload["jobs after refusals"] == []


@pytest.mark.parametrize("name, backend", [("T", "torch"), ("W", "tensorflow")])
def test_both_backends_train_across_both_nodes(workload, name, backend):
    job, summary = workload[name], workload["summaries"][name]
    assert job["state"] == "succeeded" and job["exit_status"] == 0, job
    assert job["hosts"] == {"node1": 2, "node2": 2}, job["hosts"]
    assert (summary["backend"], summary["world_size"], summary["controller"]) == (backend, 4, "gloo")
    assert sorted(summary["rank_hosts"]) == sorted(NODES * 2), summary["rank_hosts"]
    digests = summary["rank_weight_digests"]
    assert len(digests) == 4 and len(set(digests)) == 1, digests
    assert 0.7 <= summary["val_accuracy"] <= 1.0, summary["val_accuracy"]


def test_the_queue_follows_slurms_order(workload):
    t, w, x, f = (workload[k] for k in "TWXF")
    # Slurm's reason for W: Resources (T holds the CPUs) or, until its scheduler has looked at W
    # in a full pass, Priority (a job ahead of it in the queue).
    assert workload["W while T runs"]["message"] in ("pending in Slurm (Resources)",
                                                     "pending in Slurm (Priority)"), workload["W while T runs"]
    assert workload["X while T runs"]["state"] == "queued", workload["X while T runs"]
    # First come, first served: W waited for all four CPUs T held; X and F for W's.
    assert t["ended_at"] <= w["started_at"], (t, w)
    assert w["ended_at"] <= x["started_at"] and w["ended_at"] <= f["started_at"], (w, x, f)
    assert "epoch 5/5 step" in workload["T log"]


def test_cancel_ends_the_slurm_job_and_frees_its_nodes(workload):
    x = workload["X"]
    assert workload["X cancel"] == 200
    assert x["state"] == "cancelled" and x["message"] == "cancelled in Slurm while running", x
    assert f"{x['external_id']}|CANCELLED|" in workload["squeue"], workload["squeue"]
    assert workload["sinfo"] == ["node1 idle", "node2 idle"], workload["sinfo"]
    assert workload["left on nodes"] == {"node1": [], "node2": []}, workload["left on nodes"]


def test_a_failed_job_reports_slurms_exit_state(workload):
    f = workload["F"]
    assert f["state"] == "failed" and f["exit_status"] != 0, f
    first = f["message"].splitlines()[0]
    assert first.startswith(f"Slurm FAILED, exit status {f['exit_status']}: no class directories in "), first


def test_no_munge_key_in_the_image_and_nothing_left_after_down(workload):
    assert "munge.key" not in workload["key in image"], workload["key in image"]
    assert workload["left in docker"] == {"containers": [], "networks": [], "volumes": []}


def test_an_elastic_job_loses_a_node_and_finishes_on_the_other(workload):
    """E (np 4, min 2) on both nodes; node2's container killed once E had committed steps.
    Horovod resets on node1 from the last commit; the job succeeds at world size 2."""
    before, e, summary = workload["E before"], workload["E"], workload["E summary"]
    assert before["state"] == "running" and before["hosts"] == {"node1": 2, "node2": 2}, before
    assert e["state"] == "succeeded" and e["exit_status"] == 0, "\n".join(
        [e["message"], "elastic lines:", *workload["E elastic lines"], "log tail:", *workload["E log tail"],
         "stderr:", *workload["E stderr"]])
    assert e["hosts"] == {"node1": 2} and e["resizes"] == 1, e  # the discovery's record, followed
    assert (summary["world_size"], summary["rank_hosts"]) == (2, ["node1", "node1"]), summary["rank_hosts"]
    # Horovod's response cache off: with it a survivor could abort on a dead allreduce's leftovers
    # (hvdcls.launching.horovod_env's docstring)
    assert summary["horovod"]["environment"]["HOROVOD_CACHE_CAPACITY"] == "0", summary["horovod"]
    digests = summary["rank_weight_digests"]
    assert len(digests) == 2 and len(set(digests)) == 1, digests
    recoveries = summary["elastic"]["recoveries"]
    assert [r["world_size"] for r in recoveries] == [2], recoveries
    assert recoveries[0]["resumed_at_step"] >= 2, recoveries  # from a commit made on both nodes
    assert any("elastic: 2 worker(s), resuming" in line for line in workload["E elastic lines"]), workload[
        "E elastic lines"]
    status = workload["E status"]
    assert "hosts: node1:2" in status and "elastic: np 2..4, resized 1 time(s)" in status, status
    print(f"E: resumed at step {recoveries[0]['resumed_at_step']} after {recoveries[0]['seconds']} s "
          f"without a step; Slurm's nodes then: {workload['E sinfo']}")
