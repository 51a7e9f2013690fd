"""The compose cluster of docker/compose.yaml, driven from tests: build, up, exec, down.

Everything goes through the real Docker engine and the real images; nothing is mocked.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Optional

REPO = Path(__file__).resolve().parents[2]
COMPOSE_FILE = REPO / "docker" / "compose.yaml"
SLURM_COMPOSE_FILE = REPO / "docker" / "slurm.yaml"
IMAGE = os.environ.get("HVDCLS_IMAGE", "hvdcls:latest")
SLURM_IMAGE = os.environ.get("HVDCLS_SLURM_IMAGE", "hvdcls-slurm:latest")
PROMETHEUS_IMAGE = os.environ.get("HVDCLS_PROMETHEUS_IMAGE", "hvdcls-prometheus:latest")
BASE_IMAGE = os.environ.get("BASE_IMAGE", "hvdcls/base:bookworm")
WORKERS = ["worker1", "worker2"]
# The training part of the cluster: what a project needs to run horovodrun/mpirun from the launcher.
TRAINING_SERVICES = ("keygen", *WORKERS, "launcher")
SSH_PORT = 12345


def compose_command() -> Optional[list[str]]:
    """`docker compose` (v2 plugin) where it exists, else Debian's docker-compose 1.29."""
    if shutil.which("docker") and subprocess.run(["docker", "compose", "version"],
                                                 capture_output=True).returncode == 0:
        return ["docker", "compose"]
    return ["docker-compose"] if shutil.which("docker-compose") else None


def unavailable_reason() -> Optional[str]:
    """Why the docker tests cannot run here, or None."""
    if not shutil.which("docker"):
        return "no docker client (make test starts an engine as root: tools/docker_engine.sh)"
    if subprocess.run(["docker", "info"], capture_output=True, timeout=30).returncode != 0:
        return "no Docker engine answers `docker info` (tools/docker_engine.sh starts one as root)"
    if compose_command() is None:
        return "neither `docker compose` nor docker-compose is installed"
    return None


def build_images() -> None:
    """`make base-image`, `make image` and `make prometheus-image` (the compose cluster's
    Prometheus: one apt layer on the base image): each does nothing when already up to date."""
    env = {**os.environ, "BASE_IMAGE": BASE_IMAGE}
    tool = [sys.executable, str(REPO / "tools" / "docker_image.py")]
    for cmd in (["bash", str(REPO / "tools" / "base_image.sh")],
                [*tool, "image", "--base-image", BASE_IMAGE, "--tag", IMAGE],
                [*tool, "prometheus-image", "--base-image", BASE_IMAGE, "--tag", PROMETHEUS_IMAGE]):
        result = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800)
        assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]


def build_slurm_image() -> None:
    """The app image plus Debian's Slurm and munge (one apt layer; nothing when up to date)."""
    cmd = [sys.executable, str(REPO / "tools" / "docker_image.py"), "slurm-image", "--app-image", IMAGE,
           "--tag", SLURM_IMAGE]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]


class Cluster:
    """One compose project: keygen, worker1, worker2, a launcher, the service and Prometheus on a
    private network."""

    def __init__(self, project: str, compose_file: Path = COMPOSE_FILE):
        self.project = project
        self.base = [*compose_command(), "--file", str(compose_file), "--project-name", project]
        self.env = {**os.environ, "HVDCLS_IMAGE": IMAGE, "HVDCLS_SLURM_IMAGE": SLURM_IMAGE,
                    "HVDCLS_PROMETHEUS_IMAGE": PROMETHEUS_IMAGE}

    def compose(self, *args: str, timeout: int = 300, check: bool = True) -> subprocess.CompletedProcess:
        result = subprocess.run([*self.base, *args], env=self.env, capture_output=True, text=True,
                                timeout=timeout)
        if check:
            assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
        return result

    def up(self, wait: bool = True, services: tuple[str, ...] = ()) -> None:
        """Every service, or only `services` (and what they depend on)."""
        self.down()  # a project left over by a killed run
        self.compose("up", "--detach", *services)
        if wait:  # the launcher's entrypoint waits for both workers' sshd; this waits for the launcher
            self.launcher("hvdcls-container", "wait-workers", timeout=180)
            if not services or "service" in services:
                self.launcher("hvdcls-container", "wait-service", timeout=180)

    def start(self, *services: str) -> None:
        """More services of this running project (what they depend on is up already)."""
        self.compose("up", "--detach", *services)
        if "service" in services:
            self.launcher("hvdcls-container", "wait-service", timeout=180)

    def stop(self, *services: str) -> None:
        self.compose("stop", "--timeout", "5", *services, check=False)

    def down(self) -> None:
        """Containers, the network and the volumes (the SSH key with them)."""
        self.compose("down", "--volumes", "--remove-orphans", "--timeout", "5", check=False)

    def launcher(self, *cmd: str, timeout: int = 900, check: bool = True) -> subprocess.CompletedProcess:
        return self.compose("exec", "-T", "launcher", *cmd, timeout=timeout, check=check)

    def python(self, service: str, script: Path, timeout: int, *args: str) -> subprocess.CompletedProcess:
        """`python - ARGS < script` in a service's container, as the training user."""
        return subprocess.run([*self.base, "exec", "-T", "--user", "hvd", service, "python", "-", *args],
                              input=script.read_text(), env=self.env, capture_output=True, text=True,
                              timeout=timeout)

    def read_json(self, path: str) -> dict:
        return json.loads(self.launcher("cat", path, timeout=60).stdout)

    def files(self, directory: str, name: str) -> list[str]:
        out = self.launcher("find", directory, "-name", name, timeout=60).stdout
        return sorted(out.split())

    def resources(self) -> dict[str, list[str]]:
        """What Docker still holds for this project: containers, networks, volumes."""
        label = f"label=com.docker.compose.project={self.project}"
        listings = {"containers": ["docker", "ps", "--all", "--quiet", "--filter", label],
                    "networks": ["docker", "network", "ls", "--quiet", "--filter", label],
                    "volumes": ["docker", "volume", "ls", "--quiet", "--filter", label]}
        return {kind: subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.split()
                for kind, cmd in listings.items()}
