"""The image as users get it: unprivileged, no secrets inside, the wheelhouse left behind."""
import subprocess

import pytest

pytestmark = pytest.mark.timeout(2400)  # the first test builds the images


def run_in_image(image: str, *cmd: str) -> subprocess.CompletedProcess:
    return subprocess.run(["docker", "run", "--rm", "--entrypoint", cmd[0], image, *cmd[1:]],
                          capture_output=True, text=True, timeout=300)


def test_training_runs_as_an_unprivileged_user(images):
    result = run_in_image(images, "id", "-un")
    assert result.returncode == 0 and result.stdout.strip() == "hvd", result.stderr


def test_no_ssh_key_is_baked_into_the_image(images):
    # openssh-server's install makes host keys; the Dockerfile must have removed them.
    result = run_in_image(images, "find", "/etc/ssh", "/home", "/root", "-name", "ssh_host_*",
                          "-o", "-name", "id_*", "-o", "-name", "authorized_keys")
    assert result.stdout.split() == [], result.stdout


def test_the_wheelhouse_stays_in_the_build_stage(images):
    assert run_in_image(images, "test", "-e", "/wheelhouse").returncode == 1


def test_the_environment_is_complete(images):
    """hvdcls doctor checks torch, TensorFlow, Horovod (both frameworks, Gloo and MPI), OpenMPI."""
    result = run_in_image(images, "hvdcls", "doctor")
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    assert "horovod           0.28.1" in result.stdout
