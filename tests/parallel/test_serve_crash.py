"""`hvdcls serve` crashed at any instant (issue 52): rounds of submit, cancel, queue pressure on
an elastic job (a waiting job makes the queue shrink it) and jobs finishing, each round ended by
SIGKILL to the service's process group, then a restart; at the end every acknowledged job must
have ended exactly once: succeeded, or cancelled where a cancel was sent, none failed, none
started twice (each job's own log of its starts), and SQLite's integrity check must pass after
every kill.

The kills land at random instants and, in the first rounds, exactly at the service's crash
points (hvdcls.serve.faults: inside a submission, launch, hand_over before and after the spawn,
a resize, record_end, and a restart's own abandoning of a launch). The jobs are real wrappers
around tests/serve_standin.py instead of horovodrun and `hvdcls train` (a second each), so that
many rounds fit: what is tested is the service's bookkeeping, which a real run does not change
(test_serve_load.py adopts a real torch job across a SIGKILL).

In `make test` the rounds fill ROUND_SECONDS (the crash points first); HVDCLS_CRASH_ROUNDS=N
runs N rounds instead (the long run docs/serve.md reports). Every submission carries an
idempotency key and is sent again after a cut, as `hvdcls submit` does.
"""
from __future__ import annotations

import json
import os
import random
import sqlite3
import statistics
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import httpx
import pytest

from hvdcls.serve import faults, launches
from tests.results import keep
from tests.serve_server import FINAL, ServeProcess

STANDIN = Path(__file__).resolve().parents[1] / "serve_standin.py"
ROUND_SECONDS = float(os.environ.get("HVDCLS_CRASH_SECONDS", "60"))
ROUNDS = int(os.environ.get("HVDCLS_CRASH_ROUNDS", "0"))  # 0: as many as ROUND_SECONDS allow
# Rounds take ~5 s on a loaded 2-core machine; the drain after them up to a few minutes.
pytestmark = [pytest.mark.parallel, pytest.mark.timeout(600 + (30 * ROUNDS or 2 * ROUND_SECONDS))]
SLOTS = 3
SUBMITS = 3  # a round's most submissions at random instants
# The crash points in the order the first rounds use them; "restart.abandoned" needs a launch
# cut before anything ran, so it follows "launch".
HOOKED = ("submit", "launch", "restart.abandoned", "hand_over.prepared", "hand_over.started", "resize",
          "record_end")
SPECS = {  # what a round submits: the stand-in runs epochs x 0.5 s
    "short": {"np": 1, "overrides": ["training.epochs=2"]},
    "pair": {"np": 2, "overrides": ["training.epochs=2"]},
    "elastic": {"np": 3, "elastic": True, "min_np": 1, "max_np": 3, "overrides": ["training.epochs=6"]},
}


@dataclass
class Traffic:
    """What the test sent and what the service acknowledged."""

    keys: dict[str, dict] = field(default_factory=dict)  # every key sent -> its spec
    pending: list[str] = field(default_factory=list)  # keys whose request a kill cut: sent again
    acknowledged: dict[str, int] = field(default_factory=dict)  # key -> job id
    cancels: set[int] = field(default_factory=set)  # jobs a cancel was sent for (answered or cut)


def submit(server: ServeProcess, traffic: Traffic, key: str) -> Optional[int]:
    try:
        reply = server.http.post("/jobs", json=traffic.keys[key], headers={"Idempotency-Key": key}, timeout=20)
    except httpx.TransportError:
        if key not in traffic.pending:
            traffic.pending.append(key)
        return None
    assert reply.status_code in (200, 201), reply.text
    job_id = reply.json()["id"]
    assert traffic.acknowledged.setdefault(key, job_id) == job_id  # a retry names the same job
    if key in traffic.pending:
        traffic.pending.remove(key)
    return job_id


def new_job(server: ServeProcess, traffic: Traffic, kind: str) -> Optional[int]:
    key = str(uuid.uuid4())
    traffic.keys[key] = {**SPECS[kind], "name": kind}
    return submit(server, traffic, key)


def cancel_one(server: ServeProcess, traffic: Traffic, rng: random.Random) -> None:
    """Cancel one of the newest jobs (the older have ended: a job takes 1 to 3 s)."""
    newest = [job for job in sorted(set(traffic.acknowledged.values()))[-4:] if job not in traffic.cancels]
    if not newest:
        return
    job_id = rng.choice(newest)
    traffic.cancels.add(job_id)  # sent: it may have landed, even when the answer was cut
    try:
        server.http.post(f"/jobs/{job_id}/cancel", timeout=20)
    except httpx.TransportError:
        pass


def running(server: ServeProcess, job_id: int) -> bool:
    try:
        return server.job(job_id)["state"] == "running"
    except (httpx.TransportError, ValueError):
        return False


def hooked_traffic(server: ServeProcess, traffic: Traffic, point: str) -> None:
    """Traffic that reaches `point` (the service then kills itself)."""
    if point == "resize":  # a running elastic job, then a job that must wait for its slots
        elastic = new_job(server, traffic, "elastic")
        deadline = time.time() + 30
        while elastic is not None and not running(server, elastic) and time.time() < deadline:
            time.sleep(0.1)
    new_job(server, traffic, "short")


def random_traffic(server: ServeProcess, traffic: Traffic, rng: random.Random, alive) -> None:
    """Submissions (at most SUBMITS a round, so that the queue keeps up), cancels and pauses
    until the killer ends the service."""
    submitted = 0
    while alive():
        action = rng.choices(["short", "pair", "elastic", "cancel", "pause"], [3, 1, 1, 1, 2])[0]
        if action == "cancel":
            cancel_one(server, traffic, rng)
        elif action != "pause" and submitted < SUBMITS:
            new_job(server, traffic, action)
            submitted += 1
        time.sleep(rng.uniform(0.05, 0.5))


def integrity(state_dir: Path) -> str:
    with sqlite3.connect(state_dir / "jobs.db") as db:
        return db.execute("PRAGMA integrity_check").fetchone()[0]


def cut_launches(state_dir: Path) -> dict[int, str]:
    """The launches the table says were running at the kill: job id -> launch id."""
    with sqlite3.connect(state_dir / "jobs.db") as db:
        rows = db.execute("SELECT id, launch_id FROM jobs WHERE state = 'running' AND launch_id IS NOT NULL")
        return dict(rows.fetchall())


@dataclass
class Round:
    point: Optional[str]  # the crash point it was given (None: a random instant)
    restarted_at: float  # when this round's service was started
    ready_seconds: Optional[float]  # from its start to listening (None: it died starting)
    cut: dict[int, str] = field(default_factory=dict)  # launches running at its kill


def one_round(server: ServeProcess, traffic: Traffic, rng: random.Random, point: Optional[str]) -> Round:
    server.extra_env[faults.CRASH] = point or ""
    began = time.time()
    up = server.start(timeout=120, may_die=point is not None)  # a restart may reach the point itself
    this = Round(point, began, time.time() - began if up else None)
    if up:
        for key in list(traffic.pending):
            submit(server, traffic, key)
        if point is None:  # a random instant of this round's traffic
            threading.Timer(rng.uniform(0.0, 3.0), server.kill_group).start()
            random_traffic(server, traffic, rng, lambda: server.process.poll() is None)
        else:
            hooked_traffic(server, traffic, point)
            if server.process.poll() is None:  # the point not reached in the round's time: kill anyway
                deadline = time.time() + 20
                while server.process.poll() is None and time.time() < deadline:
                    time.sleep(0.05)
                server.kill_group()
    server.process.wait(timeout=60)
    this.cut = cut_launches(server.state_dir)
    assert integrity(server.state_dir) == "ok"
    return this


def drain(server: ServeProcess, traffic: Traffic) -> dict[int, dict]:
    """A last, uncrashed service: the cut submissions sent again, every job to its end."""
    server.extra_env[faults.CRASH] = ""
    server.start(timeout=120)
    for key in list(traffic.pending):
        assert submit(server, traffic, key) is not None
    deadline = time.time() + 120 + 3 * len(traffic.keys)  # each a few seconds at most, on 3 slots
    while True:
        jobs = {job["id"]: job for job in server.http.get("/jobs").json()}
        if all(job["state"] in FINAL for job in jobs.values()):
            return jobs
        assert time.time() < deadline, [job for job in jobs.values() if job["state"] not in FINAL]
        time.sleep(0.5)


def standin_log(job: dict) -> list[str]:
    path = Path(job["run_dir"] or "/nonexistent") / "standin.log"
    return [" ".join(line.split()[:2 if line.startswith("end") else 1])
            for line in (path.read_text().splitlines() if path.exists() else [])]


def restart_to_start(rounds: list[Round], drained_at: float, jobs: dict[int, dict]) -> list[float]:
    """For each restart that came up, the seconds from its start to the start of a job whose
    launch the kill before it had cut before anything ran (so queued again, on slots it had been
    given): that job's next launch, as its wrapper claimed it, if that restart made it (claimed
    before the next restart could have: a service takes over a second to launch anything)."""
    starts = [r.restarted_at for r in rounds[1:]] + [drained_at, float("inf")]
    came_up = [r.ready_seconds is not None for r in rounds[1:]] + [True]
    found = []
    for n, cut_round in enumerate(rounds):
        restarted, made_by_next = starts[n], starts[n + 1] + 1.0
        for job_id, launch_id in cut_round.cut.items() if came_up[n] else ():
            run_dir = Path(jobs[job_id]["run_dir"])
            if "abandoned_at" not in (launches.read_claim(run_dir, launch_id) or {}):
                continue  # it had started: adopted, not queued again
            claims = [json.loads(path.read_text()) for path in (run_dir / launches.LAUNCHES).glob("*.json")]
            started = min([c["at"] for c in claims if "pid" in c and c["at"] > restarted], default=None)
            if started is not None and started < made_by_next:
                found.append(started - restarted)
    return found


def check_every_job(jobs: dict[int, dict], traffic: Traffic) -> dict[str, int]:
    """Every acknowledged job ended once, as its traffic asked; none started twice."""
    assert sorted(jobs) == sorted(set(traffic.acknowledged.values())), "a job no submission made, or one lost"
    assert len(traffic.acknowledged) == len(traffic.keys)  # every key sent made its job (retried)
    ends = {"succeeded": 0, "cancelled": 0}
    for job_id, job in jobs.items():
        log = standin_log(job)
        wrappers = [p for p in (Path(job["run_dir"] or "/nonexistent") / launches.LAUNCHES).glob("*.json")
                    if "pid" in json.loads(p.read_text())]
        assert job["state"] != "failed", (job_id, job["message"])
        assert job["state"] == "succeeded" or job_id in traffic.cancels, (job_id, job["state"], job["message"])
        assert log.count("start") <= 1 and len(wrappers) <= 1, (job_id, log, wrappers)  # never twice
        if job["state"] == "succeeded":
            assert log == ["start", "end 0"], (job_id, log)
        ends[job["state"]] += 1
    return ends


def crash_point(n: int, before: Optional[str]) -> Optional[str]:
    """Round n's crash point: each in turn first; in the long run every fourth round's too (and
    the restart after a cut launch), random instants between."""
    if n < len(HOOKED):
        return HOOKED[n]
    if ROUNDS and before == "launch":
        return "restart.abandoned"
    cycle = [point for point in HOOKED if point != "restart.abandoned"]
    return cycle[(n // 4) % len(cycle)] if ROUNDS and n % 4 == 0 else None


def test_every_acknowledged_job_ends_once_whatever_the_instant_of_the_crash(tmp_path):
    seed = int(os.environ.get("HVDCLS_CRASH_SEED", str(int(time.time()))))
    rng = random.Random(seed)
    server = ServeProcess(tmp_path, hosts=f"localhost:{SLOTS}", options=("--resize-cooldown", "0"),
                          env={faults.STANDIN: str(STANDIN)}, own_group=True)
    traffic, rounds, began = Traffic(), [], time.time()
    try:
        while True:
            n = len(rounds)
            if (ROUNDS and n >= ROUNDS) or (not ROUNDS and n >= len(HOOKED) and time.time() - began > ROUND_SECONDS):
                break
            rounds.append(one_round(server, traffic, rng, crash_point(n, rounds[-1].point if rounds else None)))
        drained_at = time.time()
        jobs = drain(server, traffic)
    finally:
        server.end_everything()
    assert integrity(server.state_dir) == "ok"
    ends = check_every_job(jobs, traffic)
    log = server.log.read_text()
    hit = {point: log.count(f"test hook: crashing at {point}") for point in HOOKED}
    assert all(hit.values()), hit  # every crash point was reached and crashed the service
    ready = [r.ready_seconds for r in rounds if r.ready_seconds is not None]
    to_start = restart_to_start(rounds, drained_at, jobs)
    seconds = time.time() - began
    keep("crash.json", {
        "seed": seed, "kills": len(rounds), "seconds": seconds, "at_random": sum(r.point is None for r in rounds),
        "at_crash_points": sum(hit.values()), "hit": hit,
        "rounds_given_a_point": sum(r.point is not None for r in rounds),
        "jobs": len(jobs), "acknowledged": len(traffic.acknowledged),
        **ends, "failed": 0, "started_twice": 0, "cancels_sent": len(traffic.cancels),
        "ready_seconds": ready, "ready_median": statistics.median(ready), "ready_worst": max(ready),
        "restart_to_start": to_start, "restart_to_start_median": statistics.median(to_start) if to_start else None,
        "restart_to_start_worst": max(to_start, default=None)})
    print(f"\ncrash-anywhere (seed {seed}): {len(rounds)} kills in {seconds:.0f} s "
          f"({sum(r.point is None for r in rounds)} at random instants; at the crash points {hit}); "
          f"{len(jobs)} jobs: {ends['succeeded']} succeeded, {ends['cancelled']} cancelled, 0 failed, "
          f"0 started twice, {len(traffic.cancels)} cancels sent; restart to listening: median "
          f"{statistics.median(ready):.2f} s, worst {max(ready):.2f} s; restart to a cut job's start "
          f"({len(to_start)}): median {statistics.median(to_start) if to_start else float('nan'):.2f} s, "
          f"worst {max(to_start, default=float('nan')):.2f} s")
