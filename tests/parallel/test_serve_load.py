"""`hvdcls serve` under load, SIGKILLed in the middle and restarted, against a real server.

On 3 slots (localhost:3), before the load:

    R  torch  np 1  digits, 50 epochs: trains for real across the kill (adopted), cancelled after
    H  torch  np 2  its rank 1 held at step 2 by the HVDCLS_TEST_STALL hook: holds 2 slots, idle

then 500 submissions of np 3 from 20 concurrent clients (none can start: H holds 2 of the 3
slots), while 20 clients follow logs (R's, H's, the queued jobs') and one reads GET /jobs, a page
and the whole table, over and over. After 200 answers the service is SIGKILLed and started again
on the same port; the clients reconnect and go on. Then every queued job is cancelled, then R
and H, and the followers' streams end. (A job that ends by itself after an adoption:
tests/parallel/test_serve.py's D.)

Must hold: every submission answered 201 is in the table exactly once, under the id it was given,
and a request cut by the kill is there at most once; nothing else is; SQLite's integrity check
passes after the kill and at the end; the jobs running at the kill are adopted (same process,
not restarted), the restarted service sees R's steps go on, and cancels both, every process
gone; a follower that followed R to its end got R's whole log.
The submit and GET /jobs latencies are printed (median, 99th percentile): the figures for
docs/serve.md, measured by `python -m pytest tests/parallel/test_serve_load.py -s`.
"""
from __future__ import annotations

import itertools
import sqlite3
import statistics
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from tests.serve_server import FINAL, QUIET, ServeProcess

pytestmark = pytest.mark.parallel
SUBMISSIONS, SUBMITTERS, FOLLOWERS, KILL_AFTER = 500, 20, 20, 200
R_EPOCHS = 50  # more than it can train before it is cancelled


def integrity(state_dir: Path) -> str:
    with sqlite3.connect(state_dir / "jobs.db") as db:
        return db.execute("PRAGMA integrity_check").fetchone()[0]


def running_at(state_dir: Path) -> dict[int, int]:
    """{job id: pid} of the jobs the table says are running (read with the service dead)."""
    with sqlite3.connect(state_dir / "jobs.db") as db:
        return dict(db.execute("SELECT id, pid FROM jobs WHERE state = 'running'"))


def percentiles(seconds: list[float]) -> str:
    ordered = sorted(seconds)
    p99 = ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]
    return f"median {1000 * statistics.median(ordered):.0f} ms, p99 {1000 * p99:.0f} ms ({len(ordered)} requests)"


class Load:
    """The clients: submitters, followers and a reader, each with its own connection, each
    riding out the service's absence (a request never sent is retried; one cut is recorded)."""

    def __init__(self, server: ServeProcess, followed: list[int]):
        self.server, self.followed = server, followed
        self.answered: dict[str, int] = {}  # name -> id, from a 201
        self.cut: list[str] = []  # sent, but the connection broke before the answer
        self.submit_seconds: list[float] = []
        self.read_seconds: dict[str, list[float]] = {"page": [], "all": []}
        self.streams: list[dict] = []
        self.lock = threading.Lock()
        self.submitting, self.stopping = threading.Event(), threading.Event()
        self.queued_names = itertools.count()

    def submit_all(self, client: int) -> None:
        http = self.server.client(self.server.token, timeout=60)
        for i in range(SUBMISSIONS // SUBMITTERS):
            name = f"load-{client}-{i}"
            while True:
                started = time.perf_counter()
                try:
                    reply = http.post("/jobs", json={"np": 3, "name": name, "settings": QUIET})
                except httpx.ConnectError:  # the service is down: nothing was sent
                    time.sleep(0.1)
                    continue
                except httpx.TransportError:
                    with self.lock:
                        self.cut.append(name)
                    break
                assert reply.status_code == 201, reply.text
                with self.lock:
                    self.answered[name] = reply.json()["id"]
                    self.submit_seconds.append(time.perf_counter() - started)
                break

    def read(self) -> None:
        http = self.server.client(self.server.token, timeout=60)
        for kind in itertools.cycle(("page", "all")):
            if not self.submitting.is_set():
                return
            started = time.perf_counter()
            try:
                reply = http.get("/jobs", params={"limit": 50, "order": "desc"} if kind == "page" else None)
            except httpx.TransportError:
                time.sleep(0.1)
                continue
            assert reply.status_code == 200
            self.read_seconds[kind].append(time.perf_counter() - started)

    def follow(self, follower: int) -> None:
        """Follow a job's log to its end (R's, H's, or a queued one's), then another while the
        submissions go on; reconnect after a cut."""
        http = self.server.client(self.server.token, timeout=None)
        job_id = self.followed[follower] if follower < len(self.followed) else self.next_to_follow()
        while not self.stopping.is_set():
            seen = {"job": job_id, "bytes": b"", "cut": False}
            try:
                with http.stream("GET", f"/jobs/{job_id}/logs", params={"follow": True}) as reply:
                    for chunk in reply.iter_bytes():
                        seen["bytes"] += chunk
            except httpx.TransportError:
                seen["cut"] = True
                time.sleep(0.2)
            with self.lock:
                self.streams.append(seen)
            if not seen["cut"]:
                if not self.submitting.is_set():
                    return  # followed to its end once the submissions are over: done
                job_id = self.next_to_follow()

    def next_to_follow(self) -> int:
        """One of the queued jobs submitted so far, each in turn."""
        while not (ids := sorted(self.answered.values())):
            time.sleep(0.05)
        return ids[next(self.queued_names) % len(ids)]


@pytest.fixture(scope="module")
def loaded(tmp_path_factory):
    root = tmp_path_factory.mktemp("serve-load")
    server = ServeProcess(root, hosts="localhost:3", env={"HVDCLS_TEST_STALL": "1:2"})
    server.start()
    seen: dict = {"server": server}
    try:
        r = server.submit({"np": 1, "name": "R", "settings": {**QUIET, "training": {"log_every": 1,
                                                                                   "epochs": R_EPOCHS}}})
        h = server.submit({"np": 2, "name": "H", "settings": QUIET})
        for job in (r, h):
            server.wait(job["id"], lambda j: j["pid"] is not None)
        seen["ids"] = {"R": r["id"], "H": h["id"]}
        followed = [r["id"]] * 4 + [h["id"]] * 2  # the other followers follow queued jobs
        run_load(server, Load(server, followed), seen)
    finally:
        server.end_everything()
    seen["integrity at the end"] = integrity(server.state_dir)
    return seen


def run_load(server: ServeProcess, load: Load, seen: dict) -> None:
    load.submitting.set()
    with ThreadPoolExecutor(SUBMITTERS + FOLLOWERS + 1) as pool:
        followers = [pool.submit(load.follow, i) for i in range(FOLLOWERS)]
        reader = pool.submit(load.read)
        started = time.time()
        submitters = [pool.submit(load.submit_all, i) for i in range(SUBMITTERS)]
        while len(load.answered) < KILL_AFTER:
            assert not any(f.done() for f in submitters), [f.exception() for f in submitters if f.done()]
            time.sleep(0.02)
        server.kill()
        seen["answered before the kill"] = len(load.answered)
        seen["running at the kill"] = running_at(server.state_dir)
        seen["integrity after the kill"] = integrity(server.state_dir)
        killed_at = time.time()
        server.start()
        seen["restart seconds"] = time.time() - killed_at
        seen["after restart"] = {job_id: server.job(job_id) for job_id in seen["running at the kill"]}
        at_restart = step(seen["after restart"][seen["ids"]["R"]])
        seen["R stepping after restart"] = server.wait(seen["ids"]["R"], lambda j: step(j) > at_restart)
        for future in submitters:
            future.result()
        seen["submit seconds"] = time.time() - started
        load.submitting.clear()
        reader.result()
        seen["table"] = server.http.get("/jobs").json()
        seen["page at 500"] = [timed(server.http, {"limit": 50, "order": "desc"}) for _ in range(20)]
        seen["all at 500"] = [timed(server.http, None) for _ in range(20)]
        seen["phases"] = {"submitted": time.time() - started}
        queued = [job["id"] for job in seen["table"] if job["state"] == "queued"]
        with ThreadPoolExecutor(SUBMITTERS) as cancellers:
            seen["cancels"] = list(cancellers.map(lambda j: server.http.post(f"/jobs/{j}/cancel").json(), queued))
        seen["phases"]["cancelled"] = time.time() - started
        for name in ("R", "H"):
            server.http.post(f"/jobs/{seen['ids'][name]}/cancel")
        for name in ("R", "H"):
            seen[name] = server.wait(seen["ids"][name], lambda j: j["state"] in FINAL, timeout=60)
        seen["processes left"] = [pid for pid in seen["running at the kill"].values() if alive(pid)]
        load.stopping.set()
        for future in followers:
            future.result(timeout=60)
        seen["phases"]["followers done"] = time.time() - started
    seen["final table"] = server.http.get("/jobs").json()
    seen["load"] = load


def step(job: dict) -> int:
    """Steps done, from the job's progress (0 before the first)."""
    done = job.get("progress") or {}
    return ((done.get("epoch") or 1) - 1) * (done.get("steps_per_epoch") or 0) + (done.get("step") or 0)


def alive(group: int, wait: float = 15) -> bool:
    """Is any process of the group (a job's wrapper, horovodrun, its ranks) still there, zombies
    aside, after up to `wait` seconds?"""
    deadline = time.time() + wait
    while True:
        members = []
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[2]) == group and fields[0] != "Z":  # fields 5 (pgrp) and 3 (state)
                members.append(stat.parent.name)
        if not members or time.time() > deadline:
            return bool(members)
        time.sleep(0.5)


def timed(http: httpx.Client, params) -> float:
    started = time.perf_counter()
    assert http.get("/jobs", params=params).status_code == 200
    return time.perf_counter() - started


def test_every_submission_is_in_the_table_once(loaded):
    load, table = loaded["load"], loaded["final table"]
    by_name: dict = {}
    for job in table:
        by_name.setdefault(job["name"], []).append(job["id"])
    assert all(len(ids) == 1 for ids in by_name.values()), {n: i for n, i in by_name.items() if len(i) > 1}
    assert all(by_name.get(name) == [job_id] for name, job_id in load.answered.items())  # none lost
    assert set(by_name) == set(load.answered) | {n for n in load.cut if n in by_name} | {"R", "H"}
    assert len(load.answered) + len(load.cut) == SUBMISSIONS
    landed = sum(name in by_name for name in load.cut)
    print(f"{SUBMISSIONS} submissions: {len(load.answered)} answered 201, {len(load.cut)} cut by the kill "
          f"({landed} of them recorded), {len(table)} jobs in the table")
    assert loaded["answered before the kill"] >= KILL_AFTER and len(load.answered) > KILL_AFTER  # kill mid-way
    loaded_jobs = [job for job in table if job["name"].startswith("load-")]
    assert all(job["state"] == "cancelled" and job["started_at"] is None for job in loaded_jobs)
    assert all(job["state"] == "cancelled" for job in loaded["cancels"])


def test_the_table_survives_the_kill(loaded):
    assert loaded["integrity after the kill"] == "ok" and loaded["integrity at the end"] == "ok"
    print(f"restarted after SIGKILL, answering again in {loaded['restart seconds']:.1f} s; "
          f"phases (s from the first submission): {loaded['phases']}")


def test_jobs_running_at_the_kill_are_adopted(loaded):
    ids, at_kill = loaded["ids"], loaded["running at the kill"]
    assert ids["H"] in at_kill  # H is held: always running then
    for job_id, pid in at_kill.items():
        after = loaded["after restart"][job_id]
        assert after["pid"] == pid and after["attempts"] == 1, after  # the same processes, not restarted
        assert after["state"] == "running" or after["exit_status"] is not None, after
    assert ids["R"] in at_kill and step(loaded["R stepping after restart"]) > 0  # watched by the new service
    for name in ("R", "H"):
        job = loaded[name]
        assert job["state"] == "cancelled" and job["pid"] == at_kill[ids[name]] and job["attempts"] == 1, job
    assert loaded["processes left"] == []  # cancelled through the restarted service: every process gone


def test_followers_get_the_whole_log(loaded):
    load, r = loaded["load"], loaded["R"]
    whole = (Path(r["run_dir"]) / "stdout.log").read_bytes()
    of_r = [s for s in load.streams if s["job"] == r["id"] and not s["cut"]]
    assert of_r and all(s["bytes"] == whole for s in of_r), [len(s["bytes"]) for s in of_r]
    assert sum(s["cut"] for s in load.streams) >= 1  # the kill cut the streams open then
    assert b"epoch 1/%d step " % R_EPOCHS in whole


def test_latency_at_that_load(loaded):
    """Reported, not bounded (speed belongs to benchmarks): the figures for docs/serve.md."""
    load = loaded["load"]
    print(f"load: {SUBMISSIONS} submissions from {SUBMITTERS} clients in {loaded['submit seconds']:.1f} s "
          f"while {FOLLOWERS} clients follow logs (a SIGKILL and restart among them)")
    print(f"  POST /jobs:                 {percentiles(load.submit_seconds)}")
    print(f"  GET /jobs?limit=50 (a page): {percentiles(load.read_seconds['page'])}")
    print(f"  GET /jobs (the whole table): {percentiles(load.read_seconds['all'])}")
    print(f"after, {len(loaded['table'])} jobs, followers still on: GET /jobs?limit=50 "
          f"{percentiles(loaded['page at 500'])}; GET /jobs {percentiles(loaded['all at 500'])}")
    assert load.submit_seconds and load.read_seconds["page"] and load.read_seconds["all"]
