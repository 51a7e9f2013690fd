"""`hvdcls sweep` for real: a real `hvdcls serve` (2 slots) runs the trials as its jobs, and a
real `mlflow server` records them, in one launch of each.

The sweep: digits, 2 epochs, a grid of 4 (optimizer.lr 0.4 or 0.0001, momentum 0.9 or 0.8), two
trials at a time, median pruning after 2 finished trials. Its seed runs both lr=0.4 trials first
(tests/unit/test_sweep_driver.py finds the same order), so the two lr=0.0001 trials, far below
the median, are pruned at their first epoch and their jobs cancelled through the service. Asserted:
every trial is in trials.csv/json with its state and its job, the jobs are the sweep user's and
ended as their trials say, best.yaml loads as `hvdcls train --config` reads it, the same command
again adds no trial (its study.db), and MLflow holds the sweep as a parent run with the four
trials' runs as its children.
"""
import csv
import json
import re

import httpx
import pytest

from hvdcls import config as cfg
from tests.parallel.test_tracking import mlflow_server  # noqa: F401 (the fixture: a real mlflow server)
from tests.serve_server import REPO, ServeProcess, hvdcls

pytestmark = pytest.mark.parallel
EXPERIMENT = "hvdcls-sweep-test"
SPACE = ["optimizer.lr=choice(0.4,0.0001)", "optimizer.momentum=choice(0.9,0.8)", "training.epochs=2",
         "schedule.warmup_epochs=0", "output.report=false", "output.tensorboard=false", "output.checkpoint_every=0",
         f"output.mlflow_experiment={EXPERIMENT}"]


@pytest.fixture
def server(tmp_path):
    served = ServeProcess(tmp_path, hosts="localhost:2")
    served.start()
    try:
        yield served
    finally:
        served.end_everything()


def test_a_sweep_runs_its_trials_as_service_jobs_prunes_and_resumes(server, mlflow_server, tmp_path):  # noqa: F811
    alice = server.add_user("alice")
    out = tmp_path / "sweep"
    command = ["sweep", *SPACE, "--config", str(REPO / "configs" / "digits.yaml"), "--output-dir", str(out),
               "--trials", "4", "--parallel", "2", "--sampler", "grid", "--sampler-seed", "4", "--pruner", "median",
               "--url", server.url, "--token", alice, "--mlflow", mlflow_server, "--poll-seconds", "0.5"]
    too_many = hvdcls(*command, "--parallel", "3")  # 3 x np 1 on 2 slots: refused before any job
    assert too_many.returncode == 2 and too_many.stderr.strip().splitlines() == [
        "hvdcls: error: --parallel 3 x --np 1: 3 slots, and the service has 2"], too_many.stderr
    assert not out.exists()
    done = hvdcls(*command, timeout=420)  # ~1 min on idle cores; far more when others share them
    assert done.returncode == 0, done.stdout + done.stderr

    table = json.loads((out / "trials.json").read_text())["trials"]
    states = {(t["params"]["optimizer.lr"], t["params"]["optimizer.momentum"]): t["state"] for t in table}
    assert states == {(0.4, 0.9): "done", (0.4, 0.8): "done", (0.0001, 0.9): "pruned", (0.0001, 0.8): "pruned"}
    rows = list(csv.DictReader((out / "trials.csv").open()))
    assert sorted((r["trial"], r["state"]) for r in rows) == sorted((str(t["number"]), t["state"]) for t in table)
    sweep_ids = set()  # the tag every trial's job carries (the console's sweep pages read it)
    for trial in table:
        job = server.http.get(f"/jobs/{trial['job_id']}").json()
        assert job["owner"] == "alice" and job["np"] == 1, job
        assert job["sweep"]["trial"] == trial["number"] and job["sweep"]["params"] == trial["params"], job
        sweep_ids.add(job["sweep_id"])
        if trial["state"] == "done":
            assert job["state"] == "succeeded" and sorted(trial["epochs"]) == ["1", "2"], (trial, job)
            assert trial["value"] > 0.5
        else:  # cancelled at the decision, before its last epoch
            assert job["state"] in ("cancelled", "running") and list(trial["epochs"]) == ["1"], (trial, job)
            assert job["cancel_reason"] == "pruned", job  # the console shows it pruned, not cancelled
            assert trial["value"] < 0.5

    assert len(sweep_ids) == 1 and re.fullmatch(r"sweep-[0-9a-f]{8}", sweep_ids.pop())
    best = cfg.load(out / "best.yaml")  # `hvdcls train --config best.yaml` reads it so
    top = max((t for t in table if t["state"] == "done"), key=lambda t: t["value"])
    assert (best.optimizer.lr, best.optimizer.momentum) == (0.4, top["params"]["optimizer.momentum"])
    assert best.training.epochs == 2 and best.model.name == "compact_cnn" and best.output.mlflow_parent_run is None
    assert (out / "sweep.png").read_bytes()[:4] == b"\x89PNG" and (out / "study.db").is_file()

    again = hvdcls(*command, timeout=120)  # the same command: the study has its 4 trials
    assert again.returncode == 0, again.stdout + again.stderr
    assert not [line for line in again.stdout.splitlines() if line.startswith("trial ")], again.stdout
    assert int(server.http.get("/jobs").headers["X-Total-Count"]) == 4
    assert [t["state"] for t in json.loads((out / "trials.json").read_text())["trials"]] == \
        [t["state"] for t in table]

    assert_parent_and_children(mlflow_server, {t["job_id"] for t in table})


def assert_parent_and_children(url: str, job_ids: set) -> None:
    api = httpx.Client(base_url=f"{url}/api/2.0/mlflow", timeout=30)
    experiment = api.get("/experiments/get-by-name", params={"experiment_name": EXPERIMENT}).json()["experiment"]
    runs = api.post("/runs/search", json={"experiment_ids": [experiment["experiment_id"]]}).json()["runs"]
    tags = [{t["key"]: t["value"] for t in run["data"].get("tags", [])} for run in runs]
    [parent] = [run for run, tag in zip(runs, tags) if tag.get("hvdcls.sweep") == "true"]
    children = [run for run, tag in zip(runs, tags) if tag.get("mlflow.parentRunId") == parent["info"]["run_id"]]
    assert len(runs) == 5 and len(children) == 4, tags
    assert {int(run["info"]["run_name"]) for run in children} == job_ids  # each job's run directory's name
    assert parent["info"]["status"] == "FINISHED"
    history = api.get("/metrics/get-history", params={"run_id": parent["info"]["run_id"],
                                                       "metric_key": "trial_val_accuracy"}).json()["metrics"]
    assert len(history) == 2  # the two finished trials
    listed = {f["path"] for f in api.get("/artifacts/list", params={"run_id": parent["info"]["run_id"]}).json()["files"]}
    assert {"trials.csv", "best.yaml", "sweep.png"} <= listed
