"""A compose project comes up with its own SSH key and leaves nothing behind when torn down."""
import pytest

from tests.docker.cluster import TRAINING_SERVICES, Cluster

pytestmark = pytest.mark.timeout(2400)


def public_key(project: Cluster) -> str:
    return project.launcher("cat", "/home/hvd/.ssh/id_ed25519.pub", timeout=60).stdout.strip()


def test_each_project_has_its_own_key_and_down_removes_everything(cluster):
    other = Cluster("hvdcls-test-lifecycle")
    try:
        other.up(services=TRAINING_SERVICES)  # a second service and Prometheus would only add load
        held = other.resources()
        assert held["containers"] and held["networks"] and held["volumes"], held
        assert public_key(other).startswith("ssh-ed25519 ")
        assert public_key(other) != public_key(cluster)
    finally:
        other.down()
    assert other.resources() == {"containers": [], "networks": [], "volumes": []}
