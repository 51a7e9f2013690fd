"""The Slurm compose cluster's workload, run once inside its `service` container (as hvd, by
tests/docker/test_slurm.py: `python - < this file`) so that polling costs no `docker exec`.
Prints one JSON object with everything the tests assert on. Standard library and httpx only.

    refusals   a bad partition; 3 nodes of 1 task (the cluster has 2)       HTTP 400 at submit
    T  torch       np 4  runs at once, 2 ranks on each node
    W  tensorflow  np 4  pending in Slurm (Resources) until T ends
    X  torch       np 2  long; behind W; cancelled once Slurm runs it
    F  torch       np 1  empty data; behind W, beside X; fails
"""
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx

STATE = Path(os.environ.get("HVDCLS_STATE_DIR", "/shared/serve"))
EMPTY = Path("/shared/data/empty")
FINAL = ("succeeded", "failed", "cancelled")
IDLE = ["node1 idle", "node2 idle"]
QUICK = {"schedule": {"warmup_epochs": 0}, "training": {"log_every": 1}}
TIMEOUT = float(os.environ.get("WORKLOAD_TIMEOUT", "1500"))


def epochs(n: int) -> dict:
    return {**QUICK, "training": {**QUICK["training"], "epochs": n}}


def connect() -> httpx.Client:
    deadline = time.time() + 120
    while not (STATE / "server.json").exists():  # the service starts once both nodes are idle
        assert time.time() < deadline, f"no {STATE / 'server.json'}: is the service up?"
        time.sleep(0.5)
    url = json.loads((STATE / "server.json").read_text())["url"]
    token = (STATE / "token").read_text().strip()
    return httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=60)


def run(*cmd: str) -> str:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60).stdout


def main() -> None:
    http, out, started = connect(), {}, time.time()

    def submit(name: str, np: int, backend: str = "torch", settings=None) -> int:
        reply = http.post("/jobs", json={"name": name, "np": np, "backend": backend, "settings": settings or QUICK})
        assert reply.status_code == 201, reply.text
        return reply.json()["id"]

    def wait(job_id: int, until) -> dict:
        while not until(job := http.get(f"/jobs/{job_id}").json()):
            assert time.time() < started + TIMEOUT, job
            time.sleep(0.5)
        return job

    for name, spec in (("bad partition", {"np": 1, "slurm": {"partition": "nope"}}),
                       ("too many nodes", {"np": 3, "slurm": {"tasks_per_node": 1}})):
        reply = http.post("/jobs", json=spec)
        out[name] = [reply.status_code, reply.json()["detail"]]
    out["jobs after refusals"] = http.get("/jobs").json()

    EMPTY.mkdir(parents=True, exist_ok=True)
    t = submit("T", 4, settings=epochs(5))
    w = submit("W", 4, "tensorflow", settings=epochs(5))
    x = submit("X", 2, settings=epochs(100))
    f = submit("F", 1, settings={**QUICK, "data": {"path": str(EMPTY)}})
    out["W while T runs"] = wait(w, lambda j: (j["message"] or "").startswith("pending in Slurm ("))
    out["X while T runs"] = wait(x, lambda j: (j["message"] or "").startswith("pending in Slurm ("))
    out["X running"] = wait(x, lambda j: j["state"] == "running")
    out["X cancel"] = http.post(f"/jobs/{x}/cancel").status_code
    out["X"] = wait(x, lambda j: j["state"] in FINAL)
    for name, job_id in (("T", t), ("W", w), ("F", f)):
        out[name] = wait(job_id, lambda j: j["state"] in FINAL)
    out["T log"] = http.get(f"/jobs/{t}/logs").text[-4000:]
    summaries = {}
    for name in ("T", "W"):
        path = Path(out[name]["run_dir"]) / "summary.json"
        summaries[name] = json.loads(path.read_text()) if path.exists() else None
    out["summaries"] = summaries
    out["squeue"] = run("squeue", "--noheader", "--states=all", "--Format=JobID:|,State:|").split()
    deadline = time.time() + 60  # a cancelled job's nodes are "completing" until its processes end
    while (sinfo := run("sinfo", "--noheader", "--Node", "--format=%N %T").splitlines()) != IDLE:
        if time.time() > deadline:
            break
        time.sleep(0.5)
    out["sinfo"] = sinfo
    # Every rank and launcher of every job is gone from both nodes (ssh: the nodes' own view).
    # ("[h]": the pattern does not match the command line that carries it.)
    out["left on nodes"] = {node: run("ssh", node, "pgrep -af '[h]vdcls train|[h]orovodrun'").splitlines()
                            for node in ("node1", "node2")}
    out["seconds"] = time.time() - started
    print(json.dumps(out))


if __name__ == "__main__":
    main()
    sys.exit(0)
