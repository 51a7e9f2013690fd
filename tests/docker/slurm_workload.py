"""The Slurm compose cluster's workload, run once inside its `service` container (as hvd, by
tests/docker/test_slurm.py: `python - < this file`) so that polling costs no `docker exec`.
Prints one JSON object with everything the tests assert on. Standard library and httpx only.

    refusals   a bad partition; 3 nodes of 1 task (the cluster has 2)       HTTP 400 at submit
    T  torch       np 4  runs at once, 2 ranks on each node
    W  tensorflow  np 4  pending in Slurm (Resources) until T ends
    X  torch       np 2  long; behind W; cancelled once Slurm runs it
    F  torch       np 1  empty data; behind W, beside X; fails
    E  torch       elastic np 4 (min 2) on both nodes, last: once it has committed steps this
                   prints, then test_slurm.py kills node2's container and runs this again
                   (`python - elastic ID`) to follow E to its end on node1 alone
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


class Service:
    def __init__(self):
        self.http, self.started = connect(), time.time()

    def submit(self, name: str, np: int, backend: str = "torch", settings=None, **spec) -> int:
        reply = self.http.post("/jobs", json={"name": name, "np": np, "backend": backend,
                                              "settings": settings or QUICK, **spec})
        assert reply.status_code == 201, reply.text
        return reply.json()["id"]

    def wait(self, job_id: int, until) -> dict:
        while not until(job := self.http.get(f"/jobs/{job_id}").json()):
            assert time.time() < self.started + TIMEOUT, job
            time.sleep(0.5)
        return job


def main() -> None:
    service, out = Service(), {}
    http, started, submit, wait = service.http, service.started, service.submit, service.wait

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
    # Last, as it ends with node2 lost: an elastic job on both nodes, committing every 2 steps.
    e = submit("E", 4, elastic=True, min_np=2, max_np=4,
               settings={**QUICK, "training": {**QUICK["training"], "epochs": 2, "commit_every": 2}})
    out["E before"] = wait(e, lambda j: j["state"] in FINAL or committed(j["progress"]))
    out["E id"] = e
    print(json.dumps(out))


def committed(progress) -> bool:
    """Past its first commit (every 2 steps): step 3 of epoch 1, or any later epoch."""
    return bool(progress) and (progress["epoch"] > 1 or (progress["step"] or 0) >= 3)


def follow_elastic(job_id: int) -> None:
    """After node2's container was killed: E to its end, what it recorded, and the CLI's view."""
    service, out = Service(), {}
    out["E"] = service.wait(job_id, lambda j: j["state"] in FINAL)
    out["E seconds after the kill"] = time.time() - service.started
    run_dir = Path(out["E"]["run_dir"])
    out["E summary"] = json.loads((run_dir / "summary.json").read_text()) if (run_dir / "summary.json").exists() else None
    log = service.http.get(f"/jobs/{job_id}/logs").text
    out["E elastic lines"] = [line for line in log.splitlines() if "elastic: " in line]
    out["E log tail"] = log.splitlines()[-60:]  # why, should it fail (its message is stderr's end)
    errors = service.http.get(f"/jobs/{job_id}/logs", params={"stream": "stderr"}).text
    out["E stderr"] = [line for line in errors.splitlines() if "it/s]" not in line][-200:]  # no progress bars
    out["E status"] = run("hvdcls", "job", "status", str(job_id))
    out["E sinfo"] = run("sinfo", "--noheader", "--Node", "--format=%N %T").splitlines()
    print(json.dumps(out))


if __name__ == "__main__":
    if sys.argv[1:2] == ["elastic"]:
        follow_elastic(int(sys.argv[2]))
    else:
        main()
    sys.exit(0)
