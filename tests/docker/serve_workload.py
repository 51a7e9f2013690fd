"""The compose cluster's service workload, run once inside its `service` container (as hvd, by
tests/docker/test_serve.py: `python - < this file`) so that polling costs no `docker exec`.
Everything a user would type goes through the `hvdcls` commands; Prometheus is asked through its
HTTP API at prometheus:9090, as anything inside the network would. Prints one JSON object with
everything the tests assert on. Standard library and httpx only.

    refusals  an unknown setting (422), 5 slots of the 4 (400)            exit 2 from `hvdcls submit`
    J  torch  np 4  3 epochs across worker1 and worker2, rank 0 serving metrics (serve --job-metrics),
                    found by Prometheus through the service's GET /targets
    Q  torch  np 4  queued behind J; cancelled, once Prometheus has seen the queue, before it starts
"""
import json
import os
import subprocess
import time
from pathlib import Path

import httpx

SERVICE = "http://127.0.0.1:8470"  # /targets needs no token (serve --open-metrics); /jobs does
STATE_DIR = Path(os.environ.get("HVDCLS_STATE_DIR", "/shared/serve"))
PROMETHEUS = "http://prometheus:9090"
TIMEOUT = float(os.environ.get("WORKLOAD_TIMEOUT", "900"))
JOB = ["training.epochs=3", "schedule.warmup_epochs=0", "training.log_every=1",
       # what the tests read: summary.json, the log, the metrics (no report, TensorBoard, checkpoints)
       "output.report=false", "output.tensorboard=false", "output.checkpoint_every=0",
       # rank 0's /metrics (on a free port: serve --job-metrics) kept up a while after training, so that
       # the cluster's Prometheus scrapes its last values before the job ends and leaves /targets
       "output.metrics_linger_seconds=15"]
# The service's series the tests check, while J runs with Q queued and once both have ended.
SERVICE_SERIES = ["hvdcls_serve_queue_length", "hvdcls_serve_jobs", "hvdcls_serve_slots",
                  "hvdcls_serve_slots_in_use", "hvdcls_serve_host_slots_free"]
# J's rank 0 (scrape job `hvdcls`): its last samples, which outlive the target (it is gone by then).
RANK0_SERIES = ["hvdcls_world_size", "hvdcls_training_done", "hvdcls_epoch", 'hvdcls_accuracy{split="val"}']


def hvdcls(*args: str) -> dict:
    done = subprocess.run(["hvdcls", *args], capture_output=True, text=True, timeout=TIMEOUT)
    return {"rc": done.returncode, "stdout": done.stdout, "stderr": done.stderr}


def query(prometheus: httpx.Client, expr: str) -> list:
    """[[labels, value], ...] of an instant query."""
    body = prometheus.get("/api/v1/query", params={"query": expr}).json()
    assert body["status"] == "success", (expr, body)
    return [[series["metric"], float(series["value"][1])] for series in body["data"]["result"]]


def scraped(prometheus: httpx.Client, exprs: list[str]) -> dict:
    return {expr: query(prometheus, expr) for expr in exprs}


def value(answers: dict, expr: str, **labels: str):
    found = [v for metric, v in answers[expr] if all(metric.get(k) == want for k, want in labels.items())]
    return found[0] if len(found) == 1 else None


def wait_for(what: str, check, deadline: float):
    while not (found := check()):
        assert time.time() < deadline, f"still waiting for {what}"
        time.sleep(0.5)
    return found


def main() -> None:
    started, out = time.time(), {}
    deadline = started + TIMEOUT
    prometheus = httpx.Client(base_url=PROMETHEUS, timeout=30)

    def ready() -> bool:
        try:
            return prometheus.get("/-/ready").status_code == 200
        except httpx.TransportError:
            return False
    wait_for("Prometheus", ready, deadline)

    out["unknown setting"] = hvdcls("job", "submit", "--np", "4", "training.no_such_key=1")
    out["too many slots"] = hvdcls("job", "submit", "--np", "5")
    out["job"] = hvdcls("job", "submit", "--backend", "torch", "--np", "4", "--name", "J", *JOB)
    out["queued"] = hvdcls("job", "submit", "--backend", "torch", "--np", "4", "--name", "Q")
    job, queued = (int(out[k]["stdout"].split()[1]) for k in ("job", "queued"))
    admin = {"Authorization": f"Bearer {(STATE_DIR / 'token').read_text().strip()}"}  # the first admin's
    out["read without a token"] = httpx.get(f"{SERVICE}/jobs/{job}").status_code

    def while_running():
        state = httpx.get(f"{SERVICE}/jobs/{job}", headers=admin).json()
        assert state["state"] in ("queued", "running"), state  # J ended before Prometheus saw it run
        answers = scraped(prometheus, SERVICE_SERIES)
        seen = (value(answers, "hvdcls_serve_queue_length"), value(answers, "hvdcls_serve_slots_in_use"),
                value(answers, "hvdcls_serve_jobs", state="running"))
        return answers if seen == (1, 4, 1) else None
    out["prometheus while J runs"] = wait_for("Prometheus to see J running and Q queued", while_running, deadline)

    def discovered():
        listed = httpx.get(f"{SERVICE}/targets").json()
        active = prometheus.get("/api/v1/targets").json()["data"]["activeTargets"]
        up = sorted((t["labels"]["job"], t["labels"]["instance"], t["labels"].get("job_id")) for t in active
                    if t["health"] == "up")
        return (listed, up) if listed and len(up) == 2 else None
    out["service targets"], out["targets"] = wait_for("Prometheus to scrape J's rank 0 found in /targets",
                                                      discovered, deadline)
    out["cancel Q"] = hvdcls("job", "cancel", str(queued))
    out["logs -f"] = hvdcls("job", "logs", str(job), "--follow")  # returns when J has ended
    out["jobs"] = hvdcls("job", "list")
    out["status"] = hvdcls("job", "status", str(job))
    out["status json"] = json.loads(hvdcls("job", "status", str(job), "--json")["stdout"])
    out["Q"] = json.loads(hvdcls("job", "status", str(queued), "--json")["stdout"])
    out["summary"] = json.loads((Path(out["status json"]["run_dir"]) / "summary.json").read_text())

    def after():
        answers = scraped(prometheus, SERVICE_SERIES)
        done = (value(answers, "hvdcls_serve_jobs", state="succeeded"), value(answers, "hvdcls_serve_slots_in_use"))
        return answers if done == (1, 0) else None
    out["prometheus after"] = wait_for("Prometheus to see J succeeded", after, deadline)
    out["prometheus rank 0"] = scraped(prometheus, [f"last_over_time({s}[15m])" for s in RANK0_SERIES])
    out["seconds"] = time.time() - started
    print(json.dumps(out))


if __name__ == "__main__":
    main()
