"""Training across containers: 4 ranks on worker1 and worker2 (2 each), started from the
launcher container over SSH on port 12345, with each backend under mpirun (OpenMPI). What must
hold: the ranks ran on both hosts, ended with identical weights, rank 0 alone wrote the outputs
(one summary.json on the shared volume), the digits were learned (validation accuracy in the
band the single-host runs reach), and the watchdog's heartbeats crossed hosts: rank 0 heard
every other rank, each under its own host's name. horovodrun (Gloo) across containers, over SSH
the same way, is what every job of the Slurm cluster runs: tests/docker/test_slurm.py asserts the
same of both backends there, so it is not launched here again.
"""
import json

import pytest

from tests.docker.cluster import SSH_PORT, WORKERS

pytestmark = pytest.mark.timeout(2400)  # the first test builds the images and starts the cluster
NP, EPOCHS = 4, 6
HOSTS = ",".join(f"{w}:2" for w in WORKERS)
# Horovod's documented mpirun flags, plus the SSH port of our workers.
MPIRUN = ["mpirun", "-np", str(NP), "-H", HOSTS, "-bind-to", "none", "-map-by", "slot",
          "-x", "PATH", "-x", "LD_LIBRARY_PATH", "-mca", "pml", "ob1", "-mca", "btl", "^openib",
          "-mca", "plm_rsh_args", f"-p {SSH_PORT}"]
LAUNCHERS = {"mpirun": MPIRUN}
CONTROLLERS = {"mpirun": "mpi"}


@pytest.fixture(scope="module", params=[(b, l) for b in ("torch", "tensorflow") for l in LAUNCHERS],
                ids=lambda p: f"{p[0]}-{p[1]}")
def run(request, cluster):
    backend, launcher = request.param
    run_dir = f"/shared/runs/{backend}-{launcher}"
    cluster.launcher(*LAUNCHERS[launcher], "hvdcls", "train", "--backend", backend,
                     "--output-dir", run_dir, f"training.epochs={EPOCHS}")
    return backend, launcher, run_dir, cluster


def test_ranks_ran_on_both_hosts_and_agree(run):
    backend, launcher, run_dir, cluster = run
    summary = cluster.read_json(f"{run_dir}/summary.json")
    assert summary["backend"] == backend and summary["world_size"] == NP
    assert summary["controller"] == CONTROLLERS[launcher]
    assert sorted(summary["rank_hosts"]) == sorted(WORKERS * 2), summary["rank_hosts"]
    digests = summary["rank_weight_digests"]
    assert len(digests) == NP and len(set(digests)) == 1, digests
    # hvdcls.training.heartbeat: UDP from each rank to the address rank 0 announced (worker1's,
    # as worker2 reaches it); the ranks on worker2 among them.
    heard = summary["heartbeats"]
    assert sorted(heard) == [str(rank) for rank in range(1, NP)], heard
    assert [heard[str(rank)]["host"] for rank in range(1, NP)] == summary["rank_hosts"][1:], heard
    assert all(peer["beats"] >= 1 for peer in heard.values()), heard


def test_digits_are_learned(run):
    _, _, run_dir, cluster = run
    summary = cluster.read_json(f"{run_dir}/summary.json")
    assert summary["val_accuracy"] >= 0.90, summary["val_accuracy"]
    metrics = [json.loads(line) for line in cluster.launcher("cat", f"{run_dir}/metrics.jsonl").stdout.splitlines()]
    assert [m["epoch"] for m in metrics] == list(range(1, EPOCHS + 1))
    assert all(m["world_size"] == NP for m in metrics)


def test_rank_0_alone_wrote_the_outputs(run):
    _, _, run_dir, cluster = run
    assert cluster.files(run_dir, "summary.json") == [f"{run_dir}/summary.json"]
    assert cluster.files(run_dir, "metrics.jsonl") == [f"{run_dir}/metrics.jsonl"]
