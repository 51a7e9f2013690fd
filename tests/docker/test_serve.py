"""`hvdcls serve` in the compose cluster (docker/compose.yaml): the `service` container runs the
host-list executor over worker1:2,worker2:2, and the `prometheus` container (Debian's package)
scrapes it and the jobs' rank 0. Both are started on the session's cluster for this module and
stopped after it. One workload (tests/docker/serve_workload.py), run inside the service
container, then read by the tests: a torch job of 4 ranks across both workers through `hvdcls
submit`, a second one queued behind it and cancelled, refusals at submit, and what Prometheus
scraped meanwhile.
"""
import json
from pathlib import Path

import pytest

from tests.docker.cluster import WORKERS

pytestmark = pytest.mark.timeout(2400)  # the first docker test builds the images and starts the cluster
NP = 4


@pytest.fixture(scope="module")
def workload(cluster):
    # Started here, stopped after: the service's loop and Prometheus's scrapes cost CPU even idle.
    cluster.start("service", "prometheus")
    try:
        done = cluster.python("service", Path(__file__).with_name("serve_workload.py"), timeout=1200)
        assert done.returncode == 0, (done.stdout + done.stderr)[-4000:] + cluster.compose(
            "logs", "--tail", "30", "service", "prometheus", check=False).stdout[-4000:]
        from_launcher = cluster.launcher("hvdcls", "job", "list", timeout=60, check=False)  # $HVDCLS_SERVE_URL
    finally:
        cluster.stop("service", "prometheus")
    found = json.loads(done.stdout.splitlines()[-1])
    found["jobs from the launcher"] = from_launcher.returncode, from_launcher.stdout
    print(f"service workload: {found['seconds']:.0f} s")
    return found


def series(answers: list, key: str) -> dict:
    """{label `key`'s value: value} of one query's answer."""
    return {labels.get(key, ""): value for labels, value in answers}


@pytest.mark.parametrize("case, status, words", [("unknown setting", 422, "no_such_key"),
                                                  ("too many slots", 400, "5")])
def test_a_bad_spec_gets_exit_2_and_one_line(workload, case, status, words):
    refused = workload[case]
    assert refused["rc"] == 2 and refused["stdout"] == "", refused
    line = refused["stderr"].strip()
    assert "\n" not in line and line.startswith(f"hvdcls: error: {status}: ") and words in line, line


def test_the_job_ran_across_both_workers_and_learned(workload):
    job, summary = workload["status json"], workload["summary"]
    assert job["state"] == "succeeded" and job["exit_status"] == 0, job
    assert job["hosts"] == {w: 2 for w in WORKERS}, job["hosts"]
    assert (summary["backend"], summary["world_size"], summary["controller"]) == ("torch", NP, "gloo")
    assert sorted(summary["rank_hosts"]) == sorted(WORKERS * 2), summary["rank_hosts"]
    digests = summary["rank_weight_digests"]
    assert len(digests) == NP and len(set(digests)) == 1, digests
    assert 0.7 <= summary["val_accuracy"] <= 1.0, summary["val_accuracy"]
    assert "epoch 3/3" in workload["logs -f"]["stdout"], workload["logs -f"]["stdout"][-2000:]


def test_jobs_and_status_show_what_happened(workload):
    assert workload["job"]["stdout"] in (f"job 1 {state} (4 slots, torch)\n" for state in ("queued", "running"))
    assert workload["queued"]["stdout"] == "job 2 queued (4 slots, torch)\n", workload["queued"]
    rows = {line.split()[0]: line.split() for line in workload["jobs"]["stdout"].splitlines()[1:]}
    assert sorted(rows) == ["1", "2"], workload["jobs"]["stdout"]
    assert rows["1"][1:6] == ["J", "admin", "succeeded", "torch", "4"], rows["1"]  # the first admin's token
    assert rows["2"][1:6] == ["Q", "admin", "cancelled", "torch", "4"], rows["2"]
    assert workload["read without a token"] == 401  # the cluster's network reaches it: nothing is open
    assert workload["jobs from the launcher"] == (0, workload["jobs"]["stdout"]), workload["jobs from the launcher"]
    status = {label.strip(): value for label, value in (line.split(": ", 1) for line in
                                                       workload["status"]["stdout"].splitlines() if ": " in line)}
    assert status["state"] == "succeeded" and status["exit status"] == "0", status
    q = workload["Q"]
    assert q["state"] == "cancelled" and q["started_at"] is None, q  # cancelled before it ever ran


def test_prometheus_scraped_the_service(workload):
    running, after = workload["prometheus while J runs"], workload["prometheus after"]
    assert series(running["hvdcls_serve_slots"], "job") == {"hvdcls-serve": 4}
    assert series(running["hvdcls_serve_queue_length"], "instance") == {"service:8470": 1}
    assert series(running["hvdcls_serve_slots_in_use"], "job") == {"hvdcls-serve": 4}
    assert series(running["hvdcls_serve_host_slots_free"], "host") == {w: 0 for w in WORKERS}
    states = series(running["hvdcls_serve_jobs"], "state")
    assert (states["running"], states["queued"], states["succeeded"]) == (1, 1, 0), states
    states = series(after["hvdcls_serve_jobs"], "state")
    assert (states["running"], states["queued"], states["succeeded"], states["cancelled"], states["failed"]) \
        == (0, 0, 1, 1, 0), states
    assert series(after["hvdcls_serve_queue_length"], "job") == {"hvdcls-serve": 0}
    assert series(after["hvdcls_serve_host_slots_free"], "host") == {w: 2 for w in WORKERS}


def test_prometheus_found_and_scraped_the_jobs_rank_0(workload):
    """The service's GET /targets named J's rank 0 (its host, the free port it took); Prometheus
    discovered it there (http_sd_configs) and scraped it beside the service."""
    [group] = workload["service targets"]
    [endpoint] = group["targets"]
    rank0_host = workload["summary"]["rank_hosts"][0]
    assert endpoint.startswith(f"{rank0_host}:"), (endpoint, rank0_host)
    assert group["labels"] == {"job_id": "1", "job_name": "J", "backend": "torch"}, group
    assert workload["targets"] == [["hvdcls", endpoint, "1"], ["hvdcls-serve", "service:8470", None]]
    rank0 = {expr.split("(")[1].split("[")[0]: answers for expr, answers in workload["prometheus rank 0"].items()}
    for name, want in (("hvdcls_world_size", NP), ("hvdcls_training_done", 1), ("hvdcls_epoch", 3)):
        assert series(rank0[name], "instance") == {endpoint: want}, (name, rank0[name])
    accuracy = series(rank0['hvdcls_accuracy{split="val"}'], "instance")[endpoint]
    assert accuracy == pytest.approx(workload["summary"]["val_accuracy"], abs=1e-6)
