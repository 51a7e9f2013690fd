"""`hvdcls serve` as a real subprocess for the tests: its own state directory, a loopback port
chosen once and kept across restarts (clients reconnect to the same address after a kill),
the first admin's token, and clients for other users' tokens.

    server = ServeProcess(tmp_path, hosts="localhost:1", env={"HVDCLS_TEST_STALL": "0:1"})
    server.start()
    job = server.submit({"np": 1})                     # as the first admin (STATE_DIR/token)
    alice = server.client(server.add_user("alice"))    # `hvdcls serve token add alice`
    server.kill(); server.start()                      # SIGKILL, then the same port again
    server.end_everything()                            # no job left running, whatever happened

Jobs run as the test's own `hvdcls train` (PYTHONPATH is the repository), one thread per rank.
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Optional

import httpx

from hvdcls.launching import launch

REPO = Path(__file__).resolve().parents[1]
FINAL = ("succeeded", "failed", "cancelled")
# What a test job needs: no pictures, no TensorBoard, no checkpoints; a progress line each step.
QUIET = {"schedule": {"warmup_epochs": 0}, "training": {"log_every": 1},
         "output": {"report": False, "tensorboard": False, "checkpoint_every": 0}}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def env(extra: Optional[dict] = None) -> dict:
    environ = launch.single_host_env()
    environ["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{environ['PATH']}"
    environ["PYTHONPATH"] = str(REPO)
    return {**environ, **(extra or {})}


def hvdcls(*args: str, extra_env: Optional[dict] = None, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(launch.hvdcls_command(*args), env=env(extra_env), capture_output=True, text=True,
                          timeout=timeout)


class ServeProcess:
    def __init__(self, root: Path, hosts: str = "localhost:1", options: tuple[str, ...] = (),
                 env: Optional[dict] = None, state_dir: Optional[Path] = None, own_group: bool = False):
        self.root = Path(root)
        self.state_dir = state_dir or self.root / "state"
        self.data_root = self.root / "data"
        self.cwd = self.root / "cwd"  # the service's working directory: a test sees what lands there
        self.log = self.root / "serve.log"
        self.hosts, self.options, self.extra_env = hosts, options, env or {}
        self.own_group = own_group  # its own process group, which kill_group() ends as a crash would
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.process: Optional[subprocess.Popen] = None
        for folder in (self.data_root, self.cwd):
            folder.mkdir(parents=True, exist_ok=True)

    def start(self, timeout: float = 60, may_die: bool = False) -> bool:
        """Start the service and wait until it listens; False when it ended first and `may_die`
        said it might (a crash hook in its start-up)."""
        (self.state_dir / "server.json").unlink(missing_ok=True)
        command = launch.hvdcls_command("serve", "--hosts", self.hosts, "--state-dir", str(self.state_dir),
                                        "--port", str(self.port), "--data-root", str(self.data_root),
                                        "--grace-seconds", "5", *self.options)
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env(self.extra_env),
                                            cwd=self.cwd, start_new_session=self.own_group)
        deadline = time.time() + timeout
        while not (self.state_dir / "server.json").exists():
            if may_die and self.process.poll() is not None:
                return False
            assert self.process.poll() is None and time.time() < deadline, self.log.read_text()[-3000:]
            time.sleep(0.05)
        self.token = (self.state_dir / "token").read_text().strip()
        if getattr(self, "http", None) is not None:
            self.http.close()  # the previous start's
        self.http = self.client(self.token)
        return True

    def client(self, token: Optional[str], timeout: float = 60) -> httpx.Client:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=timeout)

    def add_user(self, name: str, *flags: str) -> str:
        """`hvdcls serve token add NAME [FLAGS]`: the new user's token."""
        done = hvdcls("serve", "token", "add", name, *flags, "--state-dir", str(self.state_dir))
        assert done.returncode == 0, done.stderr
        return done.stdout.strip()

    def stop(self) -> None:
        self.process.send_signal(signal.SIGTERM)
        self.process.wait(timeout=30)

    def kill(self) -> None:
        self.process.kill()
        self.process.wait(timeout=30)

    def kill_group(self) -> None:
        """SIGKILL to the service's process group (own_group), as a crash of it; its jobs run
        in sessions of their own and go on."""
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.process.wait(timeout=30)

    def submit(self, spec: dict, http: Optional[httpx.Client] = None) -> dict:
        reply = (http or self.http).post("/jobs", json=spec)
        assert reply.status_code == 201, reply.text
        return reply.json()

    def job(self, job_id: int) -> dict:
        return self.http.get(f"/jobs/{job_id}").json()

    def wait(self, job_id: int, until: Callable[[dict], bool], timeout: float = 240) -> dict:
        deadline = time.time() + timeout
        while not until(job := self.job(job_id)):
            assert time.time() < deadline, (job, self.log.read_text()[-3000:])
            time.sleep(0.2)
        return job

    def end_everything(self) -> None:
        """Leave no job running: cancel the queue (so nothing starts in a freed slot), then the
        running jobs, through the service; kill what is left and stop the service."""
        pids = []
        try:
            if self.process.poll() is None:
                for state in ("queued", "running"):
                    for job in self.http.get("/jobs", params={"state": state}).json():
                        pids.append(job["pid"])
                        self.http.post(f"/jobs/{job['id']}/cancel")
                for job in self.http.get("/jobs", params={"state": "running"}).json():
                    self.wait(job["id"], lambda j: j["state"] in FINAL, timeout=30)
        finally:
            if self.process.poll() is None:
                self.stop()
            for pid in filter(None, pids):
                try:
                    os.killpg(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass


def read_log(run_dir: str, *names: str) -> str:
    return "".join((Path(run_dir) / name).read_text(errors="replace") for name in names
                   if (Path(run_dir) / name).exists())
