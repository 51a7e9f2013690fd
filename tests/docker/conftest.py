"""Docker tests: the images are built from this tree and a compose cluster is brought up once
per session, then torn down (containers, network, volumes) whatever the tests did.

Without a Docker engine they skip and say why; with CI=true or HVDCLS_REQUIRE_DOCKER=1 that
skip is a failure instead, so CI cannot pass without having run them.
"""
import os

import pytest

from tests.docker import cluster as docker_cluster

# Docker is shared by whoever works on this machine: a run of one's own picks its own name.
PROJECT = os.environ.get("HVDCLS_COMPOSE_PROJECT", "hvdcls-test")


def docker_required() -> bool:
    return os.environ.get("CI", "").lower() == "true" or os.environ.get("HVDCLS_REQUIRE_DOCKER") == "1"


@pytest.fixture(scope="session")
def images():
    """The base image and hvdcls:latest, built when missing or out of date (minutes the first time)."""
    reason = docker_cluster.unavailable_reason()
    if reason:
        if docker_required():
            pytest.fail(f"docker tests required (CI=true or HVDCLS_REQUIRE_DOCKER=1): {reason}")
        pytest.skip(reason)
    docker_cluster.build_images()
    return docker_cluster.IMAGE


@pytest.fixture(scope="session")
def cluster(images):
    """The training part of the cluster (keygen, workers, launcher); test_serve.py starts the
    service and Prometheus in it for its own tests only: idle, they would still use the cores."""
    compose = docker_cluster.Cluster(PROJECT)
    try:
        compose.up(services=docker_cluster.TRAINING_SERVICES)
        yield compose
    finally:
        compose.down()
