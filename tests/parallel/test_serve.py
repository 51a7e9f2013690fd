"""`hvdcls serve` for real: uvicorn on a free localhost port, a 4-slot inventory (localhost:4),
tiny jobs (digits, compact_cnn, a few epochs, both backends) under horovodrun.

One workload, run once by the module fixture, and read by the tests:

    A  torch       np 2  long          runs at once, serving its training metrics; cancelled after
                                       a real Prometheus has answered every dashboard query
    C  torch       np 2  5 epochs      runs beside A; stopped (SIGSTOP) at epoch 2, killed while the
                                       service is down (requeued)
    D  tensorflow  np 2  3 epochs      waits for A's slots; running across the restart (adopted)
    G  torch       np 1  empty data    waits behind D (no backfill: nothing free); fails
    + 50 np-3 jobs in a burst while A and C hold the slots: queued, then cancelled

Assertions that must hold: queue order and gang starts; cancel ends a running job (its slots go
to the next); a restart adopts the live job and requeues (resuming) the one whose processes
vanished; the finished jobs have identical weights on their ranks and digits accuracy; bad
requests get 401/404/422/400 naming the problem; no submission of the burst is lost; Debian's
prometheus, scraping the service (from before the first submit) and A's rank 0, answers every
query of deploy/grafana/hvdcls-serve.json and hvdcls.json with what the service says.
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import psutil
import pytest

from hvdcls.files import status_file
from hvdcls.launching import launch
from tests.prometheus_server import PrometheusServer, dashboard_queries
from tests.results import keep
from tests.run_files import read_json, read_metrics

pytestmark = pytest.mark.parallel
REPO = Path(__file__).resolve().parents[2]
DIGITS = ["--config", str(REPO / "configs" / "digits.yaml")]
FINAL = ("succeeded", "failed", "cancelled")
# C is stopped once it reaches epoch 2 and killed later, while the service is down: the epochs
# after that are what its resumed attempt trains.
C_EPOCHS = 5
# E shrinks at epoch 2 and must grow back before it ends, some 5-10 s later (F's start, its
# cancel, the resize cooldown, the reset): epochs of about a second at either size, so the grow
# came in epoch 4 of 4 (CI, 2026-12-05) and of 6; 8 leave a margin of 4 s or more.
E_EPOCHS = 8
QUICK = {"schedule": {"warmup_epochs": 0}, "training": {"log_every": 1}}
DASHBOARDS = [REPO / "deploy" / "grafana" / name for name in ("hvdcls-serve.json", "hvdcls.json")]
ENDPOINT = re.compile(r"metrics: Prometheus endpoint on http://(\S+)/metrics")


class Server:
    """`hvdcls serve` as a subprocess; restartable on the same state directory. hosts=None: no
    inventory (--executor slurm among the options); extra_env is added to its environment;
    own_group: in a process group of its own (one a crash hook may kill, not the test's)."""

    def __init__(self, state_dir: Path, data_root: Path, log: Path, hosts: str | None = "localhost:4",
                 *options: str, extra_env: dict | None = None, own_group: bool = False):
        self.state_dir, self.data_root, self.log = state_dir, data_root, log
        self.hosts, self.options, self.extra_env = hosts, options, extra_env or {}
        self.own_group = own_group
        self.process = None

    def env(self) -> dict:
        return {**env(), **self.extra_env}

    def start(self) -> None:
        (self.state_dir / "server.json").unlink(missing_ok=True)
        inventory = ["--hosts", self.hosts] if self.hosts else []
        command = launch.hvdcls_command("serve", *inventory, "--state-dir", str(self.state_dir),
                                        "--port", "0", "--data-root", str(self.data_root), "--grace-seconds", "5",
                                        *self.options)
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=self.env(),
                                            start_new_session=self.own_group)
        deadline = time.time() + 60
        while not (self.state_dir / "server.json").exists():
            assert self.process.poll() is None and time.time() < deadline, self.log.read_text()[-3000:]
            time.sleep(0.1)
        self.url = json.loads((self.state_dir / "server.json").read_text())["url"]
        token = (self.state_dir / "token").read_text().strip()
        self.http = httpx.Client(base_url=self.url, headers={"Authorization": f"Bearer {token}"}, timeout=60)

    def stop(self) -> None:
        self.process.send_signal(signal.SIGTERM)
        self.process.wait(timeout=30)

    def job(self, job_id: int) -> dict:
        return self.http.get(f"/jobs/{job_id}").json()

    def submit(self, np: int, backend: str = "torch", settings=None, **extra) -> int:
        reply = self.http.post("/jobs", json={"np": np, "backend": backend, "settings": settings or QUICK, **extra})
        assert reply.status_code == 201, reply.text
        return reply.json()["id"]

    def wait(self, job_id: int, until, timeout: float = 240) -> dict:
        deadline = time.time() + timeout
        while True:
            job = self.job(job_id)
            if until(job):
                return job
            assert time.time() < deadline, (job, self.log.read_text()[-3000:])
            time.sleep(0.2)


def freeze_at_epoch(server: Server, job_id: int, epoch: int) -> tuple[dict, list[psutil.Process]]:
    """Stops (SIGSTOP) a running job's processes, its wrapper and all below it, once it reports
    `epoch`, so that it is still unfinished when the test kills it later, however long the rest
    of the workload takes on a slow machine (C, left to run on while A was watched, once trained
    all its epochs before its kill in CI)."""
    job = server.wait(job_id, lambda j: j["progress"] and j["progress"]["epoch"] >= epoch)
    wrapper = psutil.Process(job["pid"])
    processes = [wrapper, *wrapper.children(recursive=True)]
    for process in processes:
        process.suspend()
    return job, processes


def env() -> dict:
    environ = launch.single_host_env()
    environ["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{environ['PATH']}"
    environ["PYTHONPATH"] = str(REPO)
    return environ


def cli(state_dir: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(launch.hvdcls_command(*args, "--state-dir", str(state_dir)), env=env(),
                          capture_output=True, text=True, timeout=300)


def epochs(n: int) -> dict:
    return {**QUICK, "training": {**QUICK["training"], "epochs": n}, "output": {"checkpoint_every": 1}}


def refusals(server: Server, bad_token: httpx.Client) -> dict:
    """What the service answers to requests it must refuse: (status, message)."""
    def seen(reply):
        return reply.status_code, reply.json()["detail"]

    return {
        "no token": seen(httpx.post(f"{server.url}/jobs", json={"np": 1})),
        "read without a token": seen(httpx.get(f"{server.url}/jobs")),  # open metrics opens nothing else
        "wrong token": seen(bad_token.post("/jobs", json={"np": 1})),
        "cancel wrong token": seen(bad_token.post("/jobs/1/cancel")),
        "bad key": seen(server.http.post("/jobs", json={"np": 1, "overrides": ["training.epohcs=2"]})),
        "bad value": seen(server.http.post("/jobs", json={"np": 1, "settings": {"optimizer": {"lr": -1}}})),
        "outside roots": seen(server.http.post("/jobs", json={"np": 1, "overrides": ["data.path=/etc"]})),
        "command": seen(server.http.post("/jobs", json={"np": 1, "command": "sh -c id"})),
        "unknown job": seen(server.http.get("/jobs/99999")),
        "cancel unknown": seen(server.http.post("/jobs/99999/cancel")),
        "too large": seen(server.http.post("/jobs", json={"np": 5})),
    }


def processes_running(argument: Path, wait: float) -> list[str]:
    """Command lines naming `argument` still running after up to `wait` seconds."""
    deadline = time.time() + wait
    while True:
        found = []
        for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
            try:
                text = cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if str(argument) in text:
                found.append(text)
        if not found or time.time() > deadline:
            return found
        time.sleep(0.5)


def metric(text: str, name: str) -> float:
    return float(next(line.split()[-1] for line in text.splitlines() if line.startswith(name + " ")))


@pytest.fixture(scope="module")
def workload(tmp_path_factory):
    root = tmp_path_factory.mktemp("serve")
    (root / "data" / "empty").mkdir(parents=True)
    # --open-metrics: the test's Prometheus scrapes /metrics without a token, as the compose one does
    server = Server(root / "state", root / "data", root / "serve.log", "localhost:4", "--open-metrics")
    seen: dict = {"server": server}
    began = time.time()
    server.start()
    prometheus = PrometheusServer(root / "prometheus")
    try:
        run_workload(server, seen, root, prometheus)
    finally:
        prometheus.stop()
        end_everything(server)
    seen["seconds"] = time.time() - began
    return seen


def end_everything(server: Server) -> None:
    """Leave no job running, whatever happened: cancel through the service, then kill."""
    pids = []
    try:
        running = server.http.get("/jobs", params={"state": "running"}).json()
        pids = [job["pid"] for job in running if job["pid"]]
        for job in running:
            server.http.post(f"/jobs/{job['id']}/cancel")
        for job in running:
            server.wait(job["id"], lambda j: j["state"] in FINAL, timeout=30)
    finally:
        if server.process.poll() is None:
            server.stop()
        for pid in pids:
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def watched(settings: dict) -> dict:
    """`settings` with rank 0's training metrics served on a free loopback port."""
    return {**settings, "output": {**settings.get("output", {}), "metrics_port": 0, "metrics_host": "127.0.0.1"}}


def listed(server: Server, job_id: int) -> list[str]:
    """The endpoints GET /targets gives for the job (its status.json's, on rank 0)."""
    return [t for group in server.http.get("/targets").json() if group["labels"]["job_id"] == str(job_id)
            for t in group["targets"]]


def scraped_while_running(prometheus: PrometheusServer, server: Server, job_id: int) -> dict:
    """Prometheus scrapes the job's rank 0 too, found where the service lists it (GET /targets);
    every dashboard query, and a few exact ones, once all have answered."""
    log = Path(server.job(job_id)["run_dir"]) / "stdout.log"
    server.wait(job_id, lambda j: listed(server, job_id))
    endpoint = listed(server, job_id)
    assert endpoint == [ENDPOINT.search(log.read_text()).group(1)], endpoint  # what rank 0 said it serves
    prometheus.scrape("hvdcls", endpoint[0])
    queries = {path.name: dashboard_queries(path) for path in DASHBOARDS}
    exact = ["up", "hvdcls_serve_queue_length", "hvdcls_serve_slots_in_use", "hvdcls_serve_host_slots_free",
             "hvdcls_serve_job_slots", "hvdcls_serve_job_progress", "hvdcls_serve_queue_wait_seconds_count",
             "hvdcls_serve_first_step_seconds_count", "hvdcls_world_size"]
    wanted = [expr for panels in queries.values() for _, expr in panels] + exact
    answers = prometheus.wait_until(wanted, timeout=180, output=lambda: server.log.read_text()[-2000:])
    return {"queries": queries, "answers": answers}


def run_workload(server: Server, seen: dict, root: Path, prometheus: PrometheusServer) -> None:
    started_at = time.time()
    prometheus.scrape("hvdcls-serve", server.url.removeprefix("http://"))
    prometheus.start()  # scraping the service before any job starts: the latency histograms' increase()
    prometheus.wait_until(["hvdcls_serve_queue_length"], timeout=60)
    seen["prometheus start seconds"] = time.time() - started_at
    a = server.submit(2, settings=watched(epochs(50)), name="A")
    c = server.submit(2, settings=epochs(C_EPOCHS), name="C", requeue=True)
    server.wait(c, lambda j: j["state"] == "running")
    freezer = ThreadPoolExecutor(1)
    c_frozen = freezer.submit(freeze_at_epoch, server, c, 2)
    seen["refusals"] = refusals(server, httpx.Client(base_url=server.url, headers={"Authorization": "Bearer x"}))
    seen["cli bad key"] = cli(server.state_dir, "job", "submit", "--np", "1", "training.epohcs=2")
    with ThreadPoolExecutor(8) as pool:  # the burst: 50 at once; none fits (2 free, 3 each)
        seen["burst"] = list(pool.map(lambda i: server.submit(3, name=f"burst-{i}"), range(50)))
    seen["burst queued"] = server.http.get("/jobs", params={"state": "queued"}).json()
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda j: server.http.post(f"/jobs/{j}/cancel"), seen["burst"]))
    d = server.submit(2, "tensorflow", settings=epochs(3), name="D")
    g = server.submit(1, settings={**QUICK, "data": {"path": str(root / "data" / "empty")}}, name="G")
    seen["ids"] = {"A": a, "C": c, "D": d, "G": g}
    seen["A first step"] = server.wait(a, lambda j: j["first_step_at"] is not None)
    seen["C first step"] = server.wait(c, lambda j: j["first_step_at"] is not None)
    seen["metrics while full"] = server.http.get("/metrics").text
    seen["hosts while full"] = server.http.get("/hosts").json()
    seen["G while full"] = server.job(g)
    asked_at = time.time()
    seen["prometheus"] = scraped_while_running(prometheus, server, a)
    prometheus.stop()
    seen["prometheus"]["seconds"] = time.time() - asked_at
    cancelled_at = time.time()
    server.http.post(f"/jobs/{a}/cancel")
    seen["A"] = server.wait(a, lambda j: j["state"] in FINAL)
    seen["cancel seconds"] = time.time() - cancelled_at
    seen["A ranks left"] = processes_running(Path(seen["A"]["run_dir"]) / "job.yaml", wait=15)
    # The restart: D live (adopted), C's processes killed while the service is down (requeued).
    seen["D before restart"] = server.wait(d, lambda j: j["pid"] is not None)
    seen["C before restart"], c_processes = c_frozen.result(timeout=240)
    freezer.shutdown()
    server.stop()
    for process in c_processes:  # its ranks too: their middlemen, stopped, take nothing down
        with contextlib.suppress(psutil.NoSuchProcess):
            process.kill()
    psutil.wait_procs(c_processes, timeout=10)
    server.start()
    seen["C after restart"] = server.job(c)
    seen["D after restart"] = server.job(d)
    seen["logs -f D"] = cli(server.state_dir, "job", "logs", str(d), "-f")
    for name, job_id in seen["ids"].items():
        seen[name] = server.wait(job_id, lambda j: j["state"] in FINAL)
    seen["jobs"] = server.http.get("/jobs").json()
    seen["metrics at the end"] = server.http.get("/metrics").text


@pytest.fixture(scope="module")
def elastic_workload(tmp_path_factory):
    """An elastic job on 2 slots (this machine under two names: Horovod drops a removed *host*'s
    workers). A 1-slot job arrives: the service shrinks the elastic job to admit it. It is
    cancelled once it runs (its own training is not the point): the elastic job grows back."""
    root = tmp_path_factory.mktemp("serve-elastic")
    (root / "data").mkdir()
    server = Server(root / "state", root / "data", root / "serve.log", "localhost:1,127.0.0.1:1",
                    "--resize-cooldown", "3", "--network-interface", "lo")
    seen: dict = {"server": server}
    began = time.time()
    server.start()
    try:
        settings = {**epochs(E_EPOCHS), "training": {**epochs(E_EPOCHS)["training"], "commit_every": 5}}
        elastic = server.submit(2, settings=settings, elastic=True, min_np=1, max_np=2, name="E")
        server.wait(elastic, lambda j: j["progress"] and j["progress"]["epoch"] >= 2)
        waiting = server.submit(1, settings=epochs(50), name="F")
        seen["F running"] = server.wait(waiting, lambda j: j["pid"] is not None)
        seen["E shrunk"] = server.job(elastic)
        server.wait(elastic, lambda j: "elastic: 1 worker(s)" in read_log(j))
        # F is cancelled once E has committed at 1 worker (commit_every 5): the grow back must
        # not come before that, or nothing shows E trained at that size.
        shrunk = steps_at_one_worker(server.wait(elastic, lambda j: steps_at_one_worker(j) is not None)) or 0
        server.wait(elastic, lambda j: (steps_at_one_worker(j) or 0) > shrunk + 5)
        server.http.post(f"/jobs/{waiting}/cancel")
        seen["F"] = server.wait(waiting, lambda j: j["state"] in FINAL)
        seen["E"] = server.wait(elastic, lambda j: j["state"] in FINAL)
        seen["log"] = server.log.read_text()
    finally:
        end_everything(server)
    seen["seconds"] = time.time() - began
    return seen


def steps_at_one_worker(job: dict):
    """The run's step count (epochs done x steps per epoch + this epoch's) while its status.json
    says 1 worker; None at any other size or before a step."""
    status = status_file.read(Path(job["run_dir"]))
    if not status or status.world_size != 1 or status.step is None or not status.epoch:
        return None
    return (status.epoch - 1) * (status.steps_per_epoch or 0) + status.step


def read_log(job: dict) -> str:
    return (Path(job["run_dir"]) / "stdout.log").read_text()


def test_an_elastic_job_shrinks_for_a_waiting_job_and_grows_back(elastic_workload):
    e, f = elastic_workload["E"], elastic_workload["F"]
    assert elastic_workload["E shrunk"]["hosts"] == {"localhost": 1}  # 127.0.0.1 given to F
    assert elastic_workload["F running"]["hosts"] == {"127.0.0.1": 1}
    assert e["state"] == "succeeded" and f["state"] == "cancelled", (e["message"], f["message"])
    assert e["resizes"] == 2 and e["hosts"] == {"localhost": 1, "127.0.0.1": 1}, elastic_workload["log"][-3000:]
    summary = read_json(Path(e["run_dir"]) / "summary.json")
    recoveries = summary["elastic"]["recoveries"]
    assert [r["world_size"] for r in recoveries] == [1, 2], recoveries
    sizes = [r["world_size"] for r in read_metrics(Path(e["run_dir"]))]  # at each epoch's end
    # It trained at 1 worker between the shrink and the grow: commits at that size moved the
    # step on. Epoch-end records need not show it (on fast cores both resizes fell within one
    # epoch, and every record says 2; on slow ones the grow came late, and most say 1).
    assert recoveries[1]["resumed_at_step"] > recoveries[0]["resumed_at_step"], recoveries
    assert len(sizes) == E_EPOCHS and sizes[0] == 2, sizes
    assert summary["world_size"] == 2 and len(set(summary["rank_weight_digests"])) == 1
    status = read_json(Path(e["run_dir"]) / "status.json")  # kept by whichever process was rank 0
    assert (status["phase"], status["hosts"]) == ("done", {"localhost": 1, "127.0.0.1": 1}), status
    assert summary["elastic"]["steps_lost"] <= 2 * summary["elastic"]["commit_every"]  # an interval per resize
    assert 0.7 <= summary["val_accuracy"] <= 1.0, summary["val_accuracy"]
    keep("elastic.json", {"recoveries": recoveries, "steps_lost": summary["elastic"]["steps_lost"],
                          "workload_seconds": elastic_workload["seconds"]})
    for event in recoveries:
        print(f"resized to {event['world_size']} at step {event['resumed_at_step']}: "
              f"{event['seconds']} s without a step")
    print(f"steps lost in all: {summary['elastic']['steps_lost']}")


def test_bad_requests_are_refused_naming_the_problem(workload):
    refused = workload["refusals"]
    assert refused["no token"][0] == refused["wrong token"][0] == refused["cancel wrong token"][0] == 401
    assert refused["read without a token"][0] == 401
    assert "bearer token" in refused["wrong token"][1]
    bad_key = "config override: training.epohcs: Key 'epohcs' not in 'TrainingConfig'"
    assert refused["bad key"][0] == 422 and refused["bad key"][1].startswith(bad_key)
    assert refused["bad value"] == (422, "config optimizer.lr=-1.0: must be >= 0")
    assert refused["outside roots"][0] == 422 and "data.path='/etc': not under the service's data roots" \
        in refused["outside roots"][1]
    assert refused["command"][0] == 422 and refused["command"][1][0]["loc"] == ["body", "command"]
    assert refused["unknown job"] == refused["cancel unknown"] == (404, "no job 99999")
    assert refused["too large"] == (400, "np=5: the inventory has 4 slots in all (localhost:4)")
    result = workload["cli bad key"]
    assert result.returncode == 2 and result.stderr.startswith(f"hvdcls: error: 422: {bad_key}")
    assert len(result.stderr.strip().splitlines()) == 1


def test_a_burst_of_submissions_loses_none(workload):
    burst = workload["burst"]
    assert len(set(burst)) == 50
    assert {j["id"] for j in workload["burst queued"]} >= set(burst)  # none started: none fit
    by_id = {j["id"]: j for j in workload["jobs"]}
    assert all(by_id[j]["state"] == "cancelled" and by_id[j]["started_at"] is None for j in burst)
    assert sorted(by_id[j]["name"] for j in burst) == sorted(f"burst-{i}" for i in range(50))


def test_jobs_start_in_queue_order_and_a_cancel_frees_the_slots(workload):
    a, c, d, g = (workload[name] for name in "ACDG")
    assert a["state"] == "cancelled" and a["exit_status"] is not None
    assert workload["A ranks left"] == []  # horovodrun, its ranks and the wrapper all ended
    assert a["started_at"] < workload["D before restart"]["started_at"]
    assert workload["D before restart"]["started_at"] >= a["ended_at"]  # D waited for A's slots
    assert workload["G while full"]["state"] == "queued"  # behind D, and nothing free to backfill
    assert g["started_at"] >= min(c["ended_at"], d["ended_at"])
    full = workload["hosts while full"]
    assert full == [{"host": "localhost", "slots": 4, "free": 0, "jobs": {str(a["id"]): 2, str(c["id"]): 2}}]
    text = workload["metrics while full"]
    assert metric(text, "hvdcls_serve_slots_in_use") == 4 and metric(text, "hvdcls_serve_slots") == 4
    assert metric(text, "hvdcls_serve_queue_length") == 2  # D and G
    assert metric(text, 'hvdcls_serve_jobs{state="cancelled"}') == 50
    progress = [line for line in text.splitlines() if line.startswith("hvdcls_serve_job_progress{")]
    assert len(progress) == 2 and all(float(line.split()[-1]) > 0 for line in progress), progress
    end = workload["metrics at the end"]
    assert metric(end, "hvdcls_serve_slots_in_use") == 0 and metric(end, "hvdcls_serve_queue_length") == 0


def series(answers: dict, expr: str, key: str = None) -> dict:
    """{label `key`'s value (or the job's name, Prometheus's `job` label): value} of one answer."""
    return {labels.get(key) if key else labels["job"]: value for labels, value in answers[expr]}


def test_prometheus_answers_every_dashboard_query_with_what_the_service_says(workload):
    watched = workload["prometheus"]
    for dashboard, panels in watched["queries"].items():
        for title, expr in panels:
            assert watched["answers"][expr], (dashboard, title, expr)  # a number, not nothing or NaN
    answers = watched["answers"]
    a, c = str(workload["ids"]["A"]), str(workload["ids"]["C"])
    assert series(answers, "up") == {"hvdcls-serve": 1, "hvdcls": 1}  # the service and A's rank 0
    # while A and C hold the 4 slots and D and G wait:
    assert series(answers, "hvdcls_serve_queue_length") == {"hvdcls-serve": 2}
    assert series(answers, "hvdcls_serve_slots_in_use") == {"hvdcls-serve": 4}
    assert series(answers, "hvdcls_serve_host_slots_free", "host") == {"localhost": 0}
    assert series(answers, "hvdcls_serve_job_slots", "name") == {"A": 2, "C": 2}
    assert series(answers, "hvdcls_serve_job_slots", "job_id") == {a: 2, c: 2}
    progress = series(answers, "hvdcls_serve_job_progress", "name")
    assert set(progress) == {"A", "C"} and all(0 < p <= 1 for p in progress.values()), progress
    assert series(answers, "hvdcls_serve_queue_wait_seconds_count") == {"hvdcls-serve": 2}  # A, C started
    assert series(answers, "hvdcls_serve_first_step_seconds_count") == {"hvdcls-serve": 2}
    assert series(answers, "hvdcls_world_size", "backend") == {"torch": 2}  # A's own metrics
    print(f"Prometheus started and scraped the service in {workload['prometheus start seconds']:.1f} s; "
          f"{sum(map(len, watched['queries'].values()))} dashboard queries all answered "
          f"{watched['seconds']:.1f} s after A and C had stepped")


def test_a_restart_adopts_live_jobs_and_requeues_vanished_ones(workload):
    before, after = workload["D before restart"], workload["D after restart"]
    assert after["state"] == "running" and after["pid"] == before["pid"]  # adopted, not restarted
    assert workload["D"]["state"] == "succeeded" and workload["D"]["attempts"] == 1
    assert workload["C after restart"]["state"] in ("queued", "running")
    c = workload["C"]
    assert c["state"] == "succeeded" and c["attempts"] == 2, c
    summary = read_json(Path(c["run_dir"]) / "summary.json")
    assert summary["resumed_from"] is not None  # from the checkpoint the killed attempt wrote
    assert [r["epoch"] for r in read_metrics(Path(c["run_dir"]))] == list(range(1, C_EPOCHS + 1))
    logs = workload["logs -f D"]
    assert logs.returncode == 0 and "done: val accuracy" in logs.stdout  # followed to the end


@pytest.mark.parametrize("name, backend, trained", [("C", "torch", C_EPOCHS), ("D", "tensorflow", 3)])
def test_finished_jobs_trained_alike_on_every_rank(workload, name, backend, trained):
    job = workload[name]
    summary = read_json(Path(job["run_dir"]) / "summary.json")
    assert (summary["backend"], summary["world_size"], summary["controller"]) == (backend, 2, "gloo")
    digests = summary["rank_weight_digests"]
    assert len(digests) == 2 and len(set(digests)) == 1, digests
    assert 0.7 <= summary["val_accuracy"] <= 1.0, summary["val_accuracy"]
    for kept in ("spec.json", "job.yaml", "hostfile", "stdout.log", "stderr.log", "exit_status.json",
                 "metrics.jsonl", "checkpoints", "status.json"):
        assert (Path(job["run_dir"]) / kept).exists(), kept
    status = read_json(Path(job["run_dir"]) / "status.json")  # rank 0's last word, as the service read it
    assert (status["phase"], status["world_size"], status["hosts"], status["fraction"]) == (
        "done", 2, {"localhost": 2}, 1.0), status
    assert status["metrics"]["epoch"] == trained and status["metrics"]["val_accuracy"] == summary["val_accuracy"]


def test_a_failed_job_records_its_exit_status_and_last_lines(workload):
    g = workload["G"]
    assert g["state"] == "failed" and g["exit_status"] != 0
    first = g["message"].splitlines()[0]
    assert first.startswith(f"exit status {g['exit_status']}: no class directories in "), first
    assert len(g["message"].splitlines()) > 1


def test_submit_to_first_step_latency(workload):
    """Reported, not bounded: submit (empty queue) to the first progress line."""
    for name in ("A", "C"):
        job = workload[f"{name} first step"]
        print(f"{name} ({job['backend']}, np {job['np']}): submit to first step "
              f"{job['first_step_seconds']:.1f} s (queued {job['queued_seconds']:.2f} s)")
        assert job["first_step_seconds"] > job["queued_seconds"] >= 0
    d = workload["D"]  # queued behind A: its start to its first step
    print(f"D ({d['backend']}, np {d['np']}): start to first step {d['first_step_at'] - d['started_at']:.1f} s")
    print(f"cancel of a running job: {workload['cancel seconds']:.1f} s to 'cancelled'")
    keep("latency.json", {
        "jobs": {name: {key: workload[f"{name} first step"][key] for key in ("backend", "np", "first_step_seconds",
                                                                                "queued_seconds")} for name in "AC"},
        "D": {"backend": d["backend"], "np": d["np"], "start_to_first_step": d["first_step_at"] - d["started_at"]},
        "cancel_seconds": workload["cancel seconds"], "workload_seconds": workload["seconds"],
        "prometheus_start_seconds": workload["prometheus start seconds"],
        "prometheus_queries_seconds": workload["prometheus"]["seconds"]})
