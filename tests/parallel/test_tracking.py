"""`hvdcls train --mlflow URI` against a real MLflow tracking server, read back through its REST API.

One `mlflow server` (SQLite backend store, artifacts served from a folder, a free loopback port)
and one short launch: digits, 2 ranks under horovodrun, 2 epochs. Rank 0's run is the only
one, with the config as params, both epochs' metrics at steps 1 and 2, the run's tags and its
artifacts; the failure modes (a server that is down, mlflow missing) are tests/unit/test_tracking.py's.
"""
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from hvdcls.observe.tracking import flatten
from tests.parallel.test_train import NP, REPO, train
from tests.run_files import read_json, read_metrics
from tests.serve_server import free_port

pytestmark = pytest.mark.parallel
EXPERIMENT = "hvdcls-test"
STARTUP_SECONDS = 90  # the server migrates its fresh SQLite database, then its worker imports the app


@pytest.fixture
def mlflow_server(tmp_path):
    """The URL of a private `mlflow server`, stopped after the test."""
    binary = Path(sys.executable).with_name("mlflow")
    assert binary.exists() or shutil.which("mlflow"), "this test needs mlflow (requirements/test.txt; make setup)"
    port = free_port()
    log = tmp_path / "mlflow.log"
    with open(log, "wb") as out:
        server = subprocess.Popen(
            [str(binary if binary.exists() else shutil.which("mlflow")), "server", "--host", "127.0.0.1",
             "--port", str(port), "--workers", "1", "--backend-store-uri", f"sqlite:///{tmp_path / 'mlflow.db'}",
             "--artifacts-destination", str(tmp_path / "artifacts")],
            stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
            # Its job runner (a process of its own, for MLflow's GenAI jobs) would only slow the start.
            env={**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"})
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_up(url, server, log)
        yield url
    finally:
        os.killpg(server.pid, signal.SIGTERM)  # the server and its uvicorn worker: their own group
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)


def wait_until_up(url: str, server: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + STARTUP_SECONDS
    while True:
        assert server.poll() is None, log.read_text()[-3000:]
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        assert time.monotonic() < deadline, log.read_text()[-3000:]
        time.sleep(0.25)


def test_rank_0_tracks_the_run_in_mlflow(mlflow_server, tmp_path):
    out = tmp_path / "run"
    train("horovodrun", NP, "torch", out, "--epochs", "2", "--mlflow", mlflow_server,
          f"output.mlflow_experiment={EXPERIMENT}", "output.checkpoint_every=0", "output.tensorboard=false")
    api = httpx.Client(base_url=f"{mlflow_server}/api/2.0/mlflow", timeout=30)
    experiment = api.get("/experiments/get-by-name", params={"experiment_name": EXPERIMENT}).json()["experiment"]
    runs = api.post("/runs/search", json={"experiment_ids": [experiment["experiment_id"]]}).json()["runs"]
    assert len(runs) == 1, runs  # rank 1 logged nothing
    run, summary = runs[0], read_json(out / "summary.json")
    assert run["info"]["status"] == "FINISHED" and run["info"]["run_name"] == out.name
    assert_params_and_tags(run["data"], summary)
    run_id = run["info"]["run_id"]
    for key in ("val_accuracy", "train_loss", "images_per_sec"):
        history = api.get("/metrics/get-history", params={"run_id": run_id, "metric_key": key}).json()["metrics"]
        assert [(m["step"], m["value"]) for m in sorted(history, key=lambda m: m["step"])] == [
            (record["epoch"], pytest.approx(record[key])) for record in read_metrics(out)]
    listed = api.get("/artifacts/list", params={"run_id": run_id}).json()["files"]
    assert {f["path"] for f in listed} == {"summary.json", "report.png", "config.yaml"}


def assert_params_and_tags(data: dict, summary: dict) -> None:
    params = {p["key"]: p["value"] for p in data["params"]}
    assert params == flatten(summary["config"])  # every key of the resolved config
    assert params["training.epochs"] == "2" and params["output.mlflow_experiment"] == EXPERIMENT
    tags = {t["key"]: t["value"] for t in data["tags"]}
    assert tags["world_size"] == str(NP) and tags["backend"] == "torch" and tags["dataset"] == "digits"
    assert tags["hvdcls_version"] == summary["versions"]["hvdcls"]
    for name, value in summary["horovod"]["environment"].items():
        assert tags[f"horovod.{name}"] == value
    commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True)
    if commit.returncode == 0:  # a checkout (not an unpacked copy)
        assert tags["mlflow.source.git.commit"] == commit.stdout.strip()
