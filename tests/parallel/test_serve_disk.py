"""`hvdcls serve` with its state directory on a full file system: a 16 MiB tmpfs mounted here
(root only: skipped, saying so, otherwise), filled to the last byte by the test.

One slot, held by a real job (`holder`, its rank 0 held at its first batch by the
HVDCLS_TEST_STALL hook, so it writes nothing more), five jobs queued behind it. Twice:

    1. --reserve-mb 1: the service's own check refuses a submission (507) before anything is written
    2. --reserve-mb 0, restarted (the holder adopted), SQLite's write-ahead log emptied: the disk
       itself refuses the next write; submit and cancel answer 507 from SQLite's "disk is full"

Each time, with the disk full: the refusal is one line (the API's and `hvdcls submit`'s, exit
status 2); reads go on answering; and once the filler is deleted: SQLite's integrity check
passes, every job is as it was, no temporary file is left, and submitting and cancelling work.
"""
from __future__ import annotations

import errno
import json
import os
import shutil
import sqlite3
import subprocess
from pathlib import Path

import pytest

from tests.serve_server import FINAL, ServeProcess, hvdcls, read_log

pytestmark = pytest.mark.parallel
STABLE = ("id", "name", "owner", "state", "spec", "submitted_at", "np", "pid")  # what a full disk must not change


def fill(folder: Path) -> Path:
    """Write until the file system says ENOSPC, in ever smaller pieces: nothing is left."""
    filler = folder / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    try:
        for size in (1 << 20, 4096, 1):
            try:
                while True:
                    os.write(fd, b"\0" * size)
            except OSError as err:
                assert err.errno == errno.ENOSPC, err
    finally:
        os.close(fd)
    return filler


def integrity(state_dir: Path) -> str:
    with sqlite3.connect(state_dir / "jobs.db") as db:
        return db.execute("PRAGMA integrity_check").fetchone()[0]


def empty_the_wal(state_dir: Path) -> None:
    """Checkpoint and truncate the write-ahead log: the next commit must grow it, on a full disk."""
    with sqlite3.connect(state_dir / "jobs.db") as db:
        busy, _, _ = db.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
    assert busy == 0 and (state_dir / "jobs.db-wal").stat().st_size == 0


def stable(jobs: list[dict]) -> dict:
    return {job["id"]: {key: job[key] for key in STABLE} for job in jobs}


def while_full(server: ServeProcess, queued_id: int) -> dict:
    filler = fill(server.state_dir)
    seen = {"free": shutil.disk_usage(server.state_dir).free}
    reply = server.http.post("/jobs", json={"np": 1, "name": "when-full"})
    seen["submit"] = reply.status_code, reply.json()["detail"]
    seen["cli"] = hvdcls("job", "submit", "--np", "1", "--state-dir", str(server.state_dir))
    reply = server.http.post(f"/jobs/{queued_id}/cancel")
    seen["cancel"] = reply.status_code, reply.text
    seen["read"] = server.http.get("/jobs").json()
    seen["integrity"] = integrity(server.state_dir)
    filler.unlink()
    seen["temporary files"] = [str(p) for p in server.state_dir.rglob("*.tmp")]
    seen["integrity after"] = integrity(server.state_dir)
    seen["after"] = server.http.get("/jobs").json()
    seen["server.json"] = json.loads((server.state_dir / "server.json").read_text())
    return seen


@pytest.fixture(scope="module")
def full_disk(tmp_path_factory):
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    root = tmp_path_factory.mktemp("serve-disk")
    state = root / "state"
    state.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(state)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    server = ServeProcess(root, hosts="localhost:1", options=("--reserve-mb", "1"),
                          env={"HVDCLS_TEST_STALL": "0:1"}, state_dir=state)
    seen: dict = {"server": server}
    try:
        server.start()
        holder = server.submit({"np": 1, "name": "holder", "settings": {"output": {"report": False}}})
        server.wait(holder["id"], lambda j: j["pid"] and "holding until killed" in read_log(
            j["run_dir"], "stdout.log", "stderr.log"))  # it writes nothing more after this line
        queued = [server.submit({"np": 1, "name": f"queued-{i}"})["id"] for i in range(5)]
        seen["before"] = server.http.get("/jobs").json()
        seen["reserve"] = while_full(server, queued[0])
        seen["reserve: submit after"] = server.http.post("/jobs", json={"np": 1, "name": "after-1"})
        server.stop()
        server.options = ("--reserve-mb", "0")
        server.start()
        seen["before 2"] = server.http.get("/jobs").json()
        empty_the_wal(server.state_dir)
        seen["sqlite"] = while_full(server, queued[1])
        seen["sqlite: submit after"] = server.http.post("/jobs", json={"np": 1, "name": "after-2"})
        seen["sqlite: cancel after"] = server.http.post(f"/jobs/{queued[1]}/cancel").json()
        seen["queued"] = queued
        later = [seen[key].json()["id"] for key in ("reserve: submit after", "sqlite: submit after")]
        for job_id in [*queued, *later]:
            server.http.post(f"/jobs/{job_id}/cancel")  # the queue first: nothing may start in the freed slot
        server.http.post(f"/jobs/{holder['id']}/cancel")
        seen["holder at the end"] = server.wait(holder["id"], lambda j: j["state"] in FINAL, timeout=60)
    finally:
        if server.process is not None:
            server.end_everything()
        if subprocess.run(["umount", str(state)]).returncode != 0:
            subprocess.run(["umount", "-l", str(state)])
    return seen


def assert_refused_and_intact(full: dict, before: list[dict], words: str) -> None:
    assert full["free"] < 4096, full["free"]
    status, detail = full["submit"]
    assert status == 507 and words in detail and "\n" not in detail, full["submit"]
    cli = full["cli"]
    assert cli.returncode == 2 and cli.stderr.startswith("hvdcls: error: 507: ") and cli.stderr.count("\n") == 1
    assert stable(full["read"]) == stable(before)  # reads go on, and show what was there
    assert full["integrity"] == full["integrity after"] == "ok"
    assert full["temporary files"] == []
    assert stable(full["after"]) == stable(before)
    assert full["server.json"]["url"]  # the service's own file, whole


def test_the_reserve_refuses_submissions_before_the_disk_is_full(full_disk):
    full = full_disk["reserve"]
    assert_refused_and_intact(full, full_disk["before"], "below its reserve of 1 MB (serve --reserve-mb)")
    assert full["cancel"][0] in (200, 507)  # a cancel writes a row: it went through if SQLite had room
    after = full_disk["reserve: submit after"]
    assert after.status_code == 201 and after.json()["state"] == "queued", after.text
    print(f"full: {full['free']} bytes free; submit refused: {full['submit'][1]}")


def test_a_full_disk_refuses_what_writes_and_loses_nothing(full_disk):
    full = full_disk["sqlite"]
    assert_refused_and_intact(full, full_disk["before 2"], "is full: database or disk is full")
    assert full["cancel"][0] == 507 and "disk is full" in json.loads(full["cancel"][1])["detail"]
    cancelled = full_disk["sqlite: cancel after"]
    assert cancelled["id"] == full_disk["queued"][1] and cancelled["state"] == "cancelled"  # once there is room
    after = full_disk["sqlite: submit after"]
    assert after.status_code == 201, after.text
    print(f"full: submit refused: {full['submit'][1]}")


def test_the_holder_ran_through_both_and_was_adopted(full_disk):
    first = next(job for job in full_disk["before"] if job["name"] == "holder")
    again = next(job for job in full_disk["before 2"] if job["name"] == "holder")
    assert first["state"] == again["state"] == "running" and again["pid"] == first["pid"]  # adopted
    end = full_disk["holder at the end"]
    assert end["state"] == "cancelled" and end["exit_status"] is not None, end
